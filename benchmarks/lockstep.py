"""``overhead.py``'s step-time ratio with the processes' steps interleaved one by one: every configuration's
process (and no tool's, twice) is alive at once, and each takes one step in turn while the others wait on a pipe.

``overhead.py`` runs one process after another: a configuration's steps and no tool's are seconds apart, and
this machine's speed moves by up to 20 % between them (each round's ratio spread from 0.8 to 1.5 over 40 rounds).
Here a configuration's step and no tool's are one step apart, each in a process of its own (its own heap, threads
and imports, as in ``overhead.py``): each cycle's ratio (the configuration's step over no tool's step of the same
cycle) sees the same machine. The order within a cycle turns by one process every cycle and is reversed every
other, so no process always follows or precedes another. A second process without the tool ("none again") is
measured like the others: its ratio to no tool is this harness's own error, the figure every other ratio is
read against (an A/A check). Each process keeps a speed of its own over a set, so each configuration's ratio is
also given over both no-tool processes (each cycle's mean of their two steps).

    python benchmarks/lockstep.py [--sets 3] [--steps 60] [--warmup 4] [--only "L0 flight;monitor"]
                                  [--baseline DIR]

Each of ``--sets`` sets starts fresh processes (a process's own layout in memory is also a source of spread),
warms them up with ``--warmup`` untimed cycles and times ``--steps`` cycles. Prints, per configuration, the median
of the cycles' ratios with its quartiles, each set's median, and the ratio of the median steps. With ``--baseline
DIR`` (a checkout of another revision with its C extensions built) each configuration also runs with that code,
as "NAME @base", in the same cycles. Steps are timed in wall time by the worker around ``overhead.train_step``.
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
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import native  # noqa: E402
from overhead import BASE_SUFFIX, CONFIGS, _quartiles, code_of, worker_env  # noqa: E402

AGAIN = "none again"
TOOLS = ("none", "ours", "loaded", "msprobe", "msprobe-off")  # what a worker runs as it is (not the zero-code launch)


def work(tool: str, settings: dict, dump: str) -> None:
    """A worker: builds the model, says READY, then runs one timed step per "s" line on stdin and prints its
    seconds, until "q" or the end of stdin."""
    from overhead import gpt2, make_debugger, train_step

    debugger = make_debugger(tool, settings, dump)
    model, opt, ids = gpt2()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "s":
            break
        t0 = time.perf_counter()
        train_step(model, opt, ids, debugger)
        t1 = time.perf_counter()
        print(f"T {t1 - t0!r}", flush=True)


class Proc:
    """One configuration's worker process."""

    def __init__(self, name: str, baseline: str, tmp: str):
        plain, root = code_of(name, baseline)
        tool, settings = CONFIGS["none" if plain == AGAIN else plain]
        dump = os.path.join(tmp, name.replace(" ", "_").replace("@", "at"))
        self.name = name
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", tool, "--settings",
                                   json.dumps(settings), "--dump", dump], env=worker_env(root),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _line(self, prefix: str) -> str:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(prefix):
                return line
        raise SystemExit(f"{self.name}: the worker ended (exit {self.p.wait()})")

    def ready(self) -> None:
        self._line("READY")

    def step(self) -> float:
        assert self.p.stdin is not None
        self.p.stdin.write("s\n")
        self.p.stdin.flush()
        return float(self._line("T ").split()[1])

    def close(self) -> None:
        try:
            assert self.p.stdin is not None
            self.p.stdin.write("q\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait(timeout=120)


def order_of(names: List[str], cycle: int) -> List[str]:
    """The cycle's order: turned by one every cycle, reversed every other cycle."""
    k = cycle % len(names)
    turned = names[k:] + names[:k]
    return turned[::-1] if cycle % 2 else turned


def run_set(names: List[str], steps: int, warmup: int, baseline: str, tmp: str) -> Dict[str, List[float]]:
    """One set of processes: each name's step times (s) over the timed cycles, cycle by cycle."""
    procs = {n: Proc(n, baseline, tmp) for n in names}
    try:
        for p in procs.values():
            p.ready()
        times: Dict[str, List[float]] = {n: [] for n in names}
        for c in range(warmup + steps):
            got = {n: procs[n].step() for n in order_of(names, c)}
            if c >= warmup:
                for n in names:
                    times[n].append(got[n])
        return times
    finally:
        for p in procs.values():
            p.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--only", default="L0 flight;monitor", help="semicolon-separated configuration names")
    ap.add_argument("--baseline", default="", help="a checkout of another revision, its configurations as @base")
    ap.add_argument("--json", default="", help="write the figures here too")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        work(a.worker, json.loads(a.settings), a.dump)
        return
    native.ensure(a.baseline)
    wanted = [x.strip() for x in a.only.split(";") if x.strip() and x.strip() != "none"]
    for n in wanted:
        if n not in CONFIGS:
            raise SystemExit(f"unknown configuration {n!r}; known: {', '.join(CONFIGS)}")
        if CONFIGS[n][0] not in TOOLS:
            raise SystemExit(f"{n}: its tool ({CONFIGS[n][0]}) needs an environment of its own; use overhead.py")
    names = ["none", AGAIN, *wanted]
    if a.baseline:
        a.baseline = os.path.abspath(a.baseline)
        names += [n + BASE_SUFFIX for n in wanted if CONFIGS[n][0] == "ours"]
    ratios: Dict[str, List[float]] = {n: [] for n in names[1:]}
    per_set: Dict[str, List[float]] = {n: [] for n in names[1:]}
    # over both no-tool processes' mean step of the cycle: each process keeps a speed of its own over a set (the
    # A/A's sets differed by up to 6.5 %), and the mean of two independent ones halves that variance in the baseline
    both: Dict[str, List[float]] = {n: [] for n in names[2:]}
    both_set: Dict[str, List[float]] = {n: [] for n in names[2:]}
    steps: Dict[str, List[float]] = {n: [] for n in names}
    tmp = tempfile.mkdtemp(prefix="msprobe_lockstep_")
    try:
        for s in range(a.sets):
            t = run_set(names, a.steps, a.warmup, a.baseline, tmp)
            for n in names:
                steps[n].extend(t[n])
            for n in names[1:]:
                r = [x / y for x, y in zip(t[n], t["none"])]
                ratios[n].extend(r)
                per_set[n].append(statistics.median(r))
            for n in both:
                r = [x / ((y + z) / 2) for x, y, z in zip(t[n], t["none"], t[AGAIN])]
                both[n].extend(r)
                both_set[n].append(statistics.median(r))
            print(f"set {s + 1}/{a.sets}: " + ", ".join(f"{n} {per_set[n][-1]:.3f}" for n in names[1:]),
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(steps["none"])
    result = {"step_ms_none": base * 1e3, "sets": a.sets, "steps": a.steps, "configs": {}}
    print(f"\n{'configuration':<20}{'median step ms':>15}{'ratio of medians':>18}"
          f"{'cycle ratio: median (quartiles)':>34}  each set's median")
    print(f"{'none':<20}{base * 1e3:>15.1f}")
    for n in names[1:]:
        q = _quartiles(ratios[n])
        med = statistics.median(steps[n])
        result["configs"][n] = {"median_ms": med * 1e3, "ratio_of_medians": med / base, "cycle_ratio": q[1],
                                "cycle_quartiles": [q[0], q[2]], "per_set": per_set[n], "cycles": len(ratios[n])}
        print(f"{n:<20}{med * 1e3:>15.1f}{med / base:>18.3f}{f'{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})':>34}  "
              + ", ".join(f"{x:.3f}" for x in per_set[n]))
    print(f"\nover both no-tool processes (each cycle's mean of the two){'':>12}each set's median")
    for n in both:
        q = _quartiles(both[n])
        result["configs"][n].update(cycle_ratio_both=q[1], cycle_quartiles_both=[q[0], q[2]], per_set_both=both_set[n])
        print(f"{n:<20}{'':>33}{f'{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})':>34}  "
              + ", ".join(f"{x:.3f}" for x in both_set[n]))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
