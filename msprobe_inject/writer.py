"""The writer: one per process, mostly off the training thread.

The recorder sends typed events (below). On the training thread, ``send`` appends each record to the step's
journal as its call returns (``dumpformat.journal``: marshal and a copy into the journal's file mapping, about
3 µs, so a kill -9 at any instant loses no record whose call returned), then queues the event; events travel to a
background thread in batches. That thread reads the statistics still pending (device tensors), encodes each
record body once to JSON, keeps the step's records in order, and writes the step's documents at flush
points. The format of all of it is ``dumpformat``'s. Errors are logged to dump_error_info.log and warned
about once; they never reach the training code.
"""

from __future__ import annotations

import errno
import itertools
import linecache
import os
import queue
import shutil
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .dumpformat import files, journal, paths, stepsummary
from .dumpformat.documents import StepRecords
from .dumpformat.encoding import encode, encode_scan, events_into, join_members
from .dumpformat.nonfinite import c_walk, has_nonfinite
from .entries import untrack
from .flight import Flight

_cput = journal._put  # the journal's append in C, or None (JournalFile.put does the same in Python)

try:  # built with the package where a C compiler is available
    from ._stacksig import Table as _StackTable
    from ._stacksig import sig as _stack_sig
except ImportError:
    _StackTable = _stack_sig = None

_RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR

_BATCH = 256  # events per hand-off to the writer thread
_DRAIN_S = 0.05  # the writer also takes whatever is buffered after this long (the documents trail by about that)
_STACK_SKIP = ("msprobe_inject" + os.sep, "msprobe" + os.sep + "core", "msprobe" + os.sep + "pytorch")


# ---- the events: what the recorder says to the writer ----

class Open(NamedTuple):
    """Records that follow belong to a new step directory."""

    directory: str
    header: Dict[str, Any]
    kind: str  # "dump" | "debug"
    journal: Optional[journal.JournalFile] = None  # opened by the training thread, which appends the records
    # flight recorder: the step is held in its spill journal, and the training thread sends the writer only the
    # records its triggers need (DumpWriter.send)
    held: bool = False


class Record(NamedTuple):
    """A whole record body; replaces an earlier body of the same key, which keeps its position."""

    key: str
    body: Any
    pending: Optional[list]  # statistics the writer resolves before encoding


class Merge(NamedTuple):
    """Members added to a record (created if new); with move, the record moves to the end of the step."""

    key: str
    members: Dict[str, Any]
    pending: Optional[list]
    move: bool


class Construct(NamedTuple):
    key: str
    parent: Any


# An event built on the hot path without its class's Python ``__new__`` (an interpreter frame per record):
# ``made(Merge, (key, members, pending, move))``, every field given, in order.
made = tuple.__new__


class Stack(NamedTuple):
    key: str
    text: tuple  # the stack's lines (formatted once per distinct stack: DumpWriter.stack)


class Rename(NamedTuple):
    """The open step directory moves (proc{pid} -> rank{R} once the rank is known)."""

    old: str
    new: str


class TensorFile(NamedTuple):
    path: str
    tensor: Any
    nbytes: int


class Link(NamedTuple):
    """dst holds the same data as the already queued src."""

    src: str
    dst: str


class Flush(NamedTuple):
    done: threading.Event
    finish: bool  # the step ended (its end is journaled already): its documents are written before done is set


class Close(NamedTuple):
    done: threading.Event


class Trigger(NamedTuple):
    """Flight recorder: the recorder saw a reason to write the window (exception, SIGTERM, explicit)."""

    kind: str
    record: Optional[str]
    step: int  # the recorder's current step (it may have no records yet)


_RECORDS = (Record, Merge)
_IN_RUNS = (Record, Merge, Stack, Construct)  # what DumpWriter._events_run takes
# DumpWriter.send's common case in C (journal._send: the record's frame, its call's waiting frames, the hand-off), and
# DumpWriter.stack's tail for a stack seen before (journal._stack: its frames, the hand-off), or None where the
# journal's C append is not built
_csend = journal._send
_HandOffLock = journal._HandOffLock
_cstack = journal._stack
if _csend is not None:  # Stack for the stack tail; a build before it takes the first five alone
    journal._send_setup(Record, Merge, Construct, untrack, _BATCH, *((Stack,) if _cstack is not None else ()))
    if journal._see_setup is not None and c_walk is not None:  # _triggers_see's common answer in the C send
        journal._see_setup(c_walk)
# DumpWriter.stack for a stack seen before, called as stack_at(writer, key, skip) from the recording frame (its
# Python frame, lock and lookup in one C call; False: call DumpWriter.stack), or None where it is not built. It takes
# the C tail itself: setting _cstack to None after import leaves it on (the recording modules hold it by name)
stack_at = journal._stack_at if _cstack is not None and _stack_sig is not None else None
if stack_at is not None:
    journal._stack_setup(_stack_sig)
_next_stack_id = itertools.count().__next__  # stack ids are never reused in a process: a journal names them


def capture_stack(skip: int) -> tuple:
    """The caller's stack as (code, instruction offset) pairs: cheap on the training thread (no line
    number is computed there); format_stack turns them into text once per distinct stack."""
    f = sys._getframe(skip + 1)
    out = []
    while f is not None:
        out.append((f.f_code, f.f_lasti))
        f = f.f_back
    return tuple(out)


