"""The journal: each step directory's append-only record log, from which its documents can be rebuilt.

The training thread appends every record as its call returns (``JournalFile``, a shared file mapping), before
the writer thread has seen it: what is in a shared file mapping is in the page cache, which a ``kill -9`` of
the process does not take with it. So a rank killed at any instant keeps every record whose call returned.

Version 3 is binary: frames of a 4-byte little-endian length and a ``marshal`` (format 4) tuple:

- ``("open", header)`` first (the header carries ``_kind`` and ``_journal``);
- ``("set", key, body)``, ``("merge", key, members)``, ``("move", key, members)``: record operations with
  plain Python values (msprobe's entries); ``("setj"|"mergej"|"movej", key, text)`` hold JSON text instead,
  for a body marshal does not take;
- ``("construct", key, parent)``; ``("stackdef", id, lines)`` once per file and ``("stack", key, id)``;
- ``("end",)``: the training thread passed the step's boundary (the step is complete);
- ``("final",)``: the writer wrote the step's documents from everything before it (only in a journal that
  is kept: by default the journal is removed then).

An append copies its frames, then the first one's length: a kill in the middle leaves that length zero. Zeros
(there, and after the last frame: the file grows by allocated chunks) end the replay; everything before counts.
Version 2 journals (JSON lines, written by the writer thread) are still read.
"""

from __future__ import annotations

import errno
import json
import marshal
import mmap
import os
import struct
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import files, paths
from .documents import StepRecords
from .encoding import encode
from .nonfinite import has_nonfinite

try:  # the append in one C call (see _jput.c); without a C compiler, the same in Python
    from . import _jput
except ImportError:  # pragma: no cover
    _jput = None
_put = getattr(_jput, "put", None)
_cframe = getattr(_jput, "frame", None)
# a writer's send in one C call (see _jput.c; bound to the writer's names by _send_setup), or None: a build before it
_send = getattr(_jput, "send", None)
_send_setup = getattr(_jput, "send_setup", None)
_HandOffLock = getattr(_jput, "HandOffLock", None)  # a reentrant lock its C takes inline, or None
_stack = getattr(_jput, "stack", None)  # a writer's stack tail for a known stack, the same way
_stack_at = getattr(_jput, "stack_at", None)  # a writer's stack() for a known stack, in one call from the recording
_stack_setup = getattr(_jput, "stack_setup", None)
_see_setup = getattr(_jput, "see_setup", None)  # the C walk send asks of a held step's records (nonfinite.c_walk)
_post = getattr(_jput, "post", None)  # writer.send(made(type, fields)) in one call, DumpWriter.send's first step
_post_setup = getattr(_jput, "post_setup", None)  # given DumpWriter.send

VERSION = 3  # 3: binary frames appended by the training thread; 2: JSON lines, merge/move with members only
_LEN = struct.Struct("<I")
_MARSHAL = 4
END_LINE = b'{"op": "end"}\n'  # version 2's end line
_TAIL = 4096


def _pyframe(op: tuple) -> bytes:
    """One journal operation as bytes; ValueError when marshal does not take a value in it."""
    b = marshal.dumps(op, _MARSHAL)
    return _LEN.pack(len(b)) + b


