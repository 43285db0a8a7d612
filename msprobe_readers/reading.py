"""Reading a dump: the one layer every analysis reads through.

Layout read: ``DUMP/[attempt{k}/][duplicate_*/]step{N}/{rank{R}|proc{pid}|rank}/dump.json`` (``debug.json``
at level debug, ``dump.journal`` when neither was written); names and files are ``dumpformat.paths``'s.
``dump.json`` is read record by record, so a large file is never held in memory, and a truncated or corrupt
file still yields the records before the damage. ``stack.json`` and ``construct.json`` are streamed the same
way. Nothing here decides what a record means: that is the analyses' (and ``dumpformat.names``').
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from dataclasses import dataclass
from typing import IO, Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from msprobe_inject.dumpformat import journal, names, paths
from msprobe_inject.dumpformat.nonfinite import SUSPECT_TEXT

ProgressFn = Callable[[int], None]  # called with the number of bytes just read
CHUNK = 1 << 20  # bytes read at a time by the streaming reader

_WS = re.compile(r"[ \t\n\r]*")
_TOKEN_MAX = max(map(len, SUSPECT_TEXT))
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"[ \t\n\r]*:[ \t\n\r]*')
_FRAME_RE = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<func>.*?), ?\n ?(?P<code>.*)$", re.S)
# Frames of installed libraries and of the interpreter: not where the user's code is.
_LIB_RE = re.compile(r"[/\\](?:site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d[^/\\]*[/\\]|^<")
_TORCH_RE = re.compile(r"[/\\]torch[/\\]")
_READ_ERRORS = (ValueError, OSError, UnicodeDecodeError)
# a journal is replayed by the format's own code; a damaged one may fail it in more ways than a JSON file
_JOURNAL_ERRORS = _READ_ERRORS + (LookupError, TypeError)


def rank_label(rank: Optional[int], process: str, root: str) -> str:
    """How a rank is named in every output: ``1``, ``proc4242``, ``0 (attempt1)``."""
    name = str(rank) if rank is not None else process
    if root not in (".", ""):
        name += f" ({root})"
    return name


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
    dump: str = ""  # the dump path it was found under (where its index lives); "" for a directory named directly

    @property
    def label(self) -> str:
        return rank_label(self.rank, self.process, self.root)

    @property
    def key(self) -> Tuple[str, str]:
        return (self.root, self.process)

    @property
    def duplicate(self) -> bool:
        """Written by a second process claiming the same rank: not a replica of the job's ranks."""
        return is_duplicate_root(self.root)


def is_duplicate_root(root: str) -> bool:
    """Whether a root (relative to the dump path) is, or lies in, a ``duplicate_*`` directory."""
    return any(paths.is_duplicate(part) for part in root.split(os.sep))


@dataclass
class Frame:
    file: str
    line: int
    func: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}: {self.code}"


# ---- the streaming JSON reader ----

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
        # Offsets in buf of the SUSPECT_TEXT tokens found so far, and how far buf has been searched for them:
        # one search per chunk instead of one per record.
        self._hits: Deque[int] = deque()
        self._scanned = 0

    def _more(self, size: Optional[int] = None) -> bool:
        if self.eof:
            return False
        if self.pos:
            self.buf = self.buf[self.pos:]
            shift, self.pos = self.pos, 0
            self._hits = deque(h - shift for h in self._hits if h >= shift)
            self._scanned = max(0, self._scanned - shift)
        chunk = self.fh.read(size or CHUNK)
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
        size = CHUNK
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
            found = sorted({i for token in SUSPECT_TEXT for i in _find_all(buf, token, lo)})
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


# ---- discovery ----

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
        attempt = paths.parse_attempt(entry.name)
        if attempt is not None:
            bases.append((entry.path, attempt))
    for base, attempt in bases:
        out.append((base, attempt))
        for entry in _subdirs(base):
            if paths.is_duplicate(entry.name):
                out.append((entry.path, attempt))
    return out


def _is_proc_dir(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, name)) for name in paths.RECORD_FILES + (paths.JOURNAL,))