_LINES: Dict[Tuple[Any, int], Tuple[str, int, str]] = {}


def _site(code, lasti: int) -> Tuple[str, int, str]:
    site = _LINES.get((code, lasti))
    if site is None:
        line = code.co_firstlineno
        if hasattr(code, "co_lines"):
            for start, end, ln in code.co_lines():
                if start <= lasti < end:
                    line = ln if ln is not None else line
                    break
        else:  # Python 3.9
            import dis

            for off, ln in dis.findlinestarts(code):
                if off > lasti:
                    break
                line = ln
        if len(_LINES) > 200_000:
            _LINES.clear()
        site = _LINES[(code, lasti)] = (code.co_filename, line, code.co_name)
    return site


def format_stack(frames: tuple) -> List[str]:
    """msprobe's stack lines from capture_stack's (code, offset) pairs."""
    out = []
    for code, lasti in frames:
        path, line, func = _site(code, lasti)
        if any(s in path for s in _STACK_SKIP):
            continue
        src = linecache.getline(path, line).strip()
        if src:
            out.append(f"File {path}, line {line}, in {func}, \n {src}")
    return out


class _OpenStep:
    """The step directory being written, its records and its journal."""

    __slots__ = ("directory", "records", "journal", "held", "on_disk", "nbytes", "spill", "suspect", "light", "gaps")

    def __init__(self, directory: str, header: Dict[str, Any], kind: str):
        self.directory = directory
        self.records = StepRecords(header, kind)
        self.journal = None
        self.held: Dict[str, Dict[str, Any]] = {}  # overflow_check: finite records not written (yet)
        self.on_disk = True  # False: a flight-recorder step held until a window takes it
        self.nbytes = 0  # flight recorder: the held step's bytes (its journal's, or its encoded records')
        self.spill: Optional[str] = None  # flight recorder: the step's journal in the node-local spill directory
        self.suspect: set = set()  # records whose encoded text may hold a NaN/Inf (the step summary's first NaN)
        # flight recorder: a held step whose spill journal holds its records; nothing of it is kept here, and a
        # window that takes it replays the journal
        self.light = False
        self.gaps = False  # the held step's journal lost an append: written as incomplete if a window takes it

    @property
    def step(self) -> Optional[int]:
        return self.records.header.get("_step")


