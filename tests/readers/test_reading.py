"""msprobe_readers.reading, the layer every analysis reads through: discovery, the streaming record reader,
a rank directory's records (journal fallback, damaged files), construct.json and stack.json."""

from __future__ import annotations

import json
import os

import pytest

from msprobe_readers import reading

from .reader_util import LIB, NAN, frame, fwd, leaf, write_dump


def test_discover_the_layouts_of_both_writers(tmp_path):
    d = tmp_path / "dump"
    for rel in ("step1/rank1", "step0/rank1", "step0/rank0", "step0/proc42", "attempt1/step0/rank0",
                "attempt1_host_9/step0/rank3", "duplicate_rank0_h_5/step0/rank0",
                "attempt1/duplicate_rank1_h_6/step0/rank1", "step0/rank"):
        write_dump(d / rel, {"A.a.0.forward": fwd(leaf())})
    (d / "step0" / "notarank").mkdir()
    (d / "stepx" / "rank0").mkdir(parents=True)
    (d / ".msprobe" / "step0" / "rank0").mkdir(parents=True)
    found = [(p.root, p.attempt, p.step, p.process, p.rank, p.duplicate) for p in reading.discover(str(d))]
    assert found == [
        (".", 0, 0, "rank0", 0, False), (".", 0, 0, "rank1", 1, False), (".", 0, 0, "proc42", None, False),
        (".", 0, 0, "rank", None, False), (".", 0, 1, "rank1", 1, False),
        ("duplicate_rank0_h_5", 0, 0, "rank0", 0, True),
        ("attempt1", 1, 0, "rank0", 0, False), ("attempt1_host_9", 1, 0, "rank3", 3, False),
        (os.path.join("attempt1", "duplicate_rank1_h_6"), 1, 0, "rank1", 1, True),
    ]
    # one step directory, one rank directory, one file
    assert [p.process for p in reading.discover(str(d / "step0"))] == ["rank0", "rank1", "proc42", "rank"]
    (one,) = reading.discover(str(d / "step1" / "rank1"))
    assert (one.step, one.rank, one.file) == (1, 1, None)
    (one,) = reading.discover(str(d / "step1" / "rank1" / "dump.json"))
    assert (one.step, one.rank, one.file, one.label) == (1, 1, str(d / "step1" / "rank1" / "dump.json"), "1")
    assert reading.discover(str(tmp_path / "missing")) == []


def test_streaming_reader_agrees_with_json_at_any_chunk_size(tmp_path, monkeypatch):
    data = {"Functional.linear.0.forward": fwd(leaf(), leaf(mx=float("inf"))),
            "Functional.relu.0.forward": {"input_args": [leaf()], "output": [[leaf(), leaf(mean=NAN)]]},
            'A.\\"quoted\\".0.forward': {"output": [{"type": "int", "value": 12345678901234567890}]},
            "Tensor.add.0.forward": {"output": [leaf(norm=-1.5e-300)]}}
    write_dump(tmp_path, data)
    path = str(tmp_path / "dump.json")
    with open(path) as fh:
        expected = list(json.load(fh)["data"].items())
    for chunk in (1, 3, 7, 64):
        monkeypatch.setattr(reading, "CHUNK", chunk)
        got = list(reading.iter_records(path))
        assert [k for k, _ in got] == [k for k, _ in expected]
        assert json.dumps(got) == json.dumps(expected)
        # the NaN/Inf prefilter flags exactly the records whose text holds a non-finite token
        (proc,) = reading.discover(path)
        flags = [suspect for _, _, _, suspect in reading.iter_proc(proc)]
        assert flags == [True, True, False, False], chunk


