"""The end-of-job summary of a large job: R ranks x S steps of N records each, with and without the step
summaries the ranks write (``msprobe_inject.dumpformat.stepsummary``).

Writes a synthetic dump in the writer's format (``StepRecords`` documents plus the step summary each rank writes
at a step's end; one rank holds a NaN at one step), then times the launcher's end-of-job summary
(``msprobe_readers.cli.print_summary``) over it, first as written, then with the step summaries removed (every
record read). Wall and CPU time; the dump is removed afterwards unless --keep.

    python benchmarks/summary_scale.py [--ranks 1024] [--steps 10] [--records 300] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _records(n: int, nan_at: int = -1):
    from msprobe_inject.dumpformat.documents import StepRecords

    r = random.Random(0)
    st = StepRecords({"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None})
    suspect = set()
    for i in range(n):
        leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [8, 256], "Max": r.random() * 3,
                "Min": -r.random() * 3, "Mean": r.random() - 0.5, "Norm": r.random() * 40,
                "requires_grad": True}
        if i == nan_at:
            leaf["Max"] = leaf["Norm"] = float("nan")
        key = f"Functional.linear.{i}.forward"
        st.set(key, json.dumps({"input_args": [leaf, leaf], "input_kwargs": {}, "output": [leaf]}))
        if i == nan_at:
            suspect.add(key)
    return st, suspect


def write_dump(path: str, ranks: int, steps: int, records: int) -> int:
    from msprobe_inject.dumpformat import paths, stepsummary

    plain, _ = _records(records)
    body = plain.main_bytes()
    bad, bad_suspect = _records(records, nan_at=records // 2)
    nan_rank, nan_step = ranks // 3, steps // 2
    for step in range(steps):
        for rank in range(ranks):
            d = paths.rank_dir(path, step, rank, 0)
            os.makedirs(d)
            st, suspect, data = (bad, bad_suspect, bad.main_bytes()) if (rank, step) == (nan_rank, nan_step) \
                else (plain, set(), body)
            with open(os.path.join(d, paths.DUMP_JSON), "wb") as fh:
                fh.write(data)
            with open(os.path.join(d, paths.STEP_SUMMARY), "wb") as fh:
                fh.write(stepsummary.build(st, suspect, os.path.join(d, paths.DUMP_JSON)))
    return len(body)


def timed(path: str) -> tuple:
    from msprobe_readers.cli import print_summary

    out = io.StringIO()
    w0, c0 = time.perf_counter(), time.process_time()
    print_summary(path, out)
    return time.perf_counter() - w0, time.process_time() - c0, out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="msprobe-summary-", dir=args.dir)
    path = os.path.join(base, "dump")
    try:
        t0 = time.perf_counter()
        size = write_dump(path, args.ranks, args.steps, args.records)
        print(f"wrote {args.ranks} ranks x {args.steps} steps x {args.records} records ({size / 1024:.0f} KiB per "
              f"dump.json) in {time.perf_counter() - t0:.1f} s")
        os.sync() if hasattr(os, "sync") else None
        wall, cpu, text = timed(path)
        print(f"end-of-job summary with step summaries: {wall:.2f} s wall, {cpu:.2f} s CPU")
        for f in glob.glob(os.path.join(path, "step*", "rank*", ".step_summary.json")):
            os.unlink(f)
        wall2, cpu2, text2 = timed(path)
        print(f"end-of-job summary reading every record: {wall2:.2f} s wall, {cpu2:.2f} s CPU")
        print("same output: " + ("yes" if text == text2 else "NO"))
        print(text.splitlines()[-3])
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
