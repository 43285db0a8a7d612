"""Per-rank and per-step summary of a dump directory (ours or msprobe's).

Layout read: ``DUMP/[attempt{k}/][duplicate_*/]step{N}/{rank{R}|proc{pid}|rank}/dump.json`` (``debug.json``
for level debug, ``dump.journal`` when the json files were never written). ``dump.json`` is read record by
record, so a large file is never held in memory, and a truncated or corrupt file still counts the records
before the damage. Run as ``python -m msprobe_launch.summary DUMP_PATH [--json]`` (the launcher's table) or
``msprobe-dump summary DUMP_PATH`` (with the per-step rows and stacks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank(\d*)|proc(\d+))$")
_ATTEMPT_RE = re.compile(r"^attempt(\d+)(?:_[A-Za-z0-9_.-]+)?$")  # attempt{k}[_{host}_{pid}]
_STATS = ("Max", "Min", "Mean", "Norm")
_WS = re.compile(r"[ \t\n\r]*")
_CHUNK = 1 << 20
# Substrings of any text that decodes to a non-finite statistic: msprobe's bare NaN/Infinity tokens and
# quoted "nan"/"inf" strings. Records without them skip the tree walk; str.find is ~8x faster than a regex
# alternation here, which matters at 1 M records.
_SUSPECT = ("NaN", "Inf", "nan", "inf")
_TOKEN_MAX = 8
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"[ \t\n\r]*:[ \t\n\r]*')
_FRAME_RE = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<func>.*?), ?\n ?(?P<code>.*)$", re.S)
# Frames of installed libraries and of the interpreter: not where the user's code is.
_LIB_RE = re.compile(r"[/\\](?:site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d[^/\\]*[/\\]|^<")
JOURNAL = "dump.journal"
_MAX_RANK_LINES = 32
DUMP_FILES = ("dump.json", "debug.json")

ProgressFn = Callable[[int], None]


@dataclass
class ProcDir:
    """One step/rank directory (or one dump.json file given directly)."""

    root: str  # relative to the dump path: "." | "attempt1" | "duplicate_rank0_host_123" ...
    attempt: int
    step: int
    process: str  # directory name: "rank0" | "proc123" | "rank"
    rank: Optional[int]
    path: str  # the directory
    file: Optional[str] = None  # a specific dump.json, when one was named

    @property
    def label(self) -> str:
        return _label(self.rank, self.process, self.root)

    @property
    def key(self) -> Tuple[str, str]:
        return (self.root, self.process)


@dataclass
class Frame:
    file: str
    line: int
    func: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}: {self.code}"


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
        return _label(self.rank, self.process, self.root)

    @property
    def incomplete_steps(self) -> List[int]:
        return [s.step for s in self.per_step if s.incomplete]


def _label(rank: Optional[int], process: str, root: str) -> str:
    name = str(rank) if rank is not None else process
    if root not in (".", ""):
        name += f" ({root})"
    return name


class _Truncated(ValueError):
    pass


class _Reader:
    """Incremental reader of one JSON object on top of json.JSONDecoder.raw_decode."""

    def __init__(self, fh: IO[str], progress: Optional[ProgressFn] = None):
        self.fh = fh
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.decoder = json.JSONDecoder()  # accepts msprobe's bare NaN / Infinity tokens
        self.span = (0, 0)  # buf[span[0]:span[1]] is the text of the last value()
        self.progress = progress
        # Offsets in buf of the _SUSPECT tokens found so far, and how far buf has been searched for them:
        # one search per chunk instead of one per record.
        self._hits: Deque[int] = deque()
        self._scanned = 0

    def _more(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        if self.pos:
            self.buf = self.buf[self.pos:]
            shift, self.pos = self.pos, 0
            self._hits = deque(h - shift for h in self._hits if h >= shift)
            self._scanned = max(0, self._scanned - shift)
        chunk = self.fh.read(size)
        if not chunk:
            self.eof = True
            return False
        if self.progress is not None:
            self.progress(len(chunk))
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
                start = self.pos
                val, end = self.decoder.raw_decode(self.buf, start)
                # A number at the very end of the buffer may continue in the next chunk.
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    self.span = (start, end)
                    return val
            except json.JSONDecodeError:
                if self.eof:
                    raise
            if not self._more(size):
                # eof reached: one last attempt with everything we have
                start = self.pos
                val, end = self.decoder.raw_decode(self.buf, start)
                self.pos = end
                self.span = (start, end)
                return val
            size *= 2

    def suspect(self) -> bool:
        """Whether the text of the last value may hold a non-finite statistic."""
        start, end = self.span
        buf = self.buf
        if self._scanned < end:
            lo = max(0, self._scanned - _TOKEN_MAX)  # a token may straddle the previous search's end
            found = sorted({i for token in _SUSPECT for i in _find_all(buf, token, lo)})
            last = self._hits[-1] if self._hits else -1
            self._hits.extend(i for i in found if i > last)
            self._scanned = len(buf)
        hits = self._hits
        while hits and hits[0] < start:
            hits.popleft()
        return bool(hits) and hits[0] < end

    def key(self) -> str:
        """An object key and its colon; a regex match in the common case, the decoder otherwise."""
        m = _KEY.match(self.buf, self.pos)
        if m is not None and m.end() < len(self.buf):
            self.pos = m.end()
            text = m.group(1)
            return json.loads('"' + text + '"') if "\\" in text else text
        key = self.value()
        if not isinstance(key, str):
            raise _Truncated("object key is not a string")
        self.expect(":")
        return key

    def members(self) -> Iterator[Tuple[str, _Reader]]:
        """Iterate the members of the object starting here; the caller must consume each value."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            yield self.key(), self
            if self.buf.startswith(",", self.pos):  # json.dump puts the comma right after the value
                self.pos += 1
                continue
            nxt = self.peek()
            if nxt == ",":
                self.pos += 1
                continue
            if nxt == "}":
                self.pos += 1
                return
            raise _Truncated("expected ',' or '}', found %r" % (nxt or "end of file"))


