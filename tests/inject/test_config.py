"""The configuration (config.py): every value is valid or rejected with its key named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msprobe_inject.config import ConfigError, build_config

_config_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                           st.lists(st.one_of(st.integers(-3, 1000001), st.text(max_size=6)), max_size=4),
                           st.sampled_from(["L0", "L1", "mix", "debug", "statistics", "tensor", "md5", "0-3"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["task", "level", "step", "rank", "scope", "list", "data_mode",
                                        "summary_mode", "async_dump", "precision", "risk_level", "dump_path",
                                        "overflow_nums", "step_on", "tensor_list", "flight_recorder",
                                        "flight_after", "flight_bytes", "spike_factor", "spike_records",
                                        "preset", "unknown"]),
                       _config_values, max_size=6))
def test_config_is_valid_or_rejected_by_name(values):
    try:
        cfg = build_config(values)
    except ConfigError as exc:
        assert exc.key in str(exc) and exc.key in (set(values) | {"environment"}), (values, str(exc))
        return
    assert cfg.task in ("statistics", "tensor", "structure", "overflow_check")
    assert all(isinstance(s, int) and 0 <= s <= 1_000_000 for s in cfg.step)


@pytest.mark.parametrize("values, key, words", [
    ({"flight_recorder": -1}, "flight_recorder", "int >= 0"),
    ({"flight_recorder": 2, "task": "tensor"}, "task", "'statistics'"),
    ({"flight_recorder": 2, "level": "debug"}, "level", "'L0', 'L1', 'mix'"),
    ({"flight_recorder": 2, "step": [1]}, "step", "records every step"),
    ({"flight_bytes": "12 parsecs"}, "flight_bytes", "K/M/G suffix"),
    ({"spike_factor": -1.0}, "spike_factor", ">= 0"),
    ({"spike_records": "("}, "spike_records", "not a valid regular expression"),
    ({"preset": "fast"}, "preset", "'monitor'"),
    ({"preset": "monitor", "level": "mix"}, "level", "'L0'"),
])
def test_flight_recorder_and_preset_values_are_checked(values, key, words):
    with pytest.raises(ConfigError) as err:
        build_config(values)
    assert err.value.key == key and words in str(err.value)


def test_flight_recorder_defaults_and_sizes():
    cfg = build_config({"flight_recorder": 5, "flight_bytes": "2G"})
    assert (cfg.flight_recorder, cfg.flight_after, cfg.flight_bytes) == (5, 1, 2 << 30)
    assert cfg.spike_factor == 10.0 and cfg.spike_records == "loss|parameters_grad|clip_grad_norm"
    mon = build_config({"preset": "monitor"})
    assert (mon.level, mon.extra_info) == ("L0", False)
