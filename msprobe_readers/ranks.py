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
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Pattern, Sequence, Set, Tuple, Union

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
        self.label = proc.label
        self.records: Dict[str, Tuple[int, str, List[st.Leaf]]] = {}
        self.params: Dict[Tuple, List[str]] = {}  # (shape, stats) -> parameter names, to name optimizer records


_PATH = operator.itemgetter(0)  # a Leaf's path


def _columns(lists: List[List[st.Leaf]]) -> Tuple[List[str], Dict[str, st.Column]]:
    """The paths of the first rank's leaves that every rank has, in its order, and each one's column over the
    ranks. Ranks mostly hold the same paths in the same order: then the columns are the lists transposed."""
    first = lists[0]
    k = len(first)
    paths = [leaf.path for leaf in first]
    if len(set(paths)) == k and all(len(x) == k for x in lists):
        cols = list(zip(*lists))
        if all(len(set(map(_PATH, col))) == 1 for col in cols):
            return paths, {path: st.Column(col) for path, col in zip(paths, cols)}
    leafsets = [{leaf.path: leaf for leaf in x} for x in lists]
    paths = [path for path in paths if all(path in ls for ls in leafsets)]
    return paths, {path: st.Column([ls[path] for ls in leafsets]) for path in dict.fromkeys(paths)}


