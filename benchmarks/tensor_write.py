"""Tensor-task write throughput against dd on the same disk.

    python benchmarks/tensor_write.py [--mib 1024] [--dir DIR]

Writes --mib MiB of 4 MiB float32 tensors the way the tensor task does (staged as .pt bytes on
the calling thread, written by the background thread with O_DIRECT where the file system takes
it, atomic rename, bounded pending memory), then os.sync(); and the same amount with
`dd bs=4M conv=fsync`. Prints both rates and their ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ours(directory: str, mib: int) -> float:
    import torch

    from msprobe_inject.pytorch import encode, ptfile
    from msprobe_inject.writer import DumpWriter

    w = DumpWriter(encode.resolve, encode.save_pt, pending_bytes=256 << 20)
    w.open_step(directory, {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None}, "dump")
    tensors = [torch.randn(1 << 20) for _ in range(8)]  # 4 MiB each
    os.sync()
    t0 = time.perf_counter()
    for i in range(mib // 4):
        staged = ptfile.stage(tensors[i % 8])
        w.save_tensor(os.path.join(directory, f"t{i}.pt"), staged, staged.nbytes)
    w.close()
    os.sync()
    return mib / (time.perf_counter() - t0)


def dd(directory: str, mib: int) -> float:
    out = subprocess.run(["dd", "if=/dev/zero", f"of={os.path.join(directory, 'dd.bin')}", "bs=4M",
                          f"count={mib // 4}", "conv=fsync"], capture_output=True, text=True).stderr
    secs = float(re.search(r"copied, ([0-9.]+) s", out).group(1))
    return mib / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    base = tempfile.mkdtemp(dir=a.dir, prefix="msprobe_write_")
    try:
        rates_dd, rates_ours = [], []
        for _ in range(3):
            d1, d2 = os.path.join(base, "dd"), os.path.join(base, "ours")
            os.makedirs(d1)
            rates_dd.append(dd(d1, a.mib))
            shutil.rmtree(d1)
            rates_ours.append(ours(d2, a.mib))
            shutil.rmtree(d2)
        r_dd, r_ours = sorted(rates_dd)[1], sorted(rates_ours)[1]
        print(f"dd (bs=4M, fsync): {r_dd:.0f} MiB/s; tensor task writer (+ sync): {r_ours:.0f} MiB/s; "
              f"ratio {r_ours / r_dd:.2f} (medians of 3, {a.mib} MiB each)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
