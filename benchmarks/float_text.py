"""The record encoder's float texts, on the GPT-2 step of ``overhead.py``: the writer thread encoding each record with
this checkout's C encoder, which keeps the text of recent floats by their bits ("slots"), and with the encoder of
``--baseline DIR`` ("plain": a ``git worktree`` of the commit before, its extensions built), which formats every
float. One process per configuration, the two ways on alternate steps (ABBA). Both write the same text (checked at
start). The writer encodes under the GIL, so its time is taken from the training thread.

    python benchmarks/float_text.py --baseline DIR [--steps 40] [--warmup 4] [--only "L1;mix"]

Prints per configuration and way the median step time and the writer thread's CPU time in the encoder (ms per step),
and the ratios slots / plain.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, report, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def _baseline_encode(baseline: str):
    """encoding.encode as it is built over the baseline's _jenc, loaded beside ours under another package name."""
    found = glob.glob(os.path.join(baseline, "msprobe_inject", "dumpformat", "_jenc*.so"))
    if not found:
        raise SystemExit(f"no built _jenc in {baseline} (python setup.py build_ext --inplace)")
    spec = importlib.util.spec_from_file_location("baseline._jenc", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    std = json.JSONEncoder(check_circular=False).encode

    def encode(o, _one=mod.encode, _json=std):
        s = _one(o)
        return s if s is not None else _json(o)

    return encode


def run(name: str, steps: int, warmup: int, tmp: str, baseline: str) -> dict:
    import msprobe_inject.writer as W

    sample = {"output": [{"Max": 0.10000000149011612, "Min": -0.0, "Mean": 1e-05, "Norm": 5e-324, "shape": [2, 3]}]}
    plain = _baseline_encode(baseline)
    if plain(sample) != W.encode(sample) or plain(sample) != json.dumps(sample):
        raise SystemExit("the two encoders do not write the same text")
    spent = [0.0]
    ways = {"slots": timed(W.encode, spent, time.thread_time), "plain": timed(plain, spent, time.thread_time)}
    debugger = debugger_for(name, tmp)

    def set_way(way: str) -> None:
        W.encode = ways[way]  # the writer thread's handlers look it up per record

    model, opt, ids = gpt2()
    got = alternate(("plain", "slots"), set_way, lambda: train_step(model, opt, ids, debugger),
                    {"encode": spent}, steps, warmup)
    set_way("slots")
    return got


def main() -> None:
    got = cli(__file__, __doc__, run, 40, "L1;mix",
              (("baseline", "a worktree of the commit before, its C extensions built"),))
    if got is None:
        return
    a, results = got
    report(results, ("plain", "slots"), (("step", ".1f"), ("encode", ".2f")), ("step", "encode"),
           f"ms per step, median of {a.steps // 2} each way")


if __name__ == "__main__":
    main()
