"""The stack signature's table (_stacksig.Table): the writer's known stacks, looked up by the journal's stack_at from a
walk's words without the signature's bytes."""

import gc
import random
import sys
import weakref

import pytest

stacksig = pytest.importorskip("msprobe_inject._stacksig")


def _down(n, fn):
    if n:
        return _down(n - 1, fn)
    return fn(sys._getframe())  # at every depth the same code and offset: the stacks differ in their depth alone


@pytest.mark.parametrize("seed", range(3))
def test_the_table_holds_what_a_dict_holds_over_any_sequence_of_sets_gets_and_clears(seed):
    """Sets (new keys and replaced values), gets with and without a default and lengths in a random order, two clears,
    past several growths: every answer a dict's."""
    rng = random.Random(seed)
    keys = [stacksig.sig(sys._getframe())] + [rng.randbytes(16 * rng.randrange(1, 40)) for _ in range(3000)]
    keys += [k[:16] for k in keys[:50]] + [bytes(16 * n) for n in range(1, 5)]  # prefixes, zeros: other lengths
    t, d = stacksig.Table(), {}
    for step in range(20_000):
        k = rng.choice(keys)
        r = rng.random()
        if step in (5000, 9000):
            t.clear()
            d.clear()
        elif r < 0.6:
            v = (step, k)
            t[k] = v
            d[k] = v
        else:
            assert t.get(k) is d.get(k) and t.get(k, step) is d.get(k, step)
            if k in d:
                assert t[k] is d[k]
            else:
                with pytest.raises(KeyError):
                    t[k]
        assert len(t) == len(d)
    assert len(d) > 1000  # grown from 64 slots many times
    assert all(t.get(k) is v for k, v in d.items())


def test_a_frames_lookup_finds_what_was_set_under_its_signature_at_any_depth():
    """Table.at(frame) is table.get(sig(frame)): the words of a walk on the C stack, or past its 128 frames in a
    buffer of its own, hashed and compared as the key's bytes were."""
    t = stacksig.Table()
    depths = (0, 5, 126, 127, 128, 129, 300)
    actions = {
        "empty": lambda n: lambda f: t.at(f),  # each a Python function: the same offset in _down's frame
        "set": lambda n: lambda f: t.__setitem__(stacksig.sig(f), ("at", n)),
        "at": lambda n: lambda f: t.at(f),
        "get": lambda n: lambda f: t.get(stacksig.sig(f)),
    }
    got = {}
    for phase in actions:
        for n in depths + (4, 200):
            if phase != "set" or n in depths:
                got[phase, n] = _down(n, actions[phase](n))  # one line: the same stack below _down's frames
    assert {n: got["empty", n] for n in depths} == dict.fromkeys(depths)
    assert {n: got["at", n] for n in depths} == {n: ("at", n) for n in depths}
    assert {n: got["get", n] for n in depths} == {n: ("at", n) for n in depths}
    assert got["at", 4] is got["at", 200] is got["get", 4] is None  # depths never set
    assert t.at(sys._getframe()) is None  # another line


def test_the_table_takes_signatures_only_and_drops_entries_by_clear_alone():
    t = stacksig.Table()
    for bad in ("abc", 16, bytearray(16), b"x" * 15, b"x" * 24):
        with pytest.raises(TypeError):
            t[bad] = 1
        with pytest.raises(TypeError):
            t.get(bad)
    t[b"x" * 16] = 1
    with pytest.raises(TypeError):
        del t[b"x" * 16]
    with pytest.raises(TypeError):
        t.at("not a frame")
    with pytest.raises(TypeError):
        stacksig.Table({})
    assert len(t) == 1 and t.get(b"x" * 16) == 1


def test_a_cycle_through_the_table_is_collected():
    class Value:
        pass

    t = stacksig.Table()
    v = Value()
    v.table = t
    t[stacksig.sig(sys._getframe())] = v
    gone = weakref.ref(v)
    del t, v
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("table", ["Table", "dict"])
def test_stack_at_finds_a_known_stack_in_either_table(tmp_path, monkeypatch, table):
    """writer.stack_at looks a call's stack up in the writer's _stacksig.Table by the walk's words, and in a dict (a
    writer built without the table) by their bytes: False at a stack's first sight (DumpWriter.stack formats it),
    True at every later one from the same line, False from another line, and stack.json the same either way."""
    import json
    import os

    from msprobe_inject import writer
    from msprobe_inject.writer import DumpWriter

    if writer.stack_at is None:
        pytest.skip("the C stack is not built here")
    if table == "dict":
        monkeypatch.setattr(writer, "_StackTable", None)
    w = DumpWriter(lambda pending: None, lambda t, p: None)
    assert type(w._stacks).__name__ == table
    d = str(tmp_path / "step")
    w.open_step(d, {"task": "statistics", "level": "L1", "dump_data_dir": None, "_root": str(tmp_path)})
    answers = []

    def record(key):
        done = writer.stack_at(w, key, 1)
        answers.append(done)
        if not done:
            w.stack(key, 1)

    def site_a(key):
        record(key)

    def site_b(key):
        record(key)

    for i in range(3):
        site_a(f"a{i}")
        site_b(f"b{i}")
    w.close()
    assert answers == [False, False, True, True, True, True]
    with open(os.path.join(d, "stack.json")) as fh:
        got = json.load(fh)
    assert sorted(sorted(keys) for keys, _ in got.values()) == [["a0", "a1", "a2"], ["b0", "b1", "b2"]]
