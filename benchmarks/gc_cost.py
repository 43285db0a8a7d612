"""The garbage collector's share of the GPT-2 step of ``overhead.py``: each configuration in a process of its own,
``--steps`` steps after three unmeasured ones, every collection timed (``gc.callbacks``) by generation. Objects that
stay alive across a young collection (record bodies waiting for the writer thread, hooks waiting for the backward
pass, the statistics cache) are promoted, and once the older generations have grown by a quarter of the process's
long-lived objects (hundreds of thousands with torch and transformers loaded) a full collection runs, ~180 ms here:
rare, so the median step does not show it, but the mean does.

    python benchmarks/gc_cost.py [--steps 200] [--only "none;L1;mix;L0 flight"] [--baseline DIR] [--dtype bfloat16]

Prints per configuration the median and mean step (ms), and per generation the collections per step and their ms
per step (the mean over the steps). With ``--baseline DIR`` (another checkout, its C extensions built) each of our
configurations runs a second time with that code, as "NAME @base", after ours. ``--dtype bfloat16`` (or float16)
runs the model in that dtype, whose tensors the C entries call does not take: every entry is the Python encoder's, as
every entry of a model on an accelerator is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import native

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def worker(name: str, steps: int, dtype: str = "float32") -> dict:
    import gc

    from abba import debugger_for
    from overhead import gpt2, train_step

    with tempfile.TemporaryDirectory() as tmp:
        debugger = debugger_for(name, tmp) if name != "none" else None
        model, opt, ids = gpt2()
        if dtype != "float32":
            import torch

            model.to(getattr(torch, dtype))  # the same parameter objects: the optimizer holds them
        for _ in range(3):
            train_step(model, opt, ids, debugger)
        counts = [0, 0, 0]
        spent = [0.0, 0.0, 0.0]
        start = [0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                start[0] = time.perf_counter()
            else:
                counts[info["generation"]] += 1
                spent[info["generation"]] += time.perf_counter() - start[0]

        gc.callbacks.append(timed)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            train_step(model, opt, ids, debugger)
            times.append(time.perf_counter() - t0)
        gc.callbacks.remove(timed)
    return {"median": statistics.median(times) * 1e3, "mean": statistics.fmean(times) * 1e3,
            "collections": [c / steps for c in counts], "ms": [s * 1e3 / steps for s in spent]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", default="none;L1;mix;L0 flight")
    ap.add_argument("--baseline", help="another checkout, run after ours as NAME @base")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker, a.steps, a.dtype)), flush=True)
        return
    native.ensure(a.baseline)
    runs = []
    for name in a.only.split(";"):
        runs.append((name, ROOT))
        if a.baseline and name != "none":
            runs.append((name + " @base", os.path.abspath(a.baseline)))
    print(f"{'configuration':<18}{'median':>9}{'mean':>9}   collections per step (ms per step) by generation 0, 1, 2")
    for label, root in runs:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
        env["PYTHONPATH"] = root + os.pathsep + HERE + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", label.split(" @")[0],
                               "--steps", str(a.steps), "--dtype", a.dtype], env=env, capture_output=True, text=True,
                              timeout=3600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[0][7:])
        gens = "  ".join(f"{c:.2f} ({m:.2f})" for c, m in zip(r["collections"], r["ms"]))
        print(f"{label:<18}{r['median']:>9.1f}{r['mean']:>9.1f}   {gens}", flush=True)


if __name__ == "__main__":
    main()
