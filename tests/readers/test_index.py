"""msprobe_readers.index: the Parquet dataset (one row per tensor leaf), incremental indexing, `msprobe-dump index`
and `msprobe-dump sql` (DuckDB), and agreement with the JSON path's summary."""

from __future__ import annotations

import json
import os

import pytest

from msprobe_readers import index, reading, summary
from msprobe_readers import stats as st

from .reader_util import NAN, dump_cli, fwd, leaf, write_dump

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
pytestmark = pytest.mark.json_only  # these tests build and read the index themselves


def _job(root):
    for step in (0, 1):
        for rank in (0, 1):
            data = {
                "Functional.linear.0.forward": fwd(leaf(mx=float(rank + step)), leaf()),
                "Functional.relu.0.forward": fwd(leaf(mx=NAN) if (rank, step) == (1, 1) else leaf()),
                "Module.fc.Linear.parameters_grad.0": {"weight": leaf(norm=3.0), "bias": leaf(norm=1.0)},
                "Distributed.barrier.0.forward": {"input_args": [], "input_kwargs": {}, "output": [None]},
            }
            stack = {"0": [["Functional.linear.0.forward"], ["File train.py, line 3, in f, \n x = lin(y)"]]}
            write_dump(root / f"step{step}" / f"rank{rank}", data, stack=stack)
    write_dump(root / "attempt1" / "step0" / "rank0", {"Functional.linear.0.forward": fwd(leaf())})


def test_the_index_holds_every_leaf_and_agrees_with_the_json_summary(tmp_path):
    dump = tmp_path / "d"
    _job(dump)
    done = index.build(str(dump))
    assert done["directories"] == 5 and done["skipped"] == 0
    cols, rows = index.query(str(dump), "SELECT attempt, step, rank, count(DISTINCT position) FROM records "
                                        "GROUP BY ALL ORDER BY ALL")
    by_json = sorted((s.attempt, row.step, s.rank, row.records) for s in summary.summarize(str(dump))
                     for row in s.per_step)
    assert [tuple(r) for r in rows] == by_json
    _, leaves = index.query(str(dump), "SELECT arg, dtype, shape, max, norm, stack_id, direction FROM records "
                                       "WHERE attempt = 0 AND step = 1 AND rank = 1 ORDER BY position, arg")
    assert leaves[0] == ("input_args.0", "torch.float32", [2], 2.0, 2.0, 0, "forward")
    assert ("bias", "torch.float32", [2], 1.0, 1.0, None, "parameters_grad") in leaves
    assert any(arg is None for arg, *_ in leaves)  # the barrier: a record without tensors still has its row
    _, nan = index.query(str(dump), "SELECT rank, step, record FROM records WHERE isnan(max) ORDER BY ALL")
    first = summary.global_first_nan(summary.summarize(str(dump)))
    assert nan == [(first.rank, first.step, first.record)]
    assert not [name for name in os.listdir(dump) if name.startswith("index")]  # all of it under .msprobe/


def test_indexing_again_reads_only_what_changed(tmp_path):
    dump = tmp_path / "d"
    _job(dump)
    index.build(str(dump))
    assert index.build(str(dump)) == {"directories": 0, "skipped": 5, "rows": 0}
    later = dump / "step1" / "rank0" / "dump.json"
    write_dump(later.parent, {"Functional.add.0.forward": fwd(leaf())})
    os.utime(later, (later.stat().st_atime, later.stat().st_mtime + 5))
    again = index.build(str(dump))
    assert again["directories"] == 1 and again["skipped"] == 4
    _, rows = index.query(str(dump), "SELECT DISTINCT record FROM records WHERE step = 1 AND rank = 0")
    assert rows == [("Functional.add.0.forward",)]


