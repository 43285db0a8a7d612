"""msprobe_launch.summary on hand-written dump directories (bare NaN/Infinity tokens, corrupt files) and on a
real msprobe dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from launch_util import base_env

from msprobe_launch import summary


def _leaf(mx=1.0, mn=-1.0, mean=0.0, norm=2.0):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": mx, "Min": mn, "Mean": mean,
            "Norm": norm, "requires_grad": False}


def _write(path, data, raw=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        if raw is not None:
            fh.write(raw)
        else:
            # json.dump writes NaN/Infinity as bare tokens, exactly as msprobe does (indent=1)
            json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                       "data": data}, fh, indent=1)


@pytest.fixture()
def dump(tmp_path):
    d = tmp_path / "dump"
    ok = {"Functional.linear.0.forward": {"input_args": [_leaf()], "input_kwargs": {}, "output": [_leaf()]}}
    _write(d / "step0" / "rank0" / "dump.json", ok)
    _write(d / "step1" / "rank0" / "dump.json", {
        "Functional.linear.0.forward": {"input_args": [_leaf()], "input_kwargs": {}, "output": [_leaf()]},
        "Functional.relu.0.forward": {"input_args": [_leaf()], "input_kwargs": {},
                                      "output": [[_leaf(), _leaf(mean=float("nan"))]]},
        "Functional.linear.1.forward": {"input_args": [_leaf(mx=float("inf"))], "input_kwargs": {}, "output": []},
    })
    _write(d / "step2" / "rank0" / "dump.json", {"Tensor.add.0.forward": {"output": [_leaf(norm=float("nan"))]}})
    # rank 1: -Infinity in a kwarg at step 0; msprobe's dump_error_info.log has two lines
    _write(d / "step0" / "rank1" / "dump.json", {
        "Torch.matmul.0.forward": {"input_args": [], "input_kwargs": {"other": _leaf(mn=float("-inf"))},
                                   "output": [None, {"type": "int", "value": 3}]}})
    (d / "step0" / "rank1" / "dump_error_info.log").write_text("error one\nerror two\n")
    # rank 1, step 1: truncated in the middle of the third record
    good = ('{\n "task": "statistics",\n "level": "L1",\n "data": {\n  "A.a.0.forward": {"output": [{"Max": 1}]},\n'
            '  "A.b.0.forward": {"output": []},\n  "A.c.0.forward": {"output": [{"Max": ')
    _write(d / "step1" / "rank1" / "dump.json", None, raw=good)
    os.makedirs(d / "step1" / "rank1" / "dump_tensor_data")
    (d / "step1" / "rank1" / "dump_tensor_data" / "x.pt").write_bytes(b"\0" * 1000)
    # an elastic restart and a duplicate rank, as msprobe-launch lays them out
    _write(d / "attempt1" / "step0" / "rank0" / "dump.json", ok)
    _write(d / "duplicate_rank0_host_123" / "step0" / "rank0" / "dump.json", ok)
    # a plain single process dump and things that are not dumps
    _write(d / "step0" / "proc4242" / "dump.json", {})
    (d / "step0" / "notarank").mkdir()
    (d / ".msprobe").mkdir()
    return str(d)


def _by_label(rows):
    return {r.label: r for r in rows}


def test_summary_table_contents(dump):
    rows = _by_label(summary.summarize(dump))
    assert list(rows) == ["0", "1", "proc4242", "0 (duplicate_rank0_host_123)", "0 (attempt1)"]
    r0 = rows["0"]
    assert r0.steps == [0, 1, 2] and r0.records == 5 and r0.errors == 0
    assert r0.first_nan == (1, "Functional.relu.0.forward")  # execution order, not alphabetical
    r1 = rows["1"]
    assert r1.steps == [0, 1]
    assert r1.first_nan == (0, "Torch.matmul.0.forward")
    assert r1.records == 1 + 2  # the two complete records before the damage still count
    assert r1.errors == 2 + 1  # two log lines, one unreadable file
    assert r1.bytes > 1000 and any("unreadable" in p for p in r1.problems)
    assert rows["0 (attempt1)"].attempt == 1 and rows["0 (attempt1)"].first_nan is None
    assert rows["proc4242"].rank is None and rows["proc4242"].records == 0

    table = summary.format_table(summary.summarize(dump), dump)
    lines = table.splitlines()
    assert lines[1].split()[:6] == ["rank", "attempt", "steps", "records", "bytes", "errors"]
    assert "step 1  Functional.relu.0.forward" in table and "0-2" in table
    assert "warning: step1/rank1/dump.json: unreadable" in table


def test_streaming_reader_agrees_with_json_at_any_chunk_size(dump, monkeypatch):
    path = os.path.join(dump, "step1", "rank0", "dump.json")
    with open(path) as fh:
        expected = list(json.load(fh)["data"].items())
    for chunk in (1, 3, 7, 64):
        monkeypatch.setattr(summary, "_CHUNK", chunk)
        got = list(summary.iter_records(path))
        assert [k for k, _ in got] == [k for k, _ in expected]
        assert json.dumps(got) == json.dumps(expected)
    monkeypatch.setattr(summary, "_CHUNK", 5)
    assert _by_label(summary.summarize(dump))["0"].first_nan == (1, "Functional.relu.0.forward")


def test_nan_detection_rules():
    assert summary.has_nan_or_inf({"Max": float("nan")})
    assert summary.has_nan_or_inf([[{"Norm": float("-inf")}]])
    assert summary.has_nan_or_inf({"a": {"b": [{"Mean": "NaN"}]}})
    assert not summary.has_nan_or_inf({"type": "float", "value": float("nan")})  # a scalar, not a tensor leaf
    assert not summary.has_nan_or_inf({"Max": 1e308, "Min": None, "md5": "0000abcd"})


def test_module_entry_point_and_json(dump, tmp_path):
    env = base_env()
    proc = subprocess.run([sys.executable, "-m", "msprobe_launch.summary", dump], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0 and "Functional.relu.0.forward" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "msprobe_launch.summary", "--json", dump], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path))
    data = json.loads(proc.stdout)
    assert data[0]["label"] == "0" and data[0]["first_nan"] == [1, "Functional.relu.0.forward"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "msprobe_launch.summary", str(empty)], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1 and "no step" in proc.stdout


def test_summary_of_a_real_msprobe_dump(tmp_path):
    pytest.importorskip("msprobe.pytorch", reason="mindstudio-probe not installed")
    script = tmp_path / "ms.py"
    script.write_text(textwrap.dedent("""\
        import torch, torch.nn as nn, torch.nn.functional as F
        from msprobe.pytorch import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path="./dump", task="statistics", level="L1")
        net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        torch.manual_seed(0)
        for step in range(2):
            debugger.start()
            x = torch.randn(2, 4)
            if step == 1:
                x[0, 0] = float("nan")
            F.relu(net(x)).sum().backward()
            debugger.stop()
            debugger.step()
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=base_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = summary.summarize(str(tmp_path / "dump"))
    assert len(rows) == 1 and rows[0].process.startswith("proc") and rows[0].steps == [0, 1]
    assert rows[0].records > 2
    step, name = rows[0].first_nan
    assert step == 1 and name.endswith(".forward")
