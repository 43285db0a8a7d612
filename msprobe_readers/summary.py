"""Per-rank and per-step summary of a dump directory (ours or msprobe's), and the first NaN/Inf.

Per rank: steps, records, bytes on disk, errors (lines of dump_error_info.log plus unreadable files),
incomplete steps, and the first record (step order, then execution order) with a non-finite statistic,
with its stack. Run as ``python -m msprobe_readers.summary DUMP_PATH [--json]`` (the launcher's table) or
``msprobe-dump summary DUMP_PATH`` (with the per-step rows and stacks); ``text`` formats the result.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from msprobe_inject.dumpformat import stepsummary
from msprobe_inject.dumpformat.nonfinite import has_nonfinite, nonfinite_leaves
from msprobe_readers import index
from msprobe_readers.reading import (
    Frame,
    ProcDir,
    ProgressFn,
    RecordFn,
    discover,
    error_lines,
    find_stack,
    incomplete_reason,
    is_duplicate_root,
    iter_proc,
    rank_label,
    tree_bytes,
    user_frame,
)


@dataclass
class NanHit:
    """The first record with a NaN/Inf statistic in one rank (or globally)."""

    label: str
    rank: Optional[int]
    attempt: int
    step: int
    position: int  # index of the record in dump.json's data (execution order)
    record: str
    leaves: List[Tuple[str, str, Any]] = field(default_factory=list)  # (leaf path, statistic, value)
    stack_of: Optional[str] = None  # the record whose stack was found (a forward for backward records)
    stack: List[str] = field(default_factory=list)
    source: Optional[Frame] = None  # the innermost frame outside installed libraries
    path: str = ""  # the rank directory


@dataclass
class StepSummary:
    step: int
    records: int = 0
    bytes: int = 0
    errors: int = 0
    incomplete: Optional[str] = None  # why the step is incomplete, or None
    first_nan: Optional[Tuple[int, str]] = None  # (position, record name)


@dataclass
class RankSummary:
    root: str  # relative to the dump path: "." | "attempt1" | "duplicate_rank0_host_123" ...
    attempt: int
    process: str  # directory name: "rank0" | "proc123" | "rank"
    rank: Optional[int]
    steps: List[int] = field(default_factory=list)
    records: int = 0
    bytes: int = 0
    errors: int = 0
    first_nan: Optional[Tuple[int, str]] = None  # (step, record name)
    problems: List[str] = field(default_factory=list)
    per_step: List[StepSummary] = field(default_factory=list)
    nan: Optional[NanHit] = None  # first_nan with position, leaves and stack

    @property
    def label(self) -> str:
        return rank_label(self.rank, self.process, self.root)

    @property
    def incomplete_steps(self) -> List[int]:
        return [s.step for s in self.per_step if s.incomplete]


def _attach_stack(hit: NanHit) -> None:
    hit.stack_of, hit.stack = find_stack(hit.path, hit.record)
    hit.source = user_frame(hit.stack)


def _from_index(s: RankSummary, row: StepSummary, proc: ProcDir, file: str, meta: Dict[str, Any],
                first: Optional[Tuple[int, str]], failed: Callable[[str, Exception], None], header: Dict[str, Any],
                progress: Optional[ProgressFn]) -> None:
    """A step row from the index: its record count from the file's metadata, its first NaN/Inf from the scan of
    the whole index; that record alone is read (for its leaves)."""
    row.records = meta["records"]
    if first is not None:
        position, record = first
        row.first_nan = (position, record)
        if s.nan is None:
            s.first_nan = (proc.step, record)
            leaves = [leaf for _, _, value, _ in index.iter_indexed(proc, file, meta, position=position)
                      for leaf in nonfinite_leaves(value)]
            s.nan = NanHit(label=s.label, rank=s.rank, attempt=s.attempt, step=proc.step, position=position,
                           record=record, leaves=leaves, path=proc.path)
    index.replay(proc, meta, failed, header, progress)


def summarize(dump_path: str, on_record: Optional[RecordFn] = None, progress: Optional[ProgressFn] = None,
              stacks: bool = True, select: Optional[Callable[[ProcDir], bool]] = None) -> List[RankSummary]:
    """One RankSummary per (root, rank/proc directory), ordered by attempt, root and rank; only the
    directories ``select`` accepts, when given (a node's launcher summarises its own ranks).

    Every dump.json is read once; ``on_record(proc, position, name, record)`` sees every record, so other
    analyses can share the pass. Without ``on_record``, a step whose rank wrote its step summary
    (``dumpformat.stepsummary``) and whose record file is unchanged since is taken from that summary: the same
    figures without reading a record. With ``stacks``, the first NaN/Inf of each rank gets its stack.json
    frames.
    """
    found: Dict[Tuple[str, str], RankSummary] = {}
    # Without on_record, a directory with an up-to-date index file is summarised from the index's metadata (its
    # number of records) and one DuckDB scan of the whole index (its first NaN/Inf), without reading a record
    procs = discover(dump_path)
    metas = index.metadata(dump_path) if on_record is None else {}
    firsts = index.first_nonfinite(dump_path) if metas else {}
    for proc in procs:
        if select is not None and not select(proc):
            continue
        s = found.get(proc.key)
        if s is None:
            s = found[proc.key] = RankSummary(root=proc.root, attempt=proc.attempt, process=proc.process,
                                              rank=proc.rank)
        row = StepSummary(step=proc.step, bytes=tree_bytes(proc.path) if not proc.file else
                          os.path.getsize(proc.file))
        row.errors = error_lines(proc.path)
        header: Dict[str, Any] = {}
        done = stepsummary.read(proc.path) if on_record is None and not proc.file else None
        if done is not None:  # the rank's own summary of the finished step: no record is read
            row.records = done["records"]
            first = done.get("first_nan")
            if first:
                row.first_nan = (first["position"], first["record"])
                if s.nan is None:
                    s.first_nan = (proc.step, first["record"])
                    s.nan = NanHit(label=s.label, rank=s.rank, attempt=s.attempt, step=proc.step,
                                   position=first["position"], record=first["record"],
                                   leaves=[tuple(x) for x in first.get("leaves") or []], path=proc.path)

        def failed(file: str, exc: Exception, s: RankSummary = s, row: StepSummary = row,
                   proc: ProcDir = proc) -> None:
            row.errors += 1
            s.problems.append(f"step{proc.step}/{proc.process}/{os.path.basename(file)}: unreadable ({exc})")

        indexed = index.fresh_in(proc, metas) if metas and done is None else None
        if indexed is not None and "records" in indexed[1]:
            _from_index(s, row, proc, *indexed, firsts.get(indexed[0]), failed, header, progress)
        else:
            indexed = None
        for position, name, value, suspect in (iter_proc(proc, failed, header, progress) if done is None and
                                               indexed is None else ()):
            row.records += 1
            if row.first_nan is None and suspect and has_nonfinite(value):
                row.first_nan = (position, name)
                if s.nan is None:
                    s.first_nan = (proc.step, name)
                    s.nan = NanHit(label=s.label, rank=s.rank, attempt=s.attempt, step=proc.step,
                                   position=position, record=name, leaves=nonfinite_leaves(value),
                                   path=proc.path)
            if on_record is not None:
                on_record(proc, position, name, value)
        row.incomplete = incomplete_reason(proc, header)
        if row.incomplete:
            s.problems.append(f"step{proc.step}/{proc.process}: incomplete: {row.incomplete}")
        s.steps.append(proc.step)
        s.per_step.append(row)
        s.records += row.records
        s.bytes += row.bytes
        s.errors += row.errors

    def order(s: RankSummary) -> Tuple:
        return (s.attempt, is_duplicate_root(s.root), s.root,
                s.rank if s.rank is not None else 1 << 30, s.process)

    out = sorted(found.values(), key=order)
    if stacks:
        for s in out:
            if s.nan is not None:
                _attach_stack(s.nan)
    return out


def global_first_nan(summaries: List[RankSummary]) -> Optional[NanHit]:
    """The first NaN/Inf of the whole job: earliest attempt, then step, then position; ties go to the lower rank."""
    hits = [(s.attempt, s.nan.step, s.nan.position, i, s.nan) for i, s in enumerate(summaries) if s.nan]
    return min(hits, key=lambda h: h[:4])[4] if hits else None


if __name__ == "__main__":  # python -m msprobe_readers.summary: the launcher's end-of-job output again
    from msprobe_readers.cli import summary_main

    sys.exit(summary_main())
