"""A tensor's entry from the encoder's C to the journal's frame and the record's JSON text, as a dict (the code
before dumpformat/_entry.h) and as C values, for the two cases of a large tensor: read (the statistics cache
misses) and found in the cache (the figures it keeps). Eight 50,000-element float32 tensors per value; the two ways
alternate within each round (one process), so both see the same machine.

    python benchmarks/entry_path.py [--rounds 7] [--iters 2000]

Prints µs per entry (median over the rounds) for each way and case, and the ratio C values / dict.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

from msprobe_inject.config import DumpConfig  # noqa: E402
from msprobe_inject.dumpformat import encoding, journal  # noqa: E402
from msprobe_inject.pytorch import encode  # noqa: E402

COMPACT = 16  # _fastats.entries: or'ed into a mode, entries of C values


class _Writer:
    def send(self, ev):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    enc = encode.Encoder(DumpConfig(dump_path="unused"), lambda: "unused", _Writer())
    if enc._entries is None or not enc._large or enc.cache is None:
        sys.exit("the encoder's C entries, large tensors and cache are not all on here")
    ts = [torch.randn(50_000) for _ in range(8)]
    fn, mode, threads, cache = enc._ctx
    ctx = {("C values", "cached"): (fn, mode | COMPACT, threads, cache), ("dict", "cached"): (fn, mode & ~COMPACT,
                                                                                          threads, cache),
           ("C values", "read"): (fn, mode | COMPACT, threads, None), ("dict", "read"): (fn, mode & ~COMPACT, threads,
                                                                                        None)}
    enc.encode(ts, [], None)  # read once: the cache holds them

    def run(c, n):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            out = enc._entries(c, ts, [])
            journal.frame(("set", "k", {"output": out}))
            encoding.encode({"output": out})
            del out
        return (time.perf_counter_ns() - t0) / n / len(ts) / 1000

    got = {k: [] for k in ctx}
    for _ in range(a.rounds):
        for k, c in ctx.items():
            got[k].append(run(c, a.iters if k[1] == "cached" else max(1, a.iters // 20)))
    for case in ("read", "cached"):
        d, c = got[("dict", case)], got[("C values", case)]
        ratio = statistics.median([x / y for x, y in zip(c, d)])
        print(f"{case:7s} dict {statistics.median(d):8.2f} us  C values {statistics.median(c):8.2f} us  "
              f"C values / dict {ratio:.3f}")


if __name__ == "__main__":
    main()
