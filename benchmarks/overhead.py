"""Step-time overhead of dumping on a tiny GPT-2 training step, against no tool, from one run.

Each configuration runs in its own process; configurations are interleaved over several rounds and
the reported figure is the median step time over all measured steps of all rounds. Ratios are
against "none". Beside it, each round's median over that round's "none" (median and quartiles over the
rounds): the machine's drift between processes cancels from those. mindstudio-probe's configurations
run too when it is installed.

    python benchmarks/overhead.py [--rounds 3] [--steps 20] [--warmup 5] [--json out.json] [--only "none;L1"]
                                  [--baseline DIR] [--clock wall|cpu] [--optimizer loop|foreach]

With ``--baseline DIR`` (a checkout of another revision, e.g. ``git worktree add DIR REV``, with the
statistics kernel built or copied in), each of our configurations also runs with that checkout's
code, interleaved with ours in the same rounds, as "NAME @base": a regression shows as a ratio to it.
``--clock cpu`` times each step in the process's CPU time (every thread's) instead of wall time: on a
machine busy with other work, wall time measures the other work; CPU time barely moves with it
(torch then runs one intra-op thread, whose idle OpenMP partner would otherwise spin on the clock).
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

# name -> (tool, settings); tool: none | ours | msprobe | zero-code | loaded
CONFIGS = {
    "none": ("none", {}),
    "loaded, dump off": ("loaded", {}),
    "L0": ("ours", {"level": "L0"}),
    "L1": ("ours", {"level": "L1"}),
    "mix": ("ours", {"level": "mix"}),
    "L1 md5": ("ours", {"level": "L1", "summary_mode": "md5"}),
    "L1 tensor": ("ours", {"level": "L1", "task": "tensor"}),
    "L1 fsync": ("ours", {"level": "L1", "fsync": True}),
    "L1 zero-code": ("zero-code", {"level": "L1"}),
    "L0 flight": ("ours", {"level": "L0", "flight_recorder": 4}),
    "monitor": ("ours", {"level": "L0", "preset": "monitor"}),
    "monitor flight": ("ours", {"level": "L0", "preset": "monitor", "flight_recorder": 4}),
    "msprobe dump off": ("msprobe-off", {}),
    "msprobe L0": ("msprobe", {"level": "L0"}),
    "msprobe L1": ("msprobe", {"level": "L1"}),
    "msprobe mix": ("msprobe", {"level": "mix"}),
    "msprobe L1 md5": ("msprobe", {"level": "L1", "summary_mode": "md5"}),
    "msprobe L1 tensor": ("msprobe", {"level": "L1", "task": "tensor"}),
}
# dump settings only: with dumping off both overheads are noise around zero and their quotient means nothing
PAIRS = {"L0": "msprobe L0", "L1": "msprobe L1", "mix": "msprobe mix",
         "L1 md5": "msprobe L1 md5", "L1 tensor": "msprobe L1 tensor", "L1 zero-code": "msprobe L1"}


def gpt2() -> tuple:
    """The benchmark's model, optimizer and batch: a tiny GPT-2, the same in every process. The optimizer is
    AdamW as torch picks its implementation for CPU tensors (a loop of per-parameter ops, each an API call a dump
    records), or with OVERHEAD_OPTIMIZER=foreach the multi-tensor one torch picks by default for CUDA and NPU
    parameters (``torch._foreach_*`` calls, which msprobe's API list does not hold)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=1000, n_positions=128))
    foreach = True if os.environ.get("OVERHEAD_OPTIMIZER") == "foreach" else None
    return (model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach),
            torch.randint(0, 1000, (8, 128)))


def train_step(model, opt, ids, debugger) -> None:
    """One training step, recorded as a step of the debugger's when there is one."""
    if debugger is not None:
        debugger.start(model=model)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
    if debugger is not None:
        debugger.stop()
        debugger.step()


def make_debugger(tool: str, settings: dict, dump: str):
    """The debugger a worker of ``tool`` runs with (None for no tool, or the tool imported and nothing started),
    dumping to dump."""
    dbg = None
    if tool in ("ours", "loaded"):
        import msprobe_inject.pytorch as dbg  # noqa: F811
    elif tool in ("msprobe", "msprobe-off"):
        import msprobe.pytorch as dbg  # type: ignore  # noqa: F811
    if tool not in ("ours", "msprobe"):
        return None
    cfg = {"task": settings.get("task", "statistics"), "dump_path": dump, "level": settings["level"]}
    section = {"summary_mode": settings["summary_mode"]} if "summary_mode" in settings else {}
    cfg[cfg["task"]] = section
    for key in ("fsync", "flight_recorder", "preset"):
        if key in settings:
            cfg[key] = settings[key]
    path = os.path.join(dump + ".json")
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    return dbg.PrecisionDebugger(config_path=path)


