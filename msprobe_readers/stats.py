"""Tensor leaves of dump records and tolerant comparison of their statistics (shared by ranks, diff, report).

The statistics and what counts as non-finite are ``dumpformat.nonfinite``'s.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from msprobe_inject.dumpformat.nonfinite import STATS, is_nonfinite

__all__ = ["STATS", "Stats", "Leaf", "iter_tensors", "leaves", "close", "close_array", "leaf_mismatch",
           "Column", "MISMATCH_FIELDS", "field_value", "delta", "fmt", "median", "shard_key", "missing_reason"]
Stats = Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]


class Leaf(NamedTuple):
    """One tensor entry of a record, reduced to what comparisons need."""

    path: str  # "input_args.0", "output.0", "parameters.weight", "weight.0"
    dtype: Optional[str]
    shape: Optional[Tuple[int, ...]]
    stats: Stats
    md5: Optional[str]
    data_name: Optional[str]
    placements: Optional[tuple] = None  # per mesh dimension: ("S", dim) | ("R",) | ("P", reduce_op) | ("U", kind)
    mesh: Optional[tuple] = None  # a DTensor's device mesh: (shape, rank ids in row-major order)
    error: Optional[str] = None  # why the statistics are missing, when the dump says


def _placements(value: Any) -> Optional[tuple]:
    if not isinstance(value, list):
        return None
    out = []
    for p in value:
        if isinstance(p, dict) and "Shard" in p:
            out.append(("S", (p["Shard"] or {}).get("dim")))
        elif isinstance(p, dict) and "Partial" in p:
            out.append(("P", str((p["Partial"] or {}).get("reduce_op", "sum"))))
        elif isinstance(p, dict) and "Replicate" in p:
            out.append(("R",))
        else:  # a placement this reader does not know: never taken for a replica, never combined
            out.append(("U", str(next(iter(p), "")) if isinstance(p, dict) else str(p)))
    return tuple(out)


def _mesh(value: Any) -> Optional[tuple]:
    if not isinstance(value, list):
        return None
    shape: List[int] = []
    level: Any = value
    while isinstance(level, list):
        shape.append(len(level))
        level = level[0] if level else None
    flat: List[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        else:
            flat.append(v)

    walk(value)
    return tuple(shape), tuple(flat)


def shard_key(leaf: Leaf, rank: Optional[int]) -> Optional[tuple]:
    """Which piece of a sharded tensor a rank holds: its mesh coordinate along every dimension whose placement
    is not Replicate (None for a plain tensor). Two ranks hold the same data only when their keys are equal."""
    if leaf.placements is None or leaf.mesh is None:
        return None
    shape, flat = leaf.mesh
    if rank is None or rank not in flat:
        return ("rank", rank)
    idx = flat.index(rank)
    coords = []
    for size in reversed(shape):
        coords.append(idx % size if size else 0)
        idx = idx // size if size else 0
    coords.reverse()
    return tuple(None if i >= len(leaf.placements) or leaf.placements[i][0] == "R" else c
                 for i, c in enumerate(coords))


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and is_nonfinite(value):  # older dumps quote "nan" / "inf"
        return float(value.strip())
    return None


def _is_tensor(value: dict) -> bool:
    """A tensor entry: it has a statistic or an md5, or says it is a tensor (as dumpformat.nonfinite reads them)."""
    return ("Max" in value or "md5" in value or "Norm" in value or "Mean" in value or "Min" in value
            or str(value.get("type", "")).endswith(("Tensor", "ndarray")))


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
                        str(md5) if md5 is not None else None, entry.get("data_name"),
                        _placements(entry.get("placements")), _mesh(entry.get("device_mesh")),
                        entry.get("error") if isinstance(entry.get("error"), str) else None))
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


def close_array(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """``close`` element by element over float arrays of present values (no missing ones)."""
    with np.errstate(invalid="ignore", over="ignore"):
        na, nb = np.isnan(a), np.isnan(b)
        within = np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))
        return np.where(na | nb, na & nb, np.where(np.isfinite(a) & np.isfinite(b), within, a == b))


# leaf_mismatch's fields in the order it tests them; ``Column.mismatches`` gives 1 + an index into this, 0 for none
MISMATCH_FIELDS = ("shape", "dtype") + tuple(STATS) + ("md5",)


def _codes(values: Sequence[Any]) -> np.ndarray:
    """Equal values get equal codes, numbered in order of first appearance (the common case: all equal, all 0)."""
    if values.count(values[0]) == len(values):
        return np.zeros(len(values), dtype=np.int64)
    ids: Dict[Any, int] = {}
    return np.fromiter((ids.setdefault(v, len(ids)) for v in values), dtype=np.int64, count=len(values))


class Column:
    """The leaves of one argument path of a record over many ranks, as arrays made once: what comparing
    thousands of ranks' leaves needs. ``values`` has NaN for a missing statistic, and ``absent`` says which."""

    def __init__(self, leaves: Sequence[Leaf]):
        self.leaves = leaves
        n = self.n = len(leaves)
        _, dtypes, shapes, stats, md5s, _, placements, meshes, _ = zip(*leaves)
        self.placed = placements.count(None) < n and meshes.count(None) < n  # some leaf may be a DTensor's
        self.shape, self.dtype = _codes(shapes), _codes(dtypes)
        self.md5 = None if md5s.count(None) == n else (
            _codes(md5s), np.fromiter((m is not None for m in md5s), dtype=bool, count=n))
        self.values = np.array(stats, dtype=np.float64).reshape(n, len(STATS))  # None becomes NaN
        if np.isnan(self.values).any():  # a statistic may be missing rather than NaN
            self.absent = np.equal(np.array(stats, dtype=object).reshape(n, len(STATS)), None)
        else:
            self.absent = np.zeros((n, len(STATS)), dtype=bool)

    def subset(self, idxs: Sequence[int]) -> Column:
        return Column([self.leaves[i] for i in idxs])

    def mismatches(self, ref: np.ndarray, rtol: float, atol: float) -> Tuple[np.ndarray, np.ndarray]:
        """``leaf_mismatch(leaves[i], leaves[ref[i]], skip_missing=True)`` and whether ``missing_reason`` is not
        None, for every i at once: (code per leaf: 0 for no mismatch or ref[i] < 0, else 1 + the index of the
        field in MISMATCH_FIELDS; bool per leaf)."""
        n = self.n
        valid = ref >= 0
        r = np.where(valid, ref, np.arange(n))
        values, absent = self.values, self.absent
        agree = close_array(values, values[r], rtol, atol) | absent | absent[r]  # skip_missing
        if self.md5 is not None:
            md5, has = self.md5
            differ = has & has[r] & (md5 != md5[r])
        else:
            differ = np.zeros(n, dtype=bool)
        fields = np.vstack([self.shape != self.shape[r], self.dtype != self.dtype[r], ~agree.T, differ])
        codes = np.where(valid & fields.any(axis=0), fields.argmax(axis=0) + 1, 0)
        return codes, valid & (absent != absent[r]).any(axis=1)


def leaf_mismatch(a: Leaf, b: Leaf, rtol: float, atol: float, skip_missing: bool = False) -> Optional[str]:
    """The first field in which two leaves disagree beyond tolerance ("shape", "dtype", "md5", a statistic), or None.
    skip_missing: a statistic missing on either side is not compared (it is not a difference)."""
    if a.shape != b.shape:
        return "shape"
    if a.dtype != b.dtype:
        return "dtype"
    for stat, x, y in zip(STATS, a.stats, b.stats):
        if skip_missing and (x is None or y is None):
            continue
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


def missing_reason(a: Leaf, b: Leaf) -> Optional[str]:
    """Why a has a statistic missing that b has (or the other way round), or None when both have the same ones."""
    if all((x is None) == (y is None) for x, y in zip(a.stats, b.stats)):
        return None
    return a.error or b.error or "not recorded"
