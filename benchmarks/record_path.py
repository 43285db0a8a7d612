"""The C record path of large tensors, on the GPT-2 step of ``overhead.py``: one process, the encoder as it is ("c":
a CPU float32 tensor of any size encoded in the one C call of its value's entries, looked up in and added to the
statistics cache there, and no cache for records without inputs) and as it was before ("python": every tensor above
4,096 elements, and every parameter and gradient, encoded by the Python encoder, always through the cache) on
alternate steps (ABBA), so both see the same machine, memory and model.

    python benchmarks/record_path.py [--steps 48] [--warmup 4] [--only "L0;L0 flight;monitor;L1;mix"]

Prints per configuration the median step time and the time inside the tool (its module, backward and gradient
hooks, start, stop and step; not L1's and mix's API handler, whose time holds the API's own), in ms per step, each
way, and the ratios c / python.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject.pytorch import modules

    tool = [0.0]
    hooks = modules.ModuleHooks
    for m in ("_pre", "_post", "_post_nokw"):  # bound when the debugger installs them: wrapped before
        setattr(hooks, m, timed(getattr(hooks, m), tool))
    make = hooks._param_grad_hook  # the factory of the per-parameter hooks
    hooks._param_grad_hook = lambda self, *a: timed(make(self, *a), tool)
    for m in ("_bw_pre_body", "_bw_hook_body"):  # a module call's backward hooks are partials of these, bound at init
        setattr(hooks, m, timed(getattr(hooks, m), tool))
    debugger = debugger_for(name, tmp)
    for m in ("start", "stop", "step"):
        setattr(debugger, m, timed(getattr(debugger, m), tool))
    enc = debugger.runtime.encoder
    if not enc._large:
        raise SystemExit(f"{name}: the C call does not take large tensors here (no kernel, or torch's mean differs)")
    configured = enc.use_cache

    def set_way(way: str) -> None:
        c = way == "c"
        enc.use_cache, enc._large = configured if c else True, c
        enc.bind()
        if c:
            enc.__dict__.pop("tensor", None)
        else:
            enc.tensor = enc._tensor_entry

    model, opt, ids = gpt2()
    return alternate(("c", "python"), set_way, lambda: train_step(model, opt, ids, debugger), {"tool": tool}, steps,
                     warmup)


def main() -> None:
    got = cli(__file__, __doc__, run, 48, "L0;L0 flight;monitor;L1;mix")
    if got is None:
        return
    a, results = got
    print(f"{'configuration':<16}{'':>7}{'step':>9}{'tool':>9}   ms per step, median of {a.steps // 2} each way")
    for name, r in results:
        for w in ("python", "c"):
            print(f"{name if w == 'python' else '':<16}{w:>7}{r[w]['step']:>9.1f}{r[w]['tool']:>9.2f}")
        print(f"{'':<16}{'ratio':>7}{r['c']['step'] / r['python']['step']:>9.3f}"
              f"{r['c']['tool'] / r['python']['tool']:>9.3f}")


if __name__ == "__main__":
    main()
