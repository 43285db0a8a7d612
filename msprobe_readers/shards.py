"""The statistics of whole sharded tensors, combined from the shards the ranks recorded (no collective ever ran).

A DTensor leaf of a record carries the rank's local shard statistics with ``device_mesh`` and ``placements``.
For one (root, step, record, leaf) the ranks' pieces are combined along the mesh: ranks holding the same piece
(a ``Replicate`` mesh dimension) count once; over the distinct pieces of ``Shard`` dimensions the maximum is
the max of the maxes, the minimum the min of the mins, the mean the element-count-weighted mean and the norm
the root of the summed squared norms. A ``Partial`` placement holds addends of the tensor, not pieces of it:
the figures are not combined and the leaf is marked partial. With pieces missing (ranks not dumped) the
figures are of the pieces present and the leaf is marked incomplete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from msprobe_inject.dumpformat import paths
from msprobe_readers import stats as st
from msprobe_readers.reading import ProcDir

Key = Tuple[str, int, str, str]  # (root, step, record, leaf path)


@dataclass
class GlobalLeaf:
    leaf: st.Leaf  # the whole tensor: global shape and statistics (None figures when partial)
    pieces: int  # distinct shards combined
    expected: int  # distinct shards the mesh has
    partial: bool

    @property
    def complete(self) -> bool:
        return self.pieces == self.expected and not self.partial


def _numel(shape: Optional[Tuple[int, ...]]) -> int:
    return math.prod(shape) if shape is not None else 0


def combine(pieces: List[Tuple[Optional[int], st.Leaf]]) -> Optional[GlobalLeaf]:
    """The whole tensor of (rank, leaf) pieces of one DTensor leaf, or None when they are not a DTensor's."""
    if not pieces or pieces[0][1].placements is None or pieces[0][1].mesh is None:
        return None
    first = pieces[0][1]
    placements = first.placements
    shape_mesh, _ = first.mesh
    partial = any(p[0] in ("P", "U") for p in placements)  # addends, or pieces of an unknown kind
    by_key: Dict[Any, Tuple[Optional[int], st.Leaf]] = {}
    for rank, leaf in sorted(pieces, key=lambda p: (p[0] is None, p[0] or 0)):
        by_key.setdefault(st.shard_key(leaf, rank), (rank, leaf))  # one replica of each piece
    expected = 1
    for i, size in enumerate(shape_mesh):
        if i < len(placements) and placements[i][0] != "R":
            expected *= size
    distinct = list(by_key.values())
    shape = _global_shape(distinct, placements)
    if partial:
        stats: st.Stats = (None, None, None, None)
    else:
        stats = _combine_stats([leaf for _, leaf in distinct])
    leaf = st.Leaf(first.path, first.dtype, shape, stats, None, None, placements, first.mesh,
                   next((lf.error for _, lf in distinct if lf.error), None))
    return GlobalLeaf(leaf, len(distinct), expected, partial)


def _combine_stats(leaves: List[st.Leaf]) -> st.Stats:
    maxes, mins, sums, squares, count = [], [], 0.0, 0.0, 0
    for leaf in leaves:
        mx, mn, mean, norm = leaf.stats
        n = _numel(leaf.shape)
        if n == 0:
            continue
        if mx is None or mn is None or mean is None or norm is None:
            return (None, None, None, None)  # a missing piece leaves the whole unknown
        maxes.append(mx)
        mins.append(mn)
        sums += mean * n
        squares += norm * norm
        count += n
    if not count:
        return (None, None, None, None)

    def pick(values: List[float], fn: Any) -> float:
        return math.nan if any(math.isnan(v) for v in values) else fn(values)

    return (pick(maxes, max), pick(mins, min), sums / count, math.sqrt(squares))


