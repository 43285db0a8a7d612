"""Per-rank summary of a dump directory (ours or msprobe's).

Layout read: ``DUMP/[attempt{k}/][duplicate_*/]step{N}/{rank{R}|proc{pid}|rank}/dump.json`` (``debug.json``
for level debug). ``dump.json`` is read record by record, so a large file is never held in memory, and a
truncated or corrupt file still counts the records before the damage. Run as
``python -m msprobe_launch.summary DUMP_PATH [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank(\d*)|proc(\d+))$")
_ATTEMPT_RE = re.compile(r"^attempt(\d+)(?:_[A-Za-z0-9_.-]+)?$")  # attempt{k}[_{host}_{pid}]
_STATS = ("Max", "Min", "Mean", "Norm")
_WS = re.compile(r"[ \t\n\r]*")
_CHUNK = 1 << 20


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

    @property
    def label(self) -> str:
        name = str(self.rank) if self.rank is not None else self.process
        if self.root not in (".", ""):
            name += f" ({self.root})"
        return name


class _Truncated(ValueError):
    pass


class _Reader:
    """Incremental reader of one JSON object on top of json.JSONDecoder.raw_decode."""

    def __init__(self, fh: IO[str]):
        self.fh = fh
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.decoder = json.JSONDecoder()  # accepts msprobe's bare NaN / Infinity tokens

    def _more(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        chunk = self.fh.read(size)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        got = self.peek()
        if got != char:
            raise _Truncated("expected {!r}, found {!r}".format(char, got or "end of file"))
        self.pos += 1

    def value(self) -> Any:
        if not self.peek():
            raise _Truncated("unexpected end of file")
        size = _CHUNK
        while True:
            try:
                val, end = self.decoder.raw_decode(self.buf, self.pos)
                # A number at the very end of the buffer may continue in the next chunk.
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return val
            except json.JSONDecodeError:
                if self.eof:
                    raise
            if not self._more(size):
                # eof reached: one last attempt with everything we have
                val, end = self.decoder.raw_decode(self.buf, self.pos)
                self.pos = end
                return val
            size *= 2

    def members(self) -> Iterator[Tuple[str, _Reader]]:
        """Iterate the members of the object starting here; the caller must consume each value."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise _Truncated("object key is not a string")
            self.expect(":")
            yield key, self
            nxt = self.peek()
            if nxt == ",":
                self.pos += 1
                continue
            if nxt == "}":
                self.pos += 1
                return
            raise _Truncated("expected ',' or '}', found %r" % (nxt or "end of file"))


def iter_records(path: str) -> Iterator[Tuple[str, Any]]:
    """(record name, record) pairs of a dump.json ``data`` object, in file (= execution) order.

    Raises ValueError (after yielding what was readable) when the file is truncated or not JSON.
    """
    with open(path, encoding="utf-8") as fh:
        reader = _Reader(fh)
        for key, _ in reader.members():
            if key == "data":
                if reader.peek() != "{":
                    reader.value()
                    continue
                for name, _ in reader.members():
                    yield name, reader.value()
            else:
                reader.value()


def _bad_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value) or math.isinf(value)
    if isinstance(value, str):
        return value.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity")
    return False


def has_nan_or_inf(value: Any) -> bool:
    """True if any tensor leaf below ``value`` has a NaN or +-Inf in Max/Min/Mean/Norm."""
    if isinstance(value, dict):
        if any(_bad_number(value.get(stat)) for stat in _STATS):
            return True
        return any(has_nan_or_inf(v) for v in value.values() if isinstance(v, (dict, list)))
    if isinstance(value, list):
        return any(has_nan_or_inf(v) for v in value)
    return False