def _single(directory: str, file: Optional[str] = None) -> ProcDir:
    """A ProcDir for a rank directory or dump.json named directly; step and rank from the names if they fit."""
    directory = os.path.abspath(directory)
    process = os.path.basename(directory)
    parsed = paths.parse_process(process)
    step = paths.parse_step(os.path.basename(os.path.dirname(directory)))
    return ProcDir(root=".", attempt=0, step=step if step is not None else 0, process=process,
                   rank=parsed.rank if parsed else None, path=directory, file=file)


def _procs_of_step(step_dir: str, step: int, root: str, attempt: int, dump: str = "") -> Iterator[ProcDir]:
    for entry in _subdirs(step_dir):
        parsed = paths.parse_process(entry.name)
        if parsed is not None:
            yield ProcDir(root, attempt, step, entry.name, parsed.rank, entry.path, dump=dump)


def discover(dump_path: str) -> List[ProcDir]:
    """Every step/rank directory under a dump path, ordered by attempt, root, step and rank.

    ``dump_path`` may also be one step directory, one rank directory or one dump.json / debug.json file.
    """
    if os.path.isfile(dump_path):
        return [_single(os.path.dirname(os.path.abspath(dump_path)), os.path.abspath(dump_path))]
    if _is_proc_dir(dump_path):
        return [_single(dump_path)]
    found: List[ProcDir] = []
    step = paths.parse_step(os.path.basename(os.path.abspath(dump_path)))
    if step is not None:
        found.extend(_procs_of_step(dump_path, step, ".", 0))  # a step directory: no index of its own
    for root, attempt in _roots(dump_path):
        rel = os.path.relpath(root, dump_path)
        for step_entry in _subdirs(root):
            step = paths.parse_step(step_entry.name)
            if step is not None:
                found.extend(_procs_of_step(step_entry.path, step, rel, attempt, dump_path))

    def order(p: ProcDir) -> Tuple:  # step-major, so that cross-rank analyses can finish a step at a time
        return (p.attempt, p.duplicate, p.root, p.step, p.rank if p.rank is not None else 1 << 30, p.process)

    return sorted(found, key=order)


# ---- the records of a rank directory ----

def record_files(proc: ProcDir) -> List[str]:
    """The record files of a step/rank directory: dump.json and/or debug.json (or the named file)."""
    if proc.file:
        return [proc.file]
    return [os.path.join(proc.path, n) for n in paths.RECORD_FILES if os.path.isfile(os.path.join(proc.path, n))]


RecordFn = Callable[[ProcDir, int, str, Any], None]  # (directory, position, record name, record)
USE_INDEX = True  # read a directory through the dump's index when its file there is up to date (--no-index: never)


def iter_proc(proc: ProcDir, on_error: Optional[Callable[[str, Exception], None]] = None,
              header: Optional[Dict[str, Any]] = None, progress: Optional[ProgressFn] = None,
              indexed: bool = True) -> Iterator[Tuple[int, str, Any, bool]]:
    """(position, record name, record, may hold NaN/Inf) of one step/rank directory, in execution order.

    When the dump has an index (``msprobe-dump index``) whose file for this directory was built from its record
    files as they are now, DuckDB reads the records from it (``index.iter_indexed``: the same leaves, without
    parsing JSON). Otherwise reads dump.json (and debug.json); with neither, rebuilds the records from
    dump.journal. A file that cannot be read (or read to its end) goes to ``on_error`` after what was readable
    of it.
    """
    if indexed and USE_INDEX and proc.dump and not proc.file:
        from msprobe_readers import index  # imported here: the index is built by reading through this module

        fresh = index.fresh_file(proc) if index.exists(proc.dump) else None
        if fresh is not None:
            yield from index.iter_indexed(proc, fresh[0], fresh[1], on_error, header, progress)
            return
    files = record_files(proc)
    position = 0
    sources: List[Tuple[str, Callable[[], Iterator[Tuple[str, Any, bool]]], Tuple[type, ...]]] = []
    for file in files:
        sources.append((file, lambda f=file: _iter_flagged(f, header, progress), _READ_ERRORS))
    journal_path = os.path.join(proc.path, paths.JOURNAL)
    if not files and os.path.isfile(journal_path):
        sources.append((journal_path, lambda: ((k, v, True) for k, v in journal.iter_records(journal_path)),
                        _JOURNAL_ERRORS))
    for file, make, errors in sources:
        try:
            for name, value, suspect in make():
                yield position, name, value, suspect
                position += 1
        except errors as exc:
            if on_error is not None:
                on_error(file, exc)


