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


def test_a_recycled_journal_becomes_the_next_steps_with_nothing_of_the_old_one(tmp_path):
    """A finished step's journal is moved out of its step and zeroed (its allocated, mapped pages kept), then
    becomes the next step's journal: the old step has no journal left, the new one replays only its own."""
    from msprobe_inject.dumpformat import journal, paths

    d0, d1 = tmp_path / "step0", tmp_path / "step1"
    d0.mkdir()
    d1.mkdir()
    jf = journal.JournalFile(str(d0 / paths.JOURNAL), dict(_header(), _step=0), "dump")
    big = {"x": "y" * (2 * journal.JournalFile.CHUNK)}
    assert jf.append(journal.record_frame("set", "Functional.linear.0.forward", big))
    assert jf.put(b"", ("set", "Functional.relu.0.forward", {"output": [1.0]})) and jf.end()
    cap = jf.cap
    spare = str(d0 / f"{paths.SPARE_JOURNAL}{os.getpid()}")
    assert jf.recycle(spare)
    assert os.listdir(d0) == [os.path.basename(spare)]
    assert open(spare, "rb").read().strip(b"\0") == b""  # zeroed: no stale frame can be replayed
    assert jf.reuse(str(d1 / paths.JOURNAL), dict(_header(), _step=1), "dump")
    assert os.listdir(d0) == [] and jf.cap == cap  # no new file, no new allocation
    assert jf.put(b"", ("set", "Functional.relu.0.forward", {"output": [2.0]}))
    records, n, complete = journal.replay(str(d1 / paths.JOURNAL))
    assert dict(records.items()) == {"Functional.relu.0.forward": {"output": [2.0]}}
    assert records.header["_step"] == 1 and n == 1 and complete is False
    jf.close()


def test_the_c_append_writes_what_the_python_append_writes(tmp_path, monkeypatch):
    """put() in one C call (its own marshal writer) and the Python path (marshal.dumps) journal the same
    operations, growth included, for every kind of value a record holds and for those the C writer leaves to
    marshal; a value marshal does not take, or a journal busy on its own thread (a signal handler inside an
    append), appends nothing."""
    from msprobe_inject.dumpformat import journal

    if journal._put is None:
        import pytest

        pytest.skip("the C append is not built here")

    class Num(float):
        pass

    values = {"ascii": "Functional.linear.0.forward", "long": "x" * 300, "text": "résumé ∑ 数据", "empty": "",
              "floats": [1.5, -0.0, float("inf"), float("-inf"), 1e-310, 3.4028234663852886e38],
              "ints": [0, -1, 2**31 - 1, -2**31, 2**31, -2**63, 2**100], "flags": (True, False, None),
              "nested": {"a": [{"b": ((1, 2), [])}], 7: "int key", ("t",): {}}, "big": tuple(range(300)),
              "surrogate": "\udcff", "deep": [1]}
    for _ in range(150):  # deeper than the C writer goes: marshal writes it
        values["deep"] = [values["deep"]]
    nan = {"Max": float("nan")}

    def run(name):
        path = str(tmp_path / name)
        jf = journal.JournalFile(path, _header(), "dump")
        pre = journal.frame(("stackdef", 1, ("File a.py, line 1",))) + journal.frame(("stack", "k", 1))
        assert jf.put(pre, ("set", "k", {"output": [1.5, None, True, "s"]}))
        for key, value in values.items():
            assert jf.put(b"", ("set", key, value))
        assert jf.put(b"", ("set", "nan", nan))
        assert jf.put(b"", ("set", "grow", {"x": "y" * (3 * journal.JournalFile.CHUNK)}))  # past the chunk
        assert jf.append(journal.record_frame("merge", "k", {"output": [2.5]}))
        before = (jf.pos, bytes(jf.mm[:jf.cap]))
        for bad in ({"x": object()}, {"x": [1.0, Num(2.0)]}):
            try:
                jf.put(b"", ("set", "bad", bad))
            except ValueError:
                pass
            else:
                raise AssertionError("marshal took it")
        jf.busy = True
        assert jf.put(b"", ("set", "late", {})) is False
        jf.busy = False
        assert (jf.pos, bytes(jf.mm[:jf.cap])) == before  # nothing written, not even past the end
        jf.end()
        jf.close()
        return list(journal._ops(open(path, "rb").read()))

    fast = run("c.journal")
    monkeypatch.setattr(journal, "_put", None)
    slow = run("py.journal")
    assert repr(fast) == repr(slow) and len(fast) == len(values) + 8  # open, stackdef, stack, k, nan, grow, merge, end
    got = {op[1]: op[2] for op in fast if op[0] == "set"}
    for key, value in values.items():
        assert repr(got[key]) == repr(value), key
        assert type(got[key]) is type(value), key


