"""What the flight recorder's trigger check costs the writer thread per record it follows: ``Flight.observe`` on a
parameter gradient's members (one entry of C values, as the recorded call's C makes it), the spike rule's Norm read
(``_norm_of``) alone, and an entry's ``get("Norm")``. One process per measurement, this checkout's and (with
``--baseline DIR``) another's alternating over the rounds; medians in ns per call, and the ratio to the baseline.

    python benchmarks/spike_rule.py [--rounds 5] [--calls 200000] [--baseline DIR] [--step]

At level L0 with the default spike rule every parameter gradient's record is followed (53 per step of
``overhead.py``'s GPT-2), and the writer handles each in Python under the GIL. With ``--step`` the same check is
timed where it runs: 10 GPT-2 steps of ``overhead.py``'s "L0 flight" (after 3 unmeasured), the writer thread's CPU
time in ``Flight.observe`` and in its Merge handler around it, µs per record, one process per checkout and round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARTS = ("observe", "norm of", "entry get")
STEP_PARTS = ("observe in a step", "merge handler in a step")


def worker(calls: int) -> dict:
    import timeit

    from msprobe_inject.dumpformat import _jenc
    from msprobe_inject.dumpformat.nonfinite import has_nonfinite
    from msprobe_inject.flight import Flight, _norm_of

    entry = _jenc.entry("torch.Tensor", "torch.float32", (256, 768), (0.5, -0.5, 0.001, 3.25), 0, 0, False, False)
    body = {"weight": [entry]}
    key = "Module.transformer.h.0.attn.c_attn.Conv1D.parameters_grad.0"
    fl = Flight(4, 1, 1 << 30, 10.0, r"parameters_grad|loss", has_nonfinite)
    for step in range(6):  # a ring with history: the median is there to compare with
        fl.observe(step, key, body, False)
        fl.step_finished()
    ways = {"observe": lambda: fl.observe(7, key, body, False), "norm of": lambda: _norm_of(body),
            "entry get": lambda: entry.get("Norm")}
    empty = min(timeit.repeat(lambda: None, number=calls, repeat=3))
    return {name: (min(timeit.repeat(fn, number=calls, repeat=3)) - empty) / calls * 1e9 for name, fn in ways.items()}


def worker_step() -> dict:
    import json as _json
    import tempfile
    import time

    sys.path.insert(0, HERE)
    from overhead import gpt2, train_step

    from msprobe_inject import flight, writer

    spent = {p: [0, 0] for p in STEP_PARTS}

    def timed(cls, name, part):
        fn = getattr(cls, name)

        def run(*a, **k):
            t = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[part][0] += time.thread_time_ns() - t
                spent[part][1] += 1
        setattr(cls, name, run)

    timed(flight.Flight, "observe", "observe in a step")
    timed(writer.DumpWriter, "_on_merge", "merge handler in a step")  # bound by the writer made below
    from msprobe_inject.pytorch import PrecisionDebugger

    dump = tempfile.mkdtemp()
    with open(dump + ".json", "w") as fh:
        _json.dump({"task": "statistics", "dump_path": dump, "level": "L0", "flight_recorder": 4}, fh)
    debugger = PrecisionDebugger(config_path=dump + ".json")
    model, opt, ids = gpt2()
    for _ in range(3):
        train_step(model, opt, ids, debugger)
    for v in spent.values():
        v[0] = v[1] = 0
    for _ in range(10):
        train_step(model, opt, ids, debugger)
    return {p: ns / max(n, 1) for p, (ns, n) in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--step", action="store_true")
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker_step() if a.step else worker(a.calls)), flush=True)
        return
    parts = STEP_PARTS if a.step else PARTS
    roots = {"now": ROOT}
    if a.baseline:
        roots["base"] = os.path.abspath(a.baseline)
    got: dict = {name: {p: [] for p in parts} for name in roots}
    for r in range(a.rounds):
        for name in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
            env = dict(os.environ, PYTHONPATH=roots[name] + os.pathsep + os.environ.get("PYTHONPATH", ""))
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(a.calls)] + \
                (["--step"] if a.step else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=roots[name]).stdout
            res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
            for p in parts:
                got[name][p].append(res[p])
    print(f"ns per call, medians of {a.rounds} processes per checkout")
    print(f"{'part':24s}" + "".join(f"{name:>12s}" for name in roots) + ("   now / base" if a.baseline else ""))
    for p in parts:
        meds = {name: statistics.median(got[name][p]) for name in roots}
        line = f"{p:24s}" + "".join(f"{meds[name]:12.0f}" for name in roots)
        if a.baseline:
            line += f"   {meds['now'] / meds['base']:.3f}"
        print(line)


if __name__ == "__main__":
    main()
