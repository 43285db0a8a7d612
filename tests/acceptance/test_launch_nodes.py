"""Two nodes on one dump path without an exit barrier (wrapped commands, as msrun): each launcher finishes only
its own node's ranks. Node 1's ranks end their last step 10 s after node 0's launcher has finished; one of
them is killed mid-step and recovered by node 1's launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from launch_util import LAUNCH, base_env, runtime_available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]

RANK = """\
import os, signal, sys, time
import torch
rank = int(os.environ["RANK"])
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    if step == 2 and rank == 2:
        time.sleep(10)  # still writing its last step long after node 0 is done
    if step == 2 and rank == 3:
        time.sleep(12)  # its records reach the journal; then it dies mid-step
        os.kill(os.getpid(), signal.SIGKILL)
    opt.step()
"""


def _node(tmp_path, node, ranks):
    shell = " & ".join(f"RANK={r} {sys.executable} rank.py" for r in ranks) + " & wait"
    env = base_env(GROUP_RANK=str(node))
    return subprocess.Popen(LAUNCH + ["--dump-path", "d", "--run-id", "two-nodes", "--", "sh", "-c", shell],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _header(path):
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return {k: v for k, v in data.items() if k != "data"}, data["data"]


def test_each_node_finishes_only_its_own_ranks(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    dump = tmp_path / "d"
    node1 = _node(tmp_path, 1, (2, 3))
    node0 = _node(tmp_path, 0, (0, 1))
    out0, err0 = node0.communicate(timeout=200)
    node0_done = time.monotonic()
    assert node0.returncode == 0, err0[-3000:]
    # node 0 is done while rank 2 is still in its last step: nothing of node 1 was written by node 0
    assert node1.poll() is None, "node 1 ended too early for the test to mean anything"
    for rank in (2, 3):  # msprobe writes an empty dump.json when a step starts; a "recovery" would mark it
        path = dump / "step2" / f"rank{rank}" / "dump.json"
        assert not path.exists() or _header(path) == ({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                       "dump_data_dir": None}, {}), rank
    assert "recovered" not in err0, err0[-3000:]
    out1, err1 = node1.communicate(timeout=200)
    assert time.monotonic() - node0_done > 3
    for rank in (0, 1, 2):
        for step in (0, 1, 2):
            header, data = _header(dump / f"step{step}" / f"rank{rank}" / "dump.json")
            assert data and "incomplete" not in header, (rank, step)
    header, data = _header(dump / "step2" / "rank3" / "dump.json")  # killed: rebuilt by node 1 from its journal
    assert header.get("incomplete") is True and data
    assert "recovered" in err1 and os.path.join("step2", "rank3") in err1, err1[-3000:]
    # node 0 printed the job's table, node 1 its own ranks' table
    assert "this node's ranks" in out1 and "this node's ranks" not in out0
    manifest = json.loads((dump / "msprobe_manifest.json").read_text())  # node 0's snapshot
    assert manifest["ranks"] == [0, 1, 2, 3] and manifest["run_ids"] == ["two-nodes"]
    from msprobe_inject.dumpformat.manifest import combine

    status = {p["rank"]: p["status"] for p in combine(str(dump))["processes"]}
    assert status == {0: "finished", 1: "finished", 2: "finished", 3: "died"}
