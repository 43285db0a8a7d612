"""msprobe_readers.shards: the whole tensor's statistics from the shards the ranks recorded, and diff comparing
sharded tensors whole (a tensor-parallel run against a single-device run)."""

from __future__ import annotations

import math

import pytest

from msprobe_readers import diff, shards, text
from msprobe_readers import stats as st

from .reader_util import fwd, leaf, write_dump

DT = "torch.distributed.tensor.DTensor"


def _piece(mx, mn, mean, norm, shape, placements, mesh):
    return leaf(mx=mx, mn=mn, mean=mean, norm=norm, shape=shape, type=DT, placements=placements,
                device_mesh=mesh)


def _leaf(entry):
    return st.leaves([entry])[0]


def test_combine_shards_replicas_uneven_and_partial():
    mesh = [[0, 1], [2, 3]]  # dp x tp
    rs = [{"Replicate": {}}, {"Shard": {"dim": 0}}]
    pieces = [(0, _leaf(_piece(3.0, -1.0, 1.0, 2.0, (3, 4), rs, mesh))),
              (1, _leaf(_piece(5.0, 0.0, 2.0, 3.0, (1, 4), rs, mesh))),
              (2, _leaf(_piece(3.0, -1.0, 1.0, 2.0, (3, 4), rs, mesh))),  # rank 0's replica: counted once
              (3, _leaf(_piece(5.0, 0.0, 2.0, 3.0, (1, 4), rs, mesh)))]
    g = shards.combine(pieces)
    assert g.complete and (g.pieces, g.expected) == (2, 2)
    mx, mn, mean, norm = g.leaf.stats
    assert (mx, mn, g.leaf.shape) == (5.0, -1.0, (4, 4))
    assert mean == pytest.approx((1.0 * 12 + 2.0 * 4) / 16) and norm == pytest.approx(math.sqrt(13))
    # only rank 0 dumped: the figures of the pieces present, marked incomplete
    assert not shards.combine(pieces[:1]).complete
    partial = shards.combine([(r, _leaf(_piece(1.0, 0.0, 0.5, 1.0, (2,), [{"Partial": {"reduce_op": "sum"}}],
                                                 [0, 1]))) for r in (0, 1)])
    assert partial.partial and not partial.complete and partial.leaf.stats == (None, None, None, None)


def test_diff_compares_a_tensor_parallel_run_whole_against_a_single_device_run(tmp_path):
    a, b = tmp_path / "tp", tmp_path / "single"
    s0 = [{"Shard": {"dim": 0}}]
    write_dump(a / "step0" / "rank0", {"Tensor.add_.0.forward": fwd(_piece(3.0, -1.0, 1.0, 2.0, (2, 4), s0, [0, 1]))})
    write_dump(a / "step0" / "rank1", {"Tensor.add_.0.forward": fwd(_piece(5.0, 0.0, 2.0, 3.0, (2, 4), s0, [0, 1]))})
    whole = dict(mx=5.0, mn=-1.0, mean=1.5, norm=math.sqrt(13), shape=(4, 4))
    write_dump(b / "step0" / "rank0", {"Tensor.add_.0.forward": fwd(leaf(**whole))})
    r = diff.diff_dumps(str(a), str(b), tensors=False)
    assert [p.label for p in r.pairs] == ["0"] and r.first is None, text.format_diff(r, "A", "B")
    assert r.pairs[0].whole == 1
    assert "compared as whole tensors" in text.format_diff(r, "A", "B")
    write_dump(b / "step0" / "rank0", {"Tensor.add_.0.forward": fwd(leaf(**dict(whole, mean=1.25)))})
    r = diff.diff_dumps(str(a), str(b), tensors=False)
    pair, rec = r.first
    assert rec.first_reason.leaf == "input_args.0" and rec.first_reason.reason == "Mean"


def test_summary_shows_whole_tensor_figures(tmp_path):
    from .reader_util import dump_cli

    d = tmp_path / "dump"
    s0 = [{"Shard": {"dim": 0}}]
    write_dump(d / "step0" / "rank0", {"Tensor.add_.0.forward": fwd(_piece(3.0, -1.0, 1.0, 2.0, (2, 4), s0, [0, 1]))})
    write_dump(d / "step0" / "rank1", {"Tensor.add_.0.forward": fwd(_piece(5.0, 0.0, 2.0, 3.0, (2, 4), s0, [0, 1]))})
    proc = dump_cli(["summary", str(d), "--no-progress"], tmp_path)
    assert "whole-tensor figures for 1 (all shards dumped)" in proc.stdout, proc.stdout + proc.stderr
    assert "input_args.0 shape [4,4]: Max=5 Min=-1 Mean=1.5 Norm=3.60555" in proc.stdout, proc.stdout


def test_report_has_the_whole_tensor_section(tmp_path):
    from msprobe_readers import report

    d = tmp_path / "dump"
    s0 = [{"Shard": {"dim": 0}}]
    write_dump(d / "step0" / "rank0", {"Tensor.add_.0.forward": fwd(_piece(3.0, -1.0, 1.0, 2.0, (2, 4), s0, [0, 1]))})
    write_dump(d / "step0" / "rank1", {"Tensor.add_.0.forward": fwd(_piece(5.0, 0.0, 2.0, 3.0, (2, 4), s0, [0, 1]))})
    out = tmp_path / "r.html"
    report.build_report(str(d), str(out))
    page = out.read_text()
    assert "Sharded tensors (whole-tensor figures)" in page and "<td>3.60555</td>" in page and "[4,4]" in page
