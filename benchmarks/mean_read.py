"""The statistics of one contiguous CPU float32 tensor: the kernel's figures and torch.mean in two reads (the kernel,
then the mean: below torch's grain the C mean, from it up torch.mean as torch runs it, on its intra-op threads)
against one read (``_fastats.f32_mean``, the same bits) by the calling thread alone and shared with torch's
threads (above 32,768 elements, where torch's threads are an OpenMP team), for the statistics and the md5 modes,
from one interleaved run.

    python benchmarks/mean_read.py [--rounds 30] [--reps 10] [--threads N]

Prints the median µs per tensor of each way, and the ratios one read alone / two reads and shared / alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from msprobe_inject import _fastats
from msprobe_inject.pytorch import encode

SIZES = (4_096, 40_000, 262_144, 1_048_576, 4_194_304)


def _ways(x: torch.Tensor, lanes: int, k: int) -> dict:
    p, n = x.data_ptr(), x.numel()
    # two reads as before f32_mean: below the grain the C mean (_fastats.tmean), from it up torch.mean
    mean = (lambda: _fastats.tmean(p, n, lanes)) if n < encode._TMEAN_BELOW else (lambda: x.mean().item())
    return {
        "two": lambda: (_fastats.f32(p, n), mean()),
        "one": lambda: _fastats.f32_mean(p, n, lanes, k, False, 1),
        "shared": lambda: _fastats.f32_mean(p, n, lanes, k, False, k),
        "two md5": lambda: (_fastats.f32_crc(p, n), mean()),
        "one md5": lambda: _fastats.f32_mean(p, n, lanes, k, True, 1),
        "shared md5": lambda: _fastats.f32_mean(p, n, lanes, k, True, k),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (default: as torch starts)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if not encode.use_torch_mean() or not encode._mean_fused:
        raise SystemExit("the one-read mean is not in use here (no kernel, or torch's mean not reproduced)")
    threads, lanes = torch.get_num_threads(), encode._tmean_lanes
    print(f"torch threads {threads}, float lanes {lanes}; µs per tensor, median of {a.rounds} rounds")
    print(f"torch's threads share the read: {encode._share_reads()}")
    print(f"{'elements':>10}{'two reads':>11}{'one read':>10}{'ratio':>7}{'shared':>8}{'ratio':>7}"
          f"{'md5: two':>10}{'one':>8}{'ratio':>7}{'shared':>8}{'ratio':>7}")
    for n in SIZES:
        x = torch.randn(n)
        ways = _ways(x, lanes, threads if n >= encode._TMEAN_BELOW else 1)
        times: dict = {w: [] for w in ways}
        for _ in range(a.rounds):
            for w, f in ways.items():
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    f()
                times[w].append((time.perf_counter() - t0) / a.reps * 1e6)
        m = {w: statistics.median(v) for w, v in times.items()}
        print(f"{n:>10}{m['two']:>11.1f}{m['one']:>10.1f}{m['one'] / m['two']:>7.2f}"
              f"{m['shared']:>8.1f}{m['shared'] / m['one']:>7.2f}"
              f"{m['two md5']:>10.1f}{m['one md5']:>8.1f}{m['one md5'] / m['two md5']:>7.2f}"
              f"{m['shared md5']:>8.1f}{m['shared md5'] / m['one md5']:>7.2f}")


if __name__ == "__main__":
    main()
