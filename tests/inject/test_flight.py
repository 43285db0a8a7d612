"""The flight recorder's ring, triggers and job marker (msprobe_inject.flight), without a framework."""

from __future__ import annotations

import collections
import json
import math
import os
import random
import threading

from msprobe_inject.dumpformat.encoding import encode, is_suspect
from msprobe_inject.dumpformat.entry import MAPPINGS, Entry
from msprobe_inject.dumpformat.nonfinite import has_nonfinite
from msprobe_inject.flight import Flight, _norm_of


class _Step:
    def __init__(self, step: int):
        self.records = type("R", (), {"header": {"_step": step}})()


def _flight(steps: int = 3, after: int = 1, max_bytes: int = 1 << 20, factor: float = 10.0) -> Flight:
    return Flight(steps, after, max_bytes, factor, "loss|parameters_grad", has_nonfinite)


def _out(norm: float) -> dict:
    return {"output": [{"type": "torch.Tensor", "Max": norm, "Min": 0.0, "Mean": 0.0, "Norm": norm}]}


def test_the_ring_keeps_k_plus_slack_steps_and_respects_its_byte_bound():
    fl = _flight(steps=3)
    for s in range(20):
        fl.keep(_Step(s), 100)
    assert [st.records.header["_step"] for st, _ in fl.ring] == [15, 16, 17, 18, 19]  # K + 2
    assert fl.ring_bytes == 500 and fl.peak_bytes == 500
    small = _flight(steps=10, max_bytes=250)
    for s in range(6):
        small.keep(_Step(s), 100)
    assert [st.records.header["_step"] for st, _ in small.ring] == [4, 5] and small.ring_bytes <= 250
    assert small.dropped_for_bytes == 4
    one = _flight(steps=10, max_bytes=50)  # a step bigger than the bound is still kept, alone
    one.keep(_Step(0), 100)
    one.keep(_Step(1), 100)
    assert [st.records.header["_step"] for st, _ in one.ring] == [1]


def test_a_nonfinite_statistic_triggers_and_sets_the_window():
    fl = _flight(steps=3, after=2)
    body = _out(1.0)
    fl.observe(7, "Functional.relu.0.forward", body, is_suspect(encode(body)))
    assert fl.trigger is None
    bad = _out(float("nan"))
    fl.observe(7, "Functional.relu.1.forward", bad, is_suspect(encode(bad)))
    assert fl.own["kind"] == "nonfinite" and fl.own["record"] == "Functional.relu.1.forward"
    assert fl.window == (4, 9)
    assert [fl.in_window(s) for s in (3, 4, 9, 10)] == [False, True, True, False]


def test_a_string_that_only_looks_nonfinite_does_not_trigger():
    fl = _flight()
    body = {"output": [{"type": "str", "value": "NaN guard"}]}
    fl.observe(0, "Functional.x.0.forward", body, is_suspect(encode(body)))
    assert fl.trigger is None


def test_a_spike_is_a_norm_above_factor_times_its_median_over_earlier_steps():
    fl = _flight(steps=4, factor=10.0)
    key = "Functional.mse_loss.0.forward"
    for step, norm in enumerate([1.0, 1.2, 0.9]):
        fl.observe(step, key, _out(norm), False)
        fl.observe(step, "Functional.linear.0.forward", _out(1e9), False)  # not watched
        fl.step_finished()
    fl.observe(3, key, _out(9.0), False)  # below 10 x median (1.0)
    fl.step_finished()
    assert fl.trigger is None
    fl.observe(4, key, _out(50.0), False)
    assert fl.own["kind"] == "spike" and fl.own["step"] == 4 and fl.own["record"] == key
    assert fl.own["value"] == 50.0 and fl.own["median"] in (1.0, 1.2)


def _norm_of_reference(value):
    """The spike rule's walk as first written: every mapping's Norm, every mapping's and list's values walked."""
    best = None
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, MAPPINGS):
            n = v.get("Norm")
            if isinstance(n, (int, float)) and not isinstance(n, bool) and (best is None or not n <= best):
                best = float(n)
            stack.extend(x for x in v.values() if isinstance(x, (*MAPPINGS, list)))
        elif isinstance(v, list):
            stack.extend(v)
    return best


