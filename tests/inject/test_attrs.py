"""_attrs.h: an attribute read where an earlier read found it (a slot's offset), the protocol's answer in every case.

Read through ``_apicall.attr``, the header's read as the recorded call's C uses it. Each case reads once (the cache
entry filled), changes something, and reads again: the second answer must be ``getattr``'s."""

from __future__ import annotations

import json

import pytest
from util import PREAMBLE, run_py

_apicall = pytest.importorskip("msprobe_inject.pytorch._apicall")
attr = _apicall.attr
attr_set = _apicall.attr_set


def both(o, name):
    """attr's answer and getattr's, or the exception type each raised."""
    out = []
    for read in (attr, getattr):
        try:
            out.append(read(o, name))
        except AttributeError:
            out.append(AttributeError)
    return out


def test_slot_read_follows_the_value():
    class S:
        __slots__ = ("a", "__dict__")

    s = S()
    s.a, s.b = 1, 2
    for _ in range(3):
        assert both(s, "a") == [1, 1] and both(s, "b") == [2, 2]
    s.a, s.b = "x", "y"
    assert both(s, "a") == ["x", "x"] and both(s, "b") == ["y", "y"]
    del s.a
    assert both(s, "a") == [AttributeError, AttributeError]
    s.a = None
    assert both(s, "a") == [None, None]


def test_another_object_of_the_type():
    class S:
        __slots__ = ("a",)

    one, two = S(), S()
    one.a = 1
    assert attr(one, "a") == 1
    assert both(two, "a") == [AttributeError, AttributeError]
    two.a = 2
    assert both(two, "a") == [2, 2] and attr(one, "a") == 1


def test_a_class_change_is_seen():
    """A property put on the class over a slot it had read: the type's version tag changes, the read follows."""

    class S:
        __slots__ = ("a",)

    s = S()
    s.a = 1
    assert attr(s, "a") == 1
    slot = S.a
    S.a = property(lambda self: "from the property")
    assert both(s, "a") == ["from the property"] * 2
    S.a = slot
    assert both(s, "a") == [1, 1]


def test_a_base_class_change_is_seen():
    class Base:
        __slots__ = ("a", "__dict__")

    class Sub(Base):
        pass

    s = Sub()
    s.a = 1
    assert attr(s, "a") == 1
    Base.a = property(lambda self: 2)
    assert both(s, "a") == [2, 2]


def test_a_subclass_property_wins():
    class Base:
        __slots__ = ("a",)

    class Sub(Base):
        @property
        def a(self):
            return "sub"

    b, s = Base(), Sub()
    b.a = "base"
    for _ in range(2):
        assert both(b, "a") == ["base"] * 2 and both(s, "a") == ["sub"] * 2


def test_instance_dict_and_class_attributes():
    """A plain instance's attributes (its dict, kept inline by the interpreter) and a class attribute: the protocol."""

    class P:
        c = "class"

    p = P()
    p.x = 1
    assert both(p, "x") == [1, 1] and both(p, "c") == ["class"] * 2
    p.c = "instance"
    p.x = 2
    assert both(p, "x") == [2, 2] and both(p, "c") == ["instance"] * 2
    del p.c
    assert both(p, "c") == ["class"] * 2
    P.x = property(lambda self: "prop")
    assert both(p, "x") == ["prop"] * 2


def test_a_dict_at_a_fixed_offset():
    """A function's attributes: its dict at a fixed offset (the type has no attribute of that name): read there."""

    def f():
        pass

    def g():
        pass

    f.x, g.x = 1, 2
    for _ in range(2):
        assert both(f, "x") == [1, 1] and both(g, "x") == [2, 2]
    f.x = "again"
    del g.x
    assert both(f, "x") == ["again"] * 2 and both(g, "x") == [AttributeError, AttributeError]
    assert both(f, "__name__") == ["f", "f"]  # a getset descriptor of the type: the protocol


def test_many_pairs_at_once():
    """Many (type, name) pairs read in turn, more than the cache holds: each answer still getattr's."""
    types = [type(f"T{i}", (), {"__slots__": ("a", "b", "c")}) for i in range(60)]
    objs = []
    for i, T in enumerate(types):
        o = T()
        o.a, o.b, o.c = i, -i, str(i)
        objs.append(o)
    for _ in range(3):
        for i, o in enumerate(objs):
            assert (attr(o, "a"), attr(o, "b"), attr(o, "c")) == (i, -i, str(i))


def test_getattr_hooks_and_other_types():
    class G:
        __slots__ = ("a",)

        def __getattr__(self, name):
            return "hook:" + name

    g = G()
    assert both(g, "a") == ["hook:a"] * 2
    g.a = 1
    assert both(g, "a") == [1, 1]
    assert both(3, "real") == [3, 3]
    assert both(object(), "nope") == [AttributeError, AttributeError]


def test_a_type_gone_and_another_at_its_address():
    """Types made and freed in a loop: a new type takes a freed one's address; its tag is new, so no entry of the old
    type answers for it. The interpreter sorts a type's slots by name, and a type's size follows its number of slots:
    ("a", "z") and ("_", "a") are types of one size (so one takes the other's memory) with `a` at two offsets. A new
    type sits in the collector's youngest generation: collecting the young ones frees it (a full collection over the
    suite's heap took a third of a second per type)."""
    import gc
    layouts: dict = {}  # a type's address -> the layout of the type last made there
    taken = 0
    for i in range(200):
        second = ("z", "_")[i % 2]
        T = type("T", (), {"__slots__": ("a", second)})
        taken += layouts.get(id(T), second) != second  # the other layout's address: the case guarded
        layouts[id(T)] = second
        t = T()
        t.a = i
        setattr(t, second, -i)
        assert attr(t, "a") == i
        del T, t
        gc.collect(1)
    if not taken:  # a memory checker (valgrind, ASan) holds freed memory back: the case never arises
        pytest.skip("no freed type's address was given to a type of the other layout")