def _find_all(buf: str, token: str, start: int) -> Iterator[int]:
    i = buf.find(token, start)
    while i >= 0:
        yield i
        i = buf.find(token, i + 1)


def _iter_flagged(path: str, header: Optional[Dict[str, Any]] = None,
                  progress: Optional[ProgressFn] = None) -> Iterator[Tuple[str, Any, bool]]:
    """(record name, record, may hold NaN/Inf) of a dump.json ``data`` object, in file order.

    Top-level members other than ``data`` go into ``header`` (``"incomplete": true`` may follow ``data``).
    """
    with open(path, encoding="utf-8") as fh:
        reader = _Reader(fh, progress)
        for key, _ in reader.members():
            if key == "data":
                if reader.peek() != "{":
                    reader.value()
                    continue
                for name, _ in reader.members():
                    value = reader.value()
                    yield name, value, reader.suspect()
            else:
                value = reader.value()
                if header is not None:
                    header[key] = value


def iter_records(path: str) -> Iterator[Tuple[str, Any]]:
    """(record name, record) pairs of a dump.json ``data`` object, in file (= execution) order.

    Raises ValueError (after yielding what was readable) when the file is truncated or not JSON.
    """
    for name, value, _ in _iter_flagged(path):
        yield name, value


def iter_object(path: str) -> Iterator[Tuple[str, Any]]:
    """Top-level (key, value) pairs of any JSON object file (stack.json, construct.json), streamed."""
    with open(path, encoding="utf-8") as fh:
        reader = _Reader(fh)
        for key, _ in reader.members():
            yield key, reader.value()


