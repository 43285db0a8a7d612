"""The writer thread's timed drain, on the GPT-2 step of ``overhead.py``: every 50 ms it took whatever the training
thread had buffered ("always", the code before); it now takes a buffer only when something in it needs the writer
before the batch fills or stop() pushes it ("wanted": ``writer._drain_wanted``; records alone wait, their journal
written already). One process per configuration, the two ways on alternate steps (ABBA), so both see the same
machine, memory and model; at each switch the writer thread is woken so that its next wait is the new way's.

    python benchmarks/writer_drain.py [--steps 100] [--warmup 4] [--only "monitor;L0;L0 flight"]

Prints per configuration and way the median step time, the time in ``stop()`` and ``step()`` (where the training
thread waits for the writer, which now handles there what it did not take before), and the ratios wanted / always.
A flight recorder takes every buffer either way (its triggers watch the records): its ratio is the machine's spread.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject import writer

    wanted = writer._drain_wanted
    debugger = debugger_for(name, tmp)
    w = debugger.runtime.writer
    waited = [0.0]
    debugger.stop = timed(debugger.stop, waited)
    debugger.step = timed(debugger.step, waited)
    ways = {"always": lambda buf: True, "wanted": wanted}

    def set_way(way: str) -> None:
        writer._drain_wanted = ways[way]
        w._q.put([])  # an empty batch ends the writer's wait: its next drain is this way's

    model, opt, ids = gpt2()
    try:
        return alternate(("always", "wanted"), set_way, lambda: train_step(model, opt, ids, debugger),
                         {"in stop": waited}, steps, warmup)
    finally:
        writer._drain_wanted = wanted


def main() -> None:
    got = cli(__file__, __doc__, run, 100, "monitor;L0;L0 flight")
    if got is None:
        return
    a, results = got
    report(results, ("always", "wanted"), (("step", ".1f"), ("in stop", ".2f")), ("step", "in stop"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
