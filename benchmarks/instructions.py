"""Instructions per recorded call: ``percall.py``'s loop counted by valgrind's callgrind instead of timed, so the figure
does not move with the machine's load (a wall-clock ratio on a shared 2-core machine spreads by 5 % and more).

    python benchmarks/instructions.py [--only "none;floor;L1;mix;L0"] [--iters 100] [--mode statistics]
        [--baseline DIR] [--top 0] [--keep DIR] [--training-thread]
        [--ways "python api path;no backward hook;no encoding;records not sent;no stacks"]
    python benchmarks/instructions.py --only "none;module floor;L0;L0 flight;monitor"
        [--ways "no param grads;no module backward;records not sent;no encoding"]

Each configuration runs in its own process under ``valgrind --tool=callgrind --instr-atstart=no``: the model is built
and warmed up (20 iterations unrecorded, 30 recorded) uninstrumented, then instrumentation starts, the debugger starts
a step, ``--iters`` iterations run, the debugger stops and the writer thread writes the step's documents
(``DumpWriter.flush``), and instrumentation stops. Every thread's instructions count (the writer thread's too: it
holds the interpreter lock the training thread waits for). With --training-thread, the training thread's alone: the
writer thread's 50 ms timer decides whether a step's documents are assembled inside the window, which moves the
all-threads count by about 1 % of an L1 call from run to run. Figures: instructions per iteration, and per recorded call
over "none" (the same loop without a tool), the calls being the configuration's forward records per iteration
(API calls at L1, module calls at L0, both at mix). "L0 flight" and "monitor" are ``overhead.py``'s configurations of
those names (a flight recorder of 4 steps, triggered after the count so that its records can be counted; the monitor
preset); "L0 idle" the debugger started at L0 with a step range that leaves out every step (its hooks in place, nothing
recorded: what each step before a job's range costs; it has no calls, compare its iteration with no tool's). The
floors: "floor" a TorchFunctionMode that only calls through (the API levels'), "module floor" torch's global module
forward pre-hook and hook and a hook on each parameter's gradient accumulation, all doing nothing (the module
levels'). An instruction is not a nanosecond (a cache miss costs hundreds),
but on this loop, whose data stay in cache, the two move together; the timed figures are ``percall.py``'s.

--baseline DIR counts each configuration of ours again with another checkout's code (``git worktree add DIR REV``, its
C extensions built). --keep DIR keeps each configuration's measured callgrind output there (for ``callgrind_annotate
--inclusive=yes``). --top N prints the N functions with the most instructions of their own (C functions: the
interpreter, torch, our extensions; Python functions show as the interpreter's). --ways counts each configuration of
ours again with one part of the recording switched off, as ``call_parts.py`` does (diagnostics: a way that is not the
code's never runs in a job). Every way runs the API calls through apis.py's Python (their C common case,
``_apicall.c``, calls the encoder, the stack and the node hook the ways replace): compare a way with "python api
path", which is that alone (counted with the others, it is what their "less" is against). Needs valgrind and its
``callgrind.h`` (the start and stop are its client requests, compiled into a small helper library).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Optional

import native

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# a configuration's level, and the settings it adds to the dump config (overhead.py's names)
CONFIGS = {"none": None, "floor": None, "module floor": None, "L1": ("L1", {}), "mix": ("mix", {}), "L0": ("L0", {}),
           "L0 flight": ("L0", {"flight_recorder": 4}), "monitor": ("L0", {"preset": "monitor"}),
           "L0 idle": ("L0", {"step": [1000]})}
WAYS = ("no backward hook", "no encoding", "records not sent", "no stacks", "no param grads", "no module backward",
        "python api path")


def set_way(way: str) -> None:
    """call_parts.py's ways: one part of the recording replaced by a function that does nothing."""
    if not way:
        return
    from msprobe_inject import recorder as R
    from msprobe_inject import writer as W
    from msprobe_inject.pytorch import apis, encode, modules

    def nothing(*_a, **_k):
        return None

    def empty(self, value, pending, file_prefix=None, keys=None):
        return type(value)() if isinstance(value, (list, dict)) else []

    send = W.DumpWriter.send
    dropped = (W.Record, W.Merge, W.Construct, W.Stack)

    def records_not_sent(self, ev, push=False):  # the step's own events (open, flush) still go
        if type(ev) not in dropped:
            send(self, ev, push)

    # the API calls' common case in C (apis._fast_call) calls the encoder, the stack and the node hook itself: a way
    # that replaces one of those runs the calls through apis.py's Python, compared with "python api path"; so do the
    # module calls' and parameter gradients' (modules._fast_pre, _fast_post, _fast_param_grad: set before the model's
    # first recorded call, which makes the gradients' hooks)
    apis._fast_call = None
    modules._fast_pre = modules._fast_post = modules._fast_param_grad = None
    if way == "python api path":
        return
    cls, name, fn = {"no backward hook": (apis.ApiHooks, "_register_backward", nothing),
                     "no encoding": (encode.Encoder, "encode", empty),
                     "records not sent": (W.DumpWriter, "send", records_not_sent),
                     "no stacks": (W.DumpWriter, "stack", nothing),
                     "no param grads": (R.Recorder, "param_grad", nothing),
                     "no module backward": (R.Recorder, "module_backward", nothing)}[way]
    setattr(cls, name, fn)
    if way == "no stacks":  # a known stack's C call from the recording frames (writer.stack_at) goes too
        apis.stack_at = R.stack_at = None

HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_DUMP_STATS_AT("measured"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def build_helper(tmp: str) -> str:
    src = os.path.join(tmp, "cg_toggle.c")
    lib = os.path.join(tmp, "cg_toggle.so")
    with open(src, "w") as fh:
        fh.write(HELPER)
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def worker(name: str, mode: str, iters: int, helper: str, dump: str, way: str = "") -> None:
    import ctypes

    sys.path.insert(0, HERE)
    from percall import floor_mode, tiny_model

    model, x = tiny_model()
    debugger = mode_ctx = None
    if CONFIGS[name] is not None:
        from msprobe_inject.pytorch import PrecisionDebugger

        level, settings = CONFIGS[name]
        cfg = {"task": "statistics", "dump_path": dump, "level": level, "statistics": {"summary_mode": mode},
               **settings}
        with open(dump + ".json", "w") as fh:
            json.dump(cfg, fh)
        debugger = PrecisionDebugger(config_path=dump + ".json")
        set_way(way)
    elif name == "floor":
        mode_ctx = floor_mode()
    elif name == "module floor":
        module_floor(model)

    def body() -> None:
        model(x).sum().backward()

    for _ in range(20):
        body()
    if debugger is not None:  # a recorded warm-up step: the sites, caches and the writer thread in place
        debugger.start(model=model)
        for _ in range(30):
            body()
        debugger.stop()
        debugger.step()
        _writer(debugger).flush()
    cg = ctypes.CDLL(helper)
    cg.cg_start()
    if debugger is not None:
        debugger.start(model=model)
    if mode_ctx is not None:
        mode_ctx.__enter__()
    for _ in range(iters):
        body()
    if mode_ctx is not None:
        mode_ctx.__exit__(None, None, None)
    if debugger is not None:
        debugger.stop()
        _writer(debugger).flush()
    cg.cg_stop()
    if debugger is not None:
        debugger.step()
        if CONFIGS[name][1].get("flight_recorder"):  # the held steps written, so that their records can be counted
            debugger.trigger("counting the records")
            debugger.runtime.shutdown()


def module_floor(model) -> None:
    """The module levels' floor: what torch's global module hooks and a hook on each parameter's gradient
    accumulation cost with bodies that do nothing (what seeing every module call and gradient costs)."""
    from torch.nn.modules import module as mm

    def nothing(*_a, **_k):
        return None

    mm.register_module_forward_pre_hook(nothing)
    mm.register_module_forward_hook(nothing, always_call=True, with_kwargs=True)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(nothing)


def _writer(debugger):
    return debugger.runtime.writer  # the recorder's


def count(name: str, mode: str, iters: int, helper: str, tmp: str, root: str, top: int, way: str = "",
          keep: Optional[str] = None, training_thread: bool = False) -> dict:
    tag = name + ("_base" if root != ROOT else "") + way.replace(" ", "_")
    out = os.path.join(tmp, f"cg_{tag}")
    dump = os.path.join(tmp, f"dump_{tag}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts in every run
    # --training-thread: one output per thread, of which the window's dump (a client request from the training
    # thread) holds the training thread's alone (callgrind dumps the requesting thread's): NAME.PID.1-01
    args = ["valgrind", "--tool=callgrind", "--instr-atstart=no"] + (["--separate-threads=yes"] if training_thread
                                                                     else []) + [
            f"--callgrind-out-file={out}.%p",
            sys.executable, os.path.join(HERE, "instructions.py"), "--worker", name, "--mode", mode,
            "--iters", str(iters), "--helper", helper, "--dump", dump, "--way", way]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    dumps = [os.path.join(tmp, f) for f in os.listdir(tmp)
             if f.startswith(f"cg_{tag}.") and f.endswith(".1-01" if training_thread else ".1")]
    if len(dumps) != 1:
        raise RuntimeError(f"{tag}: expected one measured dump, found {dumps}")
    with open(dumps[0]) as fh:
        text = fh.read()
    total = int(re.search(r"^summary:\s*(\d+)", text, re.M).group(1))
    got = {"instructions": total / iters, "calls": (_forward_records(dump) / iters if not way else 0)
           if CONFIGS[name] else 0}
    if top:
        ann = subprocess.run(["callgrind_annotate", dumps[0]], capture_output=True, text=True).stdout
        rows = [ln for ln in ann.splitlines() if re.match(r"^\s*[\d,]+ \(\s*[\d.]+%\)\s+\S", ln)][1:top + 1]
        got["top"] = rows
    if keep:  # for callgrind_annotate --inclusive=yes, or kcachegrind
        os.makedirs(keep, exist_ok=True)
        shutil.copy(dumps[0], os.path.join(keep, f"callgrind.out.{tag.replace(' ', '_')}"))
    for f in os.listdir(tmp):
        if f.startswith(f"cg_{tag}."):
            os.unlink(os.path.join(tmp, f))
    shutil.rmtree(dump, ignore_errors=True)
    return got


def _forward_records(dump: str) -> int:
    n = 0
    for dirpath, _, files in os.walk(dump):
        if "dump.json" in files and os.path.basename(os.path.dirname(dirpath)) == "step1":
            with open(os.path.join(dirpath, "dump.json")) as fh:
                n += sum(1 for k in json.load(fh)["data"] if k.endswith(".forward") or ".forward." in k)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="none;floor;L1;mix;L0")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--mode", default="statistics", choices=("statistics", "md5", "xor"))
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--keep", default=None, help="a directory to keep each measured callgrind output in")
    ap.add_argument("--training-thread", action="store_true",
                    help="count the training thread alone (not the writer thread's work, whose 50 ms timer moves "
                         "the all-threads count by about 1 %% of an L1 call from run to run)")
    ap.add_argument("--ways", default="")
    ap.add_argument("--way", default="")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--helper", default=None)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.mode, a.iters, a.helper, a.dump, a.way)
        return
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py needs valgrind (callgrind) on PATH")
    names = [n.strip() for n in a.only.split(";") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        sys.exit(f"unknown configuration(s) {bad}; allowed: {list(CONFIGS)}")
    ways = [w.strip() for w in a.ways.split(";") if w.strip()]
    if [w for w in ways if w not in WAYS]:
        sys.exit(f"unknown way(s) {[w for w in ways if w not in WAYS]}; allowed: {list(WAYS)}")
    if "none" not in names:
        names.insert(0, "none")
    native.ensure(a.baseline)
    tmp = tempfile.mkdtemp(prefix="msprobe_instructions_")
    try:
        helper = build_helper(tmp)
        res = {}
        for n in names:
            res[n] = count(n, a.mode, a.iters, helper, tmp, ROOT, a.top, keep=a.keep, training_thread=a.training_thread)
            print(f"counted {n}", file=sys.stderr, flush=True)
            if a.baseline and CONFIGS[n]:
                res[n + "@base"] = count(n, a.mode, a.iters, helper, tmp, os.path.abspath(a.baseline), a.top,
                                         keep=a.keep, training_thread=a.training_thread)
                print(f"counted {n}@base", file=sys.stderr, flush=True)
            # "python api path" first: the other ways run that path, and their "less" is against it when counted
            for w in sorted(ways, key=lambda w: w != "python api path") if CONFIGS[n] else ():
                res[f"{n}, {w}"] = count(n, a.mode, a.iters, helper, tmp, ROOT, 0, w, keep=a.keep,
                                         training_thread=a.training_thread)
                ref = res.get(f"{n}, python api path") if w != "python api path" else None
                res[f"{n}, {w}"]["less"] = (ref or res[n])["instructions"] - res[f"{n}, {w}"]["instructions"]
                print(f"counted {n}, {w}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    none = res["none"]["instructions"]
    print(f"\ninstructions (callgrind), {a.iters} iterations, summary mode {a.mode}, "
          + ("the training thread alone" if a.training_thread else "all threads"))
    print(f"  {'configuration':<14}{'per iteration':>16}{'calls':>8}{'per call over none':>20}")
    for n, r in res.items():
        per = (r["instructions"] - none) / r["calls"] if r["calls"] else None
        print(f"  {n:<14}{r['instructions']:>16,.0f}{r['calls']:>8.1f}"
              + (f"{per:>20,.0f}" if per is not None else "")
              + (f"{r['less']:>14,.0f} less per iteration" if "less" in r else ""))
        if n.endswith("@base") and per is not None:
            cur = res[n[:-5]]
            now = (cur["instructions"] - none) / cur["calls"]
            print(f"  {'':<14}{'now / base':>16}{'':>8}{now / per:>20.3f}")
    for n, r in res.items():
        for row in r.get("top", []):
            print(f"  {n}: {row.strip()[:160]}")


if __name__ == "__main__":
    main()
