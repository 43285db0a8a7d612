"""The one test for a NaN/Inf statistic (dumpformat.nonfinite): the C walk decides as the Python walk does."""

from __future__ import annotations

import math
import random
from collections import OrderedDict

import pytest

from msprobe_inject.dumpformat import nonfinite

_c = nonfinite._c_nonfinite
needs_c = pytest.mark.skipif(_c is None, reason="the C extension is not built")

_FIGURES = (0.5, -3.0, 0.0, 1e300, math.nan, math.inf, -math.inf, None, 7, True, "nan", " -Infinity", "x")


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 4 or r < 0.3:
        return rng.choice(_FIGURES)
    if r < 0.55:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if r < 0.6:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(3)))  # never walked
    entry = {}
    for key in rng.sample(("Max", "Min", "Mean", "Norm", "type", "shape", "args"), rng.randrange(1, 6)):
        entry[key] = _value(rng, depth + 1) if key in ("args", "shape") else rng.choice(_FIGURES)
    return entry


@needs_c
@pytest.mark.parametrize("seed", range(10))
def test_the_c_walk_finds_a_nonfinite_statistic_where_the_python_walk_does(seed):
    rng = random.Random(seed)
    decided = 0
    for _ in range(500):
        v = _value(rng)
        got = _c(v)
        if got is not None:  # None: a statistic spelled as a string, or a subclass, is the Python walk's
            decided += 1
            assert got == nonfinite._walk(v), v
        assert nonfinite.has_nonfinite(v) == nonfinite._walk(v)
    assert decided > 200


@needs_c
def test_what_the_c_walk_leaves_to_python():
    deep = {"Max": 1.0}
    for _ in range(200):
        deep = [deep]
    assert _c(deep) is None and nonfinite.has_nonfinite(deep) is False
    assert _c({"a": [{"Norm": "inf"}]}) is None and nonfinite.has_nonfinite({"a": [{"Norm": "inf"}]})
    odd = OrderedDict(Max=math.nan)
    assert _c([odd]) is None and nonfinite.has_nonfinite([odd])
    assert _c({"Max": 1.0, "x": ({"Norm": math.nan},)}) is False  # tuples are not walked, as in Python
    assert _c({"Mean": float("-inf")}) is True and _c({"Mean": 2.0, "value": math.nan}) is False
