"""Python bytecode instructions per recorded call, by function: where the interpreter runs the tool's Python.

A figure the machine's load does not move, like ``instructions.py``'s, but at the level the tool's own code is
written in: ``sys.settrace`` with opcode events counts every bytecode instruction the training thread runs, and the
calls of each function, over iterations of ``percall.py``'s loop (``--loop``) or steps of ``overhead.py``'s GPT-2
model (``--step``) with one configuration recorded. The warm-up runs through the same calling line, so every call
site and stack is known before counting starts (a first-seen stack is formatted once per process). The writer
thread is not counted (its work is C: the journal's and the documents' encoders). A function's calls count the
resumptions of a generator (a context manager's) as calls.

    python benchmarks/opcodes.py [--loop] [--config L1] [--iters 20] [--top 25]
    python benchmarks/opcodes.py --step --config monitor [--iters 3]

Per recorded call: at ``--loop`` the counts are divided by the configuration's forward records per iteration (API
calls at L1, module calls at L0, both at mix), as ``percall.py`` and ``instructions.py`` do. "torch's module call"
is what torch's ``Module._call_impl`` runs more with global hooks registered (its ``inner`` path): the cost of a
module hook that does nothing, paid by the L0, mix and monitor levels, and by L1 for its module bookkeeping.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, Tuple

import native

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# the loop's configurations: (level, extra config); the step's are overhead.py's (abba.debugger_for)
LOOP = {"L0": ("L0", {}), "L1": ("L1", {}), "mix": ("mix", {})}
Key = Tuple[str, str]


def _where(filename: str) -> str:
    if filename.startswith(ROOT + os.sep):
        return os.path.relpath(filename, ROOT)
    return filename.split("site-packages" + os.sep)[-1]


def count(run: Callable[[], None], warm: int, iters: int) -> Tuple[collections.Counter, collections.Counter]:
    """Opcodes and calls by (file, function) over ``iters`` runs after ``warm`` runs, all from one calling line."""
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        key = (frame.f_code.co_filename, frame.f_code.co_name)
        if event == "opcode":
            ops[key] += 1
        elif event == "call":
            calls[key] += 1
        return trace

    for i in range(warm + iters):
        if i == warm:
            sys.settrace(trace)
        run()
    sys.settrace(None)
    return ops, calls


def loop_run(config: str, dump: str) -> Tuple[Callable[[], None], Any]:
    from percall import tiny_model

    model, x = tiny_model()
    debugger = None
    if config != "none":
        from msprobe_inject.pytorch import PrecisionDebugger

        level, extra = LOOP[config]
        path = os.path.join(dump, "config.json")
        with open(path, "w") as fh:
            json.dump({"task": "statistics", "dump_path": os.path.join(dump, "d"), "level": level, **extra}, fh)
        debugger = PrecisionDebugger(config_path=path)
        debugger.start(model=model)

    def run() -> None:
        model(x).sum().backward()

    return run, debugger


def step_run(config: str, dump: str) -> Tuple[Callable[[], None], Any]:
    from abba import debugger_for
    from overhead import gpt2, train_step

    model, opt, ids = gpt2()
    debugger = debugger_for(config, dump) if config != "none" else None

    def run() -> None:
        train_step(model, opt, ids, debugger)

    return run, debugger


def forward_records(dump: str) -> int:
    n = 0
    for dirpath, _, files in os.walk(dump):
        if "dump.json" in files:
            with open(os.path.join(dirpath, "dump.json")) as fh:
                n += sum(1 for k in json.load(fh).get("data", {}) if k.endswith(".forward") or ".forward." in k)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    way = ap.add_mutually_exclusive_group()
    way.add_argument("--loop", action="store_true", help="percall.py's loop (the default)")
    way.add_argument("--step", action="store_true", help="overhead.py's GPT-2 step")
    ap.add_argument("--config", default="L1")
    ap.add_argument("--iters", type=int, default=None, help="iterations (loop, default 20) or steps (default 3)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if not a.step and a.config not in LOOP:
        ap.error(f"--loop records one of {', '.join(LOOP)} (overhead.py's configurations are --step's)")
    native.ensure()  # before the tool's import, which loads them
    iters = a.iters or (3 if a.step else 20)
    warm = 5 if a.step else 30
    with tempfile.TemporaryDirectory() as tmp:
        results: Dict[str, Any] = {}
        for config in ("none", a.config):
            run, debugger = (step_run if a.step else loop_run)(config, tmp)
            ops, calls = count(run, warm, iters)
            records = 0
            if debugger is not None and not a.step:
                debugger.stop()
                debugger.step()
                records = forward_records(os.path.join(tmp, "d"))
            results[config] = (ops, calls, records)
    base_ops, _, _ = results["none"]
    ops, calls, records = results[a.config]
    unit = "step" if a.step else "iteration"
    total = sum(ops.values()) / iters
    import msprobe_inject

    pkg = os.path.dirname(os.path.abspath(msprobe_inject.__file__)) + os.sep  # wherever it is installed
    ours = sum(v for k, v in ops.items() if k[0].startswith(pkg)) / iters
    inner = sum(v for k, v in ops.items() if k[1] in ("inner", "_call_impl") and "nn/modules/module.py" in k[0])
    inner_none = sum(v for k, v in base_ops.items() if k[1] in ("inner", "_call_impl")
                     and "nn/modules/module.py" in k[0])
    print(f"{a.config}, Python opcodes per {unit} (training thread): {total:,.0f}; no tool "
          f"{sum(base_ops.values()) / iters:,.0f}; the tool's own functions {ours:,.0f}; torch's module call "
          f"{(inner - inner_none) / iters:+,.0f} over no tool")
    per_call = records / (warm + iters) if records else 0  # forward records per iteration (every one recorded)
    if per_call:
        print(f"  {per_call:.1f} recorded calls per iteration: the tool's functions {ours / per_call:,.0f} opcodes "
              f"per recorded call")
    print(f"  {'opcodes/' + unit:>14} {'calls/' + unit:>12} {'per call':>9}  function")
    for (fname, func), v in ops.most_common(a.top):
        c = calls[(fname, func)] / iters
        print(f"  {v / iters:14,.0f} {c:12.1f} {v / iters / c if c else 0:9.0f}  {_where(fname)}:{func}")


if __name__ == "__main__":
    main()
