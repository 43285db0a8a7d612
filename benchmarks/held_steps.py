"""The flight recorder's held steps on the GPT-2 step of ``overhead.py``: a step held outside any window kept as its
spill journal alone ("journal": the code now; the training thread sends the writer only the records its triggers look
at) or also as encoded records in the writer thread's memory ("memory": the code before, and the code where no spill
directory can be made). One process per configuration, the two ways on alternate steps (ABBA), so both see the same
machine, memory and model. Nothing triggers: every step is held.

    python benchmarks/held_steps.py [--steps 40] [--warmup 4] [--only "L0 flight;monitor flight"]

Prints per configuration and way the median step time and the writer thread's CPU time per step ("writer", ms, from the
kernel's per-thread accounting), and the ratios journal / memory.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def _thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[0]) / 1e9


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject import writer

    debugger = debugger_for(name, tmp)
    w = debugger.runtime.writer
    if w.flight is None:
        raise SystemExit(f"{name} is not a flight-recorder configuration")
    way = ["journal"]

    def open_step(directory: str, header: dict, kind: str = "dump") -> None:
        # DumpWriter.open_step, the step held in its journal or not by the way
        w._ensure_thread()
        w._dir = directory
        w._root = header.get("_root")
        with w._blk:
            w._end_journal()
            w._jf = w._open_journal(directory, header, kind)
            w._held = way[0] == "journal" and w._jf is not None and not w.flight.in_window(header.get("_step"))
            w.send(writer.Open(directory, header, kind, w._jf, w._held))

    w.open_step = open_step
    cpu = [0.0]
    model, opt, ids = gpt2()

    def one_step() -> None:
        # the writer's CPU from this step's start to the next's: it may still be handling a step's events as the next
        # begins, which then counts them (the ways alternate in pairs, so each way's median is its own)
        thread = w._thread
        before = _thread_cpu_s(thread.native_id) if thread is not None else None
        train_step(model, opt, ids, debugger)
        after = _thread_cpu_s(w._thread.native_id)
        cpu[0] = after - before if before is not None and w._thread is thread else 0.0

    def set_way(x: str) -> None:
        way[0] = x

    got = alternate(("memory", "journal"), set_way, one_step, {"writer": cpu}, steps, warmup)
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L0 flight;monitor flight")
    if got is None:
        return
    a, results = got
    report(results, ("memory", "journal"), (("step", ".1f"), ("writer", ".2f")), ("step", "writer"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
