"""The monitor preset's memo of the Norms read, on the GPT-2 step of ``overhead.py``: a tensor recorded again where
nested modules return the same one (a transformer block's MLP and attention, the model's last hidden state) taken
from the memo ("memo") against read again ("read"). One process per configuration, the two ways on alternate steps
(ABBA), switched on the encoder (the memo is emptied at each switch).

    python benchmarks/norm_memo.py [--steps 40] [--warmup 4] [--only "monitor"]

Prints per configuration and way the median step time and the time in the encoder's value and tensor calls (ms per
step), and the ratios memo / read; for the memo, the tensors it found per step.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    debugger = debugger_for(name, tmp)
    enc = debugger.runtime.encoder
    if not enc._norm_memo:
        raise SystemExit(f"{name}: no memo of the Norms (not the monitor preset, or stat_cache off)")
    spent = [0.0]
    for meth in ("encode", "tensor"):
        setattr(enc, meth, timed(getattr(enc, meth), spent))
    hits = [0.0]  # the tensors the memo found per step (the cache's hits, which only the memo counts here)
    cache = enc.cache

    def set_way(way: str) -> None:
        enc._norm_memo = way == "memo"
        enc.bind()
        cache.clear()

    def step() -> None:
        before = cache.hits
        train_step(model, opt, ids, debugger)
        hits[0] = (cache.hits - before) / 1e3  # alternate() reports its slots' medians times 1,000 (seconds as ms)

    model, opt, ids = gpt2()
    got = alternate(("read", "memo"), set_way, step, {"statistics": spent, "found": hits}, steps,
                    warmup)
    set_way("memo")
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "monitor")
    if got is None:
        return
    a, results = got
    report(results, ("read", "memo"), (("step", ".1f"), ("statistics", ".2f"), ("found", ".0f")),
           ("step", "statistics"), f"medians of {a.steps // 2} steps each way")


if __name__ == "__main__":
    main()
