"""What the writer thread costs the training thread, on the GPT-2 step of ``overhead.py``, in one process per
configuration.

The writer thread handles every event under the GIL: while it holds it, the training thread waits, at its next
Python line or when a torch call it released the GIL for returns. So its CPU time is the measure of what it takes
from training. Two figures:

- the writer thread's CPU time per step (``time.thread_time`` around each event handler and the statistics
  resolver), by event kind: ms per step, events per step, µs per event;
- the torch calls of the optimizer's step (AdamW's loop over the parameters, most of L1's records), timed one by
  one from below the tool (a ``TorchFunctionMode`` under the tool's), by the size of their first tensor, with the
  tool and without it on alternate steps (A B B A): a call on a small tensor runs in a few microseconds with the
  GIL released, and returns to find the writer holding it.

    python benchmarks/writer_cpu.py [--steps 10] [--only "L1;mix"]

Run it with ``PYTHONPATH`` naming another checkout to measure that checkout's tool.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import debugger_for  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402

SMALL = 4096  # elements: the statistics' small-tensor path, and calls that stay on one thread


def writer_time(name: str, steps: int, tmp: str) -> dict:
    """ms per step, events per step and µs per event of each event kind the writer thread handled."""
    debugger = debugger_for(name, tmp)
    w = debugger.runtime.writer
    cpu: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()

    def timed(handler, kind):
        def run(ev):
            t0 = time.thread_time()
            try:
                return handler(ev)
            finally:
                cpu[kind] += time.thread_time() - t0
                count[kind] += 1
        return run

    for t, handler in list(w._handlers.items()):
        w._handlers[t] = timed(handler, t.__name__)
    w._resolver = timed(w._resolver, "statistics read")
    model, opt, ids = gpt2()
    for _ in range(3):
        train_step(model, opt, ids, debugger)
    cpu.clear()
    count.clear()
    for _ in range(steps):
        train_step(model, opt, ids, debugger)
    return {k: (v / steps * 1e3, count[k] / steps, v / max(1, count[k]) * 1e6) for k, v in cpu.most_common()}


def optimizer_calls(name: str, steps: int, tmp: str) -> dict:
    """Median ms per step in the optimizer's torch calls, by size, with the tool and without it."""
    import torch
    from torch.overrides import TorchFunctionMode

    debugger = debugger_for(name, tmp)
    model, opt, ids = gpt2()
    acc: collections.Counter = collections.Counter()
    on = [False]

    class Timing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not on[0]:
                return func(*args, **(kwargs or {}))
            t0 = time.perf_counter()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                dt = time.perf_counter() - t0
                first = args[0] if args and isinstance(args[0], torch.Tensor) else None
                acc["small" if first is None or first.numel() <= SMALL else "large"] += dt
                acc["n small" if first is None or first.numel() <= SMALL else "n large"] += 1

    Timing().__enter__()  # below the tool's mode, which is pushed at each start(): it times what the tool calls
    got: dict = {w: collections.defaultdict(list) for w in ("no tool", "tool")}
    for i in range(4 + 4 * steps):
        way = ("tool", "no tool", "no tool", "tool")[i % 4]
        dbg = debugger if way == "tool" else None
        if dbg is not None:
            dbg.start(model=model)
        model(input_ids=ids, labels=ids).loss.backward()
        acc.clear()
        on[0] = True
        t0 = time.perf_counter()
        opt.step()
        phase = time.perf_counter() - t0
        on[0] = False
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        if i >= 4:
            got[way]["optimizer phase"].append(phase)
            for k in ("small", "large", "n small", "n large"):
                got[way][k].append(acc[k])
    return {w: {k: statistics.median(v) for k, v in d.items()} for w, d in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="L1;mix;L0 flight;monitor")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        with tempfile.TemporaryDirectory() as tmp:
            wt = writer_time(a.worker, a.steps, tmp)
        with tempfile.TemporaryDirectory() as tmp:
            oc = optimizer_calls(a.worker, a.steps, tmp)
        total = sum(v[0] for v in wt.values())
        print(f"{a.worker}: the writer thread's CPU, {total:.2f} ms per step")
        for k, (ms, n, us) in wt.items():
            print(f"  {k:<16}{ms:>8.2f} ms/step{n:>9.1f} events/step{us:>9.1f} us/event")
        print(f"{a.worker}: the optimizer's torch calls (ms per step, medians of {a.steps * 2} steps per way)")
        for way, d in oc.items():
            print(f"  {way:<8} phase {d['optimizer phase'] * 1e3:6.2f}   calls on <= {SMALL} elements "
                  f"{d['small'] * 1e3:5.2f} ({d['n small']:.0f})   larger {d['large'] * 1e3:5.2f} ({d['n large']:.0f})")
        return
    for name in [x.strip() for x in a.only.split(";") if x.strip()]:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--steps", str(a.steps)],
                             capture_output=True, text=True, timeout=1800)
        sys.stdout.write(out.stdout)
        if out.returncode:
            sys.stdout.write(out.stderr[-2000:])


if __name__ == "__main__":
    main()
