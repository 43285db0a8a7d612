"""The one test for a NaN/Inf statistic, over a record's tensor entries.

A statistic is non-finite when it is a NaN or an infinite float, or a string that spells one (msprobe writes
bare ``NaN``/``Infinity`` tokens, which JSON readers decode to floats; older dumps quote ``"nan"``/``"inf"``).
"""

from __future__ import annotations

import math
from typing import Any, List, Tuple

from .entry import MAPPINGS

STATS = ("Max", "Min", "Mean", "Norm")
_NONFINITE_TEXT = frozenset(("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"))
# substrings of any JSON text that may decode to a non-finite statistic: a record whose text has none of
# them needs no tree walk (str.find is far cheaper than decoding)
SUSPECT_TEXT = ("NaN", "Inf", "nan", "inf")


try:  # built with the package where a C compiler is available
    from ._jenc import nonfinite as _c_nonfinite
except ImportError:
    _c_nonfinite = None
# has_nonfinite's C walk alone (True, False, or None where it declines and _walk decides), or None where not built:
# the journal's C send asks it of a flight recorder's held records without has_nonfinite's frame
c_walk = _c_nonfinite


def is_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value) or math.isinf(value)
    if isinstance(value, str):
        return value.strip().lower() in _NONFINITE_TEXT
    return False


def has_nonfinite(value: Any) -> bool:
    """True if any tensor entry below ``value`` has a non-finite Max, Min, Mean or Norm."""
    found = _c_nonfinite(value) if _c_nonfinite is not None else None  # the same walk in C (_jenc.nonfinite)
    return _walk(value) if found is None else found


def _walk(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, MAPPINGS):
            for k in STATS:
                if is_nonfinite(v.get(k)):
                    return True
            stack.extend(x for x in v.values() if isinstance(x, (*MAPPINGS, list)))
        elif isinstance(v, list):
            stack.extend(v)
    return False


def nonfinite_leaves(value: Any, prefix: str = "") -> List[Tuple[str, str, Any]]:
    """(leaf path, statistic, value) of every non-finite statistic below ``value``: ("input_args.0", "Max", nan).
    The value is a float however the dump spells it (a quoted "NaN" is nan): readers of the index, which holds
    floats, give the same answer."""
    out: List[Tuple[str, str, Any]] = []
    if isinstance(value, dict):
        for stat in STATS:
            x = value.get(stat)
            if is_nonfinite(x):
                out.append((prefix, stat, float(x.strip()) if isinstance(x, str) else x))
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                out.extend(nonfinite_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(nonfinite_leaves(v, f"{prefix}.{i}" if prefix else str(i)))
    return out
