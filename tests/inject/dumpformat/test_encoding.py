"""The JSON encoding of record bodies: the one-buffer C encoder writes exactly what json.dumps writes."""

from __future__ import annotations

import enum
import json
import math
import random
import struct

import pytest

from msprobe_inject.dumpformat import encoding
from msprobe_inject.dumpformat.nonfinite import SUSPECT_TEXT

jenc = pytest.importorskip("msprobe_inject.dumpformat._jenc")

_CHARS = ['"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "\x80", "é", "\u2028", "\ud800",
          "\udfff", "\uffff", "\U0001f600", "\U0010ffff", "a", " ", "/", "~"]


def _float(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.1:
        return rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1.7976931348623157e308, 1e16, 1e-5,
                           1e-4, 0.1, 123456789012345678.0, 1e22, -1.5])
    if pick < 0.4:  # any bit pattern: subnormals, every exponent
        return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
    if pick < 0.7:
        return float(rng.randint(-10**6, 10**6))
    return rng.uniform(-1e3, 1e3) * 10.0 ** rng.randint(-20, 20)


def _str(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) if rng.random() < 0.5 else chr(rng.randint(32, 126))
                   for _ in range(rng.randint(0, 12)))


def _value(rng: random.Random, depth: int = 0):
    kinds = ["float", "int", "str", "none", "bool"] + (["list", "tuple", "dict"] * 2 if depth < 5 else [])
    kind = rng.choice(kinds)
    if kind == "float":
        return _float(rng)
    if kind == "int":
        return rng.choice([rng.randint(-1000, 1000), rng.randint(-2**63, 2**63 - 1), rng.randint(-10**40, 10**40),
                           2**63, -2**63 - 1])
    if kind == "str":
        return _str(rng)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    items = [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    return {_str(rng): v for v in items}


@pytest.mark.parametrize("seed", range(40))
def test_random_values_encode_as_json_dumps_does(seed):
    rng = random.Random(seed)
    for _ in range(50):
        v = _value(rng)
        assert jenc.encode(v) == json.dumps(v), v
        assert encoding.encode(v) == json.dumps(v)


def test_floats_seen_before_are_spelled_as_the_first_time_whatever_shares_their_slot():
    """The encoder keeps the text of recent floats by their bits: a float met again, after thousands of others
    took the slots (0.0 and -0.0, a float32's value and its neighbours, any bit pattern), is spelled as
    json.dumps spells it."""
    rng = random.Random(7)
    pool = [0.0, -0.0, 5e-324, -5e-324, 1e16, 1e-5]
    for _ in range(3000):
        f32 = struct.unpack("<f", struct.pack("<f", rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)))[0]
        bits = struct.unpack("<Q", struct.pack("<d", f32))[0]
        pool += [f32, struct.unpack("<d", struct.pack("<Q", bits ^ 1))[0], _float(rng)]
    for _ in range(4):
        rng.shuffle(pool)
        for i in range(0, len(pool), 7):
            chunk = pool[i:i + 7]
            assert jenc.encode(chunk) == json.dumps(chunk)
        assert jenc.encode(pool) == json.dumps(pool)


def test_strings_met_again_are_spelled_and_scanned_as_the_first_time_whatever_took_their_address():
    """The encoder keeps the text of short strings by object: the same objects again (a body's keys and its entries'
    values) and new strings made where freed ones were are spelled as json.dumps spells them and scanned as the
    substring test scans their text, whether the string was first met with the scan asked for or not."""
    rng = random.Random(3)
    kept = [_str(rng) for _ in range(300)] + ["NaN", "Inf-like", "info", "torch.float32", "x" * 70]
    for i in range(30000):
        s = kept[i % len(kept)] if i % 3 == 0 else _str(rng) + "NaN"[: i % 4]  # a new object, freed at once
        value = [s, {s: i}]
        if i % 2:
            text, suspect = jenc.encode_scan(value)
            assert suspect == any(x in text for x in SUSPECT_TEXT), text
        else:
            text = jenc.encode(value)
        assert text == json.dumps(value)


def test_a_record_body_is_encoded_by_the_c_encoder():
    entry = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 1.2345678901234567,
             "Min": -0.9876, "Mean": math.nan, "Norm": math.inf, "requires_grad": True, "data_name": "a\u00e9.pt"}
    body = {"input_args": [entry, None, {"type": "int", "value": 3}], "input_kwargs": {}, "output": [entry]}
    text = jenc.encode(body)
    assert text == json.dumps(body)
    assert '"Mean": NaN, "Norm": Infinity' in text


class _Color(enum.IntEnum):
    RED = 1


class _Str(str):
    pass


class _Float(float):
    def __repr__(self):
        return "custom"


