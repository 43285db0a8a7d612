"""The configuration (config.py): every value is valid or rejected with its key named."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from msprobe_inject.config import ConfigError, build_config

_config_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                           st.lists(st.one_of(st.integers(-3, 1000001), st.text(max_size=6)), max_size=4),
                           st.sampled_from(["L0", "L1", "mix", "debug", "statistics", "tensor", "md5", "0-3"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["task", "level", "step", "rank", "scope", "list", "data_mode",
                                        "summary_mode", "async_dump", "precision", "risk_level", "dump_path",
                                        "overflow_nums", "step_on", "tensor_list", "unknown"]),
                       _config_values, max_size=6))
def test_config_is_valid_or_rejected_by_name(values):
    try:
        cfg = build_config(values)
    except ConfigError as exc:
        assert exc.key in str(exc) and exc.key in (set(values) | {"environment"}), (values, str(exc))
        return
    assert cfg.task in ("statistics", "tensor", "structure", "overflow_check")
    assert all(isinstance(s, int) and 0 <= s <= 1_000_000 for s in cfg.step)
