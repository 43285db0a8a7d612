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

    python benchmarks/writer_cpu.py [--steps 40] [--warmup 4] [--only "L1;mix"]

Run it with ``PYTHONPATH`` naming another checkout to measure that checkout's tool.
"""

from __future__ import annotations

import collections
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402

SMALL = 4096  # elements: the statistics' small-tensor path, and calls that stay on one thread


def time_handlers(w) -> tuple:
    """(cpu, count): from now on, the writer thread's CPU time (seconds) and number of events by event kind (and
    the statistics resolver's, as "statistics read"), its handlers timed on its own clock; the runs of whole records,
    stacks and places the writer hands to one C call, as "runs in one call" (the events taken)."""
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
    real_run = getattr(w, "_events_run", None)
    if real_run is not None:  # runs of records, stacks and places go to one C call, not to their handlers
        def run(batch, i):
            t0 = time.thread_time()
            try:
                j = real_run(batch, i)
            finally:
                cpu["runs in one call"] += time.thread_time() - t0
            count["runs in one call"] += j - i
            return j

        w._events_run = run
    return cpu, count


def writer_time(name: str, steps: int, tmp: str) -> dict:
    """ms per step, events per step and µs per event of each event kind the writer thread handled."""
    debugger = debugger_for(name, tmp)
    w = debugger.runtime.writer
    cpu, count = time_handlers(w)
    model, opt, ids = gpt2()
    for _ in range(3):
        train_step(model, opt, ids, debugger)
    cpu.clear()
    count.clear()
    for _ in range(steps):
        train_step(model, opt, ids, debugger)
    return {k: (v / steps * 1e3, count[k] / steps, v / max(1, count[k]) * 1e6) for k, v in cpu.most_common()}


def optimizer_calls(name: str, steps: int, warmup: int, tmp: str) -> dict:
    """Median ms per step in the optimizer's phase and its torch calls, by size, with the tool and without it, and
    how many calls of each size a step makes."""
    import torch
    from torch.overrides import TorchFunctionMode

    debugger = debugger_for(name, tmp)
    model, opt, ids = gpt2()
    slots = {"optimizer phase": [0.0], "small": [0.0], "large": [0.0]}
    calls = {"small": 0, "large": 0}
    on = [False]

    class Timing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not on[0]:
                return func(*args, **(kwargs or {}))
            t0 = time.perf_counter()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                first = args[0] if args and isinstance(args[0], torch.Tensor) else None
                size = "small" if first is None or first.numel() <= SMALL else "large"
                slots[size][0] += time.perf_counter() - t0
                calls[size] += 1

    Timing().__enter__()  # below the tool's mode, which is pushed at each start(): it times what the tool calls
    way = ["tool"]

    def set_way(w: str) -> None:
        way[0] = w

    def step() -> None:
        dbg = debugger if way[0] == "tool" else None
        if dbg is not None:
            dbg.start(model=model)
        model(input_ids=ids, labels=ids).loss.backward()
        calls.update(small=0, large=0)
        on[0] = True
        t0 = time.perf_counter()
        opt.step()
        slots["optimizer phase"][0] += time.perf_counter() - t0
        on[0] = False
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()

    got = alternate(("no tool", "tool"), set_way, step, slots, steps, warmup)
    return {"ways": got, "calls": dict(calls)}


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    return {"writer": writer_time(name, steps, tmp), "optimizer": optimizer_calls(name, steps, warmup, tmp)}


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L1;mix;L0 flight;monitor")
    if got is None:
        return
    a, results = got
    for name, r in results:
        wt, oc = r["writer"], r["optimizer"]
        print(f"{name}: the writer thread's CPU, {sum(v[0] for v in wt.values()):.2f} ms per step")
        for k, (ms, n, us) in wt.items():
            print(f"  {k:<16}{ms:>8.2f} ms/step{n:>9.1f} events/step{us:>9.1f} us/event")
        print(f"{name}: the optimizer's torch calls (ms per step, medians of {a.steps // 2} steps per way)")
        for way, d in oc["ways"].items():
            print(f"  {way:<8} phase {d['optimizer phase']:6.2f}   calls on <= {SMALL} elements {d['small']:5.2f} "
                  f"({oc['calls']['small']})   larger {d['large']:5.2f} ({oc['calls']['large']})")

if __name__ == "__main__":
    main()
