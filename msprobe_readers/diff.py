"""Two dumps aligned by record name: per record the differences of Max/Min/Mean/Norm, and cosine similarity and
maximum absolute error when both sides saved the tensors (.pt). Pairs are (step, rank) directories present in
both dumps, or two dump.json files / rank directories named directly.

B (the baseline) is read first into a compact map (record -> tensor leaves), then A is streamed against it in
its execution order, so each file is read once and the first difference is the earliest in A.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from typing import IO, Any, Dict, List, Optional, Tuple

from msprobe_inject.dumpformat import names
from msprobe_readers import shards
from msprobe_readers import stats as st
from msprobe_readers.reading import (
    ProcDir,
    ProgressFn,
    discover,
    find_stack,
    iter_construct,
    iter_proc,
    tensor_path,
    user_frame,
)

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
CSV_FIELDS = (["step", "rank_a", "rank_b", "position", "record", "leaf", "dtype_a", "dtype_b", "shape_a", "shape_b"]
              + [f"{s}_{side}" for s in st.STATS for side in ("a", "b", "diff")]
              + ["cosine", "max_abs_err", "beyond_tolerance", "reason"])


@dataclass
class LeafDiff:
    leaf: str
    a: Optional[st.Leaf]
    b: Optional[st.Leaf]
    reason: Optional[str]  # why it is beyond tolerance (a statistic, shape, dtype, md5, tensor), or None
    cosine: Optional[float] = None
    max_abs: Optional[float] = None


@dataclass
class RecordDiff:
    position: int
    record: str
    leaves: List[LeafDiff]
    module: Optional[str] = None  # the enclosing module record (construct.json), filled for reported records
    source: Optional[str] = None  # user source line of the record's stack

    @property
    def beyond(self) -> bool:
        return any(d.reason for d in self.leaves)

    @property
    def first_reason(self) -> Optional[LeafDiff]:
        return next((d for d in self.leaves if d.reason), None)


@dataclass
class PairResult:
    a: ProcDir
    b: ProcDir
    compared: int = 0
    beyond: int = 0
    only_a: List[str] = field(default_factory=list)
    only_b: List[str] = field(default_factory=list)
    first: List[RecordDiff] = field(default_factory=list)  # the first few records beyond tolerance
    errors: List[str] = field(default_factory=list)
    whole: int = 0  # DTensor leaves compared as whole tensors (shards combined across the ranks)
    shard_only: int = 0  # DTensor leaves compared shard to shard (partial, or pieces missing)

    @property
    def label(self) -> str:
        a, b = self.a.label, self.b.label
        return a if a == b else f"{a}/{b}"


def pair_dumps(a_path: str, b_path: str, steps: Optional[set] = None,
               ranks: Optional[set] = None) -> List[Tuple[ProcDir, ProcDir]]:
    a_procs, b_procs = discover(a_path), discover(b_path)
    if len(a_procs) == 1 and len(b_procs) == 1:
        return [(a_procs[0], b_procs[0])]  # two files or two rank directories: compare whatever they are

    def key(p: ProcDir) -> Tuple:
        return (p.root, p.step, p.process)

    b_by_key = {key(p): p for p in b_procs}
    pairs = []
    for p in a_procs:
        q = b_by_key.get(key(p))
        if q is None:
            continue
        if steps is not None and p.step not in steps:
            continue
        if ranks is not None and p.rank not in ranks:
            continue
        pairs.append((p, q))
    return pairs


def _tensor_metrics(a_file: str, b_file: str) -> Tuple[Optional[float], Optional[float]]:
    """(cosine similarity, max absolute error) of two saved tensors; (None, None) if either cannot be read."""
    try:
        import torch

        ta = torch.load(a_file, map_location="cpu", weights_only=True)
        tb = torch.load(b_file, map_location="cpu", weights_only=True)
    except Exception:
        return None, None
    if not (hasattr(ta, "shape") and hasattr(tb, "shape")) or ta.shape != tb.shape:
        return None, None
    ta, tb = ta.detach().double().flatten(), tb.detach().double().flatten()
    if ta.numel() == 0:
        return None, 0.0
    max_abs = float((ta - tb).abs().max())
    na, nb = float(ta.norm()), float(tb.norm())
    if na == 0.0 and nb == 0.0:
        cosine = 1.0
    elif na == 0.0 or nb == 0.0:
        cosine = 0.0
    else:
        cosine = float(torch.dot(ta, tb)) / (na * nb)
    return cosine, max_abs


class _Compact:
    """B side: record -> leaves."""

    def __init__(self, proc: ProcDir, errors: List[str], progress: Optional[ProgressFn] = None):
        self.records: Dict[str, List[st.Leaf]] = {}

        def failed(file: str, exc: Exception) -> None:
            errors.append(f"{file}: unreadable ({exc})")

        for _, name, value, _ in iter_proc(proc, failed, progress=progress):
            self.records[name] = st.leaves(value)


Globals = Dict[shards.Key, shards.GlobalLeaf]


def _whole(leaves: List[st.Leaf], proc: ProcDir, name: str, table: Optional[Globals],
           result: PairResult) -> List[st.Leaf]:
    """A record's leaves with each DTensor shard replaced by its whole tensor, where all shards were dumped."""
    if not table:
        return leaves
    out = []
    for leaf in leaves:
        g = table.get((proc.root, proc.step, name, leaf.path)) if leaf.placements is not None else None
        if g is not None and g.complete:
            result.whole += 1
            out.append(g.leaf)
        else:
            result.shard_only += leaf.placements is not None
            out.append(leaf)
    return out