def worker(tool: str, settings: dict, steps: int, warmup: int, dump: str) -> None:
    debugger = make_debugger(tool, settings, dump)
    model, opt, ids = gpt2()
    times = []
    clock = time.process_time if os.environ.get("OVERHEAD_CLOCK") == "cpu" else time.perf_counter
    for i in range(warmup + steps):
        t0 = clock()
        train_step(model, opt, ids, debugger)
        t1 = clock()
        if i >= warmup:
            times.append(t1 - t0)
    print("TIMES " + json.dumps(times), flush=True)
    if tool == "ours":
        cache = debugger.runtime.encoder.cache
        total = warmup + steps
        print("CACHE " + json.dumps({"hits_per_step": cache.hits / total, "misses_per_step": cache.misses / total,
                                     "bytes_per_step": cache.bytes_reduced / total}), flush=True)


def bandwidth() -> float:
    """Read bandwidth in bytes/s: a full reduction over 256 MiB, as the statistics do."""
    import torch

    x = torch.empty(1 << 26, dtype=torch.float32).uniform_()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.aminmax(x)
        ts.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(ts)


CACHE: dict = {}


BASE_SUFFIX = " @base"
CLOCK = ["wall"]


def code_of(name: str, baseline: str) -> tuple:
    """(the configuration's name without " @base", the checkout whose code runs it)."""
    if name.endswith(BASE_SUFFIX):
        return name[: -len(BASE_SUFFIX)], baseline
    return name, ROOT


