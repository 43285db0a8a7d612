"""The journal: each step directory's append-only record log, from which its documents can be rebuilt.

The training thread appends every record as its call returns (``JournalFile``), before the writer thread
has seen it: data that has reached ``write()`` is in the page cache, which a ``kill -9`` of the process
does not take with it. So a rank killed at any instant keeps every record whose call returned.

Version 3 is binary: frames of a 4-byte little-endian length and a ``marshal`` (format 4) tuple:

- ``("open", header)`` first (the header carries ``_kind`` and ``_journal``);
- ``("set", key, body)``, ``("merge", key, members)``, ``("move", key, members)``: record operations with
  plain Python values (msprobe's entries); ``("setj"|"mergej"|"movej", key, text)`` hold JSON text instead,
  for a body marshal does not take;
- ``("construct", key, parent)``; ``("stackdef", id, lines)`` once per file and ``("stack", key, id)``;
- ``("end",)``: the training thread passed the step's boundary (the step is complete);
- ``("final",)``: the writer wrote the step's documents from everything before it (only in a journal that
  is kept: by default the journal is removed then).

A torn last frame (the process died inside ``write()``) ends the replay; everything before it counts.
Version 2 journals (JSON lines, written by the writer thread) are still read.
"""

from __future__ import annotations

import json
import marshal
import os
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import files, paths
from .documents import StepRecords
from .encoding import encode
from .nonfinite import has_nonfinite

VERSION = 3  # 3: binary frames appended by the training thread; 2: JSON lines, merge/move with members only
_LEN = struct.Struct("<I")
_MARSHAL = 4
END_LINE = b'{"op": "end"}\n'  # version 2's end line
_TAIL = 4096


def frame(op: tuple) -> bytes:
    """One journal operation as bytes; ValueError when marshal does not take a value in it."""
    b = marshal.dumps(op, _MARSHAL)
    return _LEN.pack(len(b)) + b


END = frame(("end",))
FINAL = frame(("final",))


def record_frame(op: str, key: str, value: Any) -> bytes:
    """A record operation; a value marshal does not take is journaled as its JSON text."""
    try:
        return frame((op, key, value))
    except ValueError:
        return frame((op + "j", key, encode(value)))


def open_frame(header: Dict[str, Any], kind: str) -> bytes:
    head = dict(header, _kind=kind, _journal=VERSION)
    try:
        return frame(("open", head))
    except ValueError:
        return frame(("open", json.loads(encode(head))))


class JournalFile:
    """One step's journal, open for appending.

    Written from two threads: the training thread appends each record as its call returns, and the end; the
    writer thread appends statistics it read later (device tensors) and the final mark. Each frame is one
    ``write()`` to an O_APPEND descriptor, which the kernel serialises: no lock, so a signal handler that
    runs on the training thread mid-append cannot deadlock against the writer thread. Only the writer thread
    closes a journal, once the training thread has moved on to the next one (a closed descriptor's number
    may already belong to another file).
    """

    __slots__ = ("fd", "_raw", "path", "stacks", "ended", "failed")

    def __init__(self, path: str, header: Dict[str, Any], kind: str):
        self.path = path
        self.stacks: set = set()  # stack ids defined in this file
        self.ended = False
        self.failed: Optional[OSError] = None
        self._raw = self.fd = files.open_fd_append(path)
        self.append(open_frame(header, kind))

    def append(self, data: bytes) -> bool:
        """False once the journal failed (the caller logs the first failure) or was closed."""
        fd = self.fd
        if fd < 0:
            return False
        try:
            n = os.write(fd, data)
            while n < len(data):  # a regular file takes all of it unless the disk is full
                data = data[n:]
                n = os.write(fd, data)
            return True
        except OSError as exc:
            self.failed = exc
            self.fd = -1  # no more writes; the descriptor is closed by close()
            return False

    def end(self, before: bytes = b"") -> bool:
        """The step's boundary passed (once)."""
        if self.ended:
            return True
        self.ended = True
        return self.append(before + END)

    def close(self) -> None:
        fd, self._raw, self.fd = self._raw, -1, -1
        if fd >= 0:
            os.close(fd)

    def unlink_if_mine(self) -> None:
        """Remove the file, unless the path now names another journal (the step reopened by this process)."""
        if self._raw < 0:
            return
        try:
            if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._raw).st_ino:
                os.unlink(self.path)
        except OSError:
            pass


# ---- reading ----
def _is_v2(data: bytes) -> bool:
    return data[:1] == b"{"


def frames(data: bytes) -> Iterator[bytes]:
    """The complete frames of a version-3 journal's bytes (a torn last one is left out)."""
    pos, n = 0, len(data)
    while pos + 4 <= n:
        (ln,) = _LEN.unpack_from(data, pos)
        if ln == 0 or pos + 4 + ln > n:
            return
        yield data[pos:pos + 4 + ln]
        pos += 4 + ln


