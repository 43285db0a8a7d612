"""Shared helpers for the runtime tests: run a real script in a fresh interpreter, read what it wrote."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSPROBE_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_py(code: str, cwd: str, env: Optional[Dict[str, str]] = None, args=(), timeout: int = 300,
           check: bool = True) -> subprocess.CompletedProcess:
    path = os.path.join(cwd, "script.py")
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(code))
    proc = subprocess.run([sys.executable, path, *args], cwd=cwd, env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"script failed rc={proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def write_config(path: str, **cfg: Any) -> str:
    task = cfg.get("task", "statistics")
    section = {k: cfg.pop(k) for k in ("scope", "list", "data_mode", "summary_mode", "tensor_list", "overflow_nums")
               if k in cfg}
    body = dict(cfg)
    body.setdefault("task", task)
    body[task] = section
    with open(path, "w") as fh:
        json.dump(body, fh)
    return path


def load_dump(dump_path: str, step: int = 0, name: str = "dump.json", rank: str = "*") -> Dict[str, Any]:
    files = sorted(glob.glob(os.path.join(dump_path, f"step{step}", rank, name)))
    listing = os.listdir(dump_path) if os.path.isdir(dump_path) else "missing"
    listing = os.listdir(dump_path) if os.path.isdir(dump_path) else "missing"
    assert files, f"no {name} under {dump_path}/step{step}/{rank}: {listing}"
    with open(files[0]) as fh:
        return json.load(fh)


def rank_dir(dump_path: str, step: int = 0) -> str:
    dirs = sorted(glob.glob(os.path.join(dump_path, f"step{step}", "*")))
    assert dirs, f"no rank dir in {dump_path}/step{step}"
    return dirs[0]


def leaves(value):
    """Every tensor entry in a record body."""
    if isinstance(value, dict):
        if value.get("type") == "torch.Tensor":
            yield value
        else:
            for v in value.values():
                yield from leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from leaves(v)


PREAMBLE = """
import sys, os, json
import torch, torch.nn as nn, torch.nn.functional as F
from msprobe_inject.pytorch import PrecisionDebugger, seed_all, save, module_dump, module_dump_end
seed_all()

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))
"""

TRAIN = """
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(STEPS):
    debugger.start(model=model)
    x = torch.randn(5, 4)
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
"""


def train_script(config_path: str, steps: int = 1, extra_pre: str = "", extra_post: str = "") -> str:
    return (PREAMBLE + extra_pre + f"\ndebugger = PrecisionDebugger(config_path={config_path!r})\n"
            + TRAIN.replace("STEPS", str(steps)) + extra_post)


def run_config(tmp_path, steps=1, extra_pre="", extra_post="", env: Optional[Dict[str, str]] = None, **cfg) -> str:
    """Train the standard script for ``steps`` steps with a config file of ``cfg``; returns the dump path."""
    dump = str(tmp_path / "dump")
    conf = write_config(str(tmp_path / "config.json"), dump_path=dump, **cfg)
    run_py(train_script(conf, steps, extra_pre, extra_post), str(tmp_path), env=env)
    return dump


def ms_env(**extra: str) -> Dict[str, str]:
    """clean_env for MindSpore scripts: its C++ log at errors only."""
    env = clean_env(**extra)
    env["GLOG_v"] = "3"
    return env
