"""Interpreter start-up cost of the msprobe-launch bootstrap.

Prints the median wall time of ``python -c pass`` (default 20 runs each):

* baseline: no bootstrap on PYTHONPATH, no MSPROBE_* variable;
* inert: the bootstrap directory first on PYTHONPATH, dumping off (what every helper process and
  every interpreter of a job started without MSPROBE_* pays);
* active: the same with MSPROBE_DUMP_PATH set, i.e. a rank before it imports torch (classification
  plus the post-import hook; for information).

The acceptance bound is inert - baseline < 50 ms.  Usage: ``python benchmarks/startup.py [--runs N]``.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOT = os.path.join(ROOT, "msprobe_inject", "_boot")


def _env(boot: bool, dump_path: str = "") -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOT]
    if boot:
        parts.insert(0, BOOT)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if dump_path:
        env["MSPROBE_DUMP_PATH"] = dump_path
    return env


def measure(env: Dict[str, str], runs: int) -> List[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("baseline (no bootstrap)", _env(boot=False)),
            ("inert bootstrap (dumping off)", _env(boot=True)),
            ("active bootstrap, before torch import", _env(boot=True, dump_path=os.path.join(tmp, "d"))),
        ]
        measure(cases[0][1], 3)  # warm the page cache
        medians = {}
        # Interleave the cases so that machine noise hits them alike.
        samples: Dict[str, List[float]] = {name: [] for name, _ in cases}
        for _ in range(args.runs):
            for name, env in cases:
                samples[name] += measure(env, 1)
        for name, _ in cases:
            medians[name] = statistics.median(samples[name])
            print(f"{name:40s} median {medians[name]:7.2f} ms  (min {min(samples[name]):.2f}, n={args.runs})")
    delta = medians[cases[1][0]] - medians[cases[0][0]]
    print(f"{'start-up delta with dumping off':40s}        {delta:+7.2f} ms  (bound: < 50 ms)")
    print(f"{'start-up delta of an active rank':40s}        "
          f"{medians[cases[2][0]] - medians[cases[0][0]]:+7.2f} ms  (before torch is imported)")
    return 0 if delta < 50.0 else 1


if __name__ == "__main__":
    sys.exit(main())