def test_a_set_stores_where_the_protocol_would():
    """attr_set, after a read filled the entry: a slot's value stored where both reads find it; an attribute of the
    dict set through the protocol; a READONLY member refused as setattr refuses it; a __setattr__ or a property
    given to the class later used."""
    class S:
        __slots__ = ("a", "__dict__")

    s = S()
    s.a = 1
    assert attr(s, "a") == 1
    attr_set(s, "a", 2)
    assert both(s, "a") == [2, 2]
    attr_set(s, "b", 3)
    assert both(s, "b") == [3, 3]
    r = range(1, 2)  # start: a member whose descriptor refuses a set, on a type with the generic __setattr__
    assert attr(r, "start") == 1
    with pytest.raises(AttributeError):
        attr_set(r, "start", 5)
    assert r.start == 1
    seen = []
    S.__setattr__ = lambda self, name, v: seen.append((name, v))
    attr_set(s, "a", 4)
    assert seen == [("a", 4)] and both(s, "a") == [2, 2]
    del S.__setattr__
    attr_set(s, "a", 5)
    assert both(s, "a") == [5, 5]
    stored = []
    S.a = property(lambda self: "p", lambda self, v: stored.append(v))
    attr_set(s, "a", 6)
    assert stored == [6] and both(s, "a") == ["p", "p"]


def test_the_recorder_objects_keep_their_attributes_in_slots():
    """The objects whose attributes the recorded call reads: those attributes are slots (read at their offsets),
    everything else still settable."""
    from msprobe_inject.entries import EncoderBase
    from msprobe_inject.pytorch.apis import ApiHooks, DumpMode
    from msprobe_inject.pytorch.encode import Encoder
    from msprobe_inject.pytorch.modules import ModuleHooks
    from msprobe_inject.recorder import Recorder
    from msprobe_inject.session import Filters, Session
    from msprobe_inject.writer import DumpWriter

    for cls, names in ((Recorder, ("api_on", "session", "encoder", "writer", "fwd", "bwd", "inp", "outp", "extra",
                                   "construct", "forked", "module_level", "api_suspended", "module_bwd", "params_on",
                                   "pgrads", "token_range")),
                       (Session, ("running", "ended", "filters", "api_counts", "ready_kind", "module_counts",
                                  "pgrad_counts")), (Filters, ("active",)),
                       (ApiHooks, ("rec", "_operators", "_sites", "_backward_c")), (EncoderBase, ("some_files",)),
                       (Encoder, ("_ctx", "_ctx_one", "_entries", "_devices")), (DumpMode, ("hooks", "known")),
                       (ModuleHooks, ("rec", "_named", "_acc")),
                       (DumpWriter, ("stopped", "_blk"))):
        for n in names:
            assert type(cls.__dict__[n]).__name__ == "member_descriptor", (cls, n)
        o = cls.__new__(cls)
        o.anything_else = 1
        assert o.anything_else == 1


MISSES = PREAMBLE + """
from msprobe_inject.dumpformat import _jput
from msprobe_inject.pytorch import _apicall
settings = {"L1": {"level": "L1"}, "mix": {"level": "mix"}, "L0": {"level": "L0"},
            "monitor": {"level": "L0", "preset": "monitor"}, "flight": {"level": "L0", "flight_recorder": 2},
            "md5": {"level": "mix", "statistics": {"summary_mode": "md5"}},
            "no model": {"level": "L1"}}[sys.argv[1]]
with open("config.json", "w") as fh:
    json.dump({"task": "statistics", "dump_path": "d", **settings}, fh)
debugger = PrecisionDebugger(config_path="config.json")
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
misses = []
for step in range(3):
    debugger.start(model=None if sys.argv[1] == "no model" else model)  # no model: no module named
    before = (_apicall.attr_misses(), _jput.attr_misses())
    for _ in range(4):
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()
        opt.step()
        opt.zero_grad()
    debugger.stop()
    debugger.runtime.writer.flush()  # the writer thread's reads of this step's records within its count
    misses.append([_apicall.attr_misses() - before[0], _jput.attr_misses() - before[1]])
    debugger.step()
print("MISSES", json.dumps(misses))
"""


@pytest.mark.parametrize("config", ["L1", "mix", "L0", "monitor", "flight", "md5", "no model"])
def test_a_recorded_call_reads_no_attribute_through_the_protocol(tmp_path, config):
    """Once the first step has filled the caches, no read of the hooks' C nor of the journal's and hand-off's C
    (``_jput``, both threads) goes through the attribute protocol: every attribute they read is a slot (a managed
    instance dict is read through the protocol) and no two of the pairs they read evict each other."""
    out = run_py(MISSES, str(tmp_path), args=(config,)).stdout
    misses = json.loads(out.split("MISSES")[1])  # each step's [_apicall's, _jput's (the journal and hand-off)]
    assert misses[0][0] > 0 and misses[0][1] > 0  # the first step's reads fill the caches
    assert misses[1:] == [[0, 0], [0, 0]]