def test_records_of_a_damaged_file_and_of_a_journal(tmp_path):
    d = tmp_path / "step0" / "rank0"
    write_dump(d, {"A.a.0.forward": fwd(leaf()), "A.b.0.forward": fwd(leaf())}, header={"incomplete": True})
    raw = (d / "dump.json").read_text()
    (d / "dump.json").write_text(raw[: raw.index('"A.b.0.forward"') + 30])
    (proc,) = reading.discover(str(tmp_path))
    errors, header = [], {}
    got = [(pos, name) for pos, name, _, _ in reading.iter_proc(proc, lambda f, e: errors.append((f, e)), header)]
    assert got == [(0, "A.a.0.forward")] and errors[0][0] == str(d / "dump.json")
    assert isinstance(errors[0][1], ValueError) and header["task"] == "statistics"
    assert "incomplete" not in header  # it followed "data", after the damage
    assert reading.incomplete_reason(proc, header) is None

    # no dump.json: the journal's records, with members merged (journal version 2) and moved records last
    os.remove(d / "dump.json")
    events = [{"op": "open", "v": {"task": "statistics", "_kind": "dump", "_journal": 2}},
              {"op": "set", "k": "Module.m.M.forward.0", "v": {"input_args": [leaf()]}},
              {"op": "merge", "k": "Module.m.M.parameters_grad.0", "v": {"weight": [leaf(norm=3.0)]}},
              {"op": "merge", "k": "Module.m.M.parameters_grad.0", "v": {"bias": [leaf(norm=NAN)]}},
              {"op": "move", "k": "Module.m.M.forward.0", "v": {"output": [leaf(mx=5.0)]}}]
    (d / "dump.journal").write_text("".join(json.dumps(e) + "\n" for e in events))
    got = [(pos, name, value, suspect) for pos, name, value, suspect in reading.iter_proc(proc)]
    assert [(pos, name) for pos, name, _, _ in got] == [(0, "Module.m.M.parameters_grad.0"),
                                                       (1, "Module.m.M.forward.0")]
    assert set(got[0][2]) == {"weight", "bias"} and got[0][2]["weight"][0]["Norm"] == 3.0
    assert got[1][2]["output"][0]["Max"] == 5.0 and "input_args" in got[1][2] and got[1][3] is True
    assert reading.incomplete_reason(proc, {}) == "dump.journal without dump.json (the process died before writing it)"
    assert reading.error_lines(str(d)) == 0 and reading.tree_bytes(str(d)) == os.path.getsize(d / "dump.journal")


def test_stacks_and_construct(tmp_path):
    user = str(tmp_path / "train.py")
    frames = [frame(LIB, 1, "_call_impl", "return f()"), frame(user, 13, "forward", "y = self.fc(x)")]
    write_dump(tmp_path, {}, stack={"0": [["Cell.net.fc.Dense.forward.0", "Cell.net.fc.Dense.forward.1"], frames],
                                    "1": [["Primitive.add.Add.0.forward"], [frame(user, 20, "f", "z = x + y")]]},
               construct={"Primitive.add.Add.0.forward": ["Cell.net.fc.Dense.forward.0", 3],
                          "Cell.net.fc.Dense.forward.0": None})
    assert list(reading.iter_construct(str(tmp_path))) == [
        ("Primitive.add.Add.0.forward", "Cell.net.fc.Dense.forward.0"), ("Cell.net.fc.Dense.forward.0", None)]
    # backward and parameters_grad records stand in with their forward's stack, for cells as for modules
    assert reading.find_stack(str(tmp_path), "Cell.net.fc.Dense.backward.1") == ("Cell.net.fc.Dense.forward.1", frames)
    assert reading.find_stack(str(tmp_path), "Cell.net.fc.Dense.parameters_grad.0")[0] == "Cell.net.fc.Dense.forward.0"
    assert reading.find_stack(str(tmp_path), "Primitive.add.Add.0.backward")[1][0].endswith("z = x + y")
    assert reading.find_stack(str(tmp_path), "Primitive.mul.Mul.0.forward") == (None, [])
    assert reading.find_stack(str(tmp_path / "nowhere"), "Primitive.add.Add.0.forward") == (None, [])
    src = reading.user_frame(frames)
    assert (src.file, src.line, src.func, src.code) == (user, 13, "forward", "y = self.fc(x)")
    assert reading.user_frame([frames[0]]).file == LIB and reading.user_frame(["not a frame"]) is None
    assert reading.is_library_file(LIB) and not reading.is_library_file(user)


@pytest.mark.parametrize("root, duplicate", [(".", False), ("attempt2", False), ("duplicate_rank0_h_1", True),
                                             (os.path.join("attempt2", "duplicate_rank0_h_1"), True)])
def test_duplicate_roots(root, duplicate):
    assert reading.is_duplicate_root(root) is duplicate
