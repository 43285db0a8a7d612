"""The step's documents: dump.json's "data" member joined in one C call is what the Python join writes."""

from __future__ import annotations

import json
import math
import random

import pytest

from msprobe_inject.dumpformat import documents, encoding
from msprobe_inject.dumpformat.documents import StepRecords

pytest.importorskip("msprobe_inject.dumpformat._jenc")

_KEYS = ["Functional.linear.0.forward", "Module.a.Linear.forward.0", "Tensor.__add__.3.backward", "é\n\"\\",
         "\U0001f600", "", "Torch.sum.10.forward"]


def _body(rng: random.Random):
    return {"input_args": [{"Max": rng.choice([1.5, math.nan, -0.0, 1e-7]), "dtype": rng.choice(["a", "é"])}],
            "output": [rng.randint(-5, 5), None, True, "x\u2028"]}


def _records(rng: random.Random) -> StepRecords:
    recs = StepRecords({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                        "_step": 0})
    for _ in range(rng.randint(0, 60)):
        key = rng.choice(_KEYS) + str(rng.randint(0, 9))
        if rng.random() < 0.5:
            recs.set(key, encoding.encode(_body(rng)))
        else:
            recs.merge(key, encoding.encode_members({rng.choice(_KEYS): _body(rng) for _ in range(rng.randint(1, 3))}),
                       move=rng.random() < 0.3)
    return recs


@pytest.mark.parametrize("seed", range(8))
def test_dump_json_is_the_same_joined_in_c_and_in_python(seed, monkeypatch):
    recs = _records(random.Random(seed))
    c = recs.main_bytes()
    monkeypatch.setattr(documents, "data_section", None)
    py = recs.main_bytes()
    assert c == py
    doc = json.loads(c)
    assert list(doc["data"]) == list(recs.bodies)


def test_a_text_that_is_not_ascii_is_joined_in_python():
    # encode writes ASCII; a body set from elsewhere may not be: Python's join escapes it as before
    recs = StepRecords({"task": "statistics"})
    recs.set("a", '{"s": "é"}')
    assert encoding.data_section(recs.bodies) is None
    assert recs.main_bytes().endswith(b'"data": {\n  "a": {"s": "\\xe9"}\n }\n}\n')