def worker_env(root: str) -> dict:
    """A worker's environment: this one without the launcher's MSPROBE_* contract, root's code first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_one(name: str, steps: int, warmup: int, tmp: str, baseline: str = "") -> list:
    name, root = code_of(name, baseline)
    tool, settings = CONFIGS[name]
    dump = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
    env = worker_env(root)
    env["OVERHEAD_CLOCK"] = CLOCK[0]
    if CLOCK[0] == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # an idle OpenMP worker spins: its CPU time would be noise
    wtool = tool
    if tool == "zero-code":
        env["PYTHONPATH"] = os.path.join(root, "msprobe_inject", "_boot") + os.pathsep + env["PYTHONPATH"]
        env["MSPROBE_DUMP_PATH"] = dump
        env["MSPROBE_LEVEL"] = settings["level"]
        wtool = "none"
    args = [sys.executable, os.path.abspath(__file__), "--worker", wtool, "--settings", json.dumps(settings),
            "--steps", str(steps), "--warmup", str(warmup), "--dump", dump]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    shutil.rmtree(dump, ignore_errors=True)
    # a tensor run leaves gigabytes of dirty pages and freed blocks: their writeback is not billed to the
    # next configuration (not enough alone: the process after a tensor run is still slow, see main())
    if hasattr(os, "sync"):
        os.sync()
    if settings.get("task") == "tensor":
        time.sleep(3)
    times = None
    for line in proc.stdout.splitlines():
        if line.startswith("TIMES "):
            times = json.loads(line[6:])
        elif line.startswith("CACHE ") and root == ROOT:
            CACHE[name] = json.loads(line[6:])
    if times is not None:
        return times
    raise RuntimeError(f"{name} ({root}) failed:\n{proc.stderr[-3000:]}")


def _quartiles(xs: list) -> tuple:
    """First quartile, median and third quartile of a non-empty list (the median for fewer than four)."""
    if len(xs) < 4:
        m = statistics.median(xs)
        return m, m, m
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(HERE, "overhead.json"))
    ap.add_argument("--only", default="", help="semicolon-separated configuration names")
    ap.add_argument("--baseline", default="", help="a checkout of another revision to compare against, interleaved")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the process's CPU time per step (all threads), for a machine under other load")
    ap.add_argument("--optimizer", choices=["loop", "foreach"], default=os.environ.get("OVERHEAD_OPTIMIZER", "loop"),
                    help="foreach: AdamW's multi-tensor implementation, torch's default on CUDA and NPU (also "
                         "OVERHEAD_OPTIMIZER=foreach, which the other benchmarks on this model read)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker == "bandwidth":
        print(f"BW {bandwidth()}")
        return
    CLOCK[0] = a.clock
    os.environ["OVERHEAD_OPTIMIZER"] = a.optimizer  # the workers' gpt2() reads it
    if a.worker:
        worker(a.worker, json.loads(a.settings), a.steps, a.warmup, a.dump)
        return
    native.ensure(a.baseline)
    try:
        import msprobe.pytorch  # type: ignore  # noqa: F401

        have_msprobe = True
    except Exception:
        have_msprobe = False
    names = [n for n in CONFIGS if have_msprobe or not CONFIGS[n][0].startswith("msprobe")]
    if a.only:
        wanted = [x.strip() for x in a.only.split(";")]
        names = [n for n in names if n in wanted or n == "none"]
    if a.baseline:
        a.baseline = os.path.abspath(a.baseline)
        names = [m for n in names for m in ([n, n + BASE_SUFFIX] if CONFIGS[n][0] in ("ours", "zero-code", "loaded")
                                           else [n])]
    samples: dict = {n: [] for n in names}
    per_round: dict = {n: [] for n in names}  # each round's median: the machine's speed drifts between rounds
    tmp = tempfile.mkdtemp(prefix="msprobe_bench_")
    try:
        for r in range(a.rounds):
            order = names
            if r % 2:  # a configuration and its @base swap places every other round, so that drift within a
                order = [m for n in names if not n.endswith(BASE_SUFFIX)  # round favours neither
                         for m in ([n + BASE_SUFFIX, n] if n + BASE_SUFFIX in samples else [n])]
            for n in order:
                got = run_one(n, a.steps, a.warmup, tmp, a.baseline)
                samples[n].extend(got)
                per_round[n].append(statistics.median(got))
                if CONFIGS[n.replace(BASE_SUFFIX, "")][1].get("task") == "tensor":
                    # discarded: the process after a tensor run was measured 10-20 % slow (no tool as
                    # much as ours) even after a sync; a throwaway run absorbs it
                    run_one("none", a.steps, a.warmup, tmp)
                print(f"round {r + 1}/{a.rounds} {n}: median {per_round[n][-1] * 1000:.1f} ms",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(samples["none"])
    result = {"step_ms_none": base * 1000, "optimizer": a.optimizer, "configs": {}}
    print(f"\n{'configuration':<22}{'median step ms':>16}{'ratio':>8}{'per round (quartiles)':>24}"
          f"{'overhead/msprobe':>18}{'vs @base':>10}  vs @base per round")
    for n in names:
        med = statistics.median(samples[n])
        ratio = med / base
        entry = {"median_ms": med * 1000, "ratio": ratio, "n": len(samples[n])}
        rel = ""
        pair = PAIRS.get(n)
        entry["round_medians_ms"] = [x * 1000 for x in per_round[n]]
        # each round's median over that round's "none": the two ran a minute apart, so the machine's drift over
        # the run (its speed moves by several per cent between processes here) cancels out of each quotient
        paired = sorted(x / y for x, y in zip(per_round[n], per_round["none"]))
        entry["ratio_per_round"] = paired
        q = _quartiles(paired)
        per = f"{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})" if n != "none" else ""
        if n + BASE_SUFFIX in samples:
            entry["vs_base"] = med / statistics.median(samples[n + BASE_SUFFIX])
            entry["vs_base_per_round"] = [x / y for x, y in zip(per_round[n], per_round[n + BASE_SUFFIX])]
        if pair in samples:
            theirs = statistics.median(samples[pair]) / base
            if theirs > 1:
                entry["overhead_vs_msprobe"] = (ratio - 1) / (theirs - 1)
                rel = f"{entry['overhead_vs_msprobe']:.2f}"
        result["configs"][n] = entry
        vs = f"{entry['vs_base']:.3f}" if "vs_base" in entry else ""
        rounds = ", ".join(f"{x:.3f}" for x in entry.get("vs_base_per_round", ()))
        print(f"{n:<22}{med * 1000:>16.1f}{ratio:>8.2f}{per:>24}{rel:>18}{vs:>10}  {rounds}".rstrip())
    bw_out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "bandwidth"], capture_output=True,
                            text=True, timeout=600).stdout
    bw = float(bw_out.split()[-1])
    result["read_bandwidth_GBps"] = bw / 1e9
    print(f"\nfloor: statistics must read each distinct tensor once; read bandwidth {bw / 1e9:.1f} GB/s "
          "(aminmax over 256 MiB)")
    print(f"{'configuration':<22}{'MB read/step':>14}{'floor ms':>10}{'overhead ms':>13}{'x floor':>9}")
    for n, c in CACHE.items():
        over = result["configs"][n]["median_ms"] - result["step_ms_none"]
        if not c["bytes_per_step"]:  # records without inputs go without the statistics cache, which counts the bytes
            result["configs"][n].update(cache=c, overhead_ms=over)
            print(f"{n:<22}{'(no cache)':>14}{'':>10}{over:>13.1f}")
            continue
        floor_ms = c["bytes_per_step"] / bw * 1000
        result["configs"][n].update(cache=c, floor_ms=floor_ms, overhead_ms=over)
        print(f"{n:<22}{c['bytes_per_step'] / 1e6:>14.1f}{floor_ms:>10.1f}{over:>13.1f}{over / floor_ms:>9.1f}")
    with open(a.json, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwritten {a.json}")


if __name__ == "__main__":
    main()
