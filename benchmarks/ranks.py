"""Many ranks of one job on one shared dump path: what the tool adds to a job's start and end.

    python benchmarks/ranks.py [--ranks 1024] [--parallel 32] [--rounds 1] [--coord-only]

One parent that has already imported torch and the tool forks ``--ranks`` children, ``--parallel`` running
at a time (a machine that runs 32 ranks at once). Each child is a rank (``RANK`` set): it creates a
``PrecisionDebugger`` on the shared dump path, dumps one tiny forward/backward at L1, calls ``step()`` and
exits through atexit, as a real rank does. The same children run once more without the tool. Printed: the
job's wall time with and without the tool, each rank's own time (p50/p99/max) and, inside it, the time spent
in coordination (``coord``'s claim, register and finish; wall and CPU time, since 32 processes on 2 cores make
any rank's wall time ~16x its CPU time) from the same run. ``--coord-only`` times only
coord's calls per rank (no torch, no dump). The figures go to ``benchmarks/README.md``; nothing here is a test.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

COORD_CALLS = ("resolve_process_root", "manifest_register", "manifest_finish")
_coord_seconds = [0.0, 0.0]  # wall, CPU of the calling thread


def _timed(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _coord_seconds[0] += time.perf_counter() - t0
            _coord_seconds[1] += time.thread_time() - c0

    return wrapper


def _instrument_coord() -> None:
    from msprobe_inject import coord

    for name in COORD_CALLS:
        setattr(coord, name, _timed(getattr(coord, name)))


def _rank_with_tool(dump: str, rank: int) -> None:
    import torch

    from msprobe_inject.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=dump, level="L1")
    model = torch.nn.Linear(8, 4)
    debugger.start(model=model, rank_id=rank)
    model(torch.ones(2, 8)).sum().backward()
    debugger.stop()
    debugger.step()


def _rank_without_tool(dump: str, rank: int) -> None:
    import torch

    model = torch.nn.Linear(8, 4)
    model(torch.ones(2, 8)).sum().backward()


def _rank_coord_only(dump: str, rank: int) -> None:
    from msprobe_inject import coord

    root = coord.resolve_process_root(dump, rank)
    coord.manifest_register(dump, rank=rank, root=root, config={"level": "L1"})
    coord.manifest_finish(dump, rank=rank, root=root, steps=[0], status="finished")


def _child(body: Callable[[str, int], None], dump: str, rank: int, out: int) -> None:
    code = 0
    t0 = time.perf_counter()
    try:
        os.environ["RANK"] = str(rank)
        body(dump, rank)
        import atexit

        atexit._run_exitfuncs()  # a rank ends through atexit: the tool's end of process is part of its time
    except BaseException:
        code = 1
    took = time.perf_counter() - t0
    os.write(out, f"{rank} {took:.6f} {_coord_seconds[0]:.6f} {_coord_seconds[1]:.6f}\n".encode())
    os._exit(code)


def run_job(body: Callable[[str, int], None], dump: str, ranks: int,
            parallel: int) -> Tuple[float, List[float], List[float], List[float], int]:
    """(wall time, per-rank times, per-rank coordination wall and CPU times, failed ranks) of one simulated job."""
    # an O_APPEND file, not a pipe: thousands of lines would fill a pipe the parent reads only at the end
    results = dump.rstrip(os.sep) + ".times"
    write_end = os.open(results, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
    running: Dict[int, int] = {}
    failed = 0
    t0 = time.perf_counter()
    for rank in range(ranks):
        while len(running) >= parallel:
            pid, status = os.wait()
            failed += os.waitstatus_to_exitcode(status) != 0
            running.pop(pid, None)
        pid = os.fork()
        if pid == 0:
            _child(body, dump, rank, write_end)
        running[pid] = rank
    while running:
        pid, status = os.wait()
        failed += os.waitstatus_to_exitcode(status) != 0
        running.pop(pid, None)
    wall = time.perf_counter() - t0
    os.close(write_end)
    with open(results, encoding="utf-8") as fh:
        rows = [line.split() for line in fh.read().splitlines() if line.strip()]
    return wall, [float(r[1]) for r in rows], [float(r[2]) for r in rows], [float(r[3]) for r in rows], failed


def _pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _describe(values: List[float]) -> Dict[str, float]:
    return {"p50": statistics.median(values) if values else float("nan"), "p99": _pct(values, 0.99),
            "max": max(values) if values else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--parallel", type=int, default=32)
    ap.add_argument("--coord-only", action="store_true")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() in the parent before forking")
    ap.add_argument("--dir", default=None, help="where the dump path is made (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=1, help="jobs with and without the tool, alternating, R times")
    a = ap.parse_args()
    os.environ.setdefault("MSPROBE_RUN_ID", "bench-ranks")
    import importlib.metadata  # noqa: F401  (torch imports it: a real rank has it before its first record)

    if not a.coord_only:
        import torch  # noqa: F401  (the parent has imported torch and the tool, as a launcher's fork would)

        import msprobe_inject.pytorch  # noqa: F401
    import msprobe_inject.coord  # noqa: F401  (a rank imports it at its first record; here the parent has)
    _instrument_coord()
    if a.gc_freeze:
        import gc

        gc.freeze()  # what fork servers do: a child's collections no longer touch (and copy) the parent's objects
    result: Dict[str, object] = {"ranks": a.ranks, "parallel": a.parallel, "coord_only": a.coord_only}
    # not a TemporaryDirectory: its atexit finalizer would run in every child (each one runs atexit)
    tmp = tempfile.mkdtemp(dir=a.dir)
    try:
        if a.coord_only:
            wall, per, coord_t, coord_cpu, failed = run_job(_rank_coord_only, os.path.join(tmp, "d"), a.ranks,
                                                            a.parallel)
            result.update(wall_s=wall, failed=failed, rank_s=_describe(per))
        else:
            # rounds alternate which job goes first, so that a machine's load drifting over the run weighs on
            # both; each round's ratio is printed, and the medians are the figures
            walls: List[float] = []
            bases: List[float] = []
            per, base_per, coord_t, coord_cpu = [], [], [], []
            failed = 0
            for rnd in range(a.rounds):
                for with_tool in ((False, True) if rnd % 2 == 0 else (True, False)):
                    if with_tool:
                        if os.path.isdir(os.path.join(tmp, "d")):
                            shutil.rmtree(os.path.join(tmp, "d"))
                        wall, p, ct, cc, f = run_job(_rank_with_tool, os.path.join(tmp, "d"), a.ranks, a.parallel)
                        walls.append(wall)
                        per += p
                        coord_t += ct
                        coord_cpu += cc
                    else:
                        shutil.rmtree(os.path.join(tmp, "none"), ignore_errors=True)
                        wall, p, _, _, f = run_job(_rank_without_tool, os.path.join(tmp, "none"), a.ranks,
                                                   a.parallel)
                        bases.append(wall)
                        base_per += p
                    failed += f
                print(f"round {rnd + 1}: {walls[-1]:.1f} s with the tool, {bases[-1]:.1f} s without "
                      f"({walls[-1] / bases[-1]:.2f}x)", flush=True)
            ratios = [w / b for w, b in zip(walls, bases)]
            result.update(wall_s=statistics.median(walls), wall_without_s=statistics.median(bases),
                          ratio=statistics.median(ratios), ratios=ratios, failed=failed, rank_s=_describe(per),
                          rank_without_s=_describe(base_per))
        result["coord_s"] = _describe(coord_t)
        result["coord_cpu_s"] = _describe(coord_cpu)
        dump = os.path.join(tmp, "d")
        result["dumped_ranks"] = sum(1 for e in os.scandir(os.path.join(dump, "step0"))) \
            if os.path.isdir(os.path.join(dump, "step0")) else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r = result
    if a.coord_only:
        print(f"{a.ranks} ranks, {a.parallel} at a time, coord only: job {r['wall_s']:.1f} s")
    else:
        print(f"{a.ranks} ranks, {a.parallel} at a time, medians of {a.rounds} round(s): job {r['wall_s']:.1f} s "
              f"with the tool, {r['wall_without_s']:.1f} s without; ratio {r['ratio']:.2f}x")
        w = r["rank_without_s"]
        print(f"per rank without the tool: p50 {w['p50'] * 1000:.0f} ms, p99 {w['p99'] * 1000:.0f} ms")
    t, c, cc = r["rank_s"], r["coord_s"], r["coord_cpu_s"]
    print(f"per rank with the tool: p50 {t['p50'] * 1000:.0f} ms, p99 {t['p99'] * 1000:.0f} ms, "
          f"max {t['max'] * 1000:.0f} ms")
    print(f"coordination per rank: p50 {c['p50'] * 1000:.1f} ms, p99 {c['p99'] * 1000:.1f} ms, "
          f"max {c['max'] * 1000:.1f} ms; its CPU time p50 {cc['p50'] * 1000:.1f} ms, p99 {cc['p99'] * 1000:.1f} ms, "
          f"max {cc['max'] * 1000:.1f} ms; failed ranks {r['failed']}; rank dirs of step0 {r['dumped_ranks']}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
