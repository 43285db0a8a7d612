"""Cross-rank consistency for data parallelism: which rank first departs from the others, and where.

Under data parallelism every rank holds the same parameters and, after the gradient all-reduce, the same
gradients, so their statistics must agree across ranks at each step. Compared by default:

* ``parameters`` of module (PyTorch) and cell (MindSpore) forward records (L0/mix): the weights each rank
  computed with;
* ``*.parameters_grad.*`` records; msprobe captures them when a gradient accumulates, which under DDP is
  *before* the bucket all-reduce (under FSDP2, before the reduce-scatter), so a record on which the ranks
  never all agree (on finite values) is treated as rank-local and left out (listed in the result);
* optimizer records: construct.json puts them under ``optimizer`` / ``clip_grad`` (mix), or their stack
  runs through ``torch/optim`` or ``clip_grad`` (any level): they read the all-reduced gradients;
* any record whose name matches a user ``--pattern``.

For each step and record the reference is the rank closest to the per-statistic median of all ranks
(the majority when there is one); with no majority (two ranks) it is the lowest rank, DDP's broadcast
source. Each other rank departs when a statistic differs from the reference beyond ``atol + rtol * |x|``.
Steps are read one at a time (the dump is discovered step-major), so memory holds one step of these records.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Pattern, Sequence, Set, Tuple

import numpy as np

from msprobe_inject.dumpformat import names
from msprobe_readers import stats as st
from msprobe_readers.reading import ProcDir, ProgressFn, discover, iter_construct, iter_proc, iter_stacks

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
_OPTIM_FRAME = re.compile(r"[/\\]torch[/\\](?:optim[/\\]|nn[/\\]utils[/\\]clip_grad)")
_OPTIM_PARENTS = ("optimizer", "clip_grad")
KINDS = ("param", "grad", "optimizer", "pattern")


@dataclass
class Departure:
    label: str
    rank: Optional[int]
    root: str
    step: int
    position: int
    record: str
    kind: str  # param | grad | optimizer | pattern
    leaf: str
    field: str  # the first statistic (or shape/dtype/md5) that differs
    value: Any
    reference: Any
    reference_label: str
    param: Optional[str]  # the parameter the record is about, when known
    ranks: int  # ranks compared for this record


@dataclass
class Missing:
    """A statistic one rank has and a replica lacks: reported, never counted as a difference."""

    label: str
    step: int
    record: str
    leaf: str
    reason: str
    other_label: str


@dataclass
class RanksResult:
    labels: List[str] = field(default_factory=list)  # every rank compared, in rank order
    first: Dict[str, Departure] = field(default_factory=dict)  # per rank label
    counts: Dict[str, int] = field(default_factory=dict)  # departing records per rank label
    step_counts: Dict[Tuple[str, int], int] = field(default_factory=dict)  # (rank label, step) -> departures
    compared: Dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})  # record comparisons
    steps: List[int] = field(default_factory=list)
    rank_local: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    missing: List[Missing] = field(default_factory=list)  # the first few
    missing_count: int = 0
    shard_leaves: int = 0  # record leaves (DTensor) a rank holds a piece of that no other rank holds: not compared
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def first_overall(self) -> Optional[Departure]:
        if not self.first:
            return None
        order = {label: i for i, label in enumerate(self.labels)}
        return min(self.first.values(), key=lambda d: (d.step, d.position, order.get(d.label, 0)))


class _Proc:
    def __init__(self, proc: ProcDir):
        self.proc = proc
        self.records: Dict[str, Tuple[int, str, List[st.Leaf]]] = {}
        self.params: Dict[Tuple, List[str]] = {}  # (shape, stats) -> parameter names, to name optimizer records


def _close_to(v: Any, x: float, rtol: float, atol: float) -> Any:
    """``st.close(v[i], x)`` for every element of a float64 array (NaN for a missing value), as a bool array."""
    if math.isnan(x):
        return np.isnan(v)
    if math.isinf(x):
        return v == x
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isfinite(v) & (np.abs(v - x) <= atol + rtol * np.maximum(np.abs(v), abs(x)))


def check_dump(dump_path: str, checker: RankChecker, progress: Optional[ProgressFn] = None) -> RanksResult:
    """Run ``checker`` over a dump. Through the index, a step's directories are read in one DuckDB query that
    yields only the records the checker keeps (``wanted``), so a step of thousands of ranks costs what its
    parameters, gradients and optimizer records do; other directories are read from their JSON."""
    from msprobe_readers import index

    found = discover(dump_path)
    metas = index.metadata(dump_path)
    for _, group in itertools.groupby(found, key=lambda p: (p.root, p.step)):
        fresh = [(p, index.fresh_in(p, metas) if metas else None) for p in group if checker.compares(p)]
        indexed = [(p, f) for p, f in fresh if f is not None]
        where = checker.wanted([p for p, _ in indexed]) if indexed else None
        # in discover's order, a directory joins its step when it has a record, as the checker over every record
        # has it (the order of the step's ranks decides ties)
        for p, f in fresh:
            if where is not None and f is not None:
                if f[1].get("records", 1):
                    checker.enter(p)
                continue
            for position, name, value, _ in iter_proc(p, progress=progress):
                checker.on_record(p, position, name, value)
        if where is not None:
            for i, position, name, leaves in index.iter_many([f[0] for _, f in indexed], where):
                checker.on_leaves(indexed[i][0], position, name, leaves)
            if progress is not None:
                progress(sum(index.source_bytes(f[1]) for _, f in indexed))
    return checker.finish()


class RankChecker:
    """Collects the records that must agree across ranks (``on_record``) and compares them a step at a time."""

    def __init__(self, patterns: Sequence[str] = (), defaults: bool = True, rtol: float = DEFAULT_RTOL,
                 atol: float = DEFAULT_ATOL, steps: Optional[Set[int]] = None):
        self.patterns: List[Pattern[str]] = [re.compile(p) for p in patterns]
        self.defaults = defaults
        self.rtol, self.atol = rtol, atol
        self.steps = steps
        self.result = RanksResult(rtol=rtol, atol=atol)
        self._group: Optional[Tuple[str, int]] = None
        self._procs: Dict[Tuple[str, str], _Proc] = {}
        self._optim: Dict[str, Set[str]] = {}
        self._labels: Dict[str, Tuple] = {}
        # parameters_grad departures wait for the end: they are dropped if the record is rank-local
        self._grad_agree: Dict[str, bool] = {}  # record -> whether two ranks ever agreed on finite values
        self._grad_deps: Dict[str, Dict[str, Departure]] = {}  # record -> rank label -> its first departure
        self._grad_step_counts: List[Tuple[str, str, int]] = []  # (record, rank label, step)
        self._lonely: List[int] = []  # steps with a single rank
        self._names: Dict[str, Tuple[Optional[str], bool]] = {}

    # ---- collection ----
    def compares(self, proc: ProcDir) -> bool:
        """Whether a step/rank directory takes part: duplicate ranks are not replicas of the job's ranks."""
        return not proc.duplicate and (self.steps is None or proc.step in self.steps)

    def enter(self, proc: ProcDir) -> Optional[_Proc]:
        """Start (or continue) a step/rank directory; None when it is not compared."""
        if not self.compares(proc):
            return None
        group = (proc.root, proc.step)
        if group != self._group:
            self._finish_group()
            self._group = group
        p = self._procs.get(proc.key)
        if p is None:
            p = self._procs[proc.key] = _Proc(proc)
            self._labels.setdefault(proc.label, (proc.attempt, proc.rank if proc.rank is not None else 1 << 30,
                                                 proc.process, proc.root))
        return p

    def wanted(self, procs: Sequence[ProcDir]) -> Optional[Tuple[str, Dict[str, Any]]]:
        """An index row filter (SQL condition, named parameters) keeping exactly the leaves ``on_leaves`` uses from
        these directories: every row of a parameters_grad or optimizer record (whole records: the condition is
        on the record), and a module record's parameters. None when only every record will do (user patterns are
        Python regexes). A record kept for another directory's optimizer is ignored by ``on_leaves``."""
        if self.patterns or not self.defaults:
            return None
        keys: Set[str] = set()
        for proc in procs:
            keys |= self._optimizer_keys(proc)
        return (f"direction = '{names.PARAMETERS_GRAD}' OR starts_with(arg, 'parameters.') OR "
                "list_contains($keys, record)", {"keys": sorted(keys)})

    def on_record(self, proc: ProcDir, position: int, name: str, value: Any) -> None:
        p = self.enter(proc)
        if p is None or not isinstance(value, dict):
            return
        mod, grad = self._name(name)
        if mod is not None and isinstance(value.get("parameters"), dict) and value["parameters"]:
            params = st.leaves(value["parameters"], "parameters")
        else:
            params = []
        self._take(p, position, name, mod, grad, params, lambda: st.leaves(value))

    def on_leaves(self, proc: ProcDir, position: int, name: str, leaves: List[st.Leaf]) -> None:
        """``on_record`` with the record's leaves already made (the index's rows are leaves)."""
        p = self.enter(proc)
        if p is None:
            return
        mod, grad = self._name(name)
        params = [leaf for leaf in leaves if leaf.path.startswith("parameters.")] if mod is not None else []
        self._take(p, position, name, mod, grad, params, lambda: leaves)

    def _name(self, name: str) -> Tuple[Optional[str], bool]:
        """(module path, is a parameters_grad record): names repeat on every rank and step."""
        known = self._names.get(name)
        if known is None:
            if len(self._names) > 1_000_000:
                self._names.clear()
            known = self._names[name] = (names.module_path(name), names.is_parameters_grad(name))
        return known

    def _take(self, p: _Proc, position: int, name: str, mod: Optional[str], grad: bool, params: List[st.Leaf],
              leaves: Callable[[], List[st.Leaf]]) -> None:
        for leaf in params:
            pname = f"{mod}.{leaf.path.split('.', 1)[1]}"
            p.params.setdefault((leaf.shape, leaf.stats), []).append(pname)
        if any(rx.search(name) for rx in self.patterns):
            p.records[name] = (position, "pattern", leaves())
        elif not self.defaults:
            return
        elif grad:
            p.records[name] = (position, "grad", leaves())
        elif params:
            p.records[name] = (position, "param", params)
        elif name in self._optimizer_keys(p.proc):
            p.records[name] = (position, "optimizer", leaves())

    def _optimizer_keys(self, proc: ProcDir) -> Set[str]:
        keys = self._optim.get(proc.path)
        if keys is not None:
            return keys
        keys = set()
        try:
            for key, parent in iter_construct(proc.path):
                if parent in _OPTIM_PARENTS:
                    keys.add(key)
        except (ValueError, OSError, UnicodeDecodeError):
            pass
        if not keys:  # L1 has no construct.json entries: use the stacks
            try:
                for records, frames in iter_stacks(proc.path):
                    if isinstance(frames, list) and any(_OPTIM_FRAME.search(str(f)) for f in frames):
                        keys.update(str(n) for n in records)
            except (ValueError, OSError, UnicodeDecodeError):
                pass
        self._optim = {proc.path: keys}  # one directory at a time
        return keys

    # ---- comparison ----
    def _reference(self, leafsets: List[Dict[str, st.Leaf]], paths: List[str]) -> int:
        """The rank closest to the per-statistic median: fewest statistics outside tolerance of it (and shapes
        other than the most common), the lowest index on a tie. Over columns: thousands of ranks per leaf."""
        n = len(leafsets)
        if n <= 2:
            return 0
        scores = np.zeros(n, dtype=np.int64)
        for path in paths:
            column = [ls[path] for ls in leafsets]
            shapes = [leaf.shape for leaf in column]
            common = max(set(shapes), key=shapes.count)
            scores += np.fromiter((s != common for s in shapes), dtype=np.int64, count=n)
            values = np.array([leaf.stats for leaf in column], dtype=np.float64).reshape(n, len(st.STATS))  # None: NaN
            for j in range(len(st.STATS)):
                v = values[:, j]
                finite = np.sort(v[~np.isnan(v)])  # infinities included, as st.median takes them
                k = len(finite)
                med = (float(finite[k // 2]) if k % 2 else (float(finite[k // 2 - 1]) + float(finite[k // 2])) / 2) \
                    if k * 2 > n else math.nan
                scores += ~_close_to(v, med, self.rtol, self.atol)
        return int(np.argmin(scores))  # the first of the lowest

    def _finish_group(self) -> None:
        procs = list(self._procs.values())
        self._procs = {}
        if self._group is None:
            return
        root, step = self._group
        if len(procs) < 2:
            self._lonely.append(step)
            return
        if step not in self.result.steps:
            self.result.steps.append(step)
        records: Dict[str, None] = {}
        for p in procs:
            records.update(dict.fromkeys(p.records))
        for name in records:
            present = [p for p in procs if name in p.records]
            if len(present) < 2:
                continue
            kind = present[0].records[name][1]
            leafsets = [{leaf.path: leaf for leaf in p.records[name][2]} for p in present]
            paths = [leaf.path for leaf in present[0].records[name][2] if all(leaf.path in ls for ls in leafsets)]
            if not paths:
                continue
            refs = self._references(present, leafsets, paths)
            if not refs:
                continue
            self.result.compared[kind] += 1
            departed = compared = 0
            agree_ref = None
            for i, p in enumerate(present):
                checked = False
                for path in paths:
                    ref = refs.get(path, {}).get(i)
                    if ref is None or ref == i:
                        continue
                    checked = True
                    a, b = leafsets[i][path], leafsets[ref][path]
                    reason = st.missing_reason(a, b)
                    if reason is not None:
                        self._missing(p, present[ref], step, name, path, a, b, reason)
                    why = st.leaf_mismatch(a, b, self.rtol, self.atol, skip_missing=True)
                    if why is None:
                        continue
                    departed += 1
                    dep = Departure(
                        label=p.proc.label, rank=p.proc.rank, root=root, step=step, position=p.records[name][0],
                        record=name, kind=kind, leaf=path, field=why,
                        value=st.field_value(a, why), reference=st.field_value(b, why),
                        reference_label=present[ref].proc.label,
                        param=self._param_name(name, kind, path, present[ref]), ranks=len(present))
                    if kind == "grad":
                        self._grad_deps.setdefault(name, {}).setdefault(dep.label, dep)
                        self._grad_step_counts.append((name, dep.label, step))
                    else:
                        self._add(dep)
                    break
                else:
                    if checked:
                        agree_ref = next((refs[q][i] for q in paths if i in refs.get(q, {})), 0)
                compared += checked
            if kind == "grad" and compared and not departed:
                # every rank agrees here (on finite values: NaN everywhere agrees trivially). Some ranks
                # agreeing is not enough: under FSDP2 with tensor parallelism, a tensor-parallel pair is fed
                # one batch and agrees before the reduction while the data-parallel ranks differ
                ref = agree_ref if agree_ref is not None else 0
                finite = any(v is not None and math.isfinite(v) for path in paths for v in leafsets[ref][path].stats)
                self._grad_agree[name] = self._grad_agree.get(name, False) or finite
            elif kind == "grad":
                self._grad_agree.setdefault(name, False)

    def _references(self, present: List[_Proc], leafsets: List[Dict[str, st.Leaf]],
                    paths: List[str]) -> Dict[str, Dict[int, int]]:
        """path -> {rank index: index of the rank it is compared with}. Only replicas are compared: ranks
        holding the same shard of a DTensor (the same mesh coordinate along every non-Replicate placement);
        a plain tensor, or a DTensor every rank holds alike, on all ranks with one reference per record."""
        n = len(present)
        whole: List[str] = []
        groups: Dict[str, Dict[Any, List[int]]] = {}
        for path in paths:
            keys = [st.shard_key(leafsets[i][path], present[i].proc.rank) for i in range(n)]
            if all(k == keys[0] for k in keys):
                whole.append(path)
                continue
            g: Dict[Any, List[int]] = {}
            for i, k in enumerate(keys):
                g.setdefault(k, []).append(i)
            groups[path] = g
        refs: Dict[str, Dict[int, int]] = {}
        if whole:
            ref = self._reference(leafsets, whole)
            for path in whole:
                refs[path] = {i: ref for i in range(n)}
        for path, g in groups.items():
            table: Dict[int, int] = {}
            if any(len(idxs) < 2 for idxs in g.values()):
                self.result.shard_leaves += 1
            for idxs in g.values():
                if len(idxs) < 2:
                    continue
                ref = idxs[self._reference([leafsets[i] for i in idxs], [path])]
                table.update({i: ref for i in idxs})
            if table:
                refs[path] = table
        return refs

    def _missing(self, p: _Proc, ref: _Proc, step: int, name: str, path: str, a: st.Leaf, b: st.Leaf,
                 reason: str) -> None:
        r = self.result
        r.missing_count += 1
        if len(r.missing) < 20:
            lacking, other = (p, ref) if any(x is None and y is not None for x, y in zip(a.stats, b.stats)) \
                else (ref, p)
            r.missing.append(Missing(lacking.proc.label, step, name, path, reason, other.proc.label))

    @staticmethod
    def _param_name(name: str, kind: str, path: str, ref: _Proc) -> Optional[str]:
        mod = names.module_path(name)
        if kind == "param" and mod is not None:
            return f"{mod}.{path.split('.', 1)[1]}"
        if kind == "grad" and mod is not None:
            return f"{mod}.{path.split('.')[0]}"
        if kind == "optimizer":
            for leaf in ref.records[name][2]:  # the first tensor argument is the parameter being updated
                candidates = ref.params.get((leaf.shape, leaf.stats))
                if candidates:
                    return " or ".join(dict.fromkeys(candidates))
                break
        return None

    def _add(self, dep: Departure) -> None:
        r = self.result
        r.counts[dep.label] = r.counts.get(dep.label, 0) + 1
        key = (dep.label, dep.step)
        r.step_counts[key] = r.step_counts.get(key, 0) + 1
        cur = r.first.get(dep.label)
        if cur is None or (dep.step, dep.position) < (cur.step, cur.position):
            r.first[dep.label] = dep

    def finish(self) -> RanksResult:
        self._finish_group()
        self._group = None
        r = self.result
        r.labels = sorted(self._labels, key=lambda label: self._labels[label])
        local = {name for name, agreed in self._grad_agree.items() if not agreed}
        r.rank_local = sorted(local)
        for name, deps in self._grad_deps.items():
            if name in local:
                continue
            for dep in deps.values():
                cur = r.first.get(dep.label)
                if cur is None or (dep.step, dep.position) < (cur.step, cur.position):
                    r.first[dep.label] = dep
        for name, label, step in self._grad_step_counts:
            if name not in local:
                r.counts[label] = r.counts.get(label, 0) + 1
                r.step_counts[(label, step)] = r.step_counts.get((label, step), 0) + 1
        r.steps.sort()
        if self._lonely:
            r.notes.append(f"only one rank in step(s) {','.join(map(str, sorted(set(self._lonely))))}: not compared")
        if not any(r.compared.values()):
            r.notes.append("no record to compare: dump at level mix or L0 (module parameters and parameters_grad), "
                           "or name records with --pattern")
        return r
