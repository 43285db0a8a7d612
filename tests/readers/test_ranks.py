"""msprobe_readers.ranks: cross-rank consistency on hand-written dumps (majority reference, rank-local gradients,
MindSpore cells, duplicate ranks) and on a real 2-rank DDP job (acceptance 2: rank 1 perturbs fc2.weight's
gradient after the all-reduce at step 1)."""

from __future__ import annotations

import json
import math
import os
import random

import pytest

from msprobe_readers import ranks, summary, text
from msprobe_readers import stats as st

from .reader_util import NAN, dump_cli, e2e, fwd, launch_script, leaf, load_data, write_dump


def _params(w_norm, b_norm=1.0):
    return {"input_args": [leaf()], "input_kwargs": {}, "output": [leaf()],
            "parameters": {"weight": leaf(norm=w_norm, shape=(3, 2)), "bias": leaf(norm=b_norm, shape=(3,))}}


def _check(path, **kw):
    """What `msprobe-dump ranks` runs (through the index, only the records it compares); the same as the checker
    over every record of summarize's pass, which the report runs."""
    result = ranks.check_dump(path, ranks.RankChecker(**kw))
    assert repr(result) == repr(_check_every_record(path, **kw))
    return result


def _check_every_record(path, **kw):
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
    out = text.format_ranks(r)
    assert "rank 0: consistent" in out and "rank 2: DEPARTS at step 0" in out and "rank-local" in out
    # only the parameters: rank 2 departs at step 2, on net.fc.weight
    r = _check(str(d), patterns=[r"^Module\..*\.forward\.0$"], defaults=False)
    assert (r.first["2"].step, r.first["2"].param) == (2, None) and r.first["2"].leaf == "parameters.weight"


def test_each_directorys_module_tree_is_read_once(tmp_path, monkeypatch):
    """The optimizer records come from each directory's construct.json: `ranks` reads it once per directory (for
    the index's row filter and for the records alike), and the answer is the same."""
    d = tmp_path / "dump"
    for step in range(3):
        for rank in range(3):
            write_dump(d / f"step{step}" / f"rank{rank}", {
                "Module.net.fc.Linear.forward.0": _params(5.0),
                "Tensor.add_.0.forward": fwd(leaf(norm=5.0, shape=(3, 2)), leaf(norm=0.1 * (rank == 2) + step)),
            }, construct={"Tensor.add_.0.forward": "optimizer", "Module.net.fc.Linear.forward.0": None})
    read = []
    plain = ranks.iter_construct
    monkeypatch.setattr(ranks, "iter_construct", lambda path: read.append(path) or plain(path))
    r = ranks.check_dump(str(d), ranks.RankChecker())
    assert sorted(read) == sorted(str(d / f"step{s}" / f"rank{k}") for s in range(3) for k in range(3))
    assert (r.first["2"].step, r.first["2"].record, r.compared["optimizer"]) == (0, "Tensor.add_.0.forward", 3)


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


def test_ranks_compare_mindspore_cell_parameters(tmp_path):
    """MindSpore L0/mix dumps name modules Cell.*: their parameters and gradients are compared like a Module's."""
    d = tmp_path / "dump"
    for step in range(2):
        for rank in range(2):
            w = 3.0 + step + (0.5 if rank == 1 and step == 1 else 0.0)  # rank 1's weight departs at step 1
            g = 1.0 + (0.5 if rank == 1 and step == 0 else 0.0)  # its bias gradient at step 0
            write_dump(d / f"step{step}" / f"rank{rank}", {
                "Cell.net.fc.Dense.forward.0": _params(w),
                "Primitive.add.Add.0.forward": fwd(leaf()),
                "Cell.net.fc.Dense.parameters_grad.0": {"bias": [leaf(norm=g)]},
            }, header={"framework": "mindspore"})
    r = _check(str(d))
    assert (r.compared["param"], r.compared["grad"]) == (2, 2) and r.counts == {"1": 2}
    dep = r.first["1"]
    assert (dep.step, dep.record, dep.kind, dep.leaf, dep.param) == (
        0, "Cell.net.fc.Dense.parameters_grad.0", "grad", "bias.0", "net.fc.bias")
    dep = _check(str(d), steps={1}).first["1"]
    assert (dep.step, dep.record, dep.kind, dep.leaf, dep.param) == (
        1, "Cell.net.fc.Dense.forward.0", "param", "parameters.weight", "net.fc.weight")
    assert (dep.value, dep.reference, dep.field) == (4.5, 4.0, "Norm")