def journal_state(path: str) -> Optional[bool]:
    """None without a journal; else whether its last line is the writer's ``{"op": "end"}`` marker."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            tail = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if line.strip():
            try:
                return json.loads(line).get("op") == "end"
            except (ValueError, AttributeError):
                return False
    return False


def iter_journal(path: str) -> Iterator[Tuple[str, Any]]:
    """Records rebuilt from a dump.journal (as msprobe_inject.writer.recover does), in execution order.

    The step's records are replayed in memory: a journal is only read when dump.json is missing.
    """
    data: Dict[str, Any] = {}
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                ev = json.loads(raw)
            except ValueError:
                break  # torn last line
            op, key, value = ev.get("op"), ev.get("k"), ev.get("v")
            if op == "open":
                data = {}
            elif op == "set":
                data[key] = value
            elif op == "move":
                data.pop(key, None)
                data[key] = value
            elif op == "update":
                cur = data.get(key)
                if isinstance(cur, dict) and isinstance(value, dict):
                    cur.update(value)
                else:
                    data[key] = value
    yield from data.items()


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


def nonfinite_leaves(value: Any, prefix: str = "") -> List[Tuple[str, str, Any]]:
    """(leaf path, statistic, value) of every NaN/Inf statistic below ``value``, e.g. ("input_args.0", "Max", nan)."""
    out: List[Tuple[str, str, Any]] = []
    if isinstance(value, dict):
        for stat in _STATS:
            if _bad_number(value.get(stat)):
                out.append((prefix, stat, value.get(stat)))
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                out.extend(nonfinite_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(nonfinite_leaves(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


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


def _is_proc_dir(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, name)) for name in DUMP_FILES + (JOURNAL,))


def _single(directory: str, file: Optional[str] = None) -> ProcDir:
    """A ProcDir for a rank directory or dump.json named directly; step and rank from the names if they fit."""
    directory = os.path.abspath(directory)
    process = os.path.basename(directory)
    pm = _RANK_RE.match(process)
    rank = int(pm.group(1)) if pm and pm.group(1) else None
    sm = _STEP_RE.match(os.path.basename(os.path.dirname(directory)))
    return ProcDir(root=".", attempt=0, step=int(sm.group(1)) if sm else 0, process=process, rank=rank,
                   path=directory, file=file)


def discover(dump_path: str) -> List[ProcDir]:
    """Every step/rank directory under a dump path, ordered by attempt, root, step and rank.

    ``dump_path`` may also be one step directory, one rank directory or one dump.json / debug.json file.
    """
    if os.path.isfile(dump_path):
        return [_single(os.path.dirname(os.path.abspath(dump_path)), os.path.abspath(dump_path))]
    if _is_proc_dir(dump_path):
        return [_single(dump_path)]
    found: List[ProcDir] = []
    if _STEP_RE.match(os.path.basename(os.path.abspath(dump_path))):
        step = int(_STEP_RE.match(os.path.basename(os.path.abspath(dump_path))).group(1))
        for proc_entry in _subdirs(dump_path):
            pm = _RANK_RE.match(proc_entry.name)
            if pm:
                rank = int(pm.group(1)) if pm.group(1) else None
                found.append(ProcDir(".", 0, step, proc_entry.name, rank, proc_entry.path))
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
                rank = int(pm.group(1)) if pm.group(1) else None
                found.append(ProcDir(rel, attempt, int(m.group(1)), proc_entry.name, rank, proc_entry.path))

    def order(p: ProcDir) -> Tuple:  # step-major, so that cross-rank analyses can finish a step at a time
        return (p.attempt, p.root != "." and not p.root.startswith("attempt"), p.root, p.step,
                p.rank if p.rank is not None else 1 << 30, p.process)

    return sorted(found, key=order)


def record_files(proc: ProcDir) -> List[str]:
    """The record files of a step/rank directory: dump.json and/or debug.json (or the named file)."""
    if proc.file:
        return [proc.file]
    return [os.path.join(proc.path, n) for n in DUMP_FILES if os.path.isfile(os.path.join(proc.path, n))]


RecordFn = Callable[[ProcDir, int, str, Any], None]


def iter_proc(proc: ProcDir, on_error: Optional[Callable[[str, Exception], None]] = None,
              header: Optional[Dict[str, Any]] = None, progress: Optional[ProgressFn] = None
              ) -> Iterator[Tuple[int, str, Any, bool]]:
    """(position, record name, record, may hold NaN/Inf) of one step/rank directory, in execution order.

    Reads dump.json (and debug.json); with neither, rebuilds the records from dump.journal.
    """
    files = record_files(proc)
    position = 0
    sources: List[Tuple[str, Callable[[], Iterator[Tuple[str, Any, bool]]]]] = []
    for file in files:
        sources.append((file, lambda f=file: _iter_flagged(f, header, progress)))
    journal = os.path.join(proc.path, JOURNAL)
    if not files and os.path.isfile(journal):
        sources.append((journal, lambda: ((k, v, True) for k, v in iter_journal(journal))))
    for file, make in sources:
        try:
            for name, value, suspect in make():
                yield position, name, value, suspect
                position += 1
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            if on_error is not None:
                on_error(file, exc)


def incomplete_reason(proc: ProcDir, header: Dict[str, Any]) -> Optional[str]:
    if header.get("incomplete") is True:
        return 'dump.json says "incomplete": true (rebuilt from the journal after a crash)'
    if proc.file:
        return None
    state = journal_state(os.path.join(proc.path, JOURNAL))
    if state is None:
        return None
    if not record_files(proc):
        return "dump.journal without dump.json (the process died before writing it)"
    if not state:
        return 'dump.journal has no final {"op": "end"} line (the process died during this step, or still runs)'
    return None


# ---- stacks ----

def forward_counterpart(record: str) -> List[str]:
    """Records whose stack stands for ``record``: itself, then its forward (backward records have no stack)."""
    out = [record]
    parts = record.split(".")
    if len(parts) >= 3 and parts[-1] == "backward":  # Functional.linear.0.backward
        out.append(".".join(parts[:-1] + ["forward"]))
    elif len(parts) >= 3 and parts[-2] == "backward":  # Module.fc1.Linear.backward.0
        out.append(".".join(parts[:-2] + ["forward", parts[-1]]))
    elif len(parts) >= 3 and parts[-2] == "parameters_grad":  # Module.fc1.Linear.parameters_grad.0
        out += [".".join(parts[:-2] + ["forward", parts[-1]]), ".".join(parts[:-2] + ["forward", "0"])]
    return out


def find_stack(rank_dir: str, record: str) -> Tuple[Optional[str], List[str]]:
    """(record the stack belongs to, frames) from stack.json, streamed; (None, []) when there is none."""
    wanted = forward_counterpart(record)
    best: Dict[str, List[str]] = {}
    path = os.path.join(rank_dir, "stack.json")
    try:
        for key, value in iter_object(path):
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
                keys, frames = value  # {"i": [[keys], [frames]]}
            else:
                keys, frames = [key], value  # legacy flat form {record: [frames]}
            for name in wanted:
                if name in keys and name not in best:
                    best[name] = [str(f) for f in frames] if isinstance(frames, list) else [str(frames)]
            if wanted[0] in best:
                break
    except (ValueError, OSError, UnicodeDecodeError):
        pass
    for name in wanted:
        if name in best:
            return name, best[name]
    return None, []


def parse_frame(text: str) -> Optional[Frame]:
    m = _FRAME_RE.match(text)
    if not m:
        return None
    return Frame(m.group("file"), int(m.group("line")), m.group("func"), m.group("code").strip())


def user_frame(frames: List[str]) -> Optional[Frame]:
    """The innermost frame outside installed libraries and the interpreter (else outside torch, else the first)."""
    parsed = [f for f in (parse_frame(t) for t in frames) if f is not None]
    for f in parsed:
        if not _LIB_RE.search(f.file):
            return f
    for f in parsed:
        if not re.search(r"[/\\]torch[/\\]", f.file):
            return f
    return parsed[0] if parsed else None


def _attach_stack(hit: NanHit) -> None:
    hit.stack_of, hit.stack = find_stack(hit.path, hit.record)
    hit.source = user_frame(hit.stack)


# ---- the summary ----

def summarize(dump_path: str, on_record: Optional[RecordFn] = None, progress: Optional[ProgressFn] = None,
              stacks: bool = True) -> List[RankSummary]:
    """One RankSummary per (root, rank/proc directory), ordered by attempt, root and rank.

    Every dump.json is read once; ``on_record(proc, position, name, record)`` sees every record, so other
    analyses can share the pass. With ``stacks``, the first NaN/Inf of each rank gets its stack.json frames.
    """
    found: Dict[Tuple[str, str], RankSummary] = {}
    for proc in discover(dump_path):
        s = found.get(proc.key)
        if s is None:
            s = found[proc.key] = RankSummary(root=proc.root, attempt=proc.attempt, process=proc.process,
                                              rank=proc.rank)
        row = StepSummary(step=proc.step, bytes=_tree_bytes(proc.path) if not proc.file else
                          os.path.getsize(proc.file))
        row.errors = _count_lines(os.path.join(proc.path, "dump_error_info.log"))
        header: Dict[str, Any] = {}

        def failed(file: str, exc: Exception, s: RankSummary = s, row: StepSummary = row,
                   proc: ProcDir = proc) -> None:
            row.errors += 1
            s.problems.append(f"step{proc.step}/{proc.process}/{os.path.basename(file)}: unreadable ({exc})")

        for position, name, value, suspect in iter_proc(proc, failed, header, progress):
            row.records += 1
            if row.first_nan is None and suspect and has_nan_or_inf(value):
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
        return (s.attempt, s.root != "." and not s.root.startswith("attempt"), s.root,
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
        rows.append((s.label, str(s.attempt), _ranges(s.steps), str(s.records), _size(s.bytes),
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
        if frame is not None and _LIB_RE.search(frame.file):
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


def print_summary(dump_path: str, file: Optional[IO[str]] = None) -> List[RankSummary]:
    """The launcher's end-of-job output: the per-rank table and the first NaN/Inf of the job with its source."""
    out = sys.stdout if file is None else file
    summaries = summarize(dump_path)
    if summaries:
        print(format_table(summaries, dump_path), file=out)
        hit = global_first_nan(summaries)
        if hit is not None:
            print("\n".join(format_hit(hit, "first NaN/Inf of the job")), file=out)
    else:
        print(f"msprobe dump summary: no step*/rank*/dump.json under {dump_path}", file=out)
    return summaries