def _tree_bytes(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += _tree_bytes(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def _subdirs(path: str) -> List[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _roots(dump_path: str) -> List[Tuple[str, int]]:
    """(root directory, attempt) pairs: the dump path, attempt{k}/ and duplicate_*/ inside either."""
    out: List[Tuple[str, int]] = []
    bases = [(dump_path, 0)]
    for entry in _subdirs(dump_path):
        m = _ATTEMPT_RE.match(entry.name)
        if m:
            bases.append((entry.path, int(m.group(1))))
    for base, attempt in bases:
        out.append((base, attempt))
        for entry in _subdirs(base):
            if entry.name.startswith("duplicate_"):
                out.append((entry.path, attempt))
    return out


def _scan_process_dir(summary: RankSummary, step: int, path: str) -> None:
    summary.steps.append(step)
    summary.bytes += _tree_bytes(path)
    summary.errors += _count_lines(os.path.join(path, "dump_error_info.log"))
    for name in ("dump.json", "debug.json"):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:
            for record, value in iter_records(file):
                summary.records += 1
                if summary.first_nan is None and has_nan_or_inf(value):
                    summary.first_nan = (step, record)
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            summary.errors += 1
            summary.problems.append(f"step{step}/{summary.process}/{name}: unreadable ({exc})")


def summarize(dump_path: str) -> List[RankSummary]:
    """One RankSummary per (root, rank/proc directory), ordered by attempt, root and rank."""
    found: Dict[Tuple[str, str], RankSummary] = {}
    steps_by_key: Dict[Tuple[str, str], List[Tuple[int, str]]] = {}
    for root, attempt in _roots(dump_path):
        rel = os.path.relpath(root, dump_path)
        for step_entry in _subdirs(root):
            m = _STEP_RE.match(step_entry.name)
            if not m:
                continue
            for proc_entry in _subdirs(step_entry.path):
                pm = _RANK_RE.match(proc_entry.name)
                if not pm:
                    continue
                key = (rel, proc_entry.name)
                if key not in found:
                    rank = int(pm.group(1)) if pm.group(1) else None
                    found[key] = RankSummary(root=rel, attempt=attempt, process=proc_entry.name, rank=rank)
                steps_by_key.setdefault(key, []).append((int(m.group(1)), proc_entry.path))
    for key, steps in steps_by_key.items():
        for step, path in sorted(steps):  # NaN search in step order
            _scan_process_dir(found[key], step, path)

    def order(s: RankSummary) -> Tuple:
        return (s.attempt, s.root != "." and not s.root.startswith("attempt"), s.root,
                s.rank if s.rank is not None else 1 << 30, s.process)

    return sorted(found.values(), key=order)


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


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def format_table(summaries: List[RankSummary], dump_path: str = "") -> str:
    header = ("rank", "attempt", "steps", "records", "bytes", "errors", "first NaN/Inf")
    rows = [header]
    for s in summaries:
        nan = f"step {s.first_nan[0]}  {s.first_nan[1]}" if s.first_nan else "-"
        rows.append((s.label, str(s.attempt), _ranges(s.steps), str(s.records), _size(s.bytes),
                     str(s.errors), nan))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = []
    if dump_path:
        lines.append(f"msprobe dump summary: {dump_path}")
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * len(header[-1]))
    for s in summaries:
        for problem in s.problems:
            lines.append(f"warning: {problem}")
    return "\n".join(lines)


def print_summary(dump_path: str, file: Optional[IO[str]] = None) -> List[RankSummary]:
    out = sys.stdout if file is None else file
    summaries = summarize(dump_path)
    if summaries:
        print(format_table(summaries, dump_path), file=out)
    else:
        print(f"msprobe dump summary: no step*/rank*/dump.json under {dump_path}", file=out)
    return summaries


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msprobe_launch.summary",
                                     description="Per-rank summary of an msprobe dump directory.")
    parser.add_argument("dump_path", help="the dump_path of the run (contains step*/ or attempt*/)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.dump_path):
        print(f"error: {args.dump_path} is not a directory", file=sys.stderr)
        return 2
    if args.json:
        summaries = summarize(args.dump_path)
        json.dump([dict(asdict(s), label=s.label) for s in summaries], sys.stdout, indent=1)
        print()
    else:
        summaries = print_summary(args.dump_path)
    return 0 if summaries else 1


if __name__ == "__main__":
    sys.exit(main())
