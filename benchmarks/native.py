"""The C++ node hooks (``msprobe_inject/pytorch/_nodehook.cpp``) built before a script measures.

The launcher builds them into the user's cache before a job's ranks start; a benchmark run with ``python`` does not,
and where they are not built every recorded call's backward hook goes through torch's Python API: on a machine whose
cache is new, ``instructions.py`` counted an L1 call at 120,080 instructions over no tool with them missing and
~78,000 with them built. Each script that times or counts the hooks calls ``ensure`` for its own code and for
``--baseline DIR``'s (whose source, when it differs, has a binary of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure(baseline: Optional[str] = None) -> bool:
    """Build the node hooks of this checkout, and of ``baseline``'s when given, unless they are in the cache, as
    ``python -m msprobe_inject.nodehook`` does; a line on stderr for each that cannot be, and False."""
    return all([_build(root) for root in (ROOT, baseline) if root])


def _build(root: str) -> bool:
    root = os.path.abspath(root)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "msprobe_inject.nodehook"], cwd=root, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = proc.stdout.strip().splitlines()
    if proc.returncode != 0:
        print(f"node hooks of {root} not built, figures are torch's Python hooks': {said[-1] if said else ''}",
              file=sys.stderr, flush=True)
        return False
    if said and not said[-1].startswith("built before"):
        print(said[-1], file=sys.stderr, flush=True)
    return True