@pytest.mark.parametrize("value", [
    {1: "an int key"}, {None: 1}, {2.5: 1}, {True: 1},  # json spells these keys its own way
    _Color.RED, _Str("x"), _Float(1.5), [{"a": _Float(2.0)}],  # subclasses: json's rules
    object(),  # json raises
])
def test_what_the_c_encoder_does_not_decide_goes_to_json(value):
    assert jenc.encode(value) is None
    try:
        expected = json.dumps(value)
    except TypeError:
        with pytest.raises(TypeError):
            encoding.encode(value)
        return
    assert encoding.encode(value) == expected


def test_a_tree_deeper_than_the_limit_goes_to_json():
    v: list = []
    for _ in range(150):
        v = [v]
    assert jenc.encode(v) is None
    assert encoding.encode(v) == json.dumps(v)


def test_a_body_larger_than_the_stack_buffer_grows_it():
    body = {"k": ["\U0001f600" * 1000, list(range(5000)), [1.0 / 3] * 3000]}
    assert jenc.encode(body) == json.dumps(body)


@pytest.mark.parametrize("seed", range(20))
def test_random_documents_are_spelled_as_json_dumps_with_indent_1(seed):
    """stack.json and construct.json: json.dumps(indent=1), from the C encoder where it is built."""
    rng = random.Random(1000 + seed)
    for _ in range(40):
        v = _value(rng)
        assert jenc.document(v) == json.dumps(v, indent=1).encode("ascii"), v
        assert encoding.dumps_document(v) == json.dumps(v, indent=1).encode("ascii")
    ascii_ = ['"', "\\", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "/", "~", " "]

    def line() -> str:  # a stack's line: long, ASCII (its runs copied at once), now and then an escape
        return "".join(rng.choice(ascii_) if rng.random() < 0.05 else chr(rng.randint(32, 126))
                       for _ in range(rng.randint(0, 120)))

    stacks = {str(i): [[_str(rng) for _ in range(rng.randint(1, 4))], [line() for _ in range(rng.randint(0, 6))]]
              for i in range(rng.randint(0, 30))}
    construct = {_str(rng): rng.choice([None, _str(rng)]) for _ in range(rng.randint(0, 30))}
    for doc in (stacks, construct, {"big": [_str(rng) * 50 for _ in range(500)]}):
        assert jenc.document(doc) == json.dumps(doc, indent=1).encode("ascii")


@pytest.mark.parametrize("value", [{1: "an int key"}, {"a": [_Color.RED]}, {"a": {"b": _Float(1.0)}}, object()])
def test_a_document_the_c_encoder_does_not_decide_goes_to_json(value):
    assert jenc.document(value) is None
    try:
        expected = json.dumps(value, indent=1).encode("ascii")
    except TypeError:
        with pytest.raises(TypeError):
            encoding.dumps_document(value)
        return
    assert encoding.dumps_document(value) == expected


@pytest.mark.parametrize("seed", range(10))
def test_suspect_text_is_the_substring_test(seed):
    rng = random.Random(seed)
    for _ in range(200):
        text = "".join(rng.choice(["N", "a", "I", "n", "f", "i", "x", "é", " ", "NaN", "inf"])
                       for _ in range(rng.randint(0, 12)))
        assert encoding.is_suspect(text) == any(s in text for s in SUSPECT_TEXT), text


def _suspect_value(rng: random.Random, depth: int = 0):
    """Values whose text may hold the suspect substrings anywhere: in keys, in strings (also through escapes: "\\n"
    then "an"), in non-finite floats, and in nothing at all."""
    def word() -> str:
        return "".join(rng.choice(["N", "a", "I", "n", "f", "i", "\n", "\\", "é", "x", "NaN", "inf"])
                       for _ in range(rng.randint(0, 5)))

    pick = rng.random()
    if depth < 4 and pick < 0.3:
        return {word(): _suspect_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 4 and pick < 0.5:
        return [_suspect_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if pick < 0.7:
        return word()
    return rng.choice([math.nan, math.inf, -math.inf, 1.5, None, True, 7, _float(rng)])


@pytest.mark.parametrize("seed", range(10))
def test_encode_scan_is_the_text_and_the_substring_test_of_it(seed):
    rng = random.Random(seed)
    flagged = 0
    for _ in range(300):
        value = {"k": _suspect_value(rng)} if rng.random() < 0.5 else _value(rng)
        text, suspect = encoding.encode_scan(value)
        assert text == json.dumps(value)
        assert suspect == encoding.is_suspect(text) == any(s in text for s in SUSPECT_TEXT), text
        flagged += suspect
    assert 30 < flagged < 270  # both answers were asked for


def test_encode_scan_of_what_the_c_encoder_does_not_decide_is_json_and_its_scan():
    value = {"a": [_Float(float("nan"))], "b": {1: "info"}}
    assert jenc.encode_scan(value) is None
    assert encoding.encode_scan(value) == (json.dumps(value), True)
