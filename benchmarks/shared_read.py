"""Large reads shared with torch's threads, on the GPT-2 step of ``overhead.py``: one process, the read shared and
not shared on alternate steps (ABBA), so both halves see the same machine, memory and model.

    python benchmarks/shared_read.py [--steps 24] [--warmup 4] [--only "L0;L0 flight;monitor"]

Prints per configuration the median step time, the time inside the recorder's module-record bodies and, within
it, in the statistics (``encode.stat_of``), in ms per step, each way, and the ratios shared / alone. Level-0
configurations for the hooks: the API records of L1 and mix are not timed there (their statistics are).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from overhead import CONFIGS, gpt2, train_step  # noqa: E402


def _timed(owner, name: str, slot: list):
    """owner.name, adding its time to slot[0]."""
    f = getattr(owner, name)

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            slot[0] += time.perf_counter() - t0

    setattr(owner, name, timed)


def run(name: str, steps: int, warmup: int, tmp: str) -> dict:
    import msprobe_inject.pytorch as dbg
    from msprobe_inject import _fastats, recorder
    from msprobe_inject.pytorch import encode

    settings = CONFIGS[name][1]
    cfg = {"task": "statistics", "statistics": {}, "dump_path": os.path.join(tmp, name.replace(" ", "_")),
           "level": settings["level"], **{k: settings[k] for k in ("flight_recorder", "preset") if k in settings}}
    path = os.path.join(tmp, name.replace(" ", "_") + ".json")
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    debugger = dbg.PrecisionDebugger(config_path=path)
    if not (encode.use_torch_mean() and encode._share_reads()):
        raise SystemExit("reads are not shared here (no kernel, or torch's threads are not an OpenMP team)")
    hooks, stats = [0.0], [0.0]
    for method in ("module_enter", "module_exit", "module_backward", "param_grad"):  # the module records' bodies
        _timed(recorder.Recorder, method, hooks)
    _timed(encode, "stat_of", stats)
    model, opt, ids = gpt2()
    got: dict = {way: {"step": [], "hooks": [], "statistics": []} for way in ("shared", "alone")}
    for i in range(warmup + steps):
        way = ("shared", "alone", "alone", "shared")[i % 4]
        if way == "shared":
            encode._share_reads()
        else:
            _fastats.use_omp(None)
        hooks[0] = stats[0] = 0.0
        t0 = time.perf_counter()
        train_step(model, opt, ids, debugger)
        t1 = time.perf_counter()
        if i >= warmup:
            got[way]["step"].append(t1 - t0)
            got[way]["hooks"].append(hooks[0])
            got[way]["statistics"].append(stats[0])
    return {way: {k: statistics.median(v) * 1e3 for k, v in d.items()} for way, d in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--only", default="L0;L0 flight;monitor")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run(a.worker, a.steps, a.warmup, tmp)), flush=True)
        return
    import subprocess

    print(f"{'configuration':<14}{'':>8}{'step':>9}{'hooks':>9}{'statistics':>12}   ms per step, median of {a.steps}")
    for name in a.only.split(";"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--steps", str(a.steps),
                               "--warmup", str(a.warmup)], capture_output=True, text=True, timeout=3600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[0][7:])
        for way in ("alone", "shared"):
            d = r[way]
            label = name if way == "alone" else ""
            print(f"{label:<14}{way:>8}{d['step']:>9.1f}{d['hooks']:>9.2f}{d['statistics']:>12.2f}")
        q = {k: f"{r['shared'][k] / r['alone'][k]:.3f}" if r["alone"][k] else "-"
             for k in ("step", "hooks", "statistics")}
        print(f"{'':<14}{'ratio':>8}{q['step']:>9}{q['hooks']:>9}{q['statistics']:>12}")


if __name__ == "__main__":
    main()
