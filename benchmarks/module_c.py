"""A module call at the monitor preset recorded by its C common case ("c": ``_apicall.module_pre`` and
``module_post``, the code now) or by the Python hooks and recorder bodies ("python": ``modules._fast_pre`` and
``_fast_post`` None, the code before), on the GPT-2 step of ``overhead.py``. One process per configuration, the two
ways on alternate steps (ABBA), so both see the same machine, memory and model. The parameter gradients' hooks keep
the function they were made with (the C's) in both ways.

    python benchmarks/module_c.py [--steps 60] [--warmup 4] [--only "monitor"]

Prints per configuration and way the median step time (ms), and the ratio c / python.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject.pytorch import modules

    if modules._fast_pre is None:
        raise SystemExit("msprobe_inject.pytorch._apicall is not built (python setup.py build_ext --inplace)")
    debugger = debugger_for(name, tmp)
    ways = {"c": (modules._fast_pre, modules._fast_post), "python": (None, None)}

    def set_way(way: str) -> None:
        modules._fast_pre, modules._fast_post = ways[way]

    model, opt, ids = gpt2()
    got = alternate(("c", "python"), set_way, lambda: train_step(model, opt, ids, debugger), {}, steps, warmup)
    set_way("c")
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 60, "monitor")
    if got is None:
        return
    a, results = got
    report(results, ("python", "c"), (("step", ".1f"),), ("step",), f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
