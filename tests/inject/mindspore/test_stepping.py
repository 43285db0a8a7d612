"""Zero-code MindSpore (mindspore/stepping.py): a 2-worker msrun job through msprobe-launch, and restore()."""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys

import pytest
from util import ROOT, run_py
from util import ms_env as _env

pytest.importorskip("mindspore")




def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RESTORE_SCRIPT = """
import mindspore as ms
from mindspore import mint, nn, ops
from msprobe_inject import config
from msprobe_inject.mindspore import stepping as zero_code
orig = (ops.tanh, mint.mul, ms.Tensor.__add__, nn.Cell.__call__, "__add__" in ms.Tensor.__dict__)
rt = zero_code.activate(config.build_config({"dump_path": "./zc", "level": "mix"}))
assert nn.Cell.__call__ is not orig[3]
net = nn.Dense(2, 2)
net(ms.Tensor([[1.0, 2.0]]))
assert ops.tanh is not orig[0] and ops.tanh.__wrapped__ is orig[0]
zero_code.deactivate()
assert (ops.tanh, mint.mul, ms.Tensor.__add__, nn.Cell.__call__, "__add__" in ms.Tensor.__dict__) == orig
assert type(net.matmul).__name__ == "MatMul" and not hasattr(type(net.matmul), "_msprobe_inject_orig")
print("restored", rt.fw.apis.wrappers.count)
"""


def test_zero_code_msrun_two_workers(tmp_path):
    pytest.importorskip("mindspore.parallel.cluster.run")
    dump = tmp_path / "dump"
    cmd = [sys.executable, "-m", "msprobe_launch", "--engine", "msrun", "--worker_num", "2", "--local_worker_num", "2",
           "--master_port", str(_free_port()), "--log_dir", str(tmp_path / "logs"), "--dump-path", str(dump),
           os.path.join(ROOT, "examples", "train_ms.py"), "--steps", "3"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    logs = "".join(open(f).read()[-2000:] for f in glob.glob(str(tmp_path / "logs" / "*.log")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + logs
    for step in range(3):
        for rank in (0, 1):
            d = dump / f"step{step}" / f"rank{rank}"
            body = json.loads((d / "dump.json").read_text())
            assert body["framework"] == "mindspore" and body["level"] == "L1", body["level"]
            keys = list(body["data"])
            assert any(k.startswith("Primitive.matmul.MatMul.") for k in keys), keys
            assert any(k.startswith("Functional.tanh.") and k.endswith(".backward") for k in keys), keys
            assert any(k.startswith("Mint.mul.") for k in keys), keys
            assert (d / "stack.json").is_file()
            assert not (d / "dump_error_info.log").exists(), (d / "dump_error_info.log").read_text()
    # the loss all_reduce after the optimizer belongs to the next step
    assert "MintDistributed.all_reduce.0.forward" in json.loads((dump / "step1" / "rank1" / "dump.json").read_text())[
        "data"]
    assert not glob.glob(str(dump / "step*" / "proc*")), "a process without rank (e.g. msrun's scheduler) dumped"


def test_wrappers_and_zero_code_hooks_are_restorable(tmp_path):
    proc = run_py(RESTORE_SCRIPT, str(tmp_path), env=_env())
    assert "restored" in proc.stdout
    assert int(proc.stdout.split("restored")[1].split()[0]) > 500
