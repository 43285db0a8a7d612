"""summary and ranks over a large index: R ranks x S steps of one synthetic rank-step of N records (defaults
1,024 x 10 x 1,000: 10.24 M records), msprobe's format without step summaries, so the readers must read records.

One rank-step is written as dump.json (with ``--grads`` of its records parameters_grad records, as in a real mix
dump where most records are activations) and indexed; every other rank-step is a hard link of that dump.json and
an index file of the same rows with that rank's own gradient means (as data-parallel ranks differ before the
all-reduce, where msprobe captures gradients), so the dump costs the disk of one rank-step and the index files
while the readers open, check and scan R x S directories and index files. Each reader runs in its own
process (its peak RSS is its own), reading through the index:

    python benchmarks/index_scale.py [--ranks 1024] [--steps 10] [--records 1000] [--grads 50] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from msprobe_readers import ranks, summary
t0 = time.perf_counter()
if {what!r} == "summary":
    rows = summary.summarize({dump!r})
    out = {{"records": sum(r.records for r in rows), "first_nan": summary.global_first_nan(rows).record}}
else:
    res = ranks.check_dump({dump!r}, ranks.RankChecker())
    out = {{"ranks": len(res.labels), "compared": res.compared}}
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def write_one(rank_dir: str, records: int, grads: int) -> None:
    """One rank-step: forward and backward records of reader.py's shapes, every (records // grads)-th record a
    parameters_grad record, and a NaN in the tenth record from the end."""
    import random

    from reader import _leaf

    r = random.Random(0)
    every = max(1, records // max(1, grads))
    data = {}
    for i in range(records):
        if i % every == every - 1:
            rec = {"bias": [_leaf(r, [64])], "weight": [_leaf(r, [64, 64])]}
            data[f"Module.layers.{i}.Linear.parameters_grad.0"] = rec
        elif i % 2:
            data[f"Functional.linear.{i}.backward"] = {"input": [_leaf(r, [32, 64])],
                                                       "output": [_leaf(r, [64]), None, _leaf(r, [64, 64])]}
        else:
            data[f"Functional.linear.{i}.forward"] = {"input_args": [_leaf(r, [32, 64]), _leaf(r, [64, 64])],
                                                      "input_kwargs": {}, "output": [_leaf(r, [32, 64])]}
        if i == records - 10:
            next(iter(data[list(data)[-1]].values()))[0]["Mean"] = float("nan")
    os.makedirs(rank_dir, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
    with open(os.path.join(rank_dir, "dump.json"), "w") as fh:
        json.dump(doc, fh, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--grads", type=int, default=50)
    parser.add_argument("--dir")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    from msprobe_readers import index
    from msprobe_readers.reading import discover

    base = args.dir or tempfile.mkdtemp(prefix="msprobe_index_scale_")
    try:
        t0 = time.perf_counter()
        first = os.path.join(base, "step0", "rank0")
        write_one(first, args.records, args.grads)
        index.build(base)
        (proc,) = discover(base)
        source = index._file_of(base, proc)
        for step in range(args.steps):
            for rank in range(args.ranks):
                if (step, rank) == (0, 0):
                    continue
                d = os.path.join(base, f"step{step}", f"rank{rank}")
                os.makedirs(d, exist_ok=True)
                os.link(os.path.join(first, "dump.json"), os.path.join(d, "dump.json"))
        # every other index file: the template's rows with each rank's own gradient means (msprobe captures a
        # parameter gradient before the all-reduce, so data-parallel ranks differ there); its metadata names the
        # hard-linked dump.json, which has the template's size and modification time
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        template = pq.read_table(source)
        grads = pc.equal(template["direction"], "parameters_grad")
        mean_at = template.schema.get_field_index("mean")
        meta = pq.read_metadata(source).metadata
        for p in discover(base):
            target = index._file_of(base, p)
            if target == source:
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            mean = pc.if_else(grads, pc.add(template["mean"], pa.scalar((p.rank or 0) * 1e-3)), template["mean"])
            pq.write_table(template.set_column(mean_at, "mean", mean).replace_schema_metadata(meta), target,
                           compression="zstd")
        total = args.ranks * args.steps * args.records
        print(f"{args.ranks} ranks x {args.steps} steps x {args.records} records = {total:,} records "
              f"({args.grads} parameters_grad per rank-step), built in {time.perf_counter() - t0:.1f} s")
        for what in ("summary", "ranks"):
            out = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT, what=what, dump=base)],
                                 capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-2000:])
                return 1
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if out.stdout.strip().count("\n"):
                print(f"({what} printed: {out.stdout.strip().splitlines()[:-1]!r})")
            print(f"{what}: {got['seconds']:.1f} s, peak RSS {got['peak_rss_mib']:.0f} MiB; "
                  f"{ {k: v for k, v in got.items() if k not in ('seconds', 'peak_rss_mib')} }")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
