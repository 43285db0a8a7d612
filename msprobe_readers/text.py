"""Text for a terminal: the summary table, NaN/Inf hits with their stacks, cross-rank departures, diffs.

The analyses (``summary``, ``ranks``, ``diff``) compute; this module only formats what they return.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

from msprobe_readers import stats as st
from msprobe_readers.diff import DiffResult, RecordDiff
from msprobe_readers.ranks import Departure, RanksResult
from msprobe_readers.reading import Frame, is_library_file, parse_frame
from msprobe_readers.summary import NanHit, RankSummary, global_first_nan

_MAX_RANK_LINES = 32


# ---- summary ----

def _ranges(values: List[int]) -> str:
    if not values:
        return "-"
    values = sorted(set(values))
    parts = []
    start = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def human_bytes(n: int) -> str:
    """Bytes for people: ``512 B``, ``1.5 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _table(rows: List[Tuple[str, ...]]) -> List[str]:
    """Left-aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * len(rows[0][-1]))
    return lines


def format_table(summaries: List[RankSummary], dump_path: str = "") -> str:
    header = ("rank", "attempt", "steps", "records", "bytes", "errors", "first NaN/Inf")
    rows = [header]
    for s in summaries:
        nan = f"step {s.first_nan[0]}  {s.first_nan[1]}" if s.first_nan else "-"
        rows.append((s.label, str(s.attempt), _ranges(s.steps), str(s.records), human_bytes(s.bytes),
                     str(s.errors), nan))
    lines = [f"msprobe dump summary: {dump_path}"] if dump_path else []
    lines += _table(rows)
    for s in summaries:
        for problem in s.problems:
            lines.append(f"warning: {problem}")
    return "\n".join(lines)


def format_leaves(leaves: List[Tuple[str, str, Any]], limit: int = 3) -> str:
    """"input_args.0 Max,Min,Mean,Norm=nan; output.0 Max=inf" from (leaf path, statistic, value) triples."""
    groups: Dict[Tuple[str, str], List[str]] = {}
    for path, stat, value in leaves:
        groups.setdefault((path or ".", str(value)), []).append(stat)
    parts = [f"{path} {','.join(stats)}={value}" for (path, value), stats in groups.items()]
    more = f" (+{len(parts) - limit} more tensors)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def stack_lines(frames: List[str]) -> List[str]:
    """One line per user frame; each run of library/interpreter frames folded into one short line."""
    out: List[str] = []
    run: List[Frame] = []

    def fold() -> None:
        if run:
            f = run[0]
            m = re.search(r"(?:site-packages|dist-packages)[/\\](.*)$", f.file)
            more = f" +{len(run) - 1} library frames" if len(run) > 1 else ""
            out.append(f"({m.group(1) if m else f.file}:{f.line} in {f.func}{more})")
            run.clear()

    for text in frames:
        frame = parse_frame(text)
        if frame is not None and is_library_file(frame.file):
            run.append(frame)
            continue
        fold()
        out.append(str(frame) if frame is not None else " ".join(text.split()))
    fold()
    return out


def format_hit(hit: NanHit, title: str, frames: int = 0) -> List[str]:
    """Lines describing a NaN/Inf hit; ``frames`` > 0 adds that many stack frames (-1: all)."""
    att = f", attempt {hit.attempt}" if hit.attempt else ""
    lines = [f"{title}: rank {hit.label}{att}, step {hit.step}, record #{hit.position} {hit.record}"]
    if hit.leaves:
        lines.append(f"  non-finite: {format_leaves(hit.leaves)}")
    if hit.source is not None:
        via = f" (stack of {hit.stack_of})" if hit.stack_of and hit.stack_of != hit.record else ""
        lines.append(f"  source: {hit.source}{via}")
    elif not hit.stack:
        lines.append("  source: no stack in stack.json for this record")
    if frames and hit.stack:
        lines.append("  stack (innermost first):")
        shown = stack_lines(hit.stack)
        for text in shown if frames < 0 else shown[:frames]:
            lines.append("    " + text)
        if 0 < frames < len(shown):
            lines.append(f"    ... {len(shown) - frames} more lines (--frames -1 shows all)")
    return lines


def format_detail(summaries: List[RankSummary], dump_path: str, frames: int = 8) -> str:
    """``msprobe-dump summary``: the table, one row per rank and step, each rank's first NaN/Inf and the job's."""
    lines = [format_table(summaries, dump_path), "", "per rank and step:"]
    rows: List[Tuple[str, ...]] = [("rank", "step", "records", "bytes", "errors", "status", "first NaN/Inf")]
    for s in summaries:
        for r in s.per_step:
            nan = f"#{r.first_nan[0]} {r.first_nan[1]}" if r.first_nan else "-"
            rows.append((s.label, str(r.step), str(r.records), human_bytes(r.bytes), str(r.errors),
                         "INCOMPLETE" if r.incomplete else "ok", nan))
    lines += _table(rows)
    hits = [s.nan for s in summaries if s.nan]
    if hits:
        lines += ["", "first NaN/Inf per rank (execution order):"]
        for hit in hits[:_MAX_RANK_LINES]:
            head, *rest = format_hit(hit, "")
            lines.append(f"  rank {hit.label}:" + head.split(",", 1)[1])
            lines += ["  " + line for line in rest]
        if len(hits) > _MAX_RANK_LINES:
            lines.append(f"  ... {len(hits) - _MAX_RANK_LINES} more ranks (the table has all; --json has details)")
        first = global_first_nan(summaries)
        if first is not None:
            lines += [""] + format_hit(first, "FIRST NaN/Inf OF THE JOB", frames)
    else:
        lines += ["", "no NaN/Inf in any record"]
    return "\n".join(lines)


# ---- ranks ----

def describe_departure(dep: Departure) -> str:
    """Where a rank departs: ``step 1, record #12 Tensor.add_.0.forward [optimizer update of fc.weight]: ...``."""
    about = {"param": "parameter", "grad": "gradient", "optimizer": "optimizer update",
             "pattern": "--pattern"}[dep.kind]
    if dep.param:
        about += f" of {dep.param}"
    return (f"step {dep.step}, record #{dep.position} {dep.record} [{about}]: {dep.leaf or '.'} "
            f"{dep.field} {st.fmt(dep.value)} vs {st.fmt(dep.reference)} on rank {dep.reference_label}")


