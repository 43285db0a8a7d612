"""Time to summarise a large dump.json: writes a synthetic dump (default 1,000,000 records, ~0.8 GB) in
msprobe's format (json.dump indent=1, bare NaN token) and times ``msprobe_readers.summary.summarize`` on it.

The last-but-ten record holds the only NaN, so every record goes through the NaN check. The bound is 30 s
for 1 M records (wall time; CPU time is printed too, as other jobs on the machine inflate the wall time).
The dump is written to a temporary directory and removed afterwards unless --keep.

    python benchmarks/reader.py [--records 1000000] [--dir DIR] [--keep] [--ranks] [--index]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _leaf(r: random.Random, shape: list) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": r.random() * 3,
            "Min": -r.random() * 3, "Mean": r.random() - 0.5, "Norm": r.random() * 40, "requires_grad": False}


def write_dump_json(path: str, records: int, nan_at: Optional[int] = None, seed: int = 0) -> int:
    """Write a dump.json with ``records`` records (forward / backward / parameters_grad in turn), streamed.

    Byte-for-byte what ``json.dump(doc, fh, indent=1)`` writes for the same document. Returns the file size.
    """
    r = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{\n "task": "statistics",\n "level": "mix",\n "framework": "pytorch",\n "dump_data_dir": null,\n'
                 ' "data": {')
        for i in range(records):
            kind = i % 3
            layer = i // 3
            if kind == 0:
                name = f"Functional.linear.{layer}.forward"
                rec = {"input_args": [_leaf(r, [32, 64]), _leaf(r, [64, 64])], "input_kwargs": {},
                       "output": [_leaf(r, [32, 64])]}
            elif kind == 1:
                name = f"Functional.linear.{layer}.backward"
                rec = {"input": [_leaf(r, [32, 64])], "output": [_leaf(r, [64]), None, _leaf(r, [64, 64])]}
            else:
                name = f"Module.layers.{layer}.Linear.parameters_grad.0"
                rec = {"bias": [_leaf(r, [64])], "weight": [_leaf(r, [64, 64])]}
            if i == nan_at:
                first = next(iter(rec.values()))
                first[0]["Mean"] = float("nan")
            body = json.dumps(rec, indent=1).replace("\n", "\n  ")
            fh.write(("\n  " if i == 0 else ",\n  ") + json.dumps(name) + ": " + body)
        fh.write("\n }\n}" if records else "}\n}")
    return os.path.getsize(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", help="where to write the dump (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic dump")
    parser.add_argument("--ranks", action="store_true", help="also time the cross-rank check's pass (one rank)")
    parser.add_argument("--index", action="store_true", help="also time msprobe-dump index and a query over it")
    args = parser.parse_args()

    from msprobe_readers import summary

    base = args.dir or tempfile.mkdtemp(prefix="msprobe_reader_bench_")
    rank_dir = os.path.join(base, "step0", "rank0")
    os.makedirs(rank_dir, exist_ok=True)
    path = os.path.join(rank_dir, "dump.json")
    try:
        t0 = time.perf_counter()
        size = write_dump_json(path, args.records, nan_at=max(0, args.records - 10))
        print(f"generated {args.records} records, {size / 2 ** 20:.0f} MiB in {time.perf_counter() - t0:.1f} s")
        t0, c0 = time.perf_counter(), time.process_time()
        rows = summary.summarize(base)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert rows[0].records == args.records, rows[0].records
        assert rows[0].first_nan is not None, "the NaN record was not found"
        print(f"summary: {args.records} records in {elapsed:.1f} s ({args.records / elapsed:,.0f} records/s, "
              f"{size / 2 ** 20 / elapsed:.0f} MiB/s; CPU {cpu:.1f} s); first NaN: {rows[0].first_nan[1]}; bound 30 s: "
              f"{'OK' if elapsed < 30 else 'EXCEEDED'}")
        if args.ranks:
            from msprobe_readers.ranks import RankChecker

            checker = RankChecker()
            t0 = time.perf_counter()
            summary.summarize(base, on_record=checker.on_record, stacks=False)
            checker.finish()
            print(f"ranks pass: {time.perf_counter() - t0:.1f} s")
        if args.index:
            import resource

            from msprobe_readers import index

            t0, c0 = time.perf_counter(), time.process_time()
            done = index.build(base, force=True)
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
            print(f"index: {args.records} records ({done['rows']} rows) in {took:.1f} s "
                  f"({args.records / took:,.0f} records/s; CPU {cpu:.1f} s)")
            t0 = time.perf_counter()
            _, res = index.query(base, "SELECT count(DISTINCT position), min(position) FILTER (WHERE isnan(mean)) "
                                       "FROM records")
            assert res[0][0] == args.records, res
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"sql over the index: records and first NaN in {time.perf_counter() - t0:.2f} s (position "
                  f"{res[0][1]}); peak RSS of this process {rss:.0f} MiB")
        return 0 if elapsed < 30 else 1
    finally:
        if not args.keep:
            shutil.rmtree(base if not args.dir else rank_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