def test_the_cli_indexes_and_queries(tmp_path):
    dump = tmp_path / "d"
    _job(dump)
    proc = dump_cli(["sql", str(dump), "SELECT rank, max(norm) AS n FROM records WHERE attempt = 0 "
                                        "GROUP BY rank ORDER BY rank"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["rank\tn", "0\t3.0", "1\t3.0"]
    proc = dump_cli(["index", str(dump)], tmp_path)
    assert proc.returncode == 0 and "5 up to date" in proc.stdout, proc.stdout + proc.stderr
    proc = dump_cli(["sql", str(dump), "SELECT count(*) AS n FROM records WHERE isnan(max)", "--json"], tmp_path)
    assert json.loads(proc.stdout) == [{"n": 1}]
    proc = dump_cli(["sql", str(dump), "SELECT nope FROM records"], tmp_path)
    assert proc.returncode == 2 and "nope" in proc.stderr


def _records(dump):
    seen = []
    summary.summarize(str(dump), on_record=lambda proc, position, name, value: seen.append(
        (proc.root, proc.step, proc.process, position, name, st.leaves(value))))
    return seen


def test_the_readers_answer_from_an_up_to_date_index_without_parsing_json(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    _job(dump)
    by_json = _records(dump)
    index.build(str(dump))

    def no_json(*args, **kwargs):
        raise AssertionError("a record file was parsed")

    monkeypatch.setattr(reading, "_iter_flagged", no_json)
    by_index = _records(dump)
    assert len(by_index) == 17 and repr(by_index) == repr(by_json)  # repr: NaN equals NaN
    (rank1,) = [s for s in summary.summarize(str(dump)) if s.rank == 1 and s.root == "."]
    assert rank1.first_nan == (1, "Functional.relu.0.forward") and rank1.nan.leaves[0][:2] == ("input_args.0", "Max")


def test_a_directory_changed_since_it_was_indexed_is_read_from_its_json(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    _job(dump)
    index.build(str(dump))
    changed = dump / "step1" / "rank0"
    write_dump(changed, {"Functional.add.0.forward": fwd(leaf(mx=7.0))})
    parsed = []
    plain = reading._iter_flagged
    monkeypatch.setattr(reading, "_iter_flagged", lambda path, *a: parsed.append(path) or plain(path, *a))
    seen = _records(dump)
    assert parsed == [str(changed / "dump.json")]
    assert [(n, leaves[0].stats[0]) for r, step, p, _, n, leaves in seen if (step, p) == (1, "rank0")] == \
        [("Functional.add.0.forward", 7.0)]
    os.remove(changed / "dump.json")  # and a directory whose records are gone is not answered from the index
    assert not [x for x in _records(dump) if (x[1], x[2]) == (1, "rank0")]


def test_the_summary_counts_from_one_pass_over_the_index_and_reads_only_the_first_nan(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    _job(dump)
    by_json = summary.summarize(str(dump))
    index.build(str(dump))
    monkeypatch.setattr(reading, "_iter_flagged", lambda *a: (_ for _ in ()).throw(AssertionError("JSON parsed")))
    reads = []
    plain = index.iter_indexed
    monkeypatch.setattr(index, "iter_indexed", lambda *a, **k: reads.append(k.get("position")) or plain(*a, **k))
    by_index = summary.summarize(str(dump))
    assert reads == [1]  # rank 1's NaN record at step 1, position 1: nothing else is read record by record
    assert repr(by_index) == repr(by_json)


@pytest.mark.parametrize("batch", [1, 2, 3, 7, 100_000])
def test_many_files_in_one_scan_give_each_record_its_leaves_whatever_the_batches(tmp_path, monkeypatch, batch):
    """iter_many reads Arrow batches of BATCH_ROWS rows, and a record's rows may run across two of them: the
    leaves are those of stats.leaves over the record in dump.json, record by record, whatever the batch size."""
    dump = tmp_path / "d"
    _job(dump)
    procs = [p for p in reading.discover(str(dump)) if p.root == "."]
    want = [(i, position, name, st.leaves(value)) for i, p in enumerate(procs)
            for position, name, value, _ in reading.iter_proc(p)]  # from the JSON: there is no index yet
    index.build(str(dump))
    files = [index.fresh_file(p)[0] for p in procs]
    monkeypatch.setattr(index, "BATCH_ROWS", batch)
    got = list(index.iter_many(files, ("true", {})))
    assert repr(got) == repr(want)  # repr: NaN equals NaN
    assert any(not leaves for *_, leaves in got) and any(len(leaves) > 1 for *_, leaves in got)


def test_an_index_file_is_created_without_group_write_and_never_through_a_symlink(tmp_path):
    """The index files are written as every dump file is (files.atomic_file): 0640 from creation, a symlink at
    the temporary path refused rather than followed, and nothing left behind when writing fails."""
    dump = tmp_path / "d"
    _job(dump)
    index.build(str(dump))
    made = [os.path.join(r, f) for r, _, fs in os.walk(index.index_root(str(dump))) for f in fs]
    assert made and all(f.endswith(".parquet") and os.stat(f).st_mode & 0o777 == 0o640 for f in made)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = str(tmp_path / "x.parquet")
    os.symlink(victim, f"{target}.tmp{os.getpid()}")
    with pytest.raises(OSError):
        index._write_tables(target, iter([]))
    assert victim.read_text() == "keep" and not os.path.exists(target)