def format_ranks(r: RanksResult, dump_path: str = "") -> str:
    """``msprobe-dump ranks``: per rank consistent or where it departs first, and the first departure."""
    total = sum(r.compared.values())
    kinds = ", ".join(f"{k} {v}" for k, v in r.compared.items() if v)
    lines = [f"cross-rank consistency: {dump_path}" if dump_path else "cross-rank consistency",
             f"{len(r.labels)} ranks, steps {','.join(map(str, r.steps)) or '-'}, {total} record comparisons"
             f"{' (' + kinds + ')' if kinds else ''}; tolerance rtol={r.rtol:g} atol={r.atol:g}"]
    for label in r.labels:
        dep = r.first.get(label)
        if dep is None:
            lines.append(f"rank {label}: consistent")
        else:
            lines.append(f"rank {label}: DEPARTS at {describe_departure(dep)}; "
                         f"{r.counts.get(label, 0)} departing record(s)")
    first = r.first_overall
    if first is not None:
        lines.append(f"first departure: rank {first.label}, {describe_departure(first)}")
    else:
        lines.append("no rank departs from the others")
    if r.rank_local:
        shown = ", ".join(r.rank_local[:4]) + (f" (+{len(r.rank_local) - 4} more)" if len(r.rank_local) > 4 else "")
        lines.append(f"note: {len(r.rank_local)} parameters_grad record(s) never agree on every rank and are treated "
                     f"as rank-local (captured before the gradient all-reduce): {shown}")
    if r.missing_count:
        lines.append(f"note: {r.missing_count} statistic(s) missing on one rank and present on its replica; "
                     "not counted as differences:")
        for m in r.missing[:5]:
            lines.append(f"  rank {m.label}, step {m.step}, {m.record}: {m.leaf or '.'} missing "
                         f"(rank {m.other_label} has it): {m.reason}")
    if r.shard_leaves:
        lines.append(f"note: {r.shard_leaves} sharded tensor(s) held as different shards on different ranks "
                     "(DTensor placements): only replicas of the same shard are compared")
    for note in r.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def format_sharded(o: Dict[str, Any]) -> str:
    """The summary's section on sharded (DTensor) tensors: their whole-tensor figures, combined from the shards."""
    lines = ["", f"sharded tensors (DTensor): {o['leaves']} leaves in {o['records']} records; whole-tensor figures "
                 f"for {o['whole']} (all shards dumped), {o['partial']} partial (not combined), "
                 f"{o['incomplete']} with shards missing"]
    for n in o["nonfinite"]:
        lines.append(f"  NaN/Inf in the whole tensor: step {n['step']}, {n['record']}: {n['leaf']}")
    if o["largest"]:
        lines.append("  largest whole-tensor norms (max of maxes, min of mins, count-weighted mean, root of summed "
                     "squared norms):")
        for x in o["largest"]:
            lines.append(f"    step {x['step']} {x['record']} {x['leaf']} shape {st.fmt(tuple(x['shape']))}: "
                         + " ".join(f"{k}={st.fmt(x[k])}" for k in st.STATS))
    return "\n".join(lines)


