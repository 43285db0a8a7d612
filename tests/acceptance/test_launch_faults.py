"""Faults through the real launcher: many ranks at once, a rank killed mid-step (recovered at the job's end)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest
from util import clean_env

pytestmark = pytest.mark.e2e


def test_eight_ranks_every_file_parses(tmp_path):
    script = tmp_path / "eight.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist, torch.nn as nn
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        m = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        dist.destroy_process_group()
    """))
    env = clean_env(OMP_NUM_THREADS="1")
    # --async-dump is accepted for msprobe compatibility and ignored: it must not break the job
    proc = subprocess.run([sys.executable, "-m", "msprobe_launch", "--standalone", "--nproc-per-node", "8",
                           "--async-dump", "--level", "mix", "--dump-path", str(tmp_path / "d"), str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jsons = glob.glob(str(tmp_path / "d" / "step*" / "rank*" / "*.json"))
    assert len({os.path.dirname(j) for j in jsons}) == 8 * 3
    for j in jsons:
        with open(j) as fh:
            json.load(fh)
    with open(tmp_path / "d" / "msprobe_manifest.json", encoding="utf-8") as fh:
        assert json.load(fh)["config"]["async_dump"] is True  # accepted and recorded, like msprobe's config


def test_rank_killed_mid_step_is_recovered_by_the_launcher(tmp_path):
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, signal, torch, torch.distributed as dist, torch.nn as nn
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            m(torch.randn(2, 4)).sum().backward()
            if rank == 1 and step == 1:  # at once: every record of the returned calls is journaled already
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step(); opt.zero_grad()
            dist.barrier()
    """))
    proc = subprocess.run([sys.executable, "-m", "msprobe_launch", "--standalone", "--nproc-per-node", "2",
                           "--dump-path", str(tmp_path / "d"), str(script)], cwd=tmp_path,
                          env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "recovered" in proc.stderr, proc.stderr[-3000:]
    d = json.load(open(tmp_path / "d" / "step1" / "rank1" / "dump.json"))
    assert d["incomplete"] is True
    assert "Functional.linear.0.forward" in d["data"] and "Functional.linear.1.backward" in d["data"]
    assert json.load(open(tmp_path / "d" / "step0" / "rank1" / "dump.json"))["data"]