# in one C call where the extension is built (no interpreter frame, no marshal reference table; marshal.loads reads
# its frames as it reads _pyframe's): a call's stack and construct frames are built at every recorded call
frame: Callable[[tuple], bytes] = _cframe if _cframe is not None else _pyframe


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
    """One step's journal, open for appending: a file mapped into memory.

    An append is a copy into the mapping: no system call, and the GIL is never released, so a writer thread
    waiting for the GIL cannot take the training thread's turn at every record (with ``write()`` it took a
    whole switch interval each time). What is copied into a shared file mapping is in the page cache, which
    outlives the process. The file grows by chunks whose blocks are allocated first (``posix_fallocate``): a
    full disk is an error at growth, never a SIGBUS on a page of the mapping. After a kill the file ends in
    zeros, where the replay stops; a journal that is closed is cut to its length.

    Written from two threads: the training thread appends each record as its call returns, and the end; the
    writer thread appends statistics it read later (device tensors) and the final mark, and closes the journal
    once the training thread has moved on. A signal handler that interrupts an append on its own thread
    appends nothing (the interrupted step is not complete); the writer thread waits at most a second.
    """

    __slots__ = ("path", "fd", "mm", "pos", "cap", "lock", "busy", "stacks", "ended", "failed", "closed", "gaps")

    CHUNK = 64 << 10  # the first write into a freshly allocated chunk costs in proportion to it (ext4: ~200 µs per MiB)
    MAX_CHUNK = 16 << 20

    def __init__(self, path: str, header: Dict[str, Any], kind: str):
        self.path = path
        self.stacks: set = set()  # stack ids defined in this file
        self.ended = False
        self.closed = False
        self.failed: Optional[Exception] = None
        self.gaps = False  # an append was skipped (a signal handler's, on the thread it interrupted)
        self.lock = threading.RLock()
        self.busy = False
        self.pos = 0
        self.cap = 0
        self.mm: Optional[mmap.mmap] = None
        self.fd = files.create_rw(path)
        try:
            self._grow(self.CHUNK)
        except BaseException:
            os.close(self.fd)
            raise
        if not self.append(open_frame(header, kind)):
            raise self.failed or OSError(f"cannot write {path}")

    def _grow(self, need: int) -> None:
        cap = max(need, self.cap + min(max(self.cap, self.CHUNK), self.MAX_CHUNK))
        cap = -(-cap // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            os.posix_fallocate(self.fd, self.cap, cap - self.cap)
        except (AttributeError, OSError) as exc:  # no fallocate here: a sparse file, as good short of a full disk
            if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self.fd, cap)
        old, self.mm = self.mm, mmap.mmap(self.fd, cap)
        self.cap = cap
        if old is not None:
            old.close()

    def put(self, pre: bytes, op: tuple) -> bool:
        """Append pre (whole frames, or b"") and op's frame; as append. ValueError (nothing appended) when
        marshal does not take a value in op."""
        if _put is not None and _put(self, pre, op):
            return True
        return self._append(pre + frame(op))  # the C append refused: growth (or a closed journal) here

    def append(self, data: bytes) -> bool:
        """False when nothing was appended: the journal failed (the caller logs the first failure), is
        closed, or an append on this thread was interrupted (a signal handler)."""
        if _put is not None and _put(self, data, None):
            return True
        return self._append(data)

    def _append(self, data: bytes) -> bool:
        if not self.lock.acquire(timeout=1.0):
            return False
        try:
            if self.busy or self.mm is None:
                return False
            self.busy = True  # _put refuses while it is set: the file may grow (releasing the GIL)
            try:
                end = self.pos + len(data)
                if end > self.cap:
                    self._grow(end)
                # the first frame's length last: until it is in place the frames are not there (a kill in the
                # middle of the copy leaves zeros, where the replay stops)
                mv = memoryview(data)
                self.mm[self.pos + 4:end] = mv[4:]
                self.mm[self.pos:self.pos + 4] = mv[:4]
                self.pos = end
                return True
            except (OSError, ValueError) as exc:  # the disk is full, or a quota
                self.failed = exc
                self._unmap()
                return False
            finally:
                self.busy = False
        finally:
            self.lock.release()

    def end(self, before: bytes = b"") -> bool:
        """The step's boundary passed (once)."""
        if self.ended:
            return True
        self.ended = self.append(before + END)
        return self.ended

    def _unmap(self) -> None:
        mm, self.mm = self.mm, None
        if mm is not None:
            try:
                mm.close()
            except (BufferError, ValueError):
                pass

    def close(self) -> None:
        """Unmap, cut the file to what was written, close (the writer thread)."""
        if not self.lock.acquire(timeout=1.0):
            return  # an append is stuck in a signal handler: the descriptor stays until the process ends
        try:
            if self.closed:
                return
            self.closed = True
            self._unmap()
            try:
                os.ftruncate(self.fd, self.pos)
            except OSError:
                pass
            os.close(self.fd)
        finally:
            self.lock.release()

    def recycle(self, spare_path: str) -> bool:
        """Writer thread, once the step's documents hold everything: move the file out of the step (to
        spare_path, beside it) and zero what it held. The next step's journal is then this file, whose blocks
        are allocated and whose pages are mapped: a fresh file would cost the training thread its creation,
        its allocation and a page fault per 4 KiB. False: nothing changed (the caller removes the file)."""
        if not self.lock.acquire(timeout=1.0):
            return False
        try:
            if self.closed or self.mm is None or self.busy:
                return False
            self.busy = True
            try:
                if os.stat(self.path, follow_symlinks=False).st_ino != os.fstat(self.fd).st_ino:
                    return False  # the path names another journal now (the step reopened by this process)
                # moved first: a kill while the frames are zeroed must not leave the step a torn journal
                os.rename(self.path, spare_path)
            except OSError:
                return False
            finally:
                self.busy = False
            self.path = spare_path
            self.mm[:self.pos] = bytes(self.pos)  # beyond pos it is zero already: the replay stops there
            self.pos = 0
            self.ended = False
            self.stacks = set()
            return True
        finally:
            self.lock.release()

    def reuse(self, path: str, header: Dict[str, Any], kind: str) -> bool:
        """Training thread: this recycled file becomes the journal at path (its header written first: a kill
        before the move leaves only a spare). False: it cannot be; the caller closes it and unlinks it."""
        if self.pos or not self.append(open_frame(header, kind)):
            return False
        try:
            os.rename(self.path, path)  # replaces a file at path, as create_rw: never truncated
        except OSError:
            return False
        self.path = path
        return True

    def unlink_if_mine(self) -> None:
        """Remove the file, unless the path now names another journal (the step reopened by this process)."""
        if self.closed:
            return
        try:
            if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self.fd).st_ino:
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


