"""msprobe-dump on hand-written dumps: incomplete steps, stacks, ordering, rank majority, tensors, the report,
the CLI's exit codes, and the benchmark's generator. No launcher, no training run (one optional msprobe run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from launch_util import ROOT, base_env
from reader_util import dump_cli

from msprobe_launch import diff, ranks, summary
from msprobe_launch.htmlreport import build_report

NAN = float("nan")
LIB = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"


def leaf(mx=1.0, mn=-1.0, mean=0.0, norm=2.0, shape=(2,), **extra):
    out = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": mn,
           "Mean": mean, "Norm": norm, "requires_grad": False}
    out.update(extra)
    return out


def write_dump(directory, data, header=None, stack=None, construct=None):
    os.makedirs(directory, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
    doc.update(header or {})
    with open(os.path.join(directory, "dump.json"), "w") as fh:
        json.dump(doc, fh, indent=1)  # bare NaN tokens, as msprobe writes them
    if stack is not None:
        with open(os.path.join(directory, "stack.json"), "w") as fh:
            json.dump(stack, fh, indent=1)
    if construct is not None:
        with open(os.path.join(directory, "construct.json"), "w") as fh:
            json.dump(construct, fh, indent=1)


def fwd(*args):
    return {"input_args": list(args), "input_kwargs": {}, "output": [leaf()]}


def frame(path, line, func, code):
    return f"File {path}, line {line}, in {func}, \n {code}"


# ---- summary ----

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
    assert status[0] is None and "no final" in status[1] and "without dump.json" in status[2]
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
    text = "\n".join(summary.format_hit(r0.nan, "x", frames=-1))
    assert "(torch/nn/modules/module.py:1 in _call_impl)" in text and f"{user}:40 in <module>" in text


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


# ---- ranks ----

def _params(w_norm, b_norm=1.0):
    return {"input_args": [leaf()], "input_kwargs": {}, "output": [leaf()],
            "parameters": {"weight": leaf(norm=w_norm, shape=(3, 2)), "bias": leaf(norm=b_norm, shape=(3,))}}


def _check(path, **kw):
    checker = ranks.RankChecker(**kw)
    summary.summarize(path, on_record=checker.on_record, stacks=False)
    return checker.finish()


def test_ranks_majority_reference_and_rank_local_gradients(tmp_path):
    d = tmp_path / "dump"
    grads = {0: [1.0, 2.0, 3.0], 1: [1.5, 2.5, 3.5], 2: [0.5, 0.7, 0.9]}  # pre-all-reduce: never equal
    for step in range(3):
        for rank in range(3):
            w = 5.0 + step
            if rank == 2 and step == 2:
                w += 0.5  # rank 2 drifts at step 2; ranks 0 and 1 are the majority
            write_dump(d / f"step{step}" / f"rank{rank}", {
                "Module.net.fc.Linear.forward.0": _params(w),
                "Module.net.fc.Linear.parameters_grad.0": {"weight": [leaf(norm=grads[rank][step], shape=(3, 2))]},
                "Tensor.add_.0.forward": fwd(leaf(norm=w, shape=(3, 2)), leaf(norm=0.1 * (rank == 2) + step)),
            }, construct={"Tensor.add_.0.forward": "optimizer", "Module.net.fc.Linear.forward.0": None})
    r = _check(str(d))
    assert r.labels == ["0", "1", "2"] and r.steps == [0, 1, 2]
    assert r.rank_local == ["Module.net.fc.Linear.parameters_grad.0"]
    assert set(r.first) == {"2"}  # the majority decides; rank 0 is not blamed
    dep = r.first["2"]
    # the optimizer record of step 0 departs first (input 1), and names the parameter it updates
    assert (dep.step, dep.record, dep.kind, dep.leaf, dep.param) == (
        0, "Tensor.add_.0.forward", "optimizer", "input_args.1", "net.fc.weight")
    assert r.step_counts[("2", 2)] == 2  # parameter and optimizer record at step 2
    text = ranks.format_result(r)
    assert "rank 0: consistent" in text and "rank 2: DEPARTS at step 0" in text and "rank-local" in text
    # only the parameters: rank 2 departs at step 2, on net.fc.weight
    r = _check(str(d), patterns=[r"^Module\..*\.forward\.0$"], defaults=False)
    assert (r.first["2"].step, r.first["2"].param) == (2, None) and r.first["2"].leaf == "parameters.weight"


def test_ranks_two_ranks_and_grads_that_agree(tmp_path):
    d = tmp_path / "dump"
    for step in range(2):
        for rank in range(2):
            g = 1.0 + step + (0.25 if rank == 1 and step == 1 else 0.0)  # all-reduced, then rank 1 drifts
            write_dump(d / f"step{step}" / f"rank{rank}",
                       {"Module.fc.Linear.parameters_grad.0": {"bias": [leaf(norm=g)], "weight": [leaf(norm=g)]}})
    r = _check(str(d))
    assert r.rank_local == [] and list(r.first) == ["1"]  # no majority with two ranks: rank 0 is the reference
    dep = r.first["1"]
    assert (dep.step, dep.param, dep.reference_label) == (1, "fc.bias", "0")
    assert _check(str(d), rtol=0.5).first == {}


# ---- diff ----

def test_diff_with_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    a, b = tmp_path / "a" / "step0" / "rank0", tmp_path / "b" / "step0" / "rank0"
    for side, base in (("a", a), ("b", b)):
        os.makedirs(base / "dump_tensor_data")
        x = torch.arange(6, dtype=torch.float32)
        y = x.clone()
        if side == "b":
            y[0], y[5] = y[5].item(), y[0].item()  # same statistics, different tensor
        torch.save(x, base / "dump_tensor_data" / "A.a.0.forward.input.0.pt")
        torch.save(y, base / "dump_tensor_data" / "A.b.0.forward.input.0.pt")
        stats = dict(mx=5.0, mn=0.0, mean=2.5, norm=float(x.norm()), shape=(6,))
        write_dump(base, {"A.a.0.forward": {"input_args": [leaf(**stats, data_name="A.a.0.forward.input.0.pt")]},
                          "A.b.0.forward": {"input_args": [leaf(**stats, data_name="A.b.0.forward.input.0.pt")]},
                          **({"A.only.0.forward": fwd(leaf())} if side == "a" else {})})
    out = tmp_path / "d.csv"
    with open(out, "w", newline="") as fh:
        r = diff.diff_dumps(str(tmp_path / "a"), str(tmp_path / "b"), csv_file=fh)
    (pair,) = r.pairs
    assert pair.compared == 2 and pair.only_a == ["A.only.0.forward"] and pair.beyond == 1
    rec = pair.first[0]
    assert rec.record == "A.b.0.forward" and rec.leaves[0].reason == "tensor"
    assert rec.leaves[0].max_abs == 5.0 and 0 < rec.leaves[0].cosine < 1
    rows = out.read_text().splitlines()
    assert rows[0].startswith("step,rank_a,rank_b,position,record,leaf") and len(rows) == 3
    assert rows[1].split(",")[-4:] == ["1.0", "0.0", "no", ""]  # identical tensors: cosine 1, max abs err 0


# ---- report ----

def test_report_of_an_l1_dump_with_nan(tmp_path):
    d = tmp_path / "dump"
    for step in range(2):
        for rank in range(2):
            bad = step == 1 and rank == 1
            write_dump(d / f"step{step}" / f"rank{rank}", {
                "Functional.linear.0.forward": fwd(leaf(mean=NAN if bad else 0.0)),
                "Functional.mse_loss.0.forward": fwd(leaf()),
                "Functional.linear.0.backward": {"input": [leaf()], "output": [leaf(norm=NAN if bad else 1.0 + rank)]},
            })
    html = tmp_path / "r.html"
    info = build_report(str(d), str(html), records=[r"mse_loss"], stats=["Max", "Norm"])
    text = html.read_text()
    assert info["first_nan"].label == "1" and "id='first-nan'" in text
    assert "backward outputs (no parameters_grad: L1 dump)" in text and ">NaN</text>" in text
    assert text.count('<svg class="series"') == 2  # one record, output leaf, two statistics
    assert "<script" not in text


# ---- CLI ----

def test_cli_usage_errors_and_entry_point(tmp_path):
    proc = dump_cli(["summary", str(tmp_path / "missing")], tmp_path)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    os.makedirs(tmp_path / "empty")
    assert dump_cli(["ranks", str(tmp_path / "empty")], tmp_path).returncode == 2
    assert dump_cli(["ranks", "--step", "3-1", str(tmp_path / "empty")], tmp_path).returncode == 2
    assert dump_cli([], tmp_path).returncode == 2
    help_text = dump_cli(["--help"], tmp_path).stdout
    assert all(c in help_text for c in ("summary", "ranks", "diff", "report"))
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        assert 'msprobe-dump = "msprobe_launch.report:main"' in fh.read()


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


def test_summary_of_an_msprobe_dump_names_its_source_line(tmp_path):
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
    out = dump_cli(["summary", str(tmp_path / "dump")], tmp_path).stdout
    head = out[out.index("FIRST NaN/Inf OF THE JOB"):].splitlines()
    assert ", step 1, record #" in head[0]
    assert any(f"{script}:10 in <module>" in line for line in head), out