def format_detail(summaries: List[RankSummary], dump_path: str, frames: int = 8) -> str:
    """``msprobe-dump summary``: the table, one row per rank and step, each rank's first NaN/Inf and the job's."""
    lines = [format_table(summaries, dump_path), "", "per rank and step:"]
    rows: List[Tuple[str, ...]] = [("rank", "step", "records", "bytes", "errors", "status", "first NaN/Inf")]
    for s in summaries:
        for r in s.per_step:
            nan = f"#{r.first_nan[0]} {r.first_nan[1]}" if r.first_nan else "-"
            rows.append((s.label, str(r.step), str(r.records), _size(r.bytes), str(r.errors),
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


def summary_json(summaries: List[RankSummary]) -> List[Dict[str, Any]]:
    out = []
    for s in summaries:
        d = asdict(s)
        d["label"] = s.label
        d["incomplete_steps"] = s.incomplete_steps
        out.append(d)
    return out


def _nan_safe(obj: Any) -> Any:
    """NaN/Inf as strings, so that --json output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _nan_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_safe(v) for v in obj]
    return obj


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
        json.dump(_nan_safe(summary_json(summaries)), sys.stdout, indent=1)
        print()
    else:
        summaries = print_summary(args.dump_path)
    return 0 if summaries else 1


if __name__ == "__main__":
    sys.exit(main())
