"""msprobe_readers.diff: two dumps aligned by record name; on hand-written dumps (saved tensors, a MindSpore
cell) and on two real runs that differ in one layer (acceptance 3)."""

from __future__ import annotations

import csv
import os

import pytest

from msprobe_readers import diff, text

from .reader_util import SCRIPTS, dump_cli, e2e, fwd, launch_script, leaf, line_of, write_dump


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


def test_diff_names_the_enclosing_mindspore_cell(tmp_path):
    for side, norm in (("a", 3.0), ("b", 2.0)):
        write_dump(tmp_path / side / "step0" / "rank0", {
            "Primitive.matmul.MatMul.0.forward": fwd(leaf(norm=norm)),
            "Cell.net.fc.Dense.forward.0": fwd(leaf()),
        }, construct={"Primitive.matmul.MatMul.0.forward": "Cell.net.fc.Dense.forward.0",
                      "Cell.net.fc.Dense.forward.0": "Cell.net.Net.forward.0", "Cell.net.Net.forward.0": None})
    r = diff.diff_dumps(str(tmp_path / "a"), str(tmp_path / "b"), tensors=False)
    pair, rec = r.first
    assert (rec.record, rec.module) == ("Primitive.matmul.MatMul.0.forward", "Cell.net.fc.Dense.forward.0")
    out = text.format_diff(r, "a", "b")
    assert ("FIRST DIFFERENCE: step 0, rank 0, record #0 Primitive.matmul.MatMul.0.forward "
            "(in Cell.net.fc.Dense.forward.0)") in out
    assert any(line.split()[:5] == ["input_args.0", "Norm", "3", "2", "1"] for line in out.splitlines()), out


@e2e
def test_diff_names_the_changed_layer_first(tmp_path):
    a, _ = launch_script(tmp_path / "a", "two_layers.py")
    b, _ = launch_script(tmp_path / "b", "two_layers.py", "--scale", "fc2=1.5")
    out_csv = tmp_path / "diff.csv"
    proc = dump_cli(["diff", a, b, "--csv", str(out_csv)], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    first = next(text for text in lines if text.startswith("FIRST DIFFERENCE:"))
    assert first.startswith("FIRST DIFFERENCE: step 0, rank 0, record #"), first
    assert "(in Module.fc2.Linear.forward.0)" in first and "fc1" not in first and "fc3" not in first
    source = lines[lines.index(first) + 1]
    line = line_of(os.path.join(SCRIPTS, "_common.py"), "x = self.fc2(x)")
    assert source.strip().startswith("source:") and f"_common.py:{line}" in source, source
    # the fc2 weight itself is what differs first: input 1 of the linear call
    assert any(text.split()[:2] == ["input_args.1", "Norm"] for text in lines), proc.stdout

    with open(out_csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    step0 = [r for r in rows if r["step"] == "0" and r["rank_a"] == "0"]
    k = next(i for i, r in enumerate(step0) if r["beyond_tolerance"] == "yes")
    assert step0[k]["record"] in first
    assert k > 0 and all("fc2" not in r["record"] and r["beyond_tolerance"] == "no" for r in step0[:k])
    assert float(step0[k]["Norm_diff"]) != 0.0 and {"cosine", "max_abs_err", "reason"} <= set(step0[k])

    # the same dump: nothing differs
    proc = dump_cli(["diff", a, a], tmp_path)
    assert proc.returncode == 0 and "no record differs beyond tolerance" in proc.stdout
    # two dump.json files named directly
    proc = dump_cli(["diff", os.path.join(a, "step0", "rank1", "dump.json"),
                     os.path.join(b, "step0", "rank1", "dump.json")], tmp_path)
    assert proc.returncode == 1 and "(in Module.fc2.Linear.forward.0)" in proc.stdout