def incomplete_reason(proc: ProcDir, header: Dict[str, Any]) -> Optional[str]:
    """Why a step/rank directory's records are incomplete, or None; ``header`` as iter_proc filled it."""
    if header.get("incomplete") is True:
        return 'dump.json says "incomplete": true (rebuilt from the journal after a crash)'
    if proc.file:
        return None
    complete = journal.is_complete(os.path.join(proc.path, paths.JOURNAL))
    if complete is None:
        return None
    if not record_files(proc):
        return "dump.journal without dump.json (the process died before writing it)"
    if not complete:
        return "dump.journal has no end (the process died during this step, or still runs)"
    return None


def tree_bytes(path: str) -> int:
    """Bytes of the files below a directory (tensor files included, the step summary not); symlinks are not
    followed."""
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += tree_bytes(entry.path)
                    elif entry.is_file(follow_symlinks=False) and entry.name != paths.STEP_SUMMARY:
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def error_lines(rank_dir: str) -> int:
    """Non-empty lines of a rank directory's dump_error_info.log (0 without one)."""
    try:
        with open(os.path.join(rank_dir, paths.ERROR_LOG), "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def tensor_path(proc: ProcDir, data_name: str) -> str:
    """The file a record's ``data_name`` names (in dump_tensor_data/ beside its dump.json)."""
    base = os.path.dirname(proc.file) if proc.file else proc.path
    return os.path.join(paths.tensor_dir(base), data_name)


# ---- construct.json and stack.json ----

def iter_construct(rank_dir: str) -> Iterator[Tuple[str, Any]]:
    """(record, parent) pairs of construct.json, streamed; Megatron's [parent, micro_step] gives parent.

    Raises like iter_object when the file is missing or damaged.
    """
    for key, parent in iter_object(os.path.join(rank_dir, paths.CONSTRUCT_JSON)):
        yield key, (parent[0] if isinstance(parent, list) and parent else parent)


def iter_stacks(rank_dir: str) -> Iterator[Tuple[List[str], Any]]:
    """(records, frames) of stack.json, streamed, in both its forms: ``{"i": [[records], [frames]]}`` and
    msprobe's older ``{record: [frames]}``. Raises like iter_object when the file is missing or damaged."""
    for key, value in iter_object(os.path.join(rank_dir, paths.STACK_JSON)):
        if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list):
            yield value[0], value[1]
        else:
            yield [key], value


def find_stack(rank_dir: str, record: str) -> Tuple[Optional[str], List[str]]:
    """(record the stack belongs to, frames) from stack.json, streamed; (None, []) when there is none.

    Backward and parameters_grad records have no stack of their own: their forward's stands in.
    """
    wanted = names.forward_counterpart(record)
    best: Dict[str, List[str]] = {}
    try:
        for keys, frames in iter_stacks(rank_dir):
            for name in wanted:
                if name in keys and name not in best:
                    best[name] = [str(f) for f in frames] if isinstance(frames, list) else [str(frames)]
            if wanted[0] in best:
                break
    except _READ_ERRORS:
        pass
    for name in wanted:
        if name in best:
            return name, best[name]
    return None, []


def parse_frame(text: str) -> Optional[Frame]:
    """A Frame from one of msprobe's stack lines (``File {path}, line {n}, in {func}, \\n {code}``)."""
    m = _FRAME_RE.match(text)
    if not m:
        return None
    return Frame(m.group("file"), int(m.group("line")), m.group("func"), m.group("code").strip())


def is_library_file(path: str) -> bool:
    """A file of an installed library or of the interpreter: not where the user's code is."""
    return _LIB_RE.search(path) is not None


def user_frame(frames: List[str]) -> Optional[Frame]:
    """The innermost frame outside installed libraries and the interpreter (else outside torch, else the first)."""
    parsed = [f for f in (parse_frame(t) for t in frames) if f is not None]
    for f in parsed:
        if not is_library_file(f.file):
            return f
    for f in parsed:
        if not _TORCH_RE.search(f.file):
            return f
    return parsed[0] if parsed else None
