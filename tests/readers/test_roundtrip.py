"""What the real writer writes, the readers read: records written with msprobe_inject.writer.DumpWriter's typed
events for a PyTorch-style (Module./Functional.) and a MindSpore-style (Cell./Primitive.) job of two ranks and
two steps, read back by the summary (first NaN and its source line), the cross-rank check (module and cell
parameters) and the journal fallback (dump.json removed)."""

from __future__ import annotations

import json
import math
import os

import pytest

from msprobe_inject.writer import Construct, DumpWriter, Merge, Record
from msprobe_readers import ranks, reading, summary

from .reader_util import line_of

NAN = float("nan")
STYLES = {
    "pytorch": {"framework": "pytorch", "api1": "Functional.linear.0", "api2": "Functional.relu.0",
                "module": "Module.fc.Linear", "path": "fc"},
    "mindspore": {"framework": "mindspore", "api1": "Primitive.matmul.MatMul.0", "api2": "Primitive.relu.ReLU.0",
                  "module": "Cell.net.fc.Dense", "path": "net.fc"},
}


def _t(norm: float = 2.0, mean: float = 0.5, shape=(3, 2)) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": 1.0, "Min": -1.0,
            "Mean": mean, "Norm": norm, "requires_grad": False}


def _write_rank(root: str, rank: int, s: dict) -> None:
    """Two steps of one rank; rank 1's api2 output is NaN at step 1 and its weight departs at step 1."""
    w = DumpWriter(lambda pending: None, lambda tensor, path: None, keep_journal=True)
    api1, api2, mod = s["api1"], s["api2"], s["module"]
    for step in range(2):
        d = os.path.join(root, f"step{step}", f"rank{rank}")
        w.open_step(d, {"task": "statistics", "level": "mix", "framework": s["framework"], "dump_data_dir": None,
                        "_root": root})
        weight = 4.0 + step + (0.25 if rank == 1 and step == 1 else 0.0)
        w.send(Merge(f"{mod}.forward.0", {"input_args": [_t(1.0)], "input_kwargs": {}}, None, False))
        w.send(Record(f"{api1}.forward", {"input_args": [_t(1.0), _t(weight)], "input_kwargs": {},
                                          "output": [_t(3.0)]}, None))
        w.stack(f"{api1}.forward", 0)  # marker: api1 stack
        w.send(Construct(f"{api1}.forward", f"{mod}.forward.0"))
        mean = NAN if rank == 1 and step == 1 else 0.25
        w.send(Record(f"{api2}.forward", {"input_args": [_t(3.0)], "input_kwargs": {},
                                          "output": [_t(3.0, mean=mean)]}, None))
        w.stack(f"{api2}.forward", 0)  # marker: api2 stack
        # the module call completes: its outputs and parameters join its inputs, and it moves there
        w.send(Merge(f"{mod}.forward.0", {"output": [_t(3.0, mean=mean)],
                                          "parameters": {"weight": _t(weight), "bias": _t(0.5, shape=(3,))}},
                     None, True))
        w.send(Record(f"{api1}.backward", {"input": [_t(0.1)], "output": [_t(0.2)]}, None))
        w.send(Merge(f"{mod}.parameters_grad.0", {"weight": [_t(0.3)]}, None, False))
        w.send(Merge(f"{mod}.parameters_grad.0", {"bias": [_t(0.4, shape=(3,))]}, None, False))
    w.close()


@pytest.fixture(params=sorted(STYLES))
def job(request, tmp_path):
    s = STYLES[request.param]
    root = str(tmp_path / "dump")
    for rank in range(2):
        _write_rank(root, rank, s)
    return root, s


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals NaN as text


def test_the_readers_read_what_the_writer_wrote(job):
    root, s = job
    api1, api2, mod = s["api1"], s["api2"], s["module"]
    order = [f"{api1}.forward", f"{api2}.forward", f"{mod}.forward.0", f"{api1}.backward", f"{mod}.parameters_grad.0"]
    records = dict(reading.iter_records(os.path.join(root, "step1", "rank1", "dump.json")))
    assert list(records) == order  # execution order; the module record where its call completed
    assert set(records[f"{mod}.forward.0"]) == {"input_args", "input_kwargs", "output", "parameters"}
    assert records[f"{mod}.forward.0"]["parameters"]["weight"]["Norm"] == 5.25
    assert math.isnan(records[f"{api2}.forward"]["output"][0]["Mean"])
    assert records[f"{mod}.parameters_grad.0"] == {"weight": [_t(0.3)], "bias": [_t(0.4, shape=(3,))]}

    rows = summary.summarize(root)
    assert [(r.label, r.steps, r.records, r.incomplete_steps) for r in rows] == [("0", [0, 1], 10, []),
                                                                                ("1", [0, 1], 10, [])]
    assert rows[0].nan is None
    hit = summary.global_first_nan(rows)
    assert (hit.label, hit.step, hit.position, hit.record) == ("1", 1, 1, f"{api2}.forward")
    assert [(p, stat) for p, stat, _ in hit.leaves] == [("output.0", "Mean")]
    assert hit.stack_of == f"{api2}.forward"
    assert (hit.source.file, hit.source.line) == (__file__, line_of(__file__, "marker: api2 stack"))
    # a backward record's source is its forward's; the module tree is the writer's
    assert reading.find_stack(os.path.join(root, "step0", "rank0"), f"{api1}.backward")[0] == f"{api1}.forward"
    assert dict(reading.iter_construct(os.path.join(root, "step0", "rank0"))) == {f"{api1}.forward": f"{mod}.forward.0"}

    checker = ranks.RankChecker()
    summary.summarize(root, on_record=checker.on_record, stacks=False)
    r = checker.finish()
    assert (r.labels, r.steps, r.compared["param"], r.compared["grad"]) == (["0", "1"], [0, 1], 2, 2)
    dep = r.first["1"]
    assert (dep.step, dep.record, dep.kind, dep.leaf, dep.field) == (
        1, f"{mod}.forward.0", "param", "parameters.weight", "Norm")
    assert (dep.param, dep.value, dep.reference) == (f"{s['path']}.weight", 5.25, 5.0)
    assert "0" not in r.first and r.rank_local == []


def test_the_journal_stands_in_for_a_missing_dump_json(job):
    root, s = job
    rank_dir = os.path.join(root, "step1", "rank1")
    written = list(reading.iter_records(os.path.join(rank_dir, "dump.json")))
    os.remove(os.path.join(rank_dir, "dump.json"))
    (proc,) = reading.discover(rank_dir)
    replayed = [(name, value) for _, name, value, _ in reading.iter_proc(proc)]
    assert [n for n, _ in replayed] == [n for n, _ in written] and _same(replayed, written)

    rows = summary.summarize(root)
    assert rows[1].incomplete_steps == [1] and rows[1].records == 10
    assert "dump.journal without dump.json" in rows[1].per_step[1].incomplete
    hit = summary.global_first_nan(rows)
    assert (hit.label, hit.step, hit.position, hit.record) == ("1", 1, 1, f"{s['api2']}.forward")
    assert hit.source.line == line_of(__file__, "marker: api2 stack")  # stack.json is still there
