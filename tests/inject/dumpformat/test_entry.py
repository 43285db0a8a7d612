"""A tensor's entry held as C values (_jenc.Entry): the journal's C writes the marshal stream of its dict and the JSON
encoder its dict's text, byte for byte; Python reads it as that dict; the non-finite walks see its figures. Here its
text and frames are checked against its dict's (as_dict); that dict against the Python encoder's, for every summary
mode, the monitor's and broadcast tensors, in tests/inject/pytorch/test_encode_fast.py."""

from __future__ import annotations

import json
import marshal
import math
import random
import struct
import subprocess
import sys

import pytest

from msprobe_inject.dumpformat import encoding, journal
from msprobe_inject.dumpformat.entry import MAPPINGS, plain
from msprobe_inject.dumpformat.nonfinite import _walk, has_nonfinite

jenc = pytest.importorskip("msprobe_inject.dumpformat._jenc")
STATS, MD5, XOR, NORM = 0, 1, 2, 3


def _float(rng: random.Random) -> float:
    if rng.random() < 0.2:
        return rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e16, 0.1, -1.5])
    return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]


def _entries(rng: random.Random, n: int):
    for _ in range(n):
        kind = rng.choice([STATS, MD5, XOR, NORM])
        scalar = rng.random() < 0.2
        shape = () if scalar else tuple(rng.choice([0, 1, 3, 4096, 2**31 - 1, 2**31, 2**40, -7])
                                        for _ in range(rng.randint(1, 4)))
        figs = tuple(_float(rng) for _ in range(4))
        yield jenc.entry(rng.choice(["torch.Tensor", "mindspore.Tensor"]), rng.choice(["torch.float32", "x\u00e9"]),
                         shape, figs, kind, rng.getrandbits(64 if kind == XOR else 32), rng.random() < 0.5, scalar)


def _same(a, b) -> bool:
    return repr(a) == repr(b)  # a NaN figure is never equal to itself


def test_an_entry_is_the_dict_it_stands_for():
    e = jenc.entry("torch.Tensor", "torch.float32", (4, 4), (1.5, -2.0, 0.1, 3.25), MD5, 0xDEADBEEF, True, False)
    d = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 1.5, "Min": -2.0, "Mean": 0.1,
         "Norm": 3.25, "requires_grad": True, "md5": "deadbeef"}
    assert e.as_dict() == d and list(d) == list(e.as_dict())  # the dicts' key order
    assert e == d and d == e and not e != d
    assert e["Norm"] == 3.25 and e.get("missing", 7) == 7 and "md5" in e and len(e) == 9 and list(e) == list(d)
    assert isinstance(e, MAPPINGS) and dict(e) == d and repr(e) == repr(d)
    x = jenc.entry("torch.Tensor", "torch.float32", (2, 3), (0, 0, 0, 0), XOR, 0x0123456789ABCDEF, False, False)
    assert x.as_dict() == {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3],
                           "md5": "0x0123456789abcdef", "requires_grad": False}
    assert list(x.as_dict()) == ["type", "dtype", "shape", "md5", "requires_grad"]
    s = jenc.entry("torch.Tensor", "torch.float32", (), (2.5, 0, 0, 0), XOR, 0, True, True)
    assert s.as_dict()["md5"] == 2.5 and s.as_dict()["shape"] == []  # a 0-d tensor's xor: its value
    n = jenc.entry("torch.Tensor", "torch.float32", (3,), (9, 9, 9, 1.25), NORM, 0, False, False)  # the monitor's
    assert n.as_dict() == {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "Max": None, "Min": None,
                           "Mean": None, "Norm": 1.25, "requires_grad": False}


class _Key(str):
    """A str subclass equal to a figure's name: looked up as the dict would (its hash and equality)."""


