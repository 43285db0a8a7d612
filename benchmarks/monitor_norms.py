"""The monitor preset's statistics, on the GPT-2 step of ``overhead.py``: each module output's and parameter
gradient's Norm alone ("norms": the C call's norm mode, one pass of lane sums of squares) against all four figures
("full": the kernel's max, min and sum of squares with torch's mean in the same read, as level L0 reads them). One
process per configuration, the two ways on alternate steps (ABBA), switched on the encoder.

    python benchmarks/monitor_norms.py [--steps 40] [--warmup 4] [--only "monitor"]

Prints per configuration and way the median step time and the time in the encoder's value and tensor calls
(ms per step), and the ratios norms / full.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject.pytorch import encode

    debugger = debugger_for(name, tmp)
    enc = debugger.runtime.encoder
    if not enc.norm_only:
        raise SystemExit(f"{name}: its entries are not the norms alone")
    spent = [0.0]
    for meth in ("encode", "tensor"):
        setattr(enc, meth, timed(getattr(enc, meth), spent))
    modes = {"full": (False, encode._ENTRY_MODES["statistics"]), "norms": (True, encode._NORM_MODE)}

    def set_way(way: str) -> None:
        enc.norm_only, enc._entry_mode = modes[way]
        enc.bind()

    model, opt, ids = gpt2()
    got = alternate(("full", "norms"), set_way, lambda: train_step(model, opt, ids, debugger),
                    {"statistics": spent}, steps, warmup)
    set_way("norms")
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "monitor")
    if got is None:
        return
    a, results = got
    report(results, ("full", "norms"), (("step", ".1f"), ("statistics", ".2f")), ("step", "statistics"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