def diff_pair(a: ProcDir, b: ProcDir, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
              tensors: bool = True, keep: int = 20, writer: Optional[Any] = None,
              progress: Optional[ProgressFn] = None, globals_a: Optional[Globals] = None,
              globals_b: Optional[Globals] = None) -> PairResult:
    result = PairResult(a, b)
    base = _Compact(b, result.errors, progress)
    if globals_b:
        base.records = {n: _whole(v, b, n, globals_b, result) for n, v in base.records.items()}
        result.whole = result.shard_only = 0  # counted on A's side
    seen: Dict[str, None] = {}

    def failed(file: str, exc: Exception) -> None:
        result.errors.append(f"{file}: unreadable ({exc})")

    for position, name, value, _ in iter_proc(a, failed, progress=progress):
        seen[name] = None
        b_leaves = base.records.get(name)
        if b_leaves is None:
            result.only_a.append(name)
            continue
        result.compared += 1
        a_leaves = _whole(st.leaves(value), a, name, globals_a, result)
        rec = _diff_record(position, name, a_leaves, b_leaves, a, b, rtol, atol, tensors)
        if rec.beyond:
            result.beyond += 1
            if len(result.first) < keep:
                result.first.append(rec)
        if writer is not None:
            _write_rows(writer, a, b, rec)
    result.only_b = [n for n in base.records if n not in seen]
    if result.first:
        _describe(result.first[0], a)
    return result


def _diff_record(position: int, name: str, a_leaves: List[st.Leaf], b_leaves: List[st.Leaf], a: ProcDir,
                 b: ProcDir, rtol: float, atol: float, tensors: bool) -> RecordDiff:
    b_map = {leaf.path: leaf for leaf in b_leaves}
    out = []
    for la in a_leaves:
        lb = b_map.pop(la.path, None)
        if lb is None:
            out.append(LeafDiff(la.path, la, None, "only in A"))
            continue
        d = LeafDiff(la.path, la, lb, st.leaf_mismatch(la, lb, rtol, atol))
        if tensors and la.data_name and lb.data_name and la.shape == lb.shape:
            d.cosine, d.max_abs = _tensor_metrics(tensor_path(a, la.data_name), tensor_path(b, lb.data_name))
            scale = max(abs(v) for v in (lb.stats[0], lb.stats[1], 0.0) if v is not None and math.isfinite(v))
            if d.reason is None and d.max_abs is not None and d.max_abs > atol + rtol * scale:
                d.reason = "tensor"
        out.append(d)
    for lb in b_map.values():
        out.append(LeafDiff(lb.path, None, lb, "only in B"))
    return RecordDiff(position, name, out)


def _write_rows(writer: Any, a: ProcDir, b: ProcDir, rec: RecordDiff) -> None:
    for d in rec.leaves:
        row: List[Any] = [a.step, a.label, b.label, rec.position, rec.record, d.leaf,
                          d.a.dtype if d.a else "", d.b.dtype if d.b else "",
                          st.fmt(d.a.shape) if d.a else "", st.fmt(d.b.shape) if d.b else ""]
        for i in range(len(st.STATS)):
            x = d.a.stats[i] if d.a else None
            y = d.b.stats[i] if d.b else None
            row += [_csv(x), _csv(y), _csv(st.delta(x, y))]
        row += [_csv(d.cosine), _csv(d.max_abs), "yes" if d.reason else "no", d.reason or ""]
        writer.writerow(row)


def _csv(value: Optional[float]) -> str:
    return "" if value is None else repr(value)


def _describe(rec: RecordDiff, proc: ProcDir) -> None:
    """Attach the enclosing module or cell (construct.json) and the user source line (stack.json) to a record."""
    parents: Dict[str, Any] = {}
    try:
        for key, parent in iter_construct(proc.path):
            parents[key] = parent
    except (ValueError, OSError, UnicodeDecodeError):
        pass
    node, hops = parents.get(rec.record), 0
    while isinstance(node, str) and not names.is_module(node) and hops < 100:
        node, hops = parents.get(node), hops + 1
    if names.is_module(rec.record):
        rec.module = rec.record
    elif isinstance(node, str):
        rec.module = node
    _, frames = find_stack(proc.path, rec.record)
    frame = user_frame(frames)
    if frame is not None:
        rec.source = str(frame)


@dataclass
class DiffResult:
    pairs: List[PairResult]
    rtol: float
    atol: float

    @property
    def first(self) -> Optional[Tuple[PairResult, RecordDiff]]:
        best = None
        for i, p in enumerate(self.pairs):
            if p.first:
                k = (p.a.attempt, p.a.step, p.first[0].position, i)
                if best is None or k < best[0]:
                    best = (k, p, p.first[0])
        return (best[1], best[2]) if best else None


def diff_dumps(a_path: str, b_path: str, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
               tensors: bool = True, csv_file: Optional[IO[str]] = None, steps: Optional[set] = None,
               ranks: Optional[set] = None, keep: int = 20, progress: Optional[ProgressFn] = None) -> DiffResult:
    writer = None
    if csv_file is not None:
        writer = csv.writer(csv_file)
        writer.writerow(CSV_FIELDS)
    pairs_ = pair_dumps(a_path, b_path, steps, ranks)
    # sharded tensors are compared whole: a TP or FSDP2 run against a single-device run, or two shardings
    ga = shards.global_leaves(a_path, steps) if pairs_ else {}
    gb = shards.global_leaves(b_path, steps) if pairs_ else {}
    pairs = [diff_pair(a, b, rtol, atol, tensors, keep, writer, progress, ga, gb) for a, b in pairs_]
    return DiffResult(pairs, rtol, atol)
