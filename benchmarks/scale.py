"""Scale: per-step overhead and rank memory over many steps, and dump.json assembly from 100k records.

    python benchmarks/scale.py [--steps 200] [--level L1]

Prints the median step time of the first and last 20 steps (with the tool, statistics at the level), the
resident memory after step 10 and at the end, and the time to assemble a 100k-record dump.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def steps_run(n: int, dump: str, level: str = "L1") -> dict:
    import psutil
    import torch
    import torch.nn as nn

    from msprobe_inject.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=dump, level=level)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(6)], nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 256)
    proc = psutil.Process()
    times, rss = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        debugger.start(model=model)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        times.append(time.perf_counter() - t0)
        rss.append(proc.memory_info().rss)
    return {"first20_ms": statistics.median(times[:20]) * 1000, "last20_ms": statistics.median(times[-20:]) * 1000,
            "rss_step10_MB": rss[9] / 2**20, "rss_end_MB": rss[-1] / 2**20}


def assemble(n: int) -> float:
    from msprobe_inject.dumpformat.documents import StepRecords

    entry = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [8, 128, 256], "Max": 3.1, "Min": -2.9,
             "Mean": 0.001, "Norm": 512.3, "requires_grad": True}
    st = StepRecords({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}, "dump")
    for i in range(n):
        body = {"input_args": [dict(entry), dict(entry)], "input_kwargs": {}, "output": [dict(entry)]}
        st.set(f"Functional.linear.{i}.forward", json.dumps(body))
    t0 = time.perf_counter()
    data = st.main_bytes()
    took = time.perf_counter() - t0
    assert len(json.loads(data)["data"]) == n
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--level", default="L1", choices=["L0", "L1", "mix"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = steps_run(a.steps, os.path.join(tmp, "d"), a.level)
    r["assemble_100k_s"] = assemble(100_000)
    print(f"step time, first 20 steps: {r['first20_ms']:.1f} ms; last 20 of {a.steps}: {r['last20_ms']:.1f} ms "
          f"(ratio {r['last20_ms'] / r['first20_ms']:.2f})")
    print(f"rank memory after step 10: {r['rss_step10_MB']:.0f} MiB; after step {a.steps}: {r['rss_end_MB']:.0f} MiB")
    print(f"dump.json assembly from 100k records: {r['assemble_100k_s']:.2f} s")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
