"""Where in the step a configuration's overhead lands: the GPT-2 step of ``overhead.py`` cut into its phases
(``start()``, forward, backward, the optimizer's step and ``zero_grad``, ``stop()`` and ``step()``), with the tool
and without it on alternate steps of one process (each way two steps in a row, the first not counted; the order
reversed every other round), medians in ms per phase. Also the garbage collector's collections on the training
thread while the tool runs, per step and by generation, and their time: what a dump's objects make Python collect.

    python benchmarks/step_phases.py [--rounds 16] [--only "L1;mix;L0 flight;monitor"]

With OVERHEAD_OPTIMIZER=foreach the model's AdamW is the multi-tensor implementation that torch picks by default
for CUDA and NPU parameters (see ``overhead.gpt2``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import native  # noqa: E402
from abba import debugger_for  # noqa: E402
from overhead import gpt2  # noqa: E402

PHASES = ("start", "forward", "backward", "optimizer", "stop and step")


def _step(model, opt, ids, debugger) -> list:
    t = [time.perf_counter()]
    if debugger is not None:
        debugger.start(model=model)
    t.append(time.perf_counter())
    out = model(input_ids=ids, labels=ids)
    t.append(time.perf_counter())
    out.loss.backward()
    t.append(time.perf_counter())
    opt.step()
    opt.zero_grad()
    t.append(time.perf_counter())
    if debugger is not None:
        debugger.stop()
        debugger.step()
    t.append(time.perf_counter())
    return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def run(name: str, rounds: int, warmup: int, tmp: str) -> dict:
    debugger = debugger_for(name, tmp)
    model, opt, ids = gpt2()
    for _ in range(warmup):
        _step(model, opt, ids, debugger)
    main = threading.main_thread()
    collected = {}  # generation -> [count, seconds], on the training thread with the tool on
    started = {}

    def on_gc(phase, info):
        if threading.current_thread() is not main or not tool_on[0]:
            return
        g = info["generation"]
        if phase == "start":
            started[g] = time.perf_counter()
        elif g in started:
            c = collected.setdefault(g, [0, 0.0])
            c[0] += 1
            c[1] += time.perf_counter() - started.pop(g)

    tool_on = [False]
    gc.callbacks.append(on_gc)
    got = {"no tool": [], "tool": []}
    try:
        for r in range(rounds):
            for way in (("no tool", "tool") if r % 2 == 0 else ("tool", "no tool")):
                tool_on[0] = way == "tool"
                for k in range(2):
                    phases = _step(model, opt, ids, debugger if way == "tool" else None)
                    if k:
                        got[way].append(phases)
        tool_on[0] = False
    finally:
        gc.callbacks.remove(on_gc)
    steps = 2 * rounds
    out = {w: [statistics.median(p[i] for p in v) for i in range(len(PHASES))] for w, v in got.items()}
    out["ratios"] = [sum(a) / sum(b) for a, b in zip(got["tool"], got["no tool"])]
    out["gc"] = {str(g): [c / steps, s * 1e3 / steps] for g, (c, s) in sorted(collected.items())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="L1;mix;L0 flight;monitor")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run(a.worker, a.rounds, a.warmup, tmp)), flush=True)
        return
    native.ensure()
    optimizer = os.environ.get("OVERHEAD_OPTIMIZER", "loop")
    print(f"optimizer: {optimizer}; medians of {a.rounds} steps per way, ms")
    print(f"{'configuration':<14}{'phase':<16}{'no tool':>9}{'tool':>9}{'overhead':>10}")
    for name in a.only.split(";"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--rounds",
                               str(a.rounds), "--warmup", str(a.warmup)], capture_output=True, text=True,
                              timeout=3600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[0][7:])
        for i, phase in enumerate(PHASES):
            none, tool = r["no tool"][i], r["tool"][i]
            print(f"{name if i == 0 else '':<14}{phase:<16}{none:>9.1f}{tool:>9.1f}{tool - none:>+10.1f}")
        q = statistics.quantiles(r["ratios"], n=4)
        print(f"{'':<14}{'step: tool / no tool':<34}{statistics.median(r['ratios']):>.3f}   per round, median "
              f"(quartiles {q[0]:.3f}–{q[2]:.3f})")
        gcs = ", ".join(f"gen{g} {c:.2f} ({ms:.2f} ms)" for g, (c, ms) in r["gc"].items()) or "none"
        print(f"{'':<14}{'collections per step with the tool: ' + gcs}")


if __name__ == "__main__":
    main()
