"""The C statistics kernel of this checkout against that of ``--baseline DIR`` (a ``git worktree`` of another commit,
its extensions built), on the GPT-2 step of ``overhead.py``: the encoder's C entries call (``_fastats.entries``: every
module output and parameter gradient of the monitor preset, most tensors of the other levels) taken from one or the
other on alternate steps (ABBA), one process per configuration, so both see the same machine, memory and model. The
baseline's extension is set up as the encoder sets up its own (its OpenMP team included). Tensors the encoder reads
from Python (through ``_f32_kernel``) use this checkout's kernel either way.

    python benchmarks/stats_kernel.py --baseline DIR [--steps 40] [--warmup 4] [--only "monitor;L0 flight;L1"]

Prints per configuration and way the median step time and the time in the C entries call (ms per step), the
ratios now / baseline, and the megabytes of tensors handed to the entries call in one more step (counted, not timed),
with the rate the entries call reached on them (GB/s: megabytes / time in the call, small tensors and cached ones
included).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from cache_key import _baseline_module  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str, baseline: str) -> dict:
    debugger = debugger_for(name, tmp)
    enc = debugger.runtime.encoder
    if enc._entries is None:
        raise SystemExit(f"{name}: the C entries call is not used in this configuration")
    base = _baseline_module(baseline)
    spent = [0.0]
    ways = {"now": timed(enc._entries, spent), "base": timed(base.entries, spent)}

    def set_way(way: str) -> None:
        enc._entries = ways[way]

    model, opt, ids = gpt2()
    got = alternate(("base", "now"), set_way, lambda: train_step(model, opt, ids, debugger), {"entries": spent},
                    steps, warmup)
    handed = [0]

    def counting(ctx, value, *rest):  # called as the encoder calls it: entries(ctx, value, pending)
        handed[0] += _bytes(value)
        return ways["now"](ctx, value, *rest)

    enc._entries = counting
    train_step(model, opt, ids, debugger)
    for w in got:
        got[w]["MB"] = handed[0] / 1e6
        got[w]["GB/s"] = handed[0] / 1e6 / got[w]["entries"] if got[w]["entries"] else 0.0
    return got


def _bytes(value) -> int:
    import torch

    from msprobe_inject.values import tensor_paths

    return sum(t.numel() * t.element_size() for t, _ in tensor_paths(value, torch.Tensor, []))


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "monitor;L0 flight;L1",
              (("baseline", "a worktree of the commit before, its C extensions built"),))
    if got is None:
        return
    a, results = got
    report(results, ("base", "now"), (("step", ".1f"), ("entries", ".2f"), ("MB", ".1f"), ("GB/s", ".1f")),
           ("step", "entries"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
