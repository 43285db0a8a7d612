"""Helpers for the launcher tests: run msprobe-launch / python in fresh processes, read the boot log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BOOT = os.path.join(ROOT, "msprobe_inject", "_boot")
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
LAUNCH = [sys.executable, "-m", "msprobe_launch"]


def base_env(**extra: str) -> Dict[str, str]:
    """os.environ without MSPROBE_* and without a boot dir, with the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and os.path.abspath(p) not in (BOOT, ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + parts)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run(cmd: Sequence[str], cwd: str, env: Optional[Dict[str, str]] = None, timeout: float = 120,
        check: Optional[int] = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env or base_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check is not None and proc.returncode != check:
        raise AssertionError(f"rc={proc.returncode} (want {check}) for {cmd}\n"
                             f"STDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def launch(args: Sequence[str], cwd: str, env: Optional[Dict[str, str]] = None, timeout: float = 180,
           check: Optional[int] = None) -> subprocess.CompletedProcess:
    return run(LAUNCH + list(args), cwd, env, timeout, check)


def read_log(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pth_installed() -> bool:
    import site
    import sysconfig

    dirs = set(site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]])
    return any(os.path.exists(os.path.join(d, "msprobe_launch.pth")) for d in dirs)


def runtime_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("msprobe_inject.zero_code") is not None