class DumpWriter:
    """Background writer for one process. All public methods are safe to call from hooks."""

    # what the journal's C calls read for every record (and set: _jbuf, _buf, records_sent; for a held step's records:
    # flight), and `stopped`, which a recorded call's C reads: at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("_jf", "_jbuf", "_buf", "_q", "_held", "records_sent", "_blk", "_stacks", "stopped", "flight",
                 "__dict__", "__weakref__")

    def __init__(self, resolver: Callable[[list], Optional[Dict[int, str]]], save_tensor: Callable[[Any, str], None],
                 pending_bytes: int = 256 << 20, overflow_nums: Optional[int] = None, fsync: bool = False,
                 keep_journal: bool = False, flight: Optional[Flight] = None,
                 resolve_host: Optional[Callable[[list], list]] = None):
        self._resolver = resolver
        # training thread: fills the statistics already on the host and returns the still pending rest
        self._resolve_host = resolve_host
        self._jf: Optional[journal.JournalFile] = None  # the open step's journal (training thread side)
        # a finished step's journal, emptied: the next step's (set by the writer thread only when None, taken
        # by the training thread only: no lock)
        self._spare: Optional[journal.JournalFile] = None
        self._jbuf: List[bytes] = []  # stack frames of a call in flight: written with its record
        self._held = False  # flight recorder, training thread: the open step is held in its spill journal (see send)
        # code ids and offsets -> (id, lines, frames); a _stacksig.Table where sig is its own: stack_at's C looks a
        # walk's words up there without making the key
        self._stacks: Any = _StackTable() if _StackTable is not None and _stack_sig is not None else {}
        # (frame, the code ids and offsets above it): the calls of one function share everything above their
        # caller. A plain function's frame object runs once: while the same one is the caller's caller it has
        # been running all along, and the frames above it stay suspended at the same instructions (a generator
        # resumes under other callers: never kept). Dropped at each step's end, not to keep a frame alive.
        self._tail: Optional[tuple] = None
        self.records_sent = 0  # record events sent (whole bodies and merged members): the crash tests compare to it
        # a fork child shares the parent's journal mappings: it must never append to (or end) them
        os.register_at_fork(after_in_child=_forget_journal(weakref.ref(self)))
        self._save_tensor = save_tensor
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._buf: list = []
        # reentrant: a signal handler (SIGTERM's flush) may run on the training thread inside send(); a plain
        # lock would deadlock it there until the launcher's SIGKILL
        self._blk = _HandOffLock() if _HandOffLock is not None else threading.RLock()
        self._dir: Optional[str] = None  # the step directory most recently opened (producer side)
        self._root: Optional[str] = None  # the dump path: nothing below it is written through a symlink
        self._thread: Optional[threading.Thread] = None
        self._step: Optional[_OpenStep] = None
        self._pid = os.getpid()
        self._errors_seen: set = set()
        self._failed_dirs: set = set()
        self.error_count = 0
        self._budget = pending_bytes
        self._pending = 0
        self._cv = threading.Condition()
        self._overflow_left = overflow_nums  # None: keep every record
        self._fsync = fsync
        self._keep_journal = keep_journal
        self.flight = flight  # the flight recorder's ring and triggers, or None: every step is written
        # runs of events in one C call (_events_run): not where the handlers do more per record (the flight recorder
        # counts bytes and watches the spike rule, overflow_check holds finite records)
        self._runs = events_into is not None and flight is None and overflow_nums is None
        self.steps_written: List[int] = []
        self.stopped = False  # a fatal write error: nothing more is written
        self._handlers: Dict[type, Callable[[Any], bool]] = {
            Open: self._on_open, Record: self._on_record, Merge: self._on_merge, Construct: self._on_construct,
            Stack: self._on_stack, Rename: self._on_rename, TensorFile: self._on_tensor, Link: self._on_link,
            Flush: self._on_flush, Close: self._on_close, Trigger: self._on_trigger,
        }

    # ---- called from the training thread ----
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
            self._pid = os.getpid()
            self._q = queue.SimpleQueue()
            self._buf = []
            self._thread = threading.Thread(target=self._run, name="msprobe-writer", daemon=True)
            self._thread.start()

    def send(self, ev: Any, push: bool = False) -> None:
        """Journal a record, then queue the event. Events travel in batches: one queue hand-off (and writer
        wake-up) per batch. Under the hand-off lock: the journal's order is the events' order.

        A flight-recorder step held in its spill journal (``_held``) is the journal alone: the writer keeps none of
        its records, and gets only those its triggers look at (statistics still to be read, a NaN/Inf, a record the
        spike rule follows), none of its stacks or places."""
        with self._blk:
            if _csend is not None and _csend(self, ev, push):  # the common record: the same steps in one C call
                return
            t = type(ev)
            if t is Record or t is Merge:
                self.records_sent += 1
            if self._jf is not None:
                if t is Record or t is Merge:
                    ev = self._journal(ev, t)
                    if self._held and not ev.pending and not self._triggers_see(ev, t):
                        return
                elif t is Construct:  # goes with the next record: that of this module's call or of one inside it
                    # key and parent are names (str, or a None parent): marshal takes them, no JSON fallback needed
                    self._jbuf.append(journal.frame(("construct", ev.key, ev.parent)))
                    if self._held:
                        return
                elif t is Stack and self._held:
                    return
            if t is Record or t is Merge:
                # alive until the writer has it: not followed by the collector (nor promoted to its older generations,
                # whose growth sets off full collections of the process): the body, and the event itself where it has
                # no statistics still to read (pending None; the journal has read the CPU's)
                untrack(ev)
            self._buf.append(ev)
            if push or len(self._buf) >= _BATCH:
                self._hand_buffer()

    def _swap_buffer(self) -> list:
        """The buffer, taken under the hand-off lock and replaced by a new list made before it is read: the allocation
        may run a collection whose Python code (a finalizer, a gc callback, the SIGTERM handler's flush) hands the
        buffer off itself. The buffer read after it is the one that code left (_jput.c hand_off does the same)."""
        fresh: list = []
        buf, self._buf = self._buf, fresh  # one line: a tracer's line event between the two may allocate
        return buf

    def _hand_buffer(self) -> None:
        """The buffer to the writer thread's queue, once, and only when it holds an event."""
        buf = self._swap_buffer()
        if buf:
            self._q.put(buf)

    def _journal(self, ev: Any, t: type) -> Any:
        pending = ev.pending
        if pending and self._resolve_host is not None:
            try:  # CPU statistics are read now (no device to wait for): the journal holds their figures
                rest = self._resolve_host(pending)
            except Exception:
                rest = pending  # the writer thread reads them, and logs what cannot be read
            if rest is not pending:
                ev = ev._replace(pending=rest or None)
        op = ("set", ev.key, ev.body) if t is Record else ("move" if ev.move else "merge", ev.key, ev.members)
        jf = self._jf
        buf = self._jbuf
        pre = b""
        if buf:  # the stack and construct frames of this call, or of calls inside it
            pre = b"".join(buf)
            buf.clear()
        try:
            ok = (_cput is not None and _cput(jf, pre, op)) or jf.put(pre, op)  # C first: one frame fewer
        except ValueError:  # a value marshal does not take: the record as JSON text
            ok = jf.append(pre + journal.record_frame(*op))
        if not ok:
            self._journal_lost(jf)
        return ev

    def _triggers_see(self, ev: Any, t: type) -> bool:
        """Whether the flight recorder's triggers look at this record of a held step: one whose figures hold a
        NaN/Inf, or one the spike rule follows. The journal's C send answers the same question itself (_jput.c
        triggers_see) and calls this only where its walk declines: a change here is made there too."""
        return has_nonfinite(ev.body if t is Record else ev.members) or self.flight.follows(ev.key)

    def _journal_lost(self, jf: journal.JournalFile) -> None:
        if jf.failed is None:  # one frame skipped by a signal handler's reentry, or the step already closed
            jf.gaps = True
            return
        if self._jf is jf:
            self._jf = None
        self.log_error(f"cannot journal {jf.path}: {jf.failed}; a crash in this step would lose its newest "
                       "records", os.path.dirname(jf.path) if self.flight is None else None)

    def stack(self, key: str, skip: int) -> None:
        """The caller's stack (skip: frames of the tool above the user's call) for stack.json. Each distinct
        stack is formatted once per process; a call costs the walk over its frames and one lookup."""
        f = sys._getframe(skip + 1)
        sig = _stack_sig(f) if _stack_sig is not None else self._py_sig(f)
        with self._blk:
            known = self._stacks.get(sig)
            if known is None:
                frames = capture_stack(skip + 1)  # its code objects stay alive with it: their ids stay theirs
                if len(self._stacks) > 50_000:
                    self._stacks.clear()
                known = self._stacks[sig] = (_next_stack_id(), tuple(format_stack(frames)), frames)
            if _cstack is not None and _cstack(self, key, known):  # the steps below in one C call
                return
            jf = self._jf
            if jf is not None:
                sid, text = known[0], known[1]
                if sid not in jf.stacks:
                    jf.stacks.add(sid)
                    self._jbuf.append(journal.frame(("stackdef", sid, text)))
                self._jbuf.append(journal.frame(("stack", key, sid)))
                if self._held:  # as send() does with a Stack: a held step's stacks are its journal's alone
                    return
            # send()'s queueing of a Stack, under the lock this holds; the event made (without the named tuple's
            # Python __new__, a frame) before the buffer is read: its allocation may hand the buffer off
            ev = made(Stack, (key, known[1]))
            self._buf.append(ev)
            if len(self._buf) >= _BATCH:
                self._hand_buffer()

    def _py_sig(self, f: Any) -> tuple:
        """The stack signature without the C extension: code ids and offsets down the stack. A loop's calls share
        the frames below the loop's, kept from the last walk while that frame is the same one."""
        back = f.f_back
        tail = self._tail
        if tail is not None and tail[0] is back:
            return (id(f.f_code), f.f_lasti, id(back.f_code), back.f_lasti) + tail[1]
        ids = []
        g = f
        while g is not None:
            ids.append(id(g.f_code))
            ids.append(g.f_lasti)
            g = g.f_back
        sig = tuple(ids)
        if back is not None and not back.f_code.co_flags & _RESUMABLE:
            self._tail = (back, sig[4:])
        return sig

    def _end_journal(self) -> None:
        """The open step is over (a step boundary, a new step, the end): its journal says so at once."""
        self._tail = None
        with self._blk:
            jf = self._jf
            self._jf = None
            if jf is not None:
                buf = b"".join(self._jbuf)
                self._jbuf.clear()
                if not jf.end(buf):
                    self._journal_lost(jf)

    def open_step(self, directory: str, header: Dict[str, Any], kind: str = "dump") -> None:
        self._ensure_thread()
        self._dir = directory
        self._root = header.get("_root")
        with self._blk:
            self._end_journal()
            self._jf = self._open_journal(directory, header, kind)
            fl = self.flight
            # the window the writer knows now (it may learn of one later: a held step it takes is replayed then)
            self._held = self._jf is not None and fl is not None and not fl.in_window(header.get("_step"))
            self.send(Open(directory, header, kind, self._jf, self._held))

    def _open_journal(self, directory: str, header: Dict[str, Any], kind: str) -> Optional[journal.JournalFile]:
        if self.stopped:
            return None
        fl = self.flight
        if self._overflow_left is not None:
            header = dict(header, _overflow_check=True)  # replay keeps the records holding a NaN/Inf
        path = os.path.join(directory, paths.JOURNAL)
        try:
            if fl is not None:  # a held step's journal is node-local: the ring outlives a kill -9 (flight.py)
                if fl.spill is None:
                    return None
                files.makedirs(fl.spill)
                path = os.path.join(fl.spill, f"{paths.step_dir_name(header.get('_step'))}{paths.JOURNAL_SUFFIX}")
            else:
                files.makedirs(directory, header.get("_root"))
                spare = self._spare
                if spare is not None:
                    self._spare = None
                    if spare.reuse(path, header, kind):
                        return spare
                    _discard(spare)
            return journal.JournalFile(path, header, kind)
        except OSError as exc:
            if fl is not None:
                self.log_error(f"flight recorder: cannot spill to {fl.spill}: {exc}; the ring is in memory only")
                fl.spill = None
            else:
                self.log_error(f"cannot journal {path}: {exc}; a crash in this step would lose its records",
                               directory)
            return None

    def rename(self, old: str, new: str) -> None:
        self._dir = new
        self.send(Rename(old, new))

    def save_tensor(self, path: str, tensor: Any, nbytes: int) -> None:
        """Queue a tensor file; waits while queued tensors exceed the memory budget."""
        with self._cv:
            while self._pending > 0 and self._pending + nbytes > self._budget:
                if not self._cv.wait(timeout=60):
                    break
            self._pending += nbytes
        self.send(TensorFile(path, tensor, nbytes), push=True)

    def link_tensor(self, src: str, dst: str) -> None:
        """dst holds the same data as the already queued src: a hard link, or a copy where links fail."""
        self.send(Link(src, dst))

    def flush(self, timeout: float = 600.0, finish: bool = False) -> None:
        """Write the current step's documents; blocks until everything queued so far is on disk. With
        finish, the step is over: a kill after this returns finds it complete."""
        if finish:
            self._end_journal()
        if self._thread is None:
            return
        ev = threading.Event()
        self.send(Flush(ev, finish), push=True)
        self.wait(ev, self._thread, timeout)

    def trigger(self, kind: str, record: Optional[str], step: int) -> None:
        """Flight recorder: write the window around ``step`` (the writer thread decides its steps)."""
        if self._thread is not None and self.flight is not None:
            self.send(Trigger(kind, record, step), push=True)

    @property
    def flight_over(self) -> bool:
        return self.flight is not None and self.flight.over

    @staticmethod
    def wait(ev: threading.Event, thread: threading.Thread, timeout: float = 600.0) -> None:
        """Wait for an event the writer thread sets, but not after that thread has died."""
        end = time.monotonic() + timeout
        while not ev.wait(1.0):
            if not thread.is_alive() or time.monotonic() > end:
                return

    def close(self, timeout: Optional[float] = None) -> None:
        """Write everything queued and stop the thread; timeout bounds the whole wait (default: 600 s + 30 s)."""
        self._end_journal()
        if self._thread is None:
            return
        end = time.monotonic() + timeout if timeout is not None else None
        self.flush(timeout if timeout is not None else 600.0)
        ev = threading.Event()
        self.send(Close(ev), push=True)
        if self._thread.is_alive():
            ev.wait(30 if end is None else max(0.0, end - time.monotonic()))
        self._thread = None

    def log_error(self, message: str, directory: Optional[str] = None, warn_as: Optional[str] = None,
                  once: Optional[str] = None) -> None:
        """Log a tool error to dump_error_info.log and warn once per distinct message (or warn_as: the
        same failure of many records is one warning; once: what makes two warnings the same, by default
        the text shown)."""
        self.error_count += 1
        d = directory or self._dir
        shown = warn_as or message
        seen = once if once is not None else shown
        first = seen not in self._errors_seen
        self._errors_seen.add(seen)
        if first:
            try:  # under -W error a warning raises: never into training code, never out of the writer
                warnings.warn(f"[msprobe-launch] {shown}", RuntimeWarning, stacklevel=2)
            except Exception:
                pass
        if d is None or d in self._failed_dirs:
            return
        try:
            files.makedirs(d, self._root)
            with files.open_append(os.path.join(d, paths.ERROR_LOG)) as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid={os.getpid()} {message}\n".encode())
        except OSError:
            pass

    # ---- the writer thread ----
    def _take_buffer(self) -> list:
        # under the lock that orders hand-offs: batches already queued come before the buffer. Its wait is bounded:
        # the training thread may hold the lock while it waits for this thread (SIGTERM's flush run inside send()),
        # and what that flush queued is this thread's next get, not this buffer
        out: list = []
        if not self._blk.acquire(timeout=_DRAIN_S):
            return out
        try:
            try:
                while True:
                    out.extend(self._q.get_nowait())
            except queue.Empty:
                pass
            out.extend(self._swap_buffer())
        finally:
            self._blk.release()
        return out

    def _run(self) -> None:
        handlers = self._handlers
        runs = self._runs
        while True:
            try:
                batch = list(self._q.get(timeout=_DRAIN_S))
            except queue.Empty:
                # what the training thread produced in the last 50 ms is taken even when no batch fills
                # up: device statistics are read (and journaled) within that much
                batch = self._take_buffer()
                if not batch:
                    continue
            try:
                while len(batch) < 2048:
                    batch.extend(self._q.get_nowait())
            except queue.Empty:
                pass
            pending = [item for ev in batch if type(ev) in _RECORDS and ev.pending for item in ev.pending]
            if pending:
                try:
                    failed = self._resolver(pending)  # the whole batch at once
                except Exception as exc:
                    failed = None
                    self.log_error(f"statistics could not be read: {type(exc).__name__}: {exc}")
                if failed:
                    self._log_unread(batch, failed)
            i, n = 0, len(batch)
            while i < n:
                ev = batch[i]
                # a record whose statistics were read here is journaled again by its handler: not offered to the run
                if runs and type(ev) in _IN_RUNS and (type(ev) not in _RECORDS or ev.pending is None):
                    j = self._events_run(batch, i)
                    if j > i:
                        i = j
                        continue
                i += 1
                try:
                    stop = handlers[type(ev)](ev)
                except Exception as exc:  # never let the thread die
                    stop = type(ev) is Close
                    self.log_error(f"writer: {type(exc).__name__}: {exc}")
                    if type(ev) is Flush or stop:  # whoever waits for it is not left waiting
                        ev.done.set()
                if stop:
                    return
            if self.flight is not None and self.flight.window is not None and self.flight.ring:
                self._write_window()

    def _events_run(self, batch: list, i: int) -> int:
        """The handlers of the records, members, stacks and places from batch[i] on, in one C call (_jenc.events), where
        the step keeps their text and nothing else is asked of them (see _runs); the index of the first event left to
        its handler."""
        st = self._live()
        if st is None or st.light:
            return i
        try:
            j = events_into(batch, i, (Record, Merge, Stack, Construct, st.suspect), st.records)
        except Exception as exc:  # raised before it took any event (an event that fails is left to its handler)
            self.log_error(f"writer: {type(exc).__name__}: {exc}")
            return i
        if j > i:
            st.records.dirty = True
        return j

    def _log_unread(self, batch: list, failed: Dict[int, str]) -> None:
        """One error line per record whose statistics could not be read, naming it; one warning per reason."""
        for ev in batch:
            if type(ev) in _RECORDS and ev.pending:
                reasons = sorted({failed[id(item[0])] for item in ev.pending if id(item[0]) in failed})
                for reason in reasons:
                    self.log_error(f"{ev.key}: statistics not computed: {reason}",
                                   warn_as=f"statistics not computed: {reason}")

    def _live(self) -> Optional[_OpenStep]:
        """The open step, unless writing has stopped for good or its directory failed."""
        st = self._step
        if self.stopped or st is None or st.directory in self._failed_dirs:
            return None
        return st

    def _on_open(self, ev: Open) -> bool:
        if self.stopped:  # the training thread may still append to ev.journal: it is not closed here
            return False
        self._finish_step()
        st = self._step = _OpenStep(ev.directory, ev.header, ev.kind)
        st.journal = ev.journal
        fl = self.flight
        if fl is not None:
            fl.rank = _rank_of(ev.directory)
            st.spill = ev.journal.path if ev.journal is not None else None
            if ev.held or not fl.in_window(st.step):
                st.on_disk = False  # held until a trigger's window takes it
                st.light = ev.held  # else no spill: its records are kept here
                return False
        try:
            if ev.journal is None or fl is not None:
                # open_step made the directory for the step's journal in it: asking again is nine file-system
                # calls per rank and step (metadata requests on a shared file system). A flight recorder's journal is
                # node-local, and a step its window takes is made here
                files.makedirs(ev.directory, ev.header.get("_root"))
            self._write_documents()  # msprobe writes empty files at the first start() of a step
        except OSError as exc:
            self._dir_failed(ev.directory, exc)
        return False

    def _on_flush(self, ev: Flush) -> bool:
        if ev.finish:
            self._finish_step()
        else:
            self._write_documents()
        ev.done.set()
        return False

    def _on_close(self, ev: Close) -> bool:
        self._finish_step()
        spare, self._spare = self._spare, None
        if spare is not None:
            _discard(spare)
        if self.flight is not None:  # another rank may have triggered after this rank's last step
            self.flight.poll()
            if self.flight.window is not None and self.flight.ring:
                self._write_window()
            if self.flight.spill is not None:  # the process ends normally: nothing is left to recover
                shutil.rmtree(self.flight.spill, ignore_errors=True)
        ev.done.set()
        return True

    def _on_tensor(self, ev: TensorFile) -> bool:
        try:
            if not self.stopped and (self._step is None or self._step.directory not in self._failed_dirs):
                if self._step is not None:
                    files.check_no_symlink(self._step.directory, os.path.dirname(ev.path))
                self._save_tensor(ev.tensor, ev.path)
        except Exception as exc:
            self.log_error(f"cannot write tensor file {os.path.basename(ev.path)}: {exc}",
                           os.path.dirname(os.path.dirname(ev.path)))
        finally:
            with self._cv:
                self._pending -= ev.nbytes
                self._cv.notify_all()
        return False

    def _on_link(self, ev: Link) -> bool:
        if self.stopped or (self._step is not None and self._step.directory in self._failed_dirs):
            return False
        try:
            if self._step is not None:
                files.check_no_symlink(self._step.directory, os.path.dirname(ev.dst))
            try:
                os.link(ev.src, ev.dst, follow_symlinks=False)
            except FileExistsError:
                os.unlink(ev.dst)
                os.link(ev.src, ev.dst, follow_symlinks=False)
        except OSError:
            try:
                with open(ev.src, "rb") as fi, files.atomic_file(ev.dst) as fo:
                    shutil.copyfileobj(fi, fo)
            except OSError as exc:
                self.log_error(f"cannot write tensor file {os.path.basename(ev.dst)}: {exc}",
                               os.path.dirname(os.path.dirname(ev.dst)))
        return False

    def _on_rename(self, ev: Rename) -> bool:
        st = self._live()
        if self.flight is not None:
            self.flight.rank = _rank_of(ev.new)
            for held, _ in self.flight.ring:  # steps held in memory move with the process's name
                if os.path.basename(held.directory) == os.path.basename(ev.old):
                    held.directory = os.path.join(os.path.dirname(held.directory), os.path.basename(ev.new))
            if st is not None and st.directory == ev.old and not st.on_disk:
                st.directory = ev.new
                return False
        if st is None or st.directory != ev.old or os.path.exists(ev.new):
            return False
        try:
            files.makedirs(os.path.dirname(ev.new))
            os.rename(ev.old, ev.new)
            st.directory = ev.new
            jf = st.journal
            if jf is not None and os.path.dirname(jf.path) == ev.old:
                jf.path = os.path.join(ev.new, os.path.basename(jf.path))
            head = st.records.header
            head["dump_data_dir"] = paths.tensor_dir(ev.new) if head.get("dump_data_dir") else None
            st.records.dirty = True
        except OSError as exc:
            self.log_error(f"cannot rename {ev.old} to {ev.new}: {exc}")
        return False

    def _on_stack(self, ev: Stack) -> bool:
        st = self._live()
        if st is not None and not st.light:
            st.records.add_stack(ev.key, ev.text)
        return False

    def _on_construct(self, ev: Construct) -> bool:
        st = self._live()
        if st is not None and not st.light:
            st.records.add_construct(ev.key, ev.parent)
        return False

    def _observe(self, st: _OpenStep, key: str, body: Any) -> bool:
        """A held step's record, for the flight recorder's triggers only: nothing is encoded or kept."""
        suspect = has_nonfinite(body)
        if suspect:
            st.suspect.add(key)
        self.flight.observe(st.step, key, body, suspect)
        return False

    def _rejournal(self, st: _OpenStep, op: str, key: str, value: Any) -> None:
        """Statistics this thread read (device tensors): the journal gets the record's figures too."""
        jf = st.journal
        if jf is not None and not jf.append(journal.record_frame(op, key, value)) and jf.failed is not None:
            self.log_error(f"cannot journal {jf.path}: {jf.failed}", st.directory)

    def _on_record(self, ev: Record) -> bool:
        st = self._live()
        if st is None:
            return False
        if ev.pending:
            self._rejournal(st, "set", ev.key, ev.body)
        if st.light:
            return self._observe(st, ev.key, ev.body)
        if self._overflow_left is not None:
            return self._overflow(st, ev.key, ev.body)
        encoded, suspect = encode_scan(ev.body)
        st.records.set(ev.key, encoded)
        if suspect:
            st.suspect.add(ev.key)
        if self.flight is not None:
            st.nbytes += len(encoded) + len(ev.key)
            self.flight.observe(st.step, ev.key, ev.body, suspect)
        return False

    def _on_merge(self, ev: Merge) -> bool:
        st = self._live()
        if st is None:
            return False
        if ev.pending:
            self._rejournal(st, "merge", ev.key, ev.members)
        if st.light:
            return self._observe(st, ev.key, ev.members)
        if self._overflow_left is not None and ev.key not in st.records:
            return self._overflow(st, ev.key, ev.members, merge=True)
        members = {}
        suspect = False
        for k, v in ev.members.items():
            members[k], seen = encode_scan(v)
            suspect = suspect or seen
        st.records.merge(ev.key, members, move=ev.move)
        if suspect:  # the values' text only: a member's key (a parameter's name) holds no statistic
            st.suspect.add(ev.key)
        if self.flight is not None:
            st.nbytes += len(join_members(members)) + len(ev.key)
            self.flight.observe(st.step, ev.key, ev.members, suspect)
        return False

    def _overflow(self, st: _OpenStep, key: str, body: Any, merge: bool = False) -> bool:
        """overflow_check: a record is written once it holds a non-finite statistic, up to overflow_nums
        records; until then its parts are held (a module's inputs wait for its outputs)."""
        if merge:
            body = {**st.held.pop(key, {}), **body}
        if self._overflow_left == 0 or not has_nonfinite(body):
            if isinstance(body, dict):
                st.held[key] = body
            return False
        self._overflow_left -= 1
        encoded = encode(body)
        st.records.set(key, encoded)
        st.suspect.add(key)
        return False

    def _write_documents(self, st: Optional[_OpenStep] = None) -> None:
        st = st or self._step
        if st is None or not st.records.dirty or not st.on_disk or st.directory in self._failed_dirs:
            return
        try:
            for name, data in st.records.documents().items():
                if st.records.is_empty(name) and os.path.exists(os.path.join(st.directory, name)):
                    continue
                files.write_atomic(os.path.join(st.directory, name), data)
            st.records.dirty = False
        except OSError as exc:
            self._dir_failed(st.directory, exc)

    def _write_summary(self, st: _OpenStep) -> None:
        """The finished step's summary (dumpformat.stepsummary), beside its documents."""
        name = paths.DEBUG_JSON if st.records.kind == "debug" else paths.DUMP_JSON
        try:
            data = stepsummary.build(st.records, st.suspect, os.path.join(st.directory, name))
            if data is not None:
                files.write_atomic(os.path.join(st.directory, paths.STEP_SUMMARY), data)
        except (OSError, ValueError) as exc:
            self.log_error(f"cannot write the step summary of {st.directory}: {exc}", st.directory)

    def _finish_step(self) -> None:
        st = self._step
        if st is None:
            return
        if self.flight is not None and self._flight_step_end(st):
            self._step = None
            return
        self._write_documents()
        jf = st.journal
        if jf is not None:
            jf.end()  # a process that ends without a step boundary: its last step is over too
        written = not st.records.dirty and st.directory not in self._failed_dirs
        if written:
            self._write_summary(st)
            if jf is not None:
                if self._keep_journal:
                    jf.append(journal.FINAL)  # the documents hold all of it: nothing to recover
                elif self._recycle(jf):
                    jf = None  # out of the step, kept open for the next one
                else:
                    jf.unlink_if_mine()  # the documents hold everything the journal does: no duplicate stays
            try:
                if self._fsync:
                    files.fsync_tree(st.directory)
            except OSError as exc:
                self.log_error(f"cannot finish {st.directory}: {exc}", st.directory)
        if jf is not None:
            jf.close()
        step = st.records.header.get("_step")
        if isinstance(step, int) and step not in self.steps_written:
            self.steps_written.append(step)
        self._step = None

    def _recycle(self, jf: journal.JournalFile) -> bool:
        """The finished step's journal becomes the spare for the next step (one spare at most)."""
        if self._spare is not None or self.flight is not None:
            return False
        if not jf.recycle(os.path.join(os.path.dirname(jf.path), f"{paths.SPARE_JOURNAL}{os.getpid()}")):
            return False
        self._spare = jf
        return True

    # ---- the flight recorder (see flight.py) ----
    def _on_trigger(self, ev: Trigger) -> bool:
        if self.flight is not None:
            self.flight.fire(ev.kind, ev.step, ev.record)
        return False

    def _flight_step_end(self, st: _OpenStep) -> bool:
        """A step ends: it is written when a window holds it, else it joins the ring. False: the step was
        opened on disk (inside a known window) and ends as any other."""
        fl = self.flight
        fl.step_finished()
        fl.poll()
        step = st.step
        held = not st.on_disk
        if held:
            jf = st.journal
            if jf is not None:  # the spilled step is complete: a kill from here on keeps all of it
                jf.end()
                if st.light:
                    st.nbytes = jf.pos
                    # an append failed (the spill is full) or was skipped (by a signal handler): the journal lacks
                    # records, and so does this step if a window takes it
                    st.gaps = jf.failed is not None or jf.gaps
                jf.close()
                st.journal = None
            if fl.in_window(step):
                self._materialize(st)
            elif fl.window is None:
                for gone in fl.keep(st, st.nbytes):
                    _unlink(gone.spill)
            else:
                _unlink(st.spill)
        if fl.ring and fl.window is not None:
            self._write_window()
        if fl.window is not None and isinstance(step, int) and step >= fl.window[1]:
            fl.over = True
        return held

    def _write_window(self) -> None:
        inside, outside = self.flight.take_window()
        for held in inside:
            self._materialize(held)
        for held in outside:
            _unlink(held.spill)

    def _materialize(self, st: _OpenStep) -> None:
        """Write a held step as an ordinary step directory."""
        st.on_disk = True
        if st.light:
            self._replay_held(st)
        _unlink(st.spill)
        try:
            files.makedirs(st.directory, st.records.header.get("_root"))
        except OSError as exc:
            self._dir_failed(st.directory, exc)
            return
        st.records.dirty = True
        self._write_documents(st)
        if not st.records.dirty:
            self._write_summary(st)
        if self._fsync and not st.records.dirty:
            try:
                files.fsync_tree(st.directory)
            except OSError as exc:
                self.log_error(f"cannot finish {st.directory}: {exc}", st.directory)
        if isinstance(st.step, int) and st.step not in self.steps_written:
            self.steps_written.append(st.step)

    def _replay_held(self, st: _OpenStep) -> None:
        """A held step's records, from its spill journal (the writer kept none of them)."""
        st.light = False
        try:
            replayed, _, _ = journal.replay(st.spill)
        except OSError as exc:
            replayed = None
            self.log_error(f"flight recorder: cannot read the held step {st.spill}: {exc}", st.directory)
        if replayed is None:
            st.records.header["incomplete"] = True
            return
        replayed.header = st.records.header
        st.records = replayed
        if st.gaps:
            replayed.header["incomplete"] = True
            self.log_error(f"flight recorder: the held step's journal {st.spill} lacks records; the step is "
                           "written as incomplete", st.directory)

    def _dir_failed(self, directory: str, exc: OSError) -> None:
        if directory in self._failed_dirs or self.stopped:
            return
        if getattr(exc, "errno", None) in _FATAL_ERRNO:
            # the disk is full or the tree is not writable: every later write would fail the same way
            self.log_error(f"cannot write dump files in {directory}: {exc}; dumping stops", directory)
            self.stopped = True
        else:  # e.g. the directory was removed: the next step starts afresh
            self.log_error(f"cannot write dump files in {directory}: {exc}; this step's files are lost", directory)
        self._failed_dirs.add(directory)


def _forget_journal(ref: Callable[[], Optional[DumpWriter]]) -> Callable[[], None]:
    def after_in_child() -> None:
        w = ref()
        if w is not None:
            w._jf = None
            w._spare = None
            w._jbuf = []

    return after_in_child


def _discard(jf: journal.JournalFile) -> None:
    jf.close()
    _unlink(jf.path)


def _unlink(path: Optional[str]) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def _rank_of(directory: str) -> Optional[int]:
    proc = paths.parse_process(os.path.basename(directory))
    return proc.rank if proc is not None else None


_FATAL_ERRNO = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}


# writer.send(made(t, fields)): how the recorders send a Record, Merge or Construct. In one C call where the journal's
# C is built (journal._post: the event made as made() makes it, DumpWriter.send's first step under the hand-off lock
# for a writer whose class has that send, writer.send for what it declines), else the same in Python.
if journal._post is not None and journal._post_setup is not None:
    journal._post_setup(DumpWriter.send)
    post = journal._post
else:
    def post(writer: DumpWriter, t: type, *fields: Any) -> None:
        writer.send(made(t, fields))
