"""The statistics read of a tensor just written, as a step's tensors are: by torch's intra-op threads (an elementwise
op from torch's 32,768-element grain up splits over them, so its output lies half in each core's cache) or by one
thread (numpy's multiply: in the calling core's cache, as much of it as fits). Each written buffer is read once by
``_fastats.f32_mean``, by the calling thread alone ("one") or shared with torch's OpenMP team ("shared"; the same
bits), in one interleaved run; torch's own sum of the freshly written buffer for scale.

    python benchmarks/fresh_read.py [--rounds 200] [--sizes 32769,49152,65536,98304,131072,262144,1048576]

Prints the median µs per read of each way and the ratio shared / one, for each writer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import torch

from msprobe_inject.pytorch import encode

SIZES = "32769,49152,65536,98304,131072,262144,1048576"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--sizes", default=SIZES)
    a = ap.parse_args()
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        raise SystemExit("the one-read mean is not in use here (no kernel, or torch's mean not reproduced)")
    if not encode._share_reads():
        raise SystemExit("no OpenMP team to share a read with here")
    f32_mean, threads, lanes = encode._fast_f32_mean, torch.get_num_threads(), encode._tmean_lanes
    pc = time.perf_counter
    print(f"torch threads {threads}; µs per read of a buffer just written, median of {a.rounds} rounds")
    print(f"{'elements':>10}{'writer':>8}{'one':>8}{'shared':>8}{'ratio':>7}{'torch sum':>11}")
    for n in (int(s) for s in a.sizes.split(",")):
        x, y = torch.randn(n), torch.empty(n)
        xn, yn, p = x.numpy(), y.numpy(), y.data_ptr()
        writers = {"torch": partial(torch.mul, x, 1.0001, out=y), "one": partial(np.multiply, xn, 1.0001, out=yn)}
        for wname, write in writers.items():
            times: dict = {"one": [], "shared": [], "sum": []}
            for i in range(a.rounds):
                order = ("one", "shared", "sum") if i % 2 else ("sum", "shared", "one")
                for way in order:
                    write()
                    t0 = pc()
                    if way == "sum":
                        y.sum()
                    else:
                        f32_mean(p, n, lanes, threads, False, threads if way == "shared" else 1)
                    times[way].append(pc() - t0)
            m = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            print(f"{n:>10}{wname:>8}{m['one']:>8.1f}{m['shared']:>8.1f}{m['shared'] / m['one']:>7.2f}"
                  f"{m['sum'] if wname == 'torch' else float('nan'):>11.1f}")


if __name__ == "__main__":
    main()
