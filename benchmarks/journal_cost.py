"""Training-thread cost of journaling each record as its call returns (the zero-loss crash record).

One process, one DumpWriter on a temporary directory, the same L1-sized record body sent again and again
(three tensor entries with their statistics ready, as for CPU float32), in alternating blocks: with the
step's journal open (marshal and a copy into the journal's file mapping in one C call, on the calling
thread) and with it closed (the event is only queued, as before the journal moved to the training thread).
Also: a record whose statistics are CPU tensors still to be read (bfloat16), and the stack of a call (walk,
lookup, journal).
Prints medians of µs per record over the blocks: the sending thread's CPU time (what the call costs the
training thread) and the wall time until the writer thread has handled it too (under the GIL the two
threads share one core's worth of Python).

    python benchmarks/journal_cost.py [--blocks 21] [--records 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _entry(**stats):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [8, 16], "Max": 1.2345678,
            "Min": -0.9876543, "Mean": 0.0123456, "Norm": 3.4567891, "requires_grad": True, **stats}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=21)
    ap.add_argument("--records", type=int, default=2000)
    a = ap.parse_args()
    import torch

    from msprobe_inject.pytorch.encode import resolve, resolve_host
    from msprobe_inject.writer import DumpWriter, Record

    tmp = tempfile.mkdtemp(prefix="journal-cost-")
    w = DumpWriter(resolve, lambda t, p: None, resolve_host=resolve_host)
    w.open_step(os.path.join(tmp, "step0", "rank0"), {"task": "statistics", "level": "L1", "framework": "pytorch",
                                                      "dump_data_dir": None, "_root": tmp})
    jf = w._jf
    low = torch.randn(8, 16).to(torch.bfloat16)
    mn, mx = torch.aminmax(low)

    def body():
        return {"input_args": [_entry(), _entry()], "input_kwargs": {}, "output": [_entry()]}

    def pending_record(i):
        e = _entry(Max=None, Min=None, Mean=None, Norm=None)
        return Record(f"Tensor.__mul__.{i}.forward", {"input_args": [e], "input_kwargs": {}, "output": [_entry()]},
                      [(e, (mx, mn, low.mean(), torch.linalg.vector_norm(low)), "f")])

    def block(journal: bool, kind: str) -> float:
        w._jf = jf if journal else None
        n = a.records
        if kind == "pending":
            evs = [pending_record(i) for i in range(n)]
        elif kind == "ready":
            evs = [Record(f"Functional.linear.{i}.forward", body(), None) for i in range(n)]
        w.flush()
        t0 = time.perf_counter()
        c0 = time.thread_time()
        if kind == "stack":
            for i in range(n):
                w.stack(f"Functional.linear.{i}.forward", 0)
        else:
            for ev in evs:
                w.send(ev)
        cpu = time.thread_time() - c0
        w.flush()  # the writer thread's share: under the GIL it is the training thread's time too
        wall = time.perf_counter() - t0
        return cpu / n * 1e6, wall / n * 1e6

    results = {}
    for kind in ("ready", "pending", "stack"):
        on, off = [], []
        for i in range(a.blocks):
            for journal in ((True, False) if i % 2 == 0 else (False, True)):
                (on if journal else off).append(block(journal, kind))
        results[kind] = [statistics.median(x[j] for x in side) for side in (off, on) for j in (0, 1)]
    w._jf = jf
    w.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print("µs per record: the sending thread's CPU time, and wall time until the writer thread has written it")
    print(f"{'record':<50} {'queued only':>18} {'journaled':>18} {'added (cpu)':>12}")
    labels = {"ready": "L1 record, 3 tensors, statistics ready (f32 CPU)",
              "pending": "L1 record, 1 bfloat16 tensor read on the host",
              "stack": "stack of the call (walk, lookup, journal)"}
    for kind, (off_cpu, off_wall, on_cpu, on_wall) in results.items():
        print(f"{labels[kind]:<50} {off_cpu:>7.2f} / {off_wall:>6.2f}   {on_cpu:>7.2f} / {on_wall:>6.2f}   "
              f"{on_cpu - off_cpu:>10.2f}")


if __name__ == "__main__":
    main()
