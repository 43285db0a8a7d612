"""The journal (dumpformat/journal.py): what the writer journaled rebuilds the same documents."""

from __future__ import annotations

import json
import os


def test_journal_alone_rebuilds_the_step(tmp_path):
    """What the writer journaled (repeated stacks by reference, merged updates) rebuilds the same files."""
    from msprobe_inject.dumpformat import journal
    from msprobe_inject.dumpformat.journal import recover
    from msprobe_inject.writer import Construct, DumpWriter, Merge, Record

    d = str(tmp_path / "step0" / "rank0")
    w = DumpWriter(lambda pending: None, lambda t, p: None, keep_journal=True)
    w.open_step(d, {"task": "statistics", "level": "mix", "dump_data_dir": None, "_root": str(tmp_path)})
    sites = {"linear": lambda key: w.stack(key, 0),
             "relu": lambda key: w.stack(key, 0)}  # two call sites, each seen three times
    for i in range(3):
        for api, site in sites.items():
            key = f"Functional.{api}.{i}.forward"
            site(key)
            w.send(Record(key, {"input_args": [{"type": "int", "value": i}], "input_kwargs": {}}, None))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"weight": [{"type": "float", "value": 1.5}]}, None, False))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"bias": [{"type": "float", "value": float("nan")}]}, None,
                 False))
    w.send(Construct("Functional.linear.0.forward", None))
    w.close()
    written = {n: open(os.path.join(d, n)).read() for n in ("dump.json", "stack.json", "construct.json")}
    ops = [op[0] for op in journal._ops(open(os.path.join(d, "dump.journal"), "rb").read())]
    assert ops.count("stackdef") == 2 and ops.count("stack") == 6  # each distinct stack's text once
    for n in written:
        os.remove(os.path.join(d, n))
    assert recover(d) == {"records": 8, "complete": True}  # 6 records and 2 merged gradients
    for n, text in written.items():
        assert open(os.path.join(d, n)).read() == text, n
    stacks = json.loads(written["stack.json"])
    assert sorted(len(v[0]) for v in stacks.values()) == [3, 3]
    grads = json.loads(written["dump.json"])["data"]["Module.fc.Linear.parameters_grad.0"]
    assert grads["weight"][0]["value"] == 1.5 and grads["bias"][0]["value"] != grads["bias"][0]["value"]


def _header():
    return {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}


def test_a_journal_left_by_a_killed_process_replays_up_to_its_last_whole_frame(tmp_path):
    """Not closed (the process died): the mapped file ends in zeros; an append cut short by the kill left its
    first frame's length zero, so it is not there at all."""
    from msprobe_inject.dumpformat import journal

    path = str(tmp_path / "dump.journal")
    jf = journal.JournalFile(path, _header(), "dump")
    for i in range(3):
        assert jf.append(journal.record_frame("set", f"Functional.relu.{i}.forward", {"output": [i]}))
    torn = journal.record_frame("set", "Functional.relu.3.forward", {"output": [3]})
    jf.mm[jf.pos + 4:jf.pos + len(torn) - 5] = torn[4:-5]  # the copy of the frame had begun, its length not yet
    assert os.path.getsize(path) >= journal.JournalFile.CHUNK  # zeros after the frames
    records, n, complete = journal.replay(path)
    assert [k for k, _ in records.items()] == [f"Functional.relu.{i}.forward" for i in range(3)]
    assert n == 3 and complete is False and journal.state(path) == (False, False)
    jf.end()
    assert journal.state(path) == (True, False) and journal.replay(path)[2] is True
    jf.append(journal.FINAL)
    jf.close()
    assert journal.state(path) == (True, True)
    assert os.path.getsize(path) == len(open(path, "rb").read().rstrip(b"\0"))  # closed: cut to its length


def test_an_append_interrupted_on_its_own_thread_is_not_overwritten(tmp_path):
    """A signal handler running on the training thread in the middle of an append appends nothing, and the
    interrupted frame stays whole."""
    from msprobe_inject.dumpformat import journal

    path = str(tmp_path / "dump.journal")
    jf = journal.JournalFile(path, _header(), "dump")
    jf.busy = True  # what the handler sees: an append of its own thread under way
    assert jf.append(journal.record_frame("set", "Functional.relu.9.forward", {})) is False and jf.failed is None
    jf.busy = False
    assert jf.append(journal.record_frame("set", "Functional.relu.0.forward", {"output": [1.5]}))
    assert [k for k, _ in journal.replay(path)[0].items()] == ["Functional.relu.0.forward"]


def test_a_reopened_step_gets_a_new_file_and_the_old_mapping_stays_valid(tmp_path):
    """The same step directory opened again by the process: the old journal is unlinked, never truncated (a
    mapping of a truncated file faults), and growing it further is safe; the new journal is on its own."""
    from msprobe_inject.dumpformat import journal

    path = str(tmp_path / "dump.journal")
    old = journal.JournalFile(path, _header(), "dump")
    new = journal.JournalFile(path, _header(), "dump")
    big = journal.record_frame("set", "Functional.linear.0.forward", {"x": "y" * (3 * journal.JournalFile.CHUNK)})
    assert old.append(big) and old.cap >= 3 * journal.JournalFile.CHUNK
    old.unlink_if_mine()  # the path names the new journal now: kept
    old.close()
    assert new.append(journal.record_frame("set", "Functional.relu.0.forward", {}))
    assert [k for k, _ in journal.replay(path)[0].items()] == ["Functional.relu.0.forward"]
    new.unlink_if_mine()
    assert not os.path.exists(path)
    new.close()


def test_version_2_journals_are_still_read(tmp_path):
    from msprobe_inject.dumpformat import journal

    path = tmp_path / "dump.journal"
    path.write_text('{"op": "open", "v": {"task": "statistics"}}\n{"op": "set", "k": "a", "v": {"x": 1}}\n'
                    '{"op": "end"}\n')
    records, n, complete = journal.replay(str(path))
    assert dict(records.items()) == {"a": {"x": 1}} and n == 1 and complete and journal.state(str(path)) == (True, True)