def _ops(data: bytes) -> Iterator[tuple]:
    for fr in frames(data):
        try:
            op = marshal.loads(fr[4:])
        except (ValueError, EOFError, TypeError):
            return
        if not isinstance(op, tuple) or not op:
            return
        yield op


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def state(path: str) -> Optional[Tuple[bool, bool]]:
    """(ended, final) of the journal at path; None without one. No frame is decoded."""
    try:
        data = _read(path)
    except OSError:
        return None
    if _is_v2(data):
        tail = data[-_TAIL:].splitlines()
        for line in reversed(tail):
            if line.strip():
                done = line.strip() + b"\n" == END_LINE
                return done, done
        return False, False
    ended = final = False
    for fr in frames(data):
        if len(fr) < 32 or b"open" in fr[4:16]:  # only these can be an end, a final or an open
            try:
                op = marshal.loads(fr[4:])
            except (ValueError, EOFError, TypeError):
                break
            if op == ("end",):
                ended = True
            elif op == ("final",):
                final = True
            elif isinstance(op, tuple) and op and op[0] == "open":
                ended = final = False  # the same directory opened again by the process
    return ended, final


def is_complete(path: str) -> Optional[bool]:
    """None without a journal at path; else whether the step's end was journaled."""
    st = state(path)
    return None if st is None else st[0]


def _replay_v2(data: bytes) -> Tuple[Optional[StepRecords], int, bool]:
    st: Optional[StepRecords] = None
    complete = False
    n = 0
    for raw in data.splitlines():
        try:
            ev = json.loads(raw)
        except ValueError:
            break
        op = ev.get("op")
        if op == "open":
            head = dict(ev["v"])
            kind = head.pop("_kind", "dump")
            head.pop("_journal", None)
            st = StepRecords(head, kind)
            complete = False
        elif op == "end":
            complete = True
        elif st is not None:
            st.apply(op, ev.get("k"), ev.get("v"))
            n += 1
    return st, n, complete


def replay(path: str, directory: Optional[str] = None) -> Tuple[Optional[StepRecords], int, bool]:
    """(records of the journal's last opened step, record operations replayed, complete)."""
    data = _read(path)
    if _is_v2(data):
        return _replay_v2(data)
    st: Optional[StepRecords] = None
    complete = False
    n = 0
    stacks: Dict[Any, tuple] = {}
    overflow = False
    for op in _ops(data):
        name = op[0]
        if name == "open":
            head = dict(op[1])
            kind = head.pop("_kind", "dump")
            head.pop("_journal", None)
            overflow = bool(head.get("_overflow_check"))
            st = StepRecords(head, kind)
            complete = False
            stacks = {}
        elif name == "end":
            complete = True
        elif name == "final" or st is None:
            continue
        elif name == "stackdef":
            stacks[op[1]] = tuple(op[2])
        elif name == "stack":
            text = stacks.get(op[2])
            if text is not None:
                st.add_stack(op[1], text)
        elif name.endswith("j") and len(op) == 3:
            st.apply(name[:-1], op[1], json.loads(op[2]))
            n += 1
        elif len(op) == 3:
            st.apply(name, op[1], op[2])
            n += name != "construct"
    if st is not None and overflow:
        _keep_nonfinite(st)
    return st, n, complete


def _keep_nonfinite(st: StepRecords) -> None:
    """overflow_check: the journal holds every record; the documents hold those with a NaN/Inf statistic."""
    for key in [k for k, body in st.items() if not has_nonfinite(body)]:
        del st.bodies[key]


def iter_records(path: str) -> Iterator[Tuple[str, Any]]:
    """The records a journal holds, decoded, in execution order (for readers when dump.json is missing)."""
    st, _, _ = replay(path)
    if st is not None:
        yield from st.items()


def needs_recovery(rank_dir: str) -> bool:
    """A journal whose step's documents were not written from all of it: the process died first."""
    st = state(os.path.join(rank_dir, paths.JOURNAL))
    return st is not None and not st[1]


def recover(rank_dir: str) -> Dict[str, Any]:
    """Rebuild the documents of a rank directory from its journal (after a crash).

    Returns {"records": n, "complete": bool}. A step whose journal lacks its end is marked
    ``"incomplete": true`` in dump.json, so readers can tell.
    """
    st, n, complete = replay(os.path.join(rank_dir, paths.JOURNAL))
    if st is None:
        return {"records": 0, "complete": False}
    if not complete:
        st.header["incomplete"] = True
    for name, data in st.documents().items():
        files.write_atomic(os.path.join(rank_dir, name), data)
    return {"records": n, "complete": complete}


def recover_tree(dump_path: str) -> List[Tuple[str, Dict[str, Any]]]:
    """recover() every rank directory below dump_path whose documents lag its journal: [(dir, result)]."""
    out = []
    for dirpath, dirnames, filenames in os.walk(dump_path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != paths.TENSOR_DIR and not d.startswith(".")]
        if paths.JOURNAL in filenames and needs_recovery(dirpath):
            try:
                out.append((dirpath, recover(dirpath)))
            except OSError as exc:
                out.append((dirpath, {"error": str(exc)}))
    return out
