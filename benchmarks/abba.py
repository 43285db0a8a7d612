"""Two ways of the same code compared on alternate steps of one process (ABBA: both see the same machine, memory and
model), and the driver that runs one such process per configuration. Used by ``shared_read.py``,
``record_path.py``, ``cache_key.py`` and ``stack_sig.py``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import native
from overhead import CONFIGS


def timed(f: Callable, slot: List[float], clock: Callable[[], float] = time.perf_counter) -> Callable:
    """f, adding its time on clock (wall time, or time.thread_time: the calling thread's CPU) to slot[0]."""
    def wrapped(*a, **k):
        t0 = clock()
        try:
            return f(*a, **k)
        finally:
            slot[0] += clock() - t0

    return wrapped


def debugger_for(name: str, tmp: str):
    """A PrecisionDebugger of overhead.py's configuration ``name`` (statistics task), dumping under tmp."""
    import msprobe_inject.pytorch as dbg

    settings = CONFIGS[name][1]
    cfg = {"task": "statistics", "statistics": {}, "dump_path": os.path.join(tmp, "dump"), "level": settings["level"],
           **{k: settings[k] for k in ("flight_recorder", "preset") if k in settings}}
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    return dbg.PrecisionDebugger(config_path=path)


def alternate(ways: Tuple[str, str], set_way: Callable[[str], None], step: Callable[[], None],
              slots: Dict[str, List[float]], steps: int, warmup: int) -> dict:
    """Run step() warmup + steps times, the ways in the order A B B A, set_way(way) before each; each slot (a
    one-item list the timed code adds seconds to) is zeroed before each step. The medians in ms per way: "step",
    and each slot's."""
    got: dict = {w: {k: [] for k in ("step", *slots)} for w in ways}
    for i in range(warmup + steps):
        way = (ways[0], ways[1], ways[1], ways[0])[i % 4]
        set_way(way)
        for slot in slots.values():
            slot[0] = 0.0
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        if i >= warmup:
            got[way]["step"].append(t1 - t0)
            for k, slot in slots.items():
                got[way][k].append(slot[0])
    return {w: {k: statistics.median(v) * 1e3 for k, v in d.items()} for w, d in got.items()}


def each_config(script: str, names: str, steps: int, warmup: int,
                extra: Optional[Dict[str, str]] = None) -> Iterator[Tuple[str, dict]]:
    """(name, result) for each of the ';'-separated configuration names: script's worker (``--worker NAME``, printing
    ``RESULT <json>``) in a process of its own, given the extra options."""
    opts = [x for k, v in (extra or {}).items() for x in (f"--{k}", v)]
    for name in names.split(";"):
        proc = subprocess.run([sys.executable, os.path.abspath(script), "--worker", name, "--steps", str(steps),
                               "--warmup", str(warmup), *opts], capture_output=True, text=True, timeout=3600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        yield name, json.loads(line[0][7:])


def cli(script: str, doc: str, run: Callable[..., dict], steps: int, only: str,
        required: Tuple[Tuple[str, str], ...] = ()) -> Optional[Tuple[argparse.Namespace, Iterator[Tuple[str, dict]]]]:
    """The command line these scripts take, with the script's required options (name, help). As a worker (``--worker
    NAME``): run(NAME, steps, warmup, tmp, **options) printed as ``RESULT <json>``, and None. Otherwise the arguments
    and each configuration's (name, result)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--only", default=only)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    for name, text in required:
        ap.add_argument(f"--{name}", required=True, help=text)
    a = ap.parse_args()
    extra = {name: getattr(a, name) for name, _ in required}
    if a.worker:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run(a.worker, a.steps, a.warmup, tmp, **extra)), flush=True)
        return None
    native.ensure(extra.get("baseline"))
    return a, each_config(script, a.only, a.steps, a.warmup, extra)


def report(results: Iterator[Tuple[str, dict]], ways: Tuple[str, str], columns: Tuple[Tuple[str, str], ...],
           ratios: Tuple[str, ...], per: str) -> None:
    """Print each configuration's figures per way (``columns``: (key, format) of each way's result) and the ratios
    ways[1] / ways[0] of the ``ratios`` keys; ``per`` says what the figures are."""
    print(f"{'configuration':<16}{'':>7}" + "".join(f"{k:>9}" for k, _ in columns) + f"   {per}")
    for name, r in results:
        for w in ways:
            print(f"{name if w == ways[0] else '':<16}{w:>7}" + "".join(f"{r[w][k]:>9{fmt}}" for k, fmt in columns))
        cells = ((f"{r[ways[1]][k] / r[ways[0]][k]:>9.3f}" if r[ways[0]][k] else f"{'-':>9}") if k in ratios
                 else f"{'':>9}" for k, _ in columns)
        print(f"{'':<16}{'ratio':>7}" + "".join(cells))