def _random_body(rng: random.Random, depth: int = 0):
    def figure():
        return rng.choice([math.nan, math.inf, -math.inf, 0.0, -1.5, 2.5, 7, True, None, "NaN", 1e300])
    kind = rng.random()
    if depth > 3 or kind < 0.3:
        if Entry is not None and rng.random() < 0.5:
            from msprobe_inject.dumpformat import _jenc
            figs = tuple(float(rng.choice([math.nan, math.inf, 0.5, 3.0, -2.0])) for _ in range(4))
            return _jenc.entry("torch.Tensor", "torch.float32", (2, 3), figs, rng.choice([0, 1, 2, 3]), 7, False,
                               rng.random() < 0.2)  # statistics, md5, xor (no Norm), norm alone; some 0-d
        return {"type": "torch.Tensor", "shape": [2, 3], "Max": figure(), "Norm": figure()}
    if kind < 0.6:
        return [_random_body(rng, depth + 1) for _ in range(rng.randint(0, 3))] + [rng.randint(0, 9), True,
                                                                                     ({"Norm": 1e308},)]
    members = {f"k{i}": _random_body(rng, depth + 1) for i in range(rng.randint(0, 3))}
    members["Norm"] = figure()
    return collections.OrderedDict(members) if rng.random() < 0.2 else members  # a dict subclass is a mapping too


def test_the_spike_rules_norm_is_the_reference_walks_on_any_body():
    """The largest Norm below a body, NaN taking over as the walk meets it: the same as the walk written first, for
    dicts, lists, entries of C values and figures of every kind, in any nesting."""
    rng = random.Random(1234)
    for _ in range(3000):
        body = _random_body(rng)
        assert repr(_norm_of(body)) == repr(_norm_of_reference(body)), body


def test_a_spike_is_measured_against_the_median_of_the_steps_before():
    """The median is that of the history at the last step's end: a record's own values within the step do not move
    it, however many calls the record has in the step."""
    fl = _flight(steps=4, factor=10.0)
    key = "Module.fc.Linear.parameters_grad.0"
    for step in range(3):
        fl.observe(step, key, {"weight": [{"Norm": 1.0}]}, False)
        fl.step_finished()
    for _ in range(5):  # the step's own large values are not its median
        fl.observe(3, key, {"weight": [{"Norm": 9.0}]}, False)
    assert fl.trigger is None
    fl.observe(3, key, {"weight": [{"Norm": 10.5}]}, False)
    assert fl.own["kind"] == "spike" and fl.own["median"] == 1.0 and fl.own["value"] == 10.5


def test_the_median_follows_the_ring_as_it_turns():
    """The median moves as old steps leave the ring (K steps, at least three kept), a step without the record keeps
    its median, and a ring of one step compares with that step alone."""
    fl = _flight(steps=3, factor=2.0)
    key = "Module.fc.Linear.parameters_grad.0"
    for step, norm in enumerate([1.0, 1.0, 1.0, 1.9, 1.9, 3.0, 3.0]):  # each under 2 x the median before it
        fl.observe(step, key, {"weight": [{"Norm": norm}]}, False)
        fl.step_finished()
    assert fl.trigger is None
    fl.step_finished()  # a step without the record: its median stays that of the ring's last three, 3.0
    fl.observe(8, key, {"weight": [{"Norm": 5.9}]}, False)  # under 2 x 3.0 (over 2 x 1.9, the median before)
    assert fl.trigger is None
    fl.observe(8, key, {"weight": [{"Norm": 6.1}]}, False)
    assert fl.own["kind"] == "spike" and fl.own["median"] == 3.0
    one = _flight(steps=1, factor=2.0)
    one.observe(0, key, {"weight": [{"Norm": 4.0}]}, False)
    one.step_finished()
    one.observe(1, key, {"weight": [{"Norm": 9.0}]}, False)
    assert one.own["kind"] == "spike" and one.own["median"] == 4.0


def test_no_spike_before_enough_history():
    fl = _flight(steps=4)
    fl.observe(0, "Functional.mse_loss.0.forward", _out(1.0), False)
    fl.step_finished()
    fl.observe(1, "Functional.mse_loss.0.forward", _out(1e6), False)
    assert fl.trigger is None


def test_the_first_rank_to_trigger_owns_the_job_marker_and_the_others_follow_it(tmp_path):
    marker = str(tmp_path / ".msprobe" / "flight" / "attempt0_trigger.json")
    flights = []
    for rank in range(8):
        fl = _flight()
        fl.marker, fl.rank = marker, rank
        flights.append(fl)
    barrier = threading.Barrier(8)

    def fire(fl: Flight) -> None:
        barrier.wait()
        fl.fire("explicit", 10 + fl.rank, "why")

    threads = [threading.Thread(target=fire, args=(fl,)) for fl in flights]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(marker, encoding="utf-8") as fh:
        job = json.load(fh)
    assert all(fl.trigger == job for fl in flights)  # one trigger for the job, whoever came first
    assert all(fl.window == (job["step"] - 3, job["step"] + 1) for fl in flights)
    assert os.listdir(os.path.dirname(marker)) == ["attempt0_trigger.json"]  # no temporary left
    late = _flight()
    late.marker = marker
    late.poll()
    assert late.trigger == job and late.own is None
