"""msprobe_readers.summary: per rank and step, incomplete steps, the first NaN/Inf and its stack; on hand-written
dumps (bare NaN/Infinity tokens, corrupt files, journals), on a real msprobe dump, and on a real 2-rank job
(acceptance 1: rank 1 gets a NaN input at step 1)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from launch_util import ROOT, base_env

from msprobe_readers import summary, text

from .reader_util import (
    LIB,
    NAN,
    SCRIPTS,
    dump_cli,
    e2e,
    first_nonfinite,
    frame,
    fwd,
    launch_script,
    leaf,
    line_of,
    write_dump,
)


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
    """Two ranks over three steps with NaN/Inf in places, a truncated file, an attempt, a duplicate, a proc dir."""
    d = tmp_path / "dump"
    ok = {"Functional.linear.0.forward": {"input_args": [leaf()], "input_kwargs": {}, "output": [leaf()]}}
    _write(d / "step0" / "rank0" / "dump.json", ok)
    _write(d / "step1" / "rank0" / "dump.json", {
        "Functional.linear.0.forward": {"input_args": [leaf()], "input_kwargs": {}, "output": [leaf()]},
        "Functional.relu.0.forward": {"input_args": [leaf()], "input_kwargs": {},
                                      "output": [[leaf(), leaf(mean=NAN)]]},
        "Functional.linear.1.forward": {"input_args": [leaf(mx=float("inf"))], "input_kwargs": {}, "output": []},
    })
    _write(d / "step2" / "rank0" / "dump.json", {"Tensor.add.0.forward": {"output": [leaf(norm=NAN)]}})
    # rank 1: -Infinity in a kwarg at step 0; msprobe's dump_error_info.log has two lines
    _write(d / "step0" / "rank1" / "dump.json", {
        "Torch.matmul.0.forward": {"input_args": [], "input_kwargs": {"other": leaf(mn=float("-inf"))},
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

    table = text.format_table(summary.summarize(dump), dump)
    lines = table.splitlines()
    assert lines[1].split()[:6] == ["rank", "attempt", "steps", "records", "bytes", "errors"]
    assert "step 1  Functional.relu.0.forward" in table and "0-2" in table
    assert "warning: step1/rank1/dump.json: unreadable" in table


def test_nan_detection_rules(tmp_path):
    """The format's rule, as the summary applies it after its text prefilter: only tensor statistics count,
    whether bare tokens or quoted strings."""
    d = tmp_path / "dump"
    cases = {
        "A.scalar.0.forward": {"output": [{"type": "float", "value": NAN}]},  # a scalar, not a tensor leaf
        "A.big.0.forward": {"output": [{"Max": 1e308, "Min": None, "md5": "0000abcd"}]},
        "A.infname.0.forward": {"output": [leaf()], "note": "Inf in a name is no statistic"},
        "A.quoted.0.forward": {"a": {"b": [{"Mean": "NaN"}]}},
        "A.nested.0.forward": [[{"Norm": float("-inf")}]],
    }
    write_dump(d / "step0" / "rank0", cases)
    (row,) = summary.summarize(str(d))
    assert row.per_step[0].first_nan == (3, "A.quoted.0.forward")
    ((path, stat, value),) = row.nan.leaves  # the value as a float, however the dump spells it
    assert (path, stat) == ("a.b.0", "Mean") and isinstance(value, float) and math.isnan(value)
    del cases["A.quoted.0.forward"]
    write_dump(d / "step0" / "rank0", cases)
    (row,) = summary.summarize(str(d))
    assert row.first_nan == (0, "A.nested.0.forward") and row.nan.position == 3


def test_incomplete_steps_from_journal_and_header(tmp_path):
    d = tmp_path / "dump"
    write_dump(d / "step0" / "rank0", {"A.a.0.forward": fwd(leaf())})
    (d / "step0" / "rank0" / "dump.journal").write_text('{"op": "open", "v": {}}\n{"op": "end"}\n')
    # died during step 1: the journal has no end marker
    write_dump(d / "step1" / "rank0", {"A.a.0.forward": fwd(leaf())})
    (d / "step1" / "rank0" / "dump.journal").write_text('{"op": "open", "v": {}}\n{"op": "set", "k": "x", "v": {}}\n')
    # died before dump.json was ever written: records come from the journal, in execution order ("move")
    os.makedirs(d / "step2" / "rank0")
    events = [{"op": "open", "v": {"task": "statistics"}},
              {"op": "set", "k": "Module.m.M.forward.0", "v": {"output": [leaf()]}},
              {"op": "set", "k": "Functional.relu.0.forward", "v": {"output": [leaf(mean=NAN)]}},
              {"op": "move", "k": "Module.m.M.forward.0", "v": {"output": [leaf()]}}]
    (d / "step2" / "rank0" / "dump.journal").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"op": "se')
    # rebuilt after a crash: "incomplete" after data
    write_dump(d / "step3" / "rank0", {"A.a.0.forward": fwd(leaf())})
    raw = (d / "step3" / "rank0" / "dump.json").read_text()
    (d / "step3" / "rank0" / "dump.json").write_text(raw[:-2] + ',\n "incomplete": true\n}')

    (row,) = summary.summarize(str(d))
    status = {s.step: s.incomplete for s in row.per_step}
    assert status[0] is None and "has no end" in status[1] and "without dump.json" in status[2]
    assert "incomplete" in status[3]
    assert row.incomplete_steps == [1, 2, 3]
    assert [s.records for s in row.per_step] == [1, 1, 2, 1]
    assert row.nan.step == 2 and row.nan.position == 0 and row.nan.record == "Functional.relu.0.forward"
    proc = dump_cli(["summary", str(d)], tmp_path)
    assert proc.returncode == 1 and proc.stdout.count("INCOMPLETE") == 3


def test_stack_forms_and_source_line(tmp_path):
    d = tmp_path / "dump"
    user = str(tmp_path / "train.py")
    write_dump(d / "step0" / "rank0", {"Functional.linear.0.forward": fwd(leaf()),
                                       "Functional.linear.0.backward": {"input": [leaf()], "output": [leaf(mx=NAN)]}},
               stack={"0": [["Functional.linear.0.forward"],
                            [frame(LIB, 1, "_call_impl", "return f()"), frame(user, 13, "forward", "y = self.fc(x)"),
                             frame(user, 40, "<module>", "loss = model(x)")]]})
    # msprobe's legacy flat form {record: [frames]}
    write_dump(d / "step0" / "rank1", {"Tensor.add.0.forward": fwd(leaf(norm=float("inf")))},
               stack={"Tensor.add.0.forward": [frame(user, 7, "<module>", "z = x + y")]})
    rows = summary.summarize(str(d))
    r0, r1 = rows
    # a backward record has no stack: its forward's stands for it
    assert r0.nan.record == "Functional.linear.0.backward" and r0.nan.stack_of == "Functional.linear.0.forward"
    assert (r0.nan.source.file, r0.nan.source.line, r0.nan.source.code) == (user, 13, "y = self.fc(x)")
    assert (r1.nan.source.line, r1.nan.leaves) == (7, [("input_args.0", "Norm", float("inf"))])
    # same step: the lower position wins over the lower rank
    first = summary.global_first_nan(rows)
    assert (first.label, first.position) == ("1", 0)
    lines = "\n".join(text.format_hit(r0.nan, "x", frames=-1))
    assert "(torch/nn/modules/module.py:1 in _call_impl)" in lines and f"{user}:40 in <module>" in lines


def test_global_first_orders_by_step_then_position_then_rank(tmp_path):
    d = tmp_path / "dump"
    write_dump(d / "step0" / "rank0", {"A.a.0.forward": fwd(leaf())})
    write_dump(d / "step1" / "rank0", {"A.a.0.forward": fwd(leaf(mx=NAN))})
    write_dump(d / "step0" / "rank3", {"A.a.0.forward": fwd(leaf()), "A.b.0.forward": fwd(leaf(mn=NAN))})
    write_dump(d / "step0" / "rank2", {"A.a.0.forward": fwd(leaf()), "A.c.0.forward": fwd(leaf(mn=NAN))})
    rows = summary.summarize(str(d))
    assert [r.label for r in rows] == ["0", "2", "3"]
    first = summary.global_first_nan(rows)
    assert (first.label, first.step, first.position, first.record) == ("2", 0, 1, "A.c.0.forward")
    # a single dump.json, a rank directory, a step directory
    assert summary.summarize(str(d / "step1" / "rank0" / "dump.json"))[0].first_nan == (1, "A.a.0.forward")
    assert summary.summarize(str(d / "step0" / "rank3"))[0].records == 2
    assert [r.label for r in summary.summarize(str(d / "step0"))] == ["0", "2", "3"]


def test_benchmark_generator_writes_what_json_dump_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_reader", os.path.join(ROOT, "benchmarks", "reader.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "step0" / "rank0" / "dump.json"
    os.makedirs(path.parent)
    bench.write_dump_json(str(path), 50, nan_at=40)
    with open(path) as fh:
        doc = json.load(fh)
    assert path.read_text() == json.dumps(doc, indent=1)
    (row,) = summary.summarize(str(tmp_path))
    assert row.records == 50 and row.nan.position == 40


def test_summary_of_a_real_msprobe_dump(tmp_path):
    pytest.importorskip("msprobe.pytorch", reason="mindstudio-probe not installed")
    script = tmp_path / "ms.py"
    script.write_text(textwrap.dedent("""\
        import torch, torch.nn as nn
        from msprobe.pytorch import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path="./dump", task="statistics", level="L1")
        net = nn.Linear(4, 3)
        for step in range(2):
            debugger.start()
            x = torch.ones(2, 4)
            if step == 1:
                x[0, 0] = float("inf")
            y = torch.nn.functional.relu(net(x))  # the source line
            y.sum().backward()
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
    out = dump_cli(["summary", str(tmp_path / "dump")], tmp_path).stdout
    head = out[out.index("FIRST NaN/Inf OF THE JOB"):].splitlines()
    assert ", step 1, record #" in head[0]
    assert any(f"{script}:10 in <module>" in line for line in head), out