def check_dump(dump_path: str, checker: RankChecker, progress: Optional[ProgressFn] = None) -> RanksResult:
    """Run ``checker`` over a dump. Through the index, a step's directories are read in one DuckDB query that
    yields only the records the checker keeps (``wanted``), so a step of thousands of ranks costs what its
    parameters, gradients and optimizer records do; a thread reads the next step's while this one is compared.
    Other directories are read from their JSON."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from msprobe_readers import index

    found = discover(dump_path)
    metas = index.metadata(dump_path)
    steps = []
    for _, group in itertools.groupby(found, key=lambda p: (p.root, p.step)):
        fresh = [(p, index.fresh_in(p, metas) if metas else None) for p in group if checker.compares(p)]
        indexed = [(p, f) for p, f in fresh if f is not None]
        steps.append((fresh, indexed))
    reads: Dict[int, Tuple[Any, Future]] = {}  # step -> (its row filter, its rows being read)
    with ThreadPoolExecutor(1) as pool, index.no_collection():
        def read(k: int) -> None:  # a step at a time, as its directories' construct.json are read for wanted()
            if k < len(steps) and k not in reads and steps[k][1]:
                where = checker.wanted([p for p, _ in steps[k][1]])
                files = [f[0] for _, f in steps[k][1]]
                reads[k] = (where, pool.submit(index.fetch_many, files, where) if where is not None else None)

        for k, (fresh, indexed) in enumerate(steps):
            read(k)
            read(k + 1)
            where, rows = reads.pop(k, (None, None))
            # in discover's order, a directory joins its step when it has a record, as the checker over every
            # record has it (the order of the step's ranks decides ties)
            for p, f in fresh:
                if where is not None and f is not None:
                    if f[1].get("records", 1):
                        checker.enter(p)
                    continue
                for position, name, value, _ in iter_proc(p, progress=progress):
                    checker.on_record(p, position, name, value)
            if where is not None:
                files = [f[0] for _, f in indexed]
                checker.on_many([p for p, _ in indexed], index.iter_many(files, where, rows.result()))
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
        self._optim: Dict[str, Tuple[Tuple[str, int], Set[str]]] = {}  # directory -> (its step, optimizer records)
        self._labels: Dict[str, Tuple] = {}
        # parameters_grad departures wait for the end: they are dropped if the record is rank-local
        self._grad_agree: Dict[str, bool] = {}  # record -> whether two ranks ever agreed on finite values
        self._grad_deps: Dict[str, Dict[str, Departure]] = {}  # record -> rank label -> its first departure
        self._grad_step_counts: List[Tuple[str, int, List[str]]] = []  # (record, step, departing rank labels)
        self._lonely: List[int] = []  # steps with a single rank
        self._names: Dict[str, Tuple[Optional[str], bool]] = {}

    # ---- collection ----
    def compares(self, proc: ProcDir) -> bool:
        """Whether a step/rank directory takes part: duplicate ranks are not replicas of the job's ranks."""
        return not proc.duplicate and (self.steps is None or proc.step in self.steps)

    def enter(self, proc: ProcDir) -> Optional[_Proc]:
        """Start (or continue) a step/rank directory; None when it is not compared."""
        group = (proc.root, proc.step)
        if group == self._group:  # the directory's next record: it was already let in, or kept out
            p = self._procs.get(proc.key)
            if p is not None and p.proc is proc:
                return p
        if not self.compares(proc):
            return None
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
        self.on_many([proc], [(0, position, name, leaves)])

    def on_many(self, procs: Sequence[ProcDir], records: Iterable[Tuple[int, int, str, List[st.Leaf]]]) -> None:
        """``on_leaves`` for (index into ``procs``, position, name, leaves) of many directories' records, in
        order (``index.iter_many``): a step of thousands of ranks is hundreds of thousands of records."""
        last, p = -1, None
        known, take = self._names, self._take
        for i, position, name, leaves in records:
            if i != last:
                last, p = i, self.enter(procs[i])
            if p is None:
                continue
            mod, grad = known.get(name) or self._name(name)
            params = [leaf for leaf in leaves if leaf.path.startswith("parameters.")] if mod is not None else []
            take(p, position, name, mod, grad, params, leaves)

    def _name(self, name: str) -> Tuple[Optional[str], bool]:
        """(module path, is a parameters_grad record): names repeat on every rank and step."""
        known = self._names.get(name)
        if known is None:
            if len(self._names) > 1_000_000:
                self._names.clear()
            known = self._names[name] = (names.module_path(name), names.is_parameters_grad(name))
        return known

    def _take(self, p: _Proc, position: int, name: str, mod: Optional[str], grad: bool, params: List[st.Leaf],
              leaves: Union[List[st.Leaf], Callable[[], List[st.Leaf]]]) -> None:
        """Keep a record the step compares; ``leaves``, or a function making them (only for a record kept)."""
        for leaf in params:
            pname = f"{mod}.{leaf.path.split('.', 1)[1]}"
            p.params.setdefault((leaf.shape, leaf.stats), []).append(pname)
        if self.patterns and any(rx.search(name) for rx in self.patterns):
            kind = "pattern"
        elif not self.defaults:
            return
        elif grad:
            kind = "grad"
        elif params:
            p.records[name] = (position, "param", params)
            return
        elif name in self._optimizer_keys(p.proc):
            kind = "optimizer"
        else:
            return
        p.records[name] = (position, kind, leaves if isinstance(leaves, list) else leaves())

    def _optimizer_keys(self, proc: ProcDir) -> Set[str]:
        known = self._optim.get(proc.path)
        if known is not None:
            return known[1]
        keys: Set[str] = set()
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
        # kept until the directory's step is compared (wanted() reads them a step ahead of the records)
        self._optim[proc.path] = ((proc.root, proc.step), keys)
        return keys

    # ---- comparison ----
    def _reference(self, columns: List[st.Column]) -> int:
        """The rank closest to the per-statistic median: fewest statistics outside tolerance of it (and shapes
        other than the most common, the first seen of them on a tie), the lowest index on a tie. Over columns:
        thousands of ranks per leaf."""
        n = columns[0].n
        if n <= 2:
            return 0
        scores = np.zeros(n, dtype=np.int64)
        for column in columns:
            scores += column.shape != np.bincount(column.shape).argmax()
            values = column.values  # missing: NaN
            for j in range(len(st.STATS)):
                v = values[:, j]
                finite = np.sort(v[~np.isnan(v)])  # infinities included, as st.median takes them
                k = len(finite)
                med = (float(finite[k // 2]) if k % 2 else (float(finite[k // 2 - 1]) + float(finite[k // 2])) / 2) \
                    if k * 2 > n else math.nan
                scores += ~st.close_array(v, np.float64(med), self.rtol, self.atol)  # missing: NaN
        return int(np.argmin(scores))  # the first of the lowest

    def _finish_group(self) -> None:
        procs = list(self._procs.values())
        self._procs = {}
        if self._group is None:
            return
        self._optim = {path: v for path, v in self._optim.items() if v[0] != self._group}
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
            paths, columns = _columns([p.records[name][2] for p in present])
            if not paths:
                continue
            refs = self._references(present, columns, paths)
            if not refs:
                continue
            self.result.compared[kind] += 1
            self._compare(root, step, name, kind, present, columns, paths, refs)

    def _compare(self, root: str, step: int, name: str, kind: str, present: List[_Proc],
                 columns: Dict[str, st.Column], paths: List[str], refs: Dict[str, Dict[int, int]]) -> None:
        """Compare every rank of one record with its reference at once, over columns (one per leaf path): a rank
        departs at the first path, in record order, where ``st.leaf_mismatch`` finds a field; a statistic one side
        lacks is reported for every path compared up to there."""
        n, count = len(present), len(paths)
        ref = np.full((count, n), -1, dtype=np.int64)
        for k, path in enumerate(paths):
            for i, j in refs.get(path, {}).items():
                ref[k, i] = j
        codes = np.zeros((count, n), dtype=np.int64)
        lacks = np.zeros((count, n), dtype=bool)
        for k, path in enumerate(paths):
            codes[k], lacks[k] = columns[path].mismatches(ref[k], self.rtol, self.atol)
        checks = (ref >= 0) & (ref != np.arange(n))
        departs = checks & (codes > 0)
        departed = departs.any(axis=0)
        first = np.where(departed, departs.argmax(axis=0), count)  # the path each rank departs at
        lacking = checks & lacks & (np.arange(count)[:, None] <= first)
        for i, k in np.argwhere(lacking.T):  # rank by rank, path by path
            a, b = columns[paths[k]].leaves[i], columns[paths[k]].leaves[ref[k, i]]
            self._missing(present[i], present[ref[k, i]], step, name, paths[k], a, b, st.missing_reason(a, b))
        checked = checks.any(axis=0)
        agreeing = np.flatnonzero(checked & ~departed)
        deps = self._grad_deps.setdefault(name, {}) if kind == "grad" else None
        labels = []
        for i in np.flatnonzero(departed):
            p, k = present[i], first[i]
            label = p.label
            labels.append(label)
            if deps is not None and label in deps:
                continue  # only a gradient's first departure per rank is kept
            path, j = paths[k], ref[k, i]
            why = st.MISMATCH_FIELDS[codes[k, i] - 1]
            a, b = columns[path].leaves[i], columns[path].leaves[j]
            dep = Departure(
                label=label, rank=p.proc.rank, root=root, step=step, position=p.records[name][0], record=name,
                kind=kind, leaf=path, field=why, value=st.field_value(a, why), reference=st.field_value(b, why),
                reference_label=present[j].label, param=self._param_name(name, kind, path, present[j]),
                ranks=n)
            if deps is not None:
                deps[label] = dep
            else:
                self._add(dep)
        if deps is not None:
            self._grad_step_counts.append((name, step, labels))
        if kind == "grad" and checked.any() and not departed.any():
            # every rank agrees here (on finite values: NaN everywhere agrees trivially). Some ranks
            # agreeing is not enough: under FSDP2 with tensor parallelism, a tensor-parallel pair is fed
            # one batch and agrees before the reduction while the data-parallel ranks differ
            i = agreeing[-1]
            j = ref[np.flatnonzero(ref[:, i] >= 0)[0], i]
            finite = any(v is not None and math.isfinite(v) for path in paths for v in columns[path].leaves[j].stats)
            self._grad_agree[name] = self._grad_agree.get(name, False) or finite
        elif kind == "grad":
            self._grad_agree.setdefault(name, False)

    def _references(self, present: List[_Proc], columns: Dict[str, st.Column],
                    paths: List[str]) -> Dict[str, Dict[int, int]]:
        """path -> {rank index: index of the rank it is compared with}. Only replicas are compared: ranks
        holding the same shard of a DTensor (the same mesh coordinate along every non-Replicate placement);
        a plain tensor, or a DTensor every rank holds alike, on all ranks with one reference per record."""
        n = len(present)
        whole: List[str] = []
        groups: Dict[str, Dict[Any, List[int]]] = {}
        for path in paths:
            column = columns[path]
            keys = [st.shard_key(column.leaves[i], present[i].proc.rank) for i in range(n)] if column.placed else []
            if all(k == keys[0] for k in keys):  # plain tensors: every key is None
                whole.append(path)
                continue
            g: Dict[Any, List[int]] = {}
            for i, k in enumerate(keys):
                g.setdefault(k, []).append(i)
            groups[path] = g
        refs: Dict[str, Dict[int, int]] = {}
        if whole:
            ref = self._reference([columns[path] for path in whole])
            for path in whole:
                refs[path] = dict.fromkeys(range(n), ref)
        for path, g in groups.items():
            table: Dict[int, int] = {}
            if any(len(idxs) < 2 for idxs in g.values()):
                self.result.shard_leaves += 1
            for idxs in g.values():
                if len(idxs) < 2:
                    continue
                ref = idxs[self._reference([columns[path].subset(idxs)])]
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

    def _param_name(self, name: str, kind: str, path: str, ref: _Proc) -> Optional[str]:
        mod = self._name(name)[0]
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
        for name, step, labels in self._grad_step_counts:
            if name not in local:
                for label in labels:
                    r.counts[label] = r.counts.get(label, 0) + 1
                    r.step_counts[(label, step)] = r.step_counts.get((label, step), 0) + 1
        r.steps.sort()
        if self._lonely:
            r.notes.append(f"only one rank in step(s) {','.join(map(str, sorted(set(self._lonely))))}: not compared")
        if not any(r.compared.values()):
            r.notes.append("no record to compare: dump at level mix or L0 (module parameters and parameters_grad), "
                           "or name records with --pattern")
        return r
