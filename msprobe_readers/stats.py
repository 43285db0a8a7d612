"""Tensor leaves of dump records and tolerant comparison of their statistics (shared by ranks, diff, report).

The statistics and what counts as non-finite are ``dumpformat.nonfinite``'s.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Iterator, List, NamedTuple, Optional, Tuple

from msprobe_inject.dumpformat.nonfinite import STATS, is_nonfinite

__all__ = ["STATS", "Stats", "Leaf", "iter_tensors", "leaves", "close", "leaf_mismatch", "field_value", "delta",
           "fmt", "median"]
Stats = Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]


class Leaf(NamedTuple):
    """One tensor entry of a record, reduced to what comparisons need."""

    path: str  # "input_args.0", "output.0", "parameters.weight", "weight.0"
    dtype: Optional[str]
    shape: Optional[Tuple[int, ...]]
    stats: Stats
    md5: Optional[str]
    data_name: Optional[str]


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and is_nonfinite(value):  # older dumps quote "nan" / "inf"
        return float(value.strip())
    return None


def _is_tensor(value: dict) -> bool:
    return "Max" in value or "md5" in value or str(value.get("type", "")).endswith(("Tensor", "ndarray"))


def iter_tensors(value: Any, prefix: str = "") -> Iterator[Tuple[str, dict]]:
    """(leaf path, tensor entry) below a record value, depth first in document order."""
    if isinstance(value, dict):
        if _is_tensor(value):
            yield prefix, value
            return
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                yield from iter_tensors(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list)):
                yield from iter_tensors(item, f"{prefix}.{i}" if prefix else str(i))


def leaves(value: Any, prefix: str = "") -> List[Leaf]:
    out = []
    for path, entry in iter_tensors(value, prefix):
        shape = entry.get("shape")
        md5 = entry.get("md5")
        dtype = entry.get("dtype")
        out.append(Leaf(sys.intern(path), sys.intern(dtype) if isinstance(dtype, str) else None,
                        tuple(shape) if isinstance(shape, list) else None,
                        (_num(entry.get("Max")), _num(entry.get("Min")), _num(entry.get("Mean")),
                         _num(entry.get("Norm"))),
                        str(md5) if md5 is not None else None, entry.get("data_name")))
    return out


def close(a: Optional[float], b: Optional[float], rtol: float, atol: float) -> bool:
    """Symmetric tolerance test; NaN equals NaN, an infinity only itself, a missing value only a missing one."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def leaf_mismatch(a: Leaf, b: Leaf, rtol: float, atol: float) -> Optional[str]:
    """The first field in which two leaves disagree beyond tolerance ("shape", "dtype", "md5", a statistic), or None."""
    if a.shape != b.shape:
        return "shape"
    if a.dtype != b.dtype:
        return "dtype"
    for stat, x, y in zip(STATS, a.stats, b.stats):
        if not close(x, y, rtol, atol):
            return stat
    if a.md5 is not None and b.md5 is not None and a.md5 != b.md5:
        return "md5"
    return None


def field_value(leaf: Leaf, name: str) -> Any:
    if name in STATS:
        return leaf.stats[STATS.index(name)]
    return getattr(leaf, name)


def delta(x: Optional[float], y: Optional[float]) -> Optional[float]:
    """x - y, None when either is missing."""
    if x is None or y is None:
        return None
    return x - y


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value or value in (math.inf, -math.inf):
            return str(value)
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def median(values: List[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