@e2e
def test_summary_names_rank_step_record_and_source_line(tmp_path):
    dump, launched = launch_script(tmp_path, "nan_rank1.py")
    # what the dump holds, read independently with plain json
    assert first_nonfinite(os.path.join(dump, "step0", "rank1", "dump.json")) is None
    position, record = first_nonfinite(os.path.join(dump, "step1", "rank1", "dump.json"))
    assert record.startswith("Functional.linear.0.forward"), record  # fc1's input holds the NaN
    rank0 = first_nonfinite(os.path.join(dump, "step1", "rank0", "dump.json"))
    assert rank0 is not None and rank0[0] > position  # rank 0 sees it later, after the gradient all-reduce
    src = os.path.join(SCRIPTS, "_common.py")
    line = line_of(src, "line marker: fc1")

    proc = dump_cli(["summary", dump], tmp_path)
    assert proc.returncode == 1, proc.stderr  # findings
    out = proc.stdout
    lines = out.splitlines()
    head = next(i for i, text in enumerate(lines) if text.startswith("FIRST NaN/Inf OF THE JOB"))
    assert lines[head] == f"FIRST NaN/Inf OF THE JOB: rank 1, step 1, record #{position} {record}"
    source = next(text for text in lines[head:] if text.strip().startswith("source:"))
    assert f"{src}:{line} in forward" in source and "self.fc1(x)" in source
    assert any("nan_rank1.py" in text and "model(x)" in text for text in lines[head:]), out  # the caller's line
    # per rank: rank 1 first NaN at step 1 in the table; per-step rows with the record
    assert f"rank 1: step 1, record #{position} {record}" in out
    assert f"rank 0: step 1, record #{rank0[0]} {rank0[1]}" in out
    assert any(r.split()[:2] == ["1", "1"] and f"#{position} {record}" in r for r in lines), out

    data = json.loads(dump_cli(["summary", "--json", dump], tmp_path).stdout)
    first = data["first_nan"]
    assert (first["rank"], first["step"], first["position"], first["record"]) == (1, 1, position, record)
    assert first["source"]["file"] == src and first["source"]["line"] == line
    assert {r["label"]: r["first_nan"] for r in data["ranks"]} == {"0": [1, rank0[1]], "1": [1, record]}

    # the launcher's end-of-job output says the same
    assert f"first NaN/Inf of the job: rank 1, step 1, record #{position} {record}" in launched.stdout
    assert f"{src}:{line}" in launched.stdout


@e2e
def test_step_summaries_give_the_same_summary_as_reading_every_record(tmp_path):
    import dataclasses
    import glob
    import json

    from msprobe_inject.dumpformat import paths, stepsummary
    from msprobe_readers import summary as sm_mod

    dump, _ = launch_script(tmp_path, "nan_rank1.py")
    written = sorted(glob.glob(os.path.join(dump, "step*", "rank*", paths.STEP_SUMMARY)))
    assert len(written) == 6  # 2 ranks x 3 steps, each written by its rank at the step's end
    assert all(stepsummary.read(os.path.dirname(p)) is not None for p in written)

    def view(summaries) -> str:
        return json.dumps([dataclasses.asdict(s) for s in summaries], sort_keys=True, default=str)

    fast = sm_mod.summarize(dump)
    for path in written:
        os.unlink(path)
    slow = sm_mod.summarize(dump)
    assert view(fast) == view(slow)
    assert fast[1].nan is not None and fast[1].nan.step == 1 and fast[1].nan.leaves  # rank 1's planted NaN

