"""Large reads shared with torch's threads, on the GPT-2 step of ``overhead.py``: one process, the read shared and
not shared on alternate steps (ABBA), so both halves see the same machine, memory and model.

    python benchmarks/shared_read.py [--steps 24] [--warmup 4] [--only "L0;L0 flight;monitor"]

Prints per configuration the median step time, the time inside the recorder's module-record bodies and, within
it, in the statistics (``encode.stat_of``: large tensors take the Python encoder's path here), in ms per step, each
way, and the ratios shared / alone. Level-0 configurations for the hooks: the API records of L1 and mix are not
timed there (their statistics are).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import alternate, cli, debugger_for, timed  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    from msprobe_inject import _fastats, recorder
    from msprobe_inject.pytorch import encode

    debugger = debugger_for(name, tmp)
    # large tensors by the Python encoder, whose read is stat_of's alone: the C entries call makes the same read
    # (f32_mean's), but times it together with the rest of the entry
    debugger.runtime.encoder._large = False
    debugger.runtime.encoder.bind()
    if not (encode.use_torch_mean() and encode._share_reads()):
        raise SystemExit("reads are not shared here (no kernel, or torch's threads are not an OpenMP team)")
    slots = {"hooks": [0.0], "statistics": [0.0]}
    for method in ("module_enter", "module_exit", "module_backward", "param_grad"):  # the module records' bodies
        setattr(recorder.Recorder, method, timed(getattr(recorder.Recorder, method), slots["hooks"]))
    encode.stat_of = timed(encode.stat_of, slots["statistics"])
    model, opt, ids = gpt2()

    def set_way(way: str) -> None:
        if way == "shared":
            encode._share_reads()
        else:
            _fastats.use_omp(None)

    return alternate(("shared", "alone"), set_way, lambda: train_step(model, opt, ids, debugger), slots, steps,
                     warmup)


def main() -> None:
    got = cli(__file__, __doc__, run, 24, "L0;L0 flight;monitor")
    if got is None:
        return
    a, results = got
    print(f"{'configuration':<14}{'':>8}{'step':>9}{'hooks':>9}{'statistics':>12}   ms per step, median of {a.steps}")
    for name, r in results:
        for way in ("alone", "shared"):
            d = r[way]
            label = name if way == "alone" else ""
            print(f"{label:<14}{way:>8}{d['step']:>9.1f}{d['hooks']:>9.2f}{d['statistics']:>12.2f}")
        q = {k: f"{r['shared'][k] / r['alone'][k]:.3f}" if r["alone"][k] else "-"
             for k in ("step", "hooks", "statistics")}
        print(f"{'':<14}{'ratio':>8}{q['step']:>9}{q['hooks']:>9}{q['statistics']:>12}")


if __name__ == "__main__":
    main()