def _ops(data: bytes, pick: Optional[Callable[[bytes], bool]] = None) -> Iterator[tuple]:
    """The decoded operations, up to the first that does not decode; with pick, only the frames it picks are
    decoded (and yielded)."""
    for fr in frames(data):
        if pick is not None and not pick(fr):
            continue
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


def _marker_or_open(fr: bytes) -> bool:
    return len(fr) < 32 or b"open" in fr[4:16]  # only these can be an end, a final or an open


def state(path: str) -> Optional[Tuple[bool, bool]]:
    """(ended, final) of the journal at path; None without one. Only short frames and opens are decoded."""
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
    for op in _ops(data, _marker_or_open):
        if op == ("end",):
            ended = True
        elif op == ("final",):
            final = True
        elif op[0] == "open":
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


def remove_spares(rank_dir: str, names: Optional[List[str]] = None, pid: Optional[int] = None) -> None:
    """Remove the emptied journals a killed process kept for a step it never began (those of pid, or all)."""
    prefix = paths.SPARE_JOURNAL + (str(pid) if pid is not None else "")
    if names is None:
        try:
            names = os.listdir(rank_dir)
        except OSError:
            return
    for name in names:
        if name.startswith(prefix) and (pid is None or name == prefix):
            try:
                os.unlink(os.path.join(rank_dir, name))
            except OSError:
                pass


def recover_tree(dump_path: str) -> List[Tuple[str, Dict[str, Any]]]:
    """recover() every rank directory below dump_path whose documents lag its journal: [(dir, result)]."""
    out = []
    for dirpath, dirnames, filenames in os.walk(dump_path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != paths.TENSOR_DIR and not d.startswith(".")]
        remove_spares(dirpath, filenames)
        if paths.JOURNAL in filenames and needs_recovery(dirpath):
            try:
                out.append((dirpath, recover(dirpath)))
            except OSError as exc:
                out.append((dirpath, {"error": str(exc)}))
    return out