def _global_shape(distinct: List[Tuple[Optional[int], st.Leaf]], placements: tuple) -> Optional[Tuple[int, ...]]:
    """The local shape with each sharded dimension summed over the pieces along its mesh dimension (the pieces
    at coordinate 0 of the other sharded mesh dimensions), so uneven shards add up right."""
    base = distinct[0][1].shape
    if base is None:
        return None
    shape = list(base)
    keyed = [(st.shard_key(leaf, rank), leaf) for rank, leaf in distinct]
    for i, p in enumerate(placements):
        if p[0] != "S" or not isinstance(p[1], int) or not 0 <= p[1] < len(shape):
            continue
        total = 0
        for key, leaf in keyed:
            if key is None or leaf.shape is None or len(leaf.shape) != len(shape):
                continue
            if all(c in (None, 0) for j, c in enumerate(key) if j != i):
                total += leaf.shape[p[1]]
        shape[p[1]] = total or shape[p[1]]
    return tuple(shape)


class ShardCollector:
    """An on_record callback collecting DTensor leaves; ``globals()`` combines them per record leaf."""

    def __init__(self) -> None:
        self.pieces: Dict[Key, List[Tuple[Optional[int], st.Leaf]]] = {}

    def on_record(self, proc: ProcDir, position: int, name: str, value: Any) -> None:
        if proc.duplicate or not isinstance(value, (dict, list)):
            return
        for leaf in st.leaves(value):
            if leaf.placements is not None:
                self.pieces.setdefault((proc.root, proc.step, name, leaf.path), []).append((proc.rank, leaf))

    def globals(self) -> Dict[Key, GlobalLeaf]:
        out: Dict[Key, GlobalLeaf] = {}
        for key, pieces in self.pieces.items():
            g = combine(pieces)
            if g is not None:
                out[key] = g
        return out


def has_dtensors(proc: ProcDir) -> bool:
    """Whether a rank directory's records may hold DTensor leaves (a byte search, no JSON parsing)."""
    import os

    files = [proc.file] if proc.file else [os.path.join(proc.path, n) for n in (paths.DUMP_JSON, paths.JOURNAL)]
    for path in files:
        # the journal (binary, marshal) holds the name without JSON's quotes
        needle = b"placements" if path.endswith(paths.JOURNAL) else b'"placements"'
        try:
            with open(path, "rb") as fh:
                tail = b""
                while True:
                    chunk = fh.read(1 << 22)
                    if not chunk:
                        break
                    if needle in tail + chunk:
                        return True
                    tail = chunk[-16:]
        except OSError:
            continue
    return False


def global_leaves(dump_path: str, steps: Optional[set] = None) -> Dict[Key, GlobalLeaf]:
    """The combined DTensor leaves of a dump (empty, after a byte search, when it has none)."""
    from msprobe_readers.reading import discover, iter_proc

    procs = [p for p in discover(dump_path) if steps is None or p.step in steps]
    if not any(has_dtensors(p) for p in procs):
        return {}
    col = ShardCollector()
    for proc in procs:
        for position, name, value, _ in iter_proc(proc):
            col.on_record(proc, position, name, value)
    return col.globals()


def overview(table: Dict[Key, GlobalLeaf], top: int = 10) -> Dict[str, Any]:
    """Counts of a dump's sharded leaves, and the whole-tensor figures of the largest-norm complete ones per step
    (the per-shard figures stay in each rank's dump.json)."""
    out: Dict[str, Any] = {"leaves": len(table), "records": len({k[:3] for k in table}),
                           "whole": sum(g.complete for g in table.values()),
                           "partial": sum(g.partial for g in table.values()),
                           "incomplete": sum(not g.complete and not g.partial for g in table.values())}
    nonfinite = [k for k, g in table.items() if g.complete and any(
        v is not None and not math.isfinite(v) for v in g.leaf.stats)]
    out["nonfinite"] = [{"root": k[0], "step": k[1], "record": k[2], "leaf": k[3]} for k in sorted(nonfinite)[:top]]
    ranked = sorted((k for k, g in table.items() if g.complete and g.leaf.stats[3] is not None
                     and math.isfinite(g.leaf.stats[3])), key=lambda k: -(table[k].leaf.stats[3] or 0.0))
    out["largest"] = [{"root": k[0], "step": k[1], "record": k[2], "leaf": k[3],
                       "shape": list(table[k].leaf.shape or ()),
                       "placements": [list(p) for p in table[k].leaf.placements or ()],
                       **dict(zip(st.STATS, table[k].leaf.stats))} for k in ranked[:top]]
    return out
