"""The signature a recorded call's stack is looked up by, on the GPT-2 step of ``overhead.py``: taken in C ("c":
``msprobe_inject._stacksig``, the code now) or by the Python walk over the frames ("python": the code before, and
the code where the extension is not built). One process per configuration, the two ways on alternate steps (ABBA),
so both see the same machine, memory and model.

    python benchmarks/stack_sig.py [--steps 40] [--warmup 4] [--only "L0;L1;mix"]

Prints per configuration and way the median step time and the time in the writer's ``stack`` (ms per step), the
stacks recorded per step, and the ratios c / python.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject import writer

    if writer._stack_sig is None:
        raise SystemExit("msprobe_inject._stacksig is not built (python setup.py build_ext --inplace)")
    debugger = debugger_for(name, tmp)
    w = debugger.runtime.writer
    real = type(w).stack
    spent = [0.0]
    calls = [0]

    def stack(key: str, skip: int) -> None:  # the caller's frame is one further down than stack() is told
        t0 = time.perf_counter()
        real(w, key, skip + 1)
        spent[0] += time.perf_counter() - t0
        calls[0] += 1

    w.stack = stack
    ways = {"c": writer._stack_sig, "python": None}

    def set_way(way: str) -> None:
        writer._stack_sig = ways[way]
        w._tail = None

    model, opt, ids = gpt2()
    got = alternate(("c", "python"), set_way, lambda: train_step(model, opt, ids, debugger), {"stack": spent},
                    steps, warmup)
    set_way("c")
    for r in got.values():
        r["stacks"] = calls[0] / (steps + warmup)
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L0;L1;mix")
    if got is None:
        return
    a, results = got
    report(results, ("python", "c"), (("step", ".1f"), ("stack", ".2f"), ("stacks", ".0f")), ("step", "stack"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