def test_its_figures_read_by_key_are_its_dicts():
    """get and [] of a figure answer from the C values without the dict (the spike rule's read of a Norm): the same
    value, None or KeyError as the dict's, for every kind of entry, any default, keys built at run time or not str."""
    rng = random.Random(5)
    keys = ["Max", "Min", "Mean", "Norm", "md5", "shape", "missing", "".join(["No", "rm"]), _Key("Norm"), 3, None]
    for e in _entries(rng, 2000):
        d = e.as_dict()
        for k in keys:
            assert _same(e.get(k), d.get(k)) and _same(e.get(k, "dflt"), d.get(k, "dflt")), (d, k)
            try:
                want = d[k]
            except KeyError:
                with pytest.raises(KeyError):
                    e[k]
            else:
                assert _same(e[k], want), (d, k)
        for bad in ((), ("Norm", 1, 2)):  # get's arity, as dict.get's
            with pytest.raises(TypeError):
                e.get(*bad)
        with pytest.raises(TypeError):
            e.get(key="Norm")


def test_its_json_text_and_journal_frame_are_its_dicts():
    rng = random.Random(21)
    for e in _entries(rng, 3000):
        d = e.as_dict()
        body = {"input_args": [e, {"k": e}], "output": e}
        plain_body = {"input_args": [d, {"k": d}], "output": d}
        assert jenc.encode(body) == json.dumps(plain_body)
        assert encoding.encode(body) == json.dumps(plain_body)
        assert jenc.encode_scan(body) == jenc.encode_scan(plain_body)  # the writer's suspect mark too
        assert json.dumps(body, default=plain) == json.dumps(plain_body)
        frame = journal.frame(("set", "Torch.add.0.forward", body))
        assert _same(marshal.loads(frame[4:]), ("set", "Torch.add.0.forward", plain_body))
        if all(-2**31 <= v < 2**31 for v in d["shape"]):  # a dict's larger int: marshal's own writer, which refers back
            assert frame == journal.frame(("set", "Torch.add.0.forward", plain_body))
        assert has_nonfinite(body) == _walk(plain_body) == _walk(body)


def test_an_entry_the_writers_cannot_take_in_c_goes_to_json_and_marshal_as_its_dict():
    e = jenc.entry("torch.Tensor", "torch.float32", (2,), (1.0, 2.0, 1.5, 2.5), STATS, 0, False, False)
    odd = {1: "an int key", "e": e}  # json spells a non-str key its own way: the C encoder hands the body back
    assert jenc.encode(odd) is None
    assert encoding.encode(odd) == json.dumps({1: "an int key", "e": e.as_dict()})
    # what the journal's C writer leaves to marshal (a lone surrogate, an int past 32 bits) is marshalled with each
    # entry as its dict: still a record frame, not the JSON text frame of a value marshal does not take
    for other in ("\ud800", 2**40):
        frame = journal.record_frame("set", "k", {"s": other, "e": [e] * 3})
        assert _same(marshal.loads(frame[4:]), ("set", "k", {"s": other, "e": [e.as_dict()] * 3}))


def test_a_frame_larger_than_the_stack_buffer_is_written_as_the_others():
    e = jenc.entry("torch.Tensor", "torch.float32", (4, 4), (1.0, -1.0, 0.5, 2.0), MD5, 7, True, False)
    body = {"input_args": [e] * 200, "output": [e] * 200}  # ~100 KB: the journal's growth appends it in Python
    frame = journal.frame(("set", "k", body))
    assert len(frame) > 50_000
    assert frame == journal.frame(("set", "k", {k: [e.as_dict()] * 200 for k in body}))


def test_the_journal_writer_finds_the_entries_whichever_module_is_imported_first():
    code = ("import marshal\n"
            "from msprobe_inject.dumpformat import _jput\n"  # before anything imports _jenc
            "from msprobe_inject.dumpformat import _jenc\n"
            "e = _jenc.entry('torch.Tensor', 'torch.float32', (2,), (1.0, 2.0, 3.0, 4.0), 0, 0, True, False)\n"
            "assert _jput.frame(('set', 'k', [e])) == _jput.frame(('set', 'k', [e.as_dict()]))\n"
            "print('SAME')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "SAME" in out.stdout, out.stderr
