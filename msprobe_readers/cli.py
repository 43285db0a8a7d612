"""``msprobe-dump``: read a dump (ours or msprobe's) — ``summary``, ``ranks``, ``diff``, ``report``; and the
launcher's end-of-job summary (``print_summary``, also ``python -m msprobe_readers.summary``).

A console script of its own rather than subcommands of ``msprobe-launch``: everything after the launcher's
options is the user's script and its arguments, so a subcommand name there could collide with a script
called ``summary`` or ``report``; a separate program can never be mistaken for a script name.

Exit codes: 0 read and nothing found; 1 findings (NaN/Inf or incomplete steps, a departing rank, differences
beyond tolerance); 2 usage error or nothing to read. ``report`` exits 0 once the file is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from typing import IO, Any, Callable, Dict, List, Optional, Set, Tuple

from msprobe_readers import __version__, flight, native, reading, text
from msprobe_readers import diff as dif
from msprobe_readers import ranks as rk
from msprobe_readers import summary as sm
from msprobe_readers.reading import ProcDir, discover, record_files

_PROGRESS_MIN_BYTES = 64 << 20


def _steps(text: str) -> Set[int]:
    """'0,2,4-6' -> {0, 2, 4, 5, 6}."""
    out: Set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise argparse.ArgumentTypeError(f"not a step list: {text!r} (use 0,2,4-6)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise argparse.ArgumentTypeError(f"bad range {part!r}")
        out.update(range(lo, hi + 1))
    return out


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {exc}")
    return text


def _nonneg(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _progress(paths: List[str], enabled: bool) -> Tuple[Optional[Callable[[int], None]], Callable[[], None]]:
    """A rich progress bar over the bytes of the record files, for long reads on a terminal; else nothing.

    rich is optional (not a dependency): without it, or off a terminal, reading is silent.
    """
    def nothing() -> None:
        return None

    if not enabled or not sys.stderr.isatty():
        return None, nothing
    total = 0
    for proc in discover(paths[0]) + (discover(paths[1]) if len(paths) > 1 else []):
        for file in record_files(proc):
            try:
                total += os.path.getsize(file)
            except OSError:
                pass
    if total < _PROGRESS_MIN_BYTES:
        return None, nothing
    try:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:
        return None, nothing
    bar = Progress(TextColumn("reading dump"), BarColumn(), DownloadColumn(), TimeRemainingColumn(), transient=True)
    task = bar.add_task("read", total=total)
    bar.start()
    return (lambda n: bar.advance(task, n)), bar.stop


def _nan_safe(obj: Any) -> Any:
    """NaN/Inf as strings, so that --json output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _nan_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_safe(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    """Dataclasses and named tuples (tensor leaves) as JSON objects; NaN/Inf as strings (strict JSON)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return {k: _jsonable(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return _nan_safe(obj)


def _need_dump(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return f"{path}: no such file or directory"
    if not discover(path):
        return f"{path}: no step*/rank*/dump.json (nor a dump.json file) here"
    return None


def summary_json(summaries: List[sm.RankSummary]) -> List[Dict[str, Any]]:
    """Per rank summaries as JSON objects (with their label and incomplete steps); NaN/Inf still floats."""
    out = []
    for s in summaries:
        d = dataclasses.asdict(s)
        d["label"] = s.label
        d["incomplete_steps"] = s.incomplete_steps
        out.append(d)
    return out


def cmd_summary(args: argparse.Namespace) -> int:
    from msprobe_readers import shards
    from msprobe_readers.reading import discover

    progress, done = _progress([args.dump], not args.no_progress)
    collector = shards.ShardCollector() if any(shards.has_dtensors(p) for p in discover(args.dump)) else None
    try:
        summaries = sm.summarize(args.dump, progress=progress,
                                 on_record=collector.on_record if collector is not None else None)
    finally:
        done()
    first = sm.global_first_nan(summaries)
    fl = flight.read(args.dump)
    built = native.read(args.dump)
    whole = shards.overview(collector.globals()) if collector is not None else None
    if args.json:
        out = {"dump_path": args.dump, "ranks": summary_json(summaries),
               "first_nan": dataclasses.asdict(first) if first else None}
        if whole is not None:
            out["sharded"] = whole
        if fl is not None:
            out["flight_recorder"] = fl
        if built is not None:
            out["native"] = built
        json.dump(_nan_safe(out), sys.stdout, indent=1)
        print()
    else:
        for line in flight.describe(fl) + native.describe(built):
            print(line)
        print(text.format_detail(summaries, args.dump, args.frames))
        if whole is not None:
            print(text.format_sharded(whole))
    incomplete = any(s.incomplete_steps for s in summaries)
    return 1 if first is not None or incomplete else 0


def cmd_ranks(args: argparse.Namespace) -> int:
    checker = rk.RankChecker(args.pattern, defaults=not args.no_defaults, rtol=args.rtol, atol=args.atol,
                             steps=args.step)
    progress, done = _progress([args.dump], not args.no_progress)
    try:
        result = rk.check_dump(args.dump, checker, progress)
    finally:
        done()
    if args.json:
        out = {"dump_path": args.dump, "labels": result.labels, "steps": result.steps, "compared": result.compared,
               "first": {k: _jsonable(v) for k, v in result.first.items()}, "counts": result.counts,
               "first_overall": _jsonable(result.first_overall) if result.first_overall else None,
               "rank_local": result.rank_local, "notes": result.notes, "rtol": result.rtol, "atol": result.atol,
               "missing": [_jsonable(m) for m in result.missing], "missing_count": result.missing_count,
               "shard_leaves": result.shard_leaves}
        json.dump(_nan_safe(out), sys.stdout, indent=1)
        print()
    else:
        print(text.format_ranks(result, args.dump))
    return 1 if result.first else 0


def cmd_diff(args: argparse.Namespace) -> int:
    csv_file = open(args.csv, "w", newline="", encoding="utf-8") if args.csv else None
    progress, done = _progress([args.a, args.b], not args.no_progress)
    try:
        result = dif.diff_dumps(args.a, args.b, args.rtol, args.atol, tensors=not args.no_tensors,
                                csv_file=csv_file, steps=args.step, ranks=args.rank, keep=max(args.top, 1),
                                progress=progress)
    finally:
        done()
        if csv_file is not None:
            csv_file.close()
    if not result.pairs:
        print(f"msprobe-dump diff: no step/rank directory is present in both {args.a} and {args.b}", file=sys.stderr)
        return 2
    if args.json:
        first = result.first
        out = {"a": args.a, "b": args.b, "rtol": result.rtol, "atol": result.atol,
               "pairs": [{"step": p.a.step, "rank": p.label, "compared": p.compared, "beyond": p.beyond,
                          "only_a": p.only_a, "only_b": p.only_b, "errors": p.errors,
                          "first": _jsonable(p.first[0]) if p.first else None} for p in result.pairs],
               "first": {"step": first[0].a.step, "rank": first[0].label, **_jsonable(first[1])} if first else None}
        json.dump(_nan_safe(out), sys.stdout, indent=1)
        print()
    else:
        print(text.format_diff(result, args.a, args.b, args.top))
        if args.csv:
            print(f"per-leaf rows written to {args.csv}")
    return 1 if result.first else 0


def cmd_report(args: argparse.Namespace) -> int:
    from msprobe_readers.report import build_report  # the HTML code is only loaded for this command

    out = args.output or os.path.join(os.getcwd(), "msprobe_report.html")
    progress, done = _progress([args.dump], not args.no_progress)
    try:
        info = build_report(args.dump, out, records=args.record, stats=args.stat or ["Norm"],
                            heatmap_steps=sorted(args.heatmap_step) if args.heatmap_step else None,
                            patterns=args.pattern, rtol=args.rtol, atol=args.atol, title=args.title,
                            max_series=args.max_series, progress=progress)
    finally:
        done()
    first, dep = info["first_nan"], info["ranks"].first_overall
    print(f"report written to {os.path.abspath(out)}")
    if first is not None:
        print("\n".join(text.format_hit(first, "first NaN/Inf of the job")))
    if dep is not None:
        print(f"first cross-rank departure: rank {dep.label}, {text.describe_departure(dep)}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from msprobe_readers import index

    done = index.build(args.dump, force=args.force)
    print(f"indexed {done['directories']} step/rank directories ({done['rows']} rows), {done['skipped']} up to date: "
          f"{index.index_root(args.dump)}")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from msprobe_readers import index

    if not index.exists(args.dump):
        index.build(args.dump)
    try:
        columns, rows = index.query(args.dump, args.query)
    except Exception as exc:  # the engine's own message says what is wrong with the query
        print(f"msprobe-dump sql: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(_nan_safe([dict(zip(columns, row)) for row in rows]), sys.stdout, indent=1, default=str)
        print()
    else:
        print(index.format_rows(columns, rows))
    return 0


def _tolerance(p: argparse.ArgumentParser, rtol: float, atol: float) -> None:
    p.add_argument("--rtol", type=_nonneg, default=rtol, metavar="X",
                   help=f"relative tolerance: |a-b| <= atol + rtol*max(|a|,|b|) (default {rtol:g})")
    p.add_argument("--atol", type=_nonneg, default=atol, metavar="X", help=f"absolute tolerance (default {atol:g})")


def _index_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--index", action="store_true",
                   help="bring the dump's index up to date first (see `index`), then read the records through it")
    g.add_argument("--no-index", action="store_true",
                   help="read the JSON files even where the dump's index is up to date")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msprobe-dump",
        description="Read an msprobe dump (msprobe-launch's or msprobe's): where the first NaN/Inf appeared, "
                    "which rank departs from the others, how two dumps differ, and an HTML report.",
        epilog="exit codes: 0 nothing found, 1 findings, 2 usage error or nothing to read")
    parser.add_argument("--version", action="version", version=f"msprobe-dump {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("summary", help="per rank and step: records, bytes, errors, incomplete steps, first NaN/Inf",
                       description="Per rank and step: records, bytes, errors, incomplete steps; the first record "
                                   "with a NaN/Inf statistic per rank (execution order) and in the whole job, with "
                                   "its stack from stack.json.")
    p.add_argument("dump", help="dump path, step directory, rank directory or dump.json file")
    p.add_argument("--frames", type=int, default=8, metavar="N",
                   help="stack frames shown for the job's first NaN/Inf (default 8, -1 all, 0 none)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (shown only with rich installed, on "
                                                              "a terminal, for dumps over 64 MiB)")
    _index_options(p)
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("ranks", help="cross-rank consistency under data parallelism",
                       description="Compare, step by step, the records that must agree across data-parallel ranks "
                                   "(module parameters, parameters_grad, optimizer records, and --pattern "
                                   "matches) and report per rank the first record where it departs from the "
                                   "others.")
    p.add_argument("dump", help="dump path")
    p.add_argument("--pattern", action="append", type=_regex, default=[], metavar="REGEX",
                   help="also compare records whose name matches (repeatable)")
    p.add_argument("--no-defaults", action="store_true",
                   help="compare only the --pattern records (not parameters, gradients and optimizer records)")
    p.add_argument("--step", type=_steps, default=None, metavar="LIST", help="only these steps, e.g. 0,2,4-6")
    _tolerance(p, rk.DEFAULT_RTOL, rk.DEFAULT_ATOL)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _index_options(p)
    p.set_defaults(func=cmd_ranks)

    p = sub.add_parser("diff", help="two dumps aligned by record name",
                       description="Align two dumps by record name, per step and rank (or two dump.json files / "
                                   "rank directories), and report per record the differences of Max/Min/Mean/Norm "
                                   "(and cosine similarity and max abs error when both saved .pt tensors), with the "
                                   "first record beyond tolerance in A's execution order.")
    p.add_argument("a", help="dump A (dump path, rank directory or dump.json)")
    p.add_argument("b", help="dump B, the baseline")
    _tolerance(p, dif.DEFAULT_RTOL, dif.DEFAULT_ATOL)
    p.add_argument("--csv", metavar="OUT", help="write one row per record and tensor leaf to this CSV file")
    p.add_argument("--step", type=_steps, default=None, metavar="LIST", help="only these steps")
    p.add_argument("--rank", type=_steps, default=None, metavar="LIST", help="only these ranks")
    p.add_argument("--top", type=int, default=10, metavar="N", help="records beyond tolerance listed (default 10)")
    p.add_argument("--no-tensors", action="store_true", help="do not load .pt files (statistics only)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _index_options(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("report", help="a self-contained HTML report",
                       description="Write one self-contained HTML file: the findings (first NaN/Inf with its "
                                   "source line, cross-rank departures, incomplete steps), rank x layer heat maps "
                                   "of gradient norms, and the statistics of chosen records over steps.")
    p.add_argument("dump", help="dump path")
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default ./msprobe_report.html)")
    p.add_argument("--record", action="append", type=_regex, default=[], metavar="REGEX",
                   help="records to plot over steps (repeatable; default: loss and parameters_grad records)")
    p.add_argument("--stat", action="append", choices=("Max", "Min", "Mean", "Norm"), default=[],
                   help="statistic plotted (repeatable; default Norm)")
    p.add_argument("--heatmap-step", action="append", type=int, default=[], metavar="N",
                   help="steps with a heat map (repeatable; default: all if at most 3, else the first NaN/Inf "
                        "step, the first departure step and the last step)")
    p.add_argument("--max-series", type=int, default=24, metavar="N", help="at most N plotted series (default 24)")
    p.add_argument("--pattern", action="append", type=_regex, default=[], metavar="REGEX",
                   help="extra records for the cross-rank check, as in `ranks`")
    _tolerance(p, rk.DEFAULT_RTOL, rk.DEFAULT_ATOL)
    p.add_argument("--title", help="page title")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _index_options(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("index", help="write the records' statistics as a Parquet dataset (for sql and any engine)",
                       description="Write every record's statistics as a Parquet dataset under "
                                   "DUMP/.msprobe/index/ (hive partitions attempt/step/rank), one file per step/rank "
                                   "directory; directories indexed before and unchanged since are skipped.")
    p.add_argument("dump", help="dump path")
    p.add_argument("--force", action="store_true", help="rewrite every file")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("sql", help="a SQL query (DuckDB) over the index; the table is `records`",
                       description="Run a DuckDB query over the dump's index (built first when missing); the "
                                   "dataset is the view `records`. Prints tab-separated rows with a header.")
    p.add_argument("dump", help="dump path")
    p.add_argument("query", help='e.g. "SELECT rank, count(*) FROM records GROUP BY rank"')
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_sql)
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    """``msprobe-dump``; exits with 0 (nothing found), 1 (findings) or 2 (usage error, nothing to read)."""
    args = build_parser().parse_args(argv)
    dumps = [getattr(args, n) for n in ("dump", "a", "b") if hasattr(args, n)]
    for path in dumps:
        problem = _need_dump(path)
        if problem and args.command == "summary" and os.path.isdir(path) and flight.read(path) is not None:
            problem = None  # a flight recorder that never triggered: the summary says so
        if problem:
            print(f"msprobe-dump {args.command}: {problem}", file=sys.stderr)
            sys.exit(2)
    if getattr(args, "no_index", False):
        reading.USE_INDEX = False
    if getattr(args, "index", False):
        from msprobe_readers import index

        for path in dumps:
            if os.path.isdir(path):
                index.build(path)
    try:
        code = args.func(args)
    except BrokenPipeError:  # `msprobe-dump ... | head`
        code = 0
    sys.exit(code)


# ---- the launcher's end-of-job summary ----

def print_summary(dump_path: str, file: Optional[IO[str]] = None,
                  select: Optional[Callable[[ProcDir], bool]] = None) -> List[sm.RankSummary]:
    """The launcher's end-of-job output: the per-rank table and the first NaN/Inf of the job with its source
    (of the rank directories ``select`` accepts, when given)."""
    out = sys.stdout if file is None else file
    summaries = sm.summarize(dump_path, select=select)
    for line in flight.describe(flight.read(dump_path)):
        print(line, file=out)
    if summaries:
        print(text.format_table(summaries, dump_path), file=out)
        hit = sm.global_first_nan(summaries)
        if hit is not None:
            print("\n".join(text.format_hit(hit, "first NaN/Inf of the job")), file=out)
    else:
        print(f"msprobe dump summary: no step*/rank*/dump.json under {dump_path}", file=out)
    return summaries


def summary_main(argv: Optional[List[str]] = None) -> int:
    """``python -m msprobe_readers.summary DUMP [--json]``: print_summary's output, or the summaries as JSON.
    Returns 0 when there was something to summarise, 1 when not, 2 when DUMP is not a directory."""
    parser = argparse.ArgumentParser(prog="python -m msprobe_readers.summary",
                                     description="Per-rank summary of an msprobe dump directory.")
    parser.add_argument("dump_path", help="the dump_path of the run (contains step*/ or attempt*/)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.dump_path):
        print(f"error: {args.dump_path} is not a directory", file=sys.stderr)
        return 2
    if args.json:
        summaries = sm.summarize(args.dump_path)
        json.dump(_nan_safe(summary_json(summaries)), sys.stdout, indent=1)
        print()
    else:
        summaries = print_summary(args.dump_path)
    return 0 if summaries else 1


if __name__ == "__main__":
    main()