# ---- diff ----

def _diff_lines(rec: RecordDiff, limit: int = 6) -> List[str]:
    rows = [("leaf", "field", "A", "B", "A-B")]
    for d in rec.leaves:
        if not d.reason:
            continue
        if d.a is None or d.b is None:
            rows.append((d.leaf, d.reason, "", "", ""))
            continue
        fields = [f for f in st.STATS if not st.close(st.field_value(d.a, f), st.field_value(d.b, f), 0.0, 0.0)]
        for f in fields or [d.reason]:
            if f in st.STATS:
                x, y = st.field_value(d.a, f), st.field_value(d.b, f)
                rows.append((d.leaf, f, st.fmt(x), st.fmt(y), st.fmt(st.delta(x, y))))
            else:
                rows.append((d.leaf, f, st.fmt(st.field_value(d.a, f) if f != "tensor" else d.max_abs),
                             st.fmt(st.field_value(d.b, f) if f != "tensor" else None), ""))
        if d.cosine is not None:
            rows.append((d.leaf, "cosine / max abs err", st.fmt(d.cosine), st.fmt(d.max_abs), ""))
        if len(rows) > limit:
            break
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def format_diff(r: DiffResult, a_path: str, b_path: str, top: int = 10) -> str:
    """``msprobe-dump diff``: one row per step and rank, then the first record beyond tolerance in detail."""
    lines = [f"diff A={a_path}  B={b_path}  (rtol={r.rtol:g}, atol={r.atol:g})"]
    if not r.pairs:
        lines.append("no step/rank directory is present in both dumps")
        return "\n".join(lines)
    rows = [("step", "rank", "compared", "only A", "only B", "beyond tol", "first beyond tolerance")]
    for p in r.pairs:
        first = f"#{p.first[0].position} {p.first[0].record}" if p.first else "-"
        rows.append((str(p.a.step), p.label, str(p.compared), str(len(p.only_a)), str(len(p.only_b)),
                     str(p.beyond), first))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * len(row[-1]))
    for p in r.pairs:
        for e in p.errors:
            lines.append(f"warning: {e}")
    whole = sum(p.whole for p in r.pairs)
    shard_only = sum(p.shard_only for p in r.pairs)
    if whole:
        lines.append(f"note: {whole} sharded (DTensor) tensor(s) compared as whole tensors: max of maxes, min of "
                     "mins, count-weighted mean, root of summed squared norms over the shards of all ranks")
    if shard_only:
        lines.append(f"note: {shard_only} sharded tensor(s) compared shard to shard (a Partial placement, or "
                     "shards of ranks not in the dump)")
    found = r.first
    if found is None:
        lines.append("no record differs beyond tolerance")
        return "\n".join(lines)
    pair, rec = found
    where = f" (in {rec.module})" if rec.module and rec.module != rec.record else ""
    lines += ["", f"FIRST DIFFERENCE: step {pair.a.step}, rank {pair.label}, record #{rec.position} "
                  f"{rec.record}{where}"]
    if rec.source:
        lines.append(f"  source: {rec.source}")
    lines += _diff_lines(rec)
    shown = [x for x in pair.first[1:top]]
    if shown:
        lines.append(f"  next records beyond tolerance in step {pair.a.step}, rank {pair.label}:")
        for x in shown:
            d = x.first_reason
            lines.append(f"    #{x.position} {x.record}: {d.leaf if d else ''} {d.reason if d else ''}")
    return "\n".join(lines)
