"""Host cost of one recorded call on tiny tensors: the accelerator regime, where statistics are cheap and
the tool's per-call Python work decides the slowdown.

A loop of small ops (``Linear(4, 4)``, ``relu``, ``+``, ``*``, ``sum`` on 4x4 tensors inside two small
modules, with backward) runs under the explicit API for each configuration in its own process;
configurations are interleaved over rounds. The figure is the median iteration time over all rounds,
less the median without a tool, divided by the calls the configuration records per iteration (its
forward records: API calls at L1, module calls at L0, both at mix). The floor is a TorchFunctionMode
whose handler only calls through: what seeing every call costs before any recording.

    python benchmarks/percall.py [--rounds 3] [--iters 200] [--repeats 5] [--json out.json]
        [--only "none;floor;ours L1 statistics"] [--baseline DIR]

--baseline DIR runs each of our configurations a second time with another checkout's code (``git worktree add
DIR REV``, its C extensions built), interleaved in the same rounds, labelled "@base".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import native

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LEVELS = ("L0", "L1", "mix")
MODES = ("statistics", "md5", "xor")
TOOLS = ("ours", "msprobe")


def configs(have_msprobe: bool) -> list:
    out = [("none", "", ""), ("floor", "", "")]
    for tool in TOOLS if have_msprobe else TOOLS[:1]:
        for level in LEVELS:
            for mode in MODES:
                out.append((tool, level, mode))
    return out


def label(tool: str, level: str, mode: str) -> str:
    return tool if not level else f"{tool} {level} {mode}"


def tiny_model() -> tuple:
    """The loop's model and input: two blocks of ``Linear(4, 4)``, ``relu``, ``*`` and ``+`` on a 4x4 tensor, one
    intra-op thread, the same in every process."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.fc(x)) * 0.5 + x

    return nn.Sequential(Block(), Block()), torch.randn(4, 4, requires_grad=True)


def floor_mode():
    """The floor: a TorchFunctionMode whose handler only calls through (what seeing every call costs)."""
    from torch.overrides import TorchFunctionMode

    class Through(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return Through()


def worker(tool: str, level: str, mode: str, iters: int, repeats: int, dump: str) -> None:
    model, x = tiny_model()
    debugger = None
    if tool in ("ours", "msprobe"):
        if tool == "ours":
            from msprobe_inject.pytorch import PrecisionDebugger
        else:
            from msprobe.pytorch import PrecisionDebugger  # type: ignore
        cfg = {"task": "statistics", "dump_path": dump, "level": level, "statistics": {"summary_mode": mode}}
        with open(dump + ".json", "w") as fh:
            json.dump(cfg, fh)
        debugger = PrecisionDebugger(config_path=dump + ".json")
    mode_ctx = floor_mode() if tool == "floor" else None

    def body() -> None:
        model(x).sum().backward()

    for _ in range(20):  # warm-up, unrecorded
        body()
    times = []
    if debugger is not None:
        debugger.start(model=model)
    if mode_ctx is not None:
        mode_ctx.__enter__()
    for _ in range(repeats):
        for _ in range(iters):
            t0 = time.perf_counter()
            body()
            times.append(time.perf_counter() - t0)
    if mode_ctx is not None:
        mode_ctx.__exit__(None, None, None)
    calls = 0
    if debugger is not None:
        debugger.stop()
        debugger.step()
        calls = _forward_records(dump) / (iters * repeats)
    print("RESULT " + json.dumps({"times": times, "calls": calls}), flush=True)


def _forward_records(dump: str) -> int:
    n = 0
    for dirpath, _, files in os.walk(dump):
        if "dump.json" in files:
            with open(os.path.join(dirpath, "dump.json")) as fh:
                n += sum(1 for k in json.load(fh)["data"] if k.endswith(".forward") or ".forward." in k)
    return n


def _block_means(ts: list, block: int = 50) -> list:
    return [statistics.fmean(ts[i:i + block]) for i in range(0, len(ts) - block + 1, block)] or [statistics.fmean(ts)]


def run_one(cfg: tuple, iters: int, repeats: int, tmp: str, root: str = ROOT) -> dict:
    tool, level, mode = cfg
    dump = os.path.join(tmp, label(*cfg).replace(" ", "_") + ("_base" if root != ROOT else ""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, os.path.join(root, "benchmarks", "percall.py"), "--worker", json.dumps(cfg),
            "--iters", str(iters), "--repeats", str(repeats), "--dump", dump]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1800)
    shutil.rmtree(dump, ignore_errors=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{label(*cfg)} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--only", default="", help="configurations to run, ';'-separated labels")
    ap.add_argument("--baseline", default="", help="another checkout whose code runs our configurations too")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*json.loads(a.worker), a.iters, a.repeats, a.dump)
        return
    native.ensure(a.baseline)
    try:
        import msprobe.pytorch  # type: ignore  # noqa: F401

        have_msprobe = True
    except Exception:
        have_msprobe = False
    cfgs = configs(have_msprobe)
    if a.only:
        wanted = {x.strip() for x in a.only.split(";")}
        cfgs = [c for c in cfgs if label(*c) in wanted]
    runs = [(c, ROOT, label(*c)) for c in cfgs]
    if a.baseline:
        runs += [(c, os.path.abspath(a.baseline), label(*c) + " @base") for c in cfgs if c[0] == "ours"]
    times: dict = {name: [] for _, _, name in runs}
    calls: dict = {}
    tmp = tempfile.mkdtemp(prefix="msprobe_percall_")
    try:
        for r in range(a.rounds):
            for c, root, name in runs:
                res = run_one(c, a.iters, a.repeats, tmp, root)
                times[name].extend(res["times"])
                calls[name] = res["calls"]
                print(f"round {r + 1}/{a.rounds} {name}: median {statistics.median(res['times']) * 1e6:.1f} us",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Two figures per configuration. "median": the median single iteration, what the recording itself costs.
    # "all-in": the median over blocks of 50 consecutive iterations of their mean, which also counts what
    # comes periodically (the writer thread holding the GIL while it encodes a batch, garbage collections
    # of the objects each record allocates): the cost the job pays.
    if "none" not in times:
        raise SystemExit("--only must include none: every figure is relative to it")
    base = statistics.median(times["none"])
    base_all = statistics.median(_block_means(times["none"]))
    out = {"iteration_us_none": base * 1e6, "iteration_us_none_all_in": base_all * 1e6, "configs": {}}
    print(f"\n{'configuration':<26}{'iteration us':>14}{'all-in us':>11}{'calls/iter':>12}{'us per call':>13}"
          f"{'all-in':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        med_all = statistics.median(_block_means(ts))
        n = calls.get(name, 0)
        entry = {"iteration_us": med * 1e6, "iteration_us_all_in": med_all * 1e6, "calls_per_iteration": n}
        per = per_all = ""
        if n:
            entry["us_per_call"] = (med - base) * 1e6 / n
            entry["us_per_call_all_in"] = (med_all - base_all) * 1e6 / n
            per, per_all = f"{entry['us_per_call']:.1f}", f"{entry['us_per_call_all_in']:.1f}"
        out["configs"][name] = entry
        print(f"{name:<26}{med * 1e6:>14.1f}{med_all * 1e6:>11.1f}{n:>12.1f}{per:>13}{per_all:>9}")
    floor_calls = calls.get("ours L1 statistics")
    if floor_calls and "floor" in times:
        f = (statistics.median(times["floor"]) - base) * 1e6 / floor_calls
        out["floor_us_per_call"] = f
        print(f"\nfloor: a TorchFunctionMode that only calls through costs {f:.1f} us per L1 call")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