def test_ranks_leave_out_duplicate_ranks_of_an_attempt(tmp_path):
    """A duplicate rank (a second process claiming rank 0) is no replica, in an attempt as at the top."""
    d = tmp_path / "dump"
    for root in ("attempt1", "attempt1/duplicate_rank0_host_77", "duplicate_rank0_host_12"):
        for rank in (0, 1) if "duplicate" not in root else (0,):
            write_dump(d / root / "step0" / f"rank{rank}",
                       {"Module.fc.Linear.forward.0": _params(9.0 if "duplicate" in root else 2.0)})
    r = _check(str(d))
    assert r.labels == ["0 (attempt1)", "1 (attempt1)"] and r.first == {} and r.notes == []
    assert r.compared["param"] == 1


@e2e
def test_ranks_names_the_perturbed_rank_and_parameter(tmp_path):
    dump, _ = launch_script(tmp_path, "perturb_grad.py")
    # the dump itself: identical fc2 weights on both ranks at step 1, different ones at step 2
    fc2 = "Module.module.fc2.Linear.forward.0"
    w = [[load_data(os.path.join(dump, f"step{s}", f"rank{r}", "dump.json"))[fc2]["parameters"]["weight"]
          for r in (0, 1)] for s in (1, 2)]
    assert w[0][0] == w[0][1] and w[1][0]["Norm"] != w[1][1]["Norm"]

    proc = dump_cli(["ranks", dump], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "rank 0: consistent" in lines, proc.stdout
    rank1 = next(text for text in lines if text.startswith("rank 1:"))
    assert rank1.startswith("rank 1: DEPARTS at step 1,") and "module.fc2.weight" in rank1, rank1
    first = next(text for text in lines if text.startswith("first departure:"))
    assert "rank 1, step 1" in first and "module.fc2.weight" in first and "fc1" not in first
    # pre-all-reduce gradients differ legitimately: reported as rank-local, not as a departure
    assert any("rank-local" in text and "parameters_grad" in text for text in lines)

    data = json.loads(dump_cli(["ranks", "--json", dump], tmp_path).stdout)
    assert list(data["first"]) == ["1"]
    dep = data["first"]["1"]
    assert (dep["step"], dep["param"], dep["reference_label"]) == (1, "module.fc2.weight", "0")
    assert dep["kind"] in ("optimizer", "param")

    # a tolerance wider than the perturbation hides it
    proc = dump_cli(["ranks", "--rtol", "10", dump], tmp_path)
    assert proc.returncode == 0 and "no rank departs" in proc.stdout
    # --pattern: each rank's loss input comes from its own data, so rank 1 departs at step 0
    proc = dump_cli(["ranks", "--no-defaults", "--pattern", r"^Functional\.mse_loss\.0\.forward$", dump], tmp_path)
    assert proc.returncode == 1
    assert "rank 1: DEPARTS at step 0" in proc.stdout and "Functional.mse_loss.0.forward" in proc.stdout


def _dt(mx, placements, mesh, shape=(2,)):
    return leaf(mx=mx, shape=shape, type="torch.distributed.tensor.DTensor", device_mesh=mesh, placements=placements)


def test_ranks_compares_only_replicas_of_the_same_shard(tmp_path):
    """A 2x2 mesh [[0, 1], [2, 3]], data parallel along dim 0, tensor parallel along dim 1: a [Replicate, Shard(0)]
    optimizer record is the same on ranks 0 and 2 and on ranks 1 and 3, and differs between 0 and 1."""
    d = tmp_path / "dump"
    mesh = [[0, 1], [2, 3]]
    rs = [{"Replicate": {}}, {"Shard": {"dim": 0}}]
    for rank in range(4):
        tp = rank % 2
        shard_max = 10.0 + tp + (0.5 if rank == 3 else 0.0)  # rank 3 departs from its replica, rank 1
        write_dump(d / "step0" / f"rank{rank}", {
            "Tensor.add_.0.forward": fwd(_dt(shard_max, rs, mesh), _dt(7.0, [{"Replicate": {}}] * 2, mesh)),
            "Tensor.add_.1.forward": fwd(_dt(20.0 + tp, rs, mesh)),  # shards differ, replicas agree
        }, construct={"Tensor.add_.0.forward": "optimizer", "Tensor.add_.1.forward": "optimizer"})
    r = _check(str(d))
    assert set(r.first) == {"3"}, {k: text.describe_departure(v) for k, v in r.first.items()}
    dep = r.first["3"]
    assert (dep.record, dep.leaf, dep.reference_label) == ("Tensor.add_.0.forward", "input_args.0", "1")
    assert r.counts["3"] == 1


def test_ranks_sharded_tensors_on_a_1d_mesh_are_not_compared(tmp_path):
    d = tmp_path / "dump"
    for rank in range(2):
        write_dump(d / "step0" / f"rank{rank}", {
            "Tensor.__iadd__.0.forward": fwd(_dt(1.0 + rank, [{"Shard": {"dim": 0}}], [0, 1])),
        }, construct={"Tensor.__iadd__.0.forward": "optimizer"})
    r = _check(str(d))
    assert r.first == {} and r.shard_leaves == 1
    assert "only replicas of the same shard are compared" in text.format_ranks(r)


def test_ranks_missing_statistic_is_reported_not_a_difference(tmp_path):
    d = tmp_path / "dump"
    for rank in range(2):
        missing = rank == 1
        entry = leaf(mx=None if missing else 3.0, mn=None if missing else 1.0, mean=None if missing else 2.0,
                     norm=None if missing else 4.0, **({"error": "RuntimeError: boom"} if missing else {}))
        write_dump(d / "step0" / f"rank{rank}", {"Tensor.__iadd__.0.forward": fwd(entry)},
                   construct={"Tensor.__iadd__.0.forward": "optimizer"})
    r = _check(str(d))
    assert r.first == {}
    assert r.missing_count == 1 and r.missing[0].label == "1" and r.missing[0].reason == "RuntimeError: boom"
    out = text.format_ranks(r)
    assert "rank 1: consistent" in out and "missing" in out and "RuntimeError: boom" in out


def _reference_by_elements(checker, leafsets, paths):
    """The reference rank as ranks.py chose it element by element before it compared columns (the oracle)."""
    n = len(leafsets)
    if n <= 2:
        return 0
    scores = [0] * n
    for path in paths:
        shapes = [ls[path].shape for ls in leafsets]
        common = max(dict.fromkeys(shapes), key=shapes.count)  # the first seen of the most common
        for i, s in enumerate(shapes):
            scores[i] += s != common
        for j in range(len(st.STATS)):
            vals = [ls[path].stats[j] for ls in leafsets]
            finite = [v for v in vals if v is not None and not math.isnan(v)]
            med = st.median(finite) if len(finite) * 2 > n else math.nan
            for i, v in enumerate(vals):
                scores[i] += not st.close(math.nan if v is None else v, med, checker.rtol, checker.atol)
    return min(range(n), key=lambda i: (scores[i], i))


@pytest.mark.json_only
def test_the_reference_over_columns_is_the_element_by_element_one():
    rng = random.Random(7)
    pool = [0.0, 1.0, 1.0 + 1e-7, 1.1, -1.0, 2.0, 1e308, NAN, math.inf, -math.inf, None]
    checker = ranks.RankChecker()
    for _ in range(3000):
        n = rng.randint(3, 9)
        paths = [f"output.{k}" for k in range(rng.randint(1, 3))]
        leafsets = [{p: st.Leaf(p, "torch.float32", rng.choice([(2,), (2,), (3,)]),
                                tuple(rng.choice(pool) for _ in st.STATS), None, None) for p in paths}
                    for _ in range(n)]
        columns = [st.Column([ls[p] for ls in leafsets]) for p in paths]
        assert checker._reference(columns) == _reference_by_elements(checker, leafsets, paths)


def test_a_rank_without_records_in_a_step_is_not_one_of_its_ranks(tmp_path):
    """As the checker over every record has it: a directory joins its step with its first record. Two ranks
    with the gradient and one empty: the step has two ranks, and nothing is reported for the empty one."""
    d = tmp_path / "dump"
    for rank in (0, 1):
        write_dump(d / "step0" / f"rank{rank}", {"Module.fc.Linear.parameters_grad.0": {"weight": leaf(norm=2.0)}})
    write_dump(d / "step0" / "rank2", {})
    r = _check(str(d))
    assert r.labels == ["0", "1"] and r.compared["grad"] == 1


class _ElementChecker(ranks.RankChecker):
    """The comparison as ranks.py made it rank by rank and leaf by leaf before it compared columns (the oracle)."""

    def _compare(self, root, step, name, kind, present, columns, paths, refs):
        leafsets = [{path: columns[path].leaves[i] for path in paths} for i in range(len(present))]
        departed = compared = 0
        agree_ref = None
        labels = []
        for i, p in enumerate(present):
            checked = False
            for path in paths:
                ref = refs.get(path, {}).get(i)
                if ref is None or ref == i:
                    continue
                checked = True
                a, b = leafsets[i][path], leafsets[ref][path]
                reason = st.missing_reason(a, b)
                if reason is not None:
                    self._missing(p, present[ref], step, name, path, a, b, reason)
                why = st.leaf_mismatch(a, b, self.rtol, self.atol, skip_missing=True)
                if why is None:
                    continue
                departed += 1
                dep = ranks.Departure(
                    label=p.proc.label, rank=p.proc.rank, root=root, step=step, position=p.records[name][0],
                    record=name, kind=kind, leaf=path, field=why, value=st.field_value(a, why),
                    reference=st.field_value(b, why), reference_label=present[ref].proc.label,
                    param=self._param_name(name, kind, path, present[ref]), ranks=len(present))
                if kind == "grad":
                    self._grad_deps.setdefault(name, {}).setdefault(dep.label, dep)
                    labels.append(dep.label)
                else:
                    self._add(dep)
                break
            else:
                if checked:
                    agree_ref = next((refs[q][i] for q in paths if i in refs.get(q, {})), 0)
            compared += checked
        if kind == "grad":
            self._grad_step_counts.append((name, step, labels))
        if kind == "grad" and compared and not departed:
            ref = agree_ref if agree_ref is not None else 0
            finite = any(v is not None and math.isfinite(v) for path in paths for v in leafsets[ref][path].stats)
            self._grad_agree[name] = self._grad_agree.get(name, False) or finite
        elif kind == "grad":
            self._grad_agree.setdefault(name, False)


@pytest.mark.json_only
def test_the_comparison_over_columns_is_the_rank_by_rank_one():
    """Random records over random ranks (statistics missing, NaN, infinite, near and far; shapes, dtypes, md5;
    DTensor shards on a 2-d mesh): the checker finds what the rank-by-rank comparison finds, to the repr."""
    rng = random.Random(11)
    pool = [0.0, 1.0, 1.0 + 1e-7, 1.1, -1.0, 1e308, -1e308, NAN, math.inf, -math.inf, None]
    names = ["Module.fc.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0",
             "Module.fc.Linear.forward.0", "Functional.adam.0.forward"]
    for trial in range(300):
        n = rng.randint(2, 9)
        procs = [ranks.ProcDir(".", 0, step, f"rank{r}", r, f"/nowhere/step{step}/rank{r}")
                 for step in range(2) for r in range(n)]
        checkers = [ranks.RankChecker(patterns=["adam"]), _ElementChecker(patterns=["adam"])]
        base = {}
        for proc in procs:
            for position, name in enumerate(names):
                if rng.random() < 0.1:
                    continue
                leaves = []
                for k in range(rng.randint(1, 3)):
                    path = ("parameters.weight" if "forward.0" in name and k == 0 else f"output.{k}")
                    key = (proc.step, name, path)
                    stats = base.setdefault(key, tuple(rng.choice(pool) for _ in st.STATS))
                    if rng.random() < 0.4:  # this rank departs here, or lacks a statistic
                        stats = tuple(rng.choice(pool) if rng.random() < 0.5 else v for v in stats)
                    sharded = rng.random() < 0.2
                    leaves.append(st.Leaf(
                        path, rng.choice(["torch.float32"] * 9 + ["torch.bfloat16"]),
                        rng.choice([(2,)] * 9 + [(3,)]), stats, rng.choice([None, None, "ab", "cd"]), None,
                        (("S", 0), ("R",)) if sharded else None, ((2, 4), tuple(range(8))) if sharded else None,
                        rng.choice([None, None, "not recorded"])))
                for checker in checkers:
                    checker.on_leaves(proc, position, name, list(leaves))
        got, want = (c.finish() for c in checkers)
        assert repr(got) == repr(want), trial