def test_the_c_frame_reads_back_as_the_python_frame():
    """journal.frame in one C call (the stack and construct frames a recorded call leaves for the next record's
    append) gives frames that decode as marshal.dumps' do, with their length first, a large one through marshal's
    own writer, and ValueError for what marshal does not take."""
    import marshal

    import pytest

    from msprobe_inject.dumpformat import journal

    if journal._cframe is None:
        pytest.skip("the C frame is not built here")

    class Num(float):
        pass

    lines = tuple(f"File train.py, line {i}, in step, \n loss = model(x)  # {i}" for i in range(400))
    ops = [("end",), ("stack", "Module.fc1.Linear.forward.0", 12), ("construct", "Functional.relu.0.forward", None),
           ("construct", "Module.fc1.Linear.backward.0", "Module.fc2.Linear.backward.0"), ("stackdef", 3, lines),
           ("stackdef", 4, ("résumé ∑ 数据", "\udcff")), ("set", "k", {"Max": 1.5, "shape": [4, 4], "n": 2**40})]
    for op in ops:
        got = journal.frame(op)
        assert int.from_bytes(got[:4], "little") == len(got) - 4, op[0]
        assert repr(marshal.loads(got[4:])) == repr(marshal.loads(journal._pyframe(op)[4:])) == repr(op), op[0]
    assert len(journal.frame(ops[4])) > 2048  # past the C writer's buffer
    for bad in (("stack", object(), 1), ("construct", "k", Num(1.0))):
        with pytest.raises(ValueError):
            journal.frame(bad)


def test_the_c_calls_read_and_set_the_journals_attributes_as_the_protocol_does(tmp_path):
    """put() reads the journal's busy, mm and pos and sets pos: at their slots' offsets where a read found them there
    (_attrs.h), through the attribute protocol for a type that asks for it (its own __getattribute__ or
    __setattr__); a value changed between calls is followed either way."""
    import pytest

    from msprobe_inject.dumpformat import _jput, journal

    if getattr(_jput, "put", None) is None:
        pytest.skip("the C append is not built here")

    class Traced(journal.JournalFile):  # its reads go through its own __getattribute__
        __slots__ = ()
        reads: list = []
        on = False

        def __getattribute__(self, name):
            if Traced.on:
                Traced.reads.append(name)
            return super().__getattribute__(name)

    class Logged(journal.JournalFile):  # its sets through its own __setattr__
        __slots__ = ()
        sets: list = []

        def __setattr__(self, name, value):
            Logged.sets.append(name)
            super().__setattr__(name, value)

    header = {"task": "statistics", "dump_data_dir": None}
    for cls in (journal.JournalFile, Traced, Logged):
        jf = cls(str(tmp_path / f"{cls.__name__}.journal"), header, "dump")
        Logged.sets.clear()
        for i in range(3):  # the first read fills the cache entries, the others use them
            start = jf.pos
            Traced.on = True
            appended = _jput.put(jf, b"", ("set", f"k{i}", {"Max": 1.5}))
            Traced.on = False
            assert appended is True and jf.pos > start
        jf.busy = True  # the Python path holds the journal: the C declines, whichever way it reads
        Traced.on = True
        appended = _jput.put(jf, b"", ("set", "k9", 1))
        Traced.on = False
        assert appended is False
        jf.busy = False
        if cls is Logged:
            assert Logged.sets == ["pos"] * 3 + ["busy"] * 2, Logged.sets
        jf.close()
        with open(jf.path, "rb") as fh:
            ops = list(journal._ops(fh.read()))
        assert ops[1:] == [("set", f"k{i}", {"Max": 1.5}) for i in range(3)], ops
    assert Traced.reads == ["busy", "mm", "pos"] * 3 + ["busy"], Traced.reads

    class Late(journal.JournalFile):  # a __setattr__ given after its sets were cached at the slot's offset
        __slots__ = ()

    jf = Late(str(tmp_path / "late.journal"), header, "dump")
    for i in range(3):
        assert _jput.put(jf, b"", ("set", f"k{i}", 1)) is True
    sets: list = []

    def logged(self, name, value):
        sets.append(name)
        journal.JournalFile.__setattr__(self, name, value)

    Late.__setattr__ = logged
    pos = jf.pos
    assert _jput.put(jf, b"", ("set", "k3", 1)) is True and jf.pos > pos
    assert sets == ["pos"], sets
    jf.close()
