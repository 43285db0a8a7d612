"""The statistics cache's key, on the GPT-2 step of ``overhead.py``: a contiguous tensor keyed by its element count
("count": the code now, so that a view, reshape or flatten of a tensor already read is found) or by its shape and
strides ("shape": the code before, whose C extension ``--baseline DIR`` holds: a ``git worktree`` of that commit with
its extensions built). One process per configuration, the two ways on alternate steps (ABBA), so both see the same
machine, memory and model. The baseline's extension is set up as the encoder sets up its own (the OpenMP team it
shares reads with included: without it the baseline read alone and looked slower than it is).

    python benchmarks/cache_key.py --baseline DIR [--steps 40] [--warmup 4] [--only "L1;mix"]

Prints per configuration and way the median step time and the time in the encoder's value and tensor calls (ms per
step), the megabytes the statistics read per step (each tensor the cache did not find), and the ratios count / shape.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def _shape_key(self, t):
    try:
        return (t.data_ptr(), t.dtype, t.shape, t.stride(), t._version, t.device)
    except Exception:
        return None


def _baseline_module(baseline: str):
    """The baseline's _fastats, loaded beside ours under another package name and set up as encode.py sets up ours."""
    from msprobe_inject.pytorch import encode as E

    found = glob.glob(os.path.join(baseline, "msprobe_inject", "_fastats*.so"))
    if not found:
        raise SystemExit(f"no built _fastats in {baseline}/msprobe_inject (python setup.py build_ext --inplace)")
    spec = importlib.util.spec_from_file_location("baseline._fastats", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not E.use_fast_entries():
        raise SystemExit("the C entries call is not used here")
    mod.entries_setup(E._TENSOR, E._PARAM, E._F32, E._STRIDED, E._tmean_lanes, E._CHEAP_UPTO)
    mod.cache_setup(E.READY, E._STORAGE_REFS)
    ours, E._fast_use_omp = E._fast_use_omp, mod.use_omp
    try:
        E._share_reads()
    finally:
        E._fast_use_omp = ours
    return mod


def run(name: str, steps: int, warmup: int, tmp: str, baseline: str) -> dict:
    from msprobe_inject.pytorch import encode

    debugger = debugger_for(name, tmp)
    enc = debugger.runtime.encoder
    if not enc.use_cache:
        raise SystemExit(f"{name}: no statistics cache in this configuration")
    base = _baseline_module(baseline)
    spent = [0.0]
    ways = {"count": (timed(enc._entries, spent), encode.StatCache.key),
            "shape": (timed(base.entries, spent), _shape_key)}
    enc._tensor = timed(enc._tensor, spent)
    read: dict = {w: [] for w in ways}
    now = ["count"]

    def set_way(way: str) -> None:
        if enc.cache.bytes_reduced:  # the step just run's
            read[now[0]].append(enc.cache.bytes_reduced / 1e6)
        enc.cache.bytes_reduced = 0
        now[0] = way
        enc._entries, encode.StatCache.key = ways[way]

    model, opt, ids = gpt2()
    got = alternate(("count", "shape"), set_way, lambda: train_step(model, opt, ids, debugger), {"encoder": spent},
                    steps, warmup)
    set_way("count")
    for w in ways:
        mb = sorted(read[w][warmup // 2:])
        got[w]["MB read"] = mb[len(mb) // 2]
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L1;mix",
              (("baseline", "a worktree of the commit before, its C extensions built"),))
    if got is None:
        return
    a, results = got
    report(results, ("shape", "count"), (("step", ".1f"), ("encoder", ".2f"), ("MB read", ".1f")),
           ("step", "encoder", "MB read"), f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
