"""The writer: one per process, off the training thread.

Records arrive as events on a queue. A background thread resolves their pending statistics,
appends them to an append-only journal in the rank directory (so a kill -9 loses nothing that
was journaled), keeps the step's records in order, and assembles dump.json, stack.json and
construct.json (or debug.json) at flush points. Errors are logged to dump_error_info.log and
warned about once; they never reach the training code.
"""

from __future__ import annotations

import errno
import json
import linecache
import os
import queue
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import layout

JOURNAL = "dump.journal"
_BATCH = 256  # events per hand-off to the writer thread
_DRAIN_S = 0.05  # the writer also takes whatever is buffered after this long: a kill -9 loses at most that
ERROR_LOG = "dump_error_info.log"
_JSON_FILES = ("dump.json", "stack.json", "construct.json")
_key = json.encoder.encode_basestring_ascii
_STACK_SKIP = ("msprobe_inject" + os.sep, "msprobe" + os.sep + "core", "msprobe" + os.sep + "pytorch")


def _make_encode() -> Callable[[Any], str]:
    """json.dumps without its per-call set-up: one C encoder for the process.

    Record bodies are acyclic by construction (the encoders cut cycles), so no circular check.
    JSONEncoder.encode builds a new C encoder (and a closure) on every call: ~15 % of a record's encoding.
    """
    std = json.JSONEncoder(check_circular=False).encode
    try:
        from json.encoder import c_make_encoder

        c_enc = c_make_encoder(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None,
                               ": ", ", ", False, False, True)

        def encode(o: Any, _c=c_enc, _join="".join) -> str:
            return _join(_c(o, 0))

        sample = {"a": [1, -2.5, float("nan"), float("inf"), None, True, "\u00e9\n"], "b": {}, "c": [[]]}
        if all(encode(v) == std(v) for v in (sample, "s", None, 3.0, [])):
            return encode
    except Exception:  # pragma: no cover - a Python without the C accelerator
        pass
    return std


_encode = _make_encode()


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


class StepState:
    """The records of one step of one rank, in msprobe's order."""

    def __init__(self, directory: str, header: Dict[str, Any], kind: str):
        self.directory = directory
        self.header = header
        self.kind = kind  # "dump" or "debug"
        # key -> the record body, encoded once (C encoder). Only strings are kept: they are not tracked by
        # the garbage collector, so a step's records do not pile up in its older generations
        self.enc: Dict[str, str] = {}
        self.stacks: Dict[Tuple, List[str]] = {}  # stack text -> keys, in order of first use
        self.stack_order: List[Tuple] = []  # the journal names a repeated stack by its position here
        self.stack_pos: Dict[Tuple, int] = {}
        self.construct: Dict[str, Any] = {}
        self.journal = None
        self.dirty = True
        self.incomplete = False

    def apply(self, op: str, key: str, value: Any, encoded: Optional[str] = None) -> None:
        if op == "set":
            self.enc[key] = encoded if encoded is not None else _encode(value)
        elif op == "move":
            self.enc.pop(key, None)
            self.enc[key] = encoded if encoded is not None else _encode(value)
        elif op == "update":  # merge fields into an existing record, keeping its position (rare: decoded)
            cur = self.enc.get(key)
            cur = json.loads(cur) if cur is not None else None
            if isinstance(cur, dict) and isinstance(value, dict):
                cur.update(value)
            else:
                cur = value
            self.enc[key] = _encode(cur)
        elif op == "construct":
            self.construct[key] = value
        elif op == "stack":
            self.add_stack(key, tuple(value))
        elif op == "stackref":
            self.stacks[self.stack_order[value]].append(key)
        self.dirty = True

    def add_stack(self, key: str, text: Tuple) -> Optional[int]:
        """Record key's stack; its position when this step has seen that stack before, else None."""
        pos = self.stack_pos.get(text)
        if pos is None:
            self.stack_pos[text] = len(self.stack_order)
            self.stack_order.append(text)
            self.stacks[text] = [key]
            return None
        self.stacks[text].append(key)
        return pos

    def main_bytes(self) -> bytes:
        """dump.json / debug.json: the header, then one record per line (each body encoded once)."""
        head = {k: v for k, v in self.header.items() if not k.startswith("_")}
        parts = ["{\n"]
        for k, v in head.items():
            parts.append(f" {json.dumps(k)}: {json.dumps(v)},\n")
        enc = self.enc
        recs = [f"\n  {_key(k)}: {v}" for k, v in enc.items()]
        parts.append(' "data": {' + ",".join(recs) + ("\n }\n}\n" if recs else "}\n}\n"))
        return "".join(parts).encode("ascii", "backslashreplace")

    def documents(self) -> Dict[str, Any]:
        """File name -> document; the main file is given as ready bytes."""
        name = "debug.json" if self.kind == "debug" else "dump.json"
        docs: Dict[str, Any] = {name: self.main_bytes()}
        if self.kind == "debug":
            return docs
        if self.header.get("_extra_info", True):
            docs["stack.json"] = {str(i): [keys, list(fr)] for i, (fr, keys) in enumerate(self.stacks.items())}
            docs["construct.json"] = self.construct
        return docs


class DumpWriter:
    """Background writer for one process. All public methods are safe to call from hooks."""

    def __init__(self, resolver: Callable[[list], None], save_tensor: Callable[[Any, str], None],
                 pending_bytes: int = 256 << 20, overflow_nums: Optional[int] = None):
        self._resolver = resolver
        self._save_tensor = save_tensor
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._buf: list = []
        self._blk = threading.Lock()
        self._dir: Optional[str] = None  # the step directory most recently opened (producer side)
        self._root: Optional[str] = None  # the dump path: nothing below it is written through a symlink
        self._thread: Optional[threading.Thread] = None
        self._state: Optional[StepState] = None
        self._pid = os.getpid()
        self._errors_seen: set = set()
        self._error_dirs: List[str] = []
        self._failed_dirs: set = set()
        self.error_count = 0
        self._budget = pending_bytes
        self._pending = 0
        self._cv = threading.Condition()
        self._overflow_left = overflow_nums  # None: keep every record
        self.steps_written: List[int] = []
        self.stopped = False  # a fatal write error: nothing more is written
        self._stack_text: Dict[tuple, Tuple[tuple, str]] = {}  # frames -> (text, its json)

    # ---- called from the training thread ----
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
            self._pid = os.getpid()
            self._q = queue.SimpleQueue()
            self._buf = []
            self._thread = threading.Thread(target=self._run, name="msprobe-writer", daemon=True)
            self._thread.start()

    def _send(self, ev, push: bool = False) -> None:
        # events travel in batches: one queue hand-off (and writer wake-up) per batch, not per record
        with self._blk:
            self._buf.append(ev)
            if push or len(self._buf) >= _BATCH:
                buf, self._buf = self._buf, []
                self._q.put(buf)

    def open_step(self, directory: str, header: Dict[str, Any], kind: str = "dump") -> None:
        self._ensure_thread()
        self._dir = directory
        self._root = header.get("_root")
        self._send(("open", directory, header, kind))

    def put(self, op: str, key: str, value: Any, pending: Optional[list] = None) -> None:
        self._send((op, key, value, pending))

    def rename(self, old: str, new: str) -> None:
        """Move the open step directory (proc{pid} -> rank{R} once the rank is known)."""
        self._dir = new
        self._send(("rename", old, new, None))

    def put_stack(self, key: str, frames: tuple) -> None:
        self._send(("stack", key, frames, None))

    def put_construct(self, key: str, parent: Any) -> None:
        self._send(("construct", key, parent, None))

    def save_tensor(self, path: str, tensor: Any, nbytes: int) -> None:
        """Queue a tensor file; waits while queued tensors exceed the memory budget."""
        with self._cv:
            while self._pending > 0 and self._pending + nbytes > self._budget:
                if not self._cv.wait(timeout=60):
                    break
            self._pending += nbytes
        self._send(("tensor", path, tensor, nbytes), push=True)

    def link_tensor(self, src: str, dst: str) -> None:
        """dst holds the same data as the already queued src: a hard link, or a copy where links fail."""
        self._send(("link", src, dst, None))

    def flush(self, timeout: float = 600.0) -> None:
        """Write the current step's json files; blocks until everything queued so far is on disk."""
        if self._thread is None:
            return
        ev = threading.Event()
        self._send(("flush", None, ev, None), push=True)
        self.wait(ev, self._thread, timeout)

    @staticmethod
    def wait(ev: threading.Event, thread: threading.Thread, timeout: float = 600.0) -> None:
        """Wait for an event the writer thread sets, but not after that thread has died."""
        end = time.monotonic() + timeout
        while not ev.wait(1.0):
            if not thread.is_alive() or time.monotonic() > end:
                return

    def close(self) -> None:
        if self._thread is None:
            return
        self.flush()
        ev = threading.Event()
        self._send(("close", None, ev, None), push=True)
        if self._thread.is_alive():
            ev.wait(30)
        self._thread = None

    def log_error(self, message: str, directory: Optional[str] = None) -> None:
        """Log a tool error to dump_error_info.log and warn once per distinct message."""
        self.error_count += 1
        d = directory or self._dir
        first = message not in self._errors_seen
        self._errors_seen.add(message)
        if first:
            try:  # under -W error a warning raises: never into training code, never out of the writer
                warnings.warn(f"[msprobe-launch] {message}", RuntimeWarning, stacklevel=2)
            except Exception:
                pass
        if d is None or d in self._failed_dirs:
            return
        try:
            layout.makedirs(d, self._root)
            with layout.open_append(os.path.join(d, ERROR_LOG)) as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid={os.getpid()} {message}\n".encode())
        except OSError:
            pass

    # ---- the writer thread ----
    def _take_buffer(self) -> list:
        # under the lock that orders hand-offs: batches already queued come before the buffer
        out: list = []
        with self._blk:
            try:
                while True:
                    out.extend(self._q.get_nowait())
            except queue.Empty:
                pass
            out.extend(self._buf)
            self._buf = []
        return out

    def _run(self) -> None:
        while True:
            try:
                batch = list(self._q.get(timeout=_DRAIN_S))
            except queue.Empty:
                # what the training thread produced in the last 50 ms reaches the journal even
                # when no batch fills up: a kill -9 loses at most that much
                batch = self._take_buffer()
                if not batch:
                    continue
            try:
                while len(batch) < 2048:
                    batch.extend(self._q.get_nowait())
            except queue.Empty:
                pass
            lines: List[bytes] = []
            pending = [item for ev in batch if len(ev) == 4 and isinstance(ev[3], list) for item in ev[3]]
            if pending:
                try:
                    self._resolver(pending)  # the whole batch at once
                except Exception as exc:
                    self.log_error(f"statistics could not be read: {type(exc).__name__}: {exc}")
            for ev in batch:
                try:
                    stop = self._handle(ev, lines)
                except Exception as exc:  # never let the thread die
                    stop = False
                    self.log_error(f"writer: {type(exc).__name__}: {exc}")
                if stop:
                    self._write_journal(lines)
                    return
            self._write_journal(lines)

    def _handle(self, ev, lines: List[bytes]) -> bool:
        op = ev[0]
        if self.stopped and op not in ("flush", "close", "tensor"):
            return False
        if op == "open":
            self._write_journal(lines)
            lines.clear()
            self._finish_step()
            _, directory, header, kind = ev
            self._state = StepState(directory, header, kind)
            try:
                layout.makedirs(directory, header.get("_root"))
                self._state.journal = layout.open_append(os.path.join(directory, JOURNAL))
                head = dict(header, _kind=kind)
                self._state.journal.write(json.dumps({"op": "open", "v": head}).encode() + b"\n")
                self._write_documents()  # msprobe writes empty files at the first start() of a step
            except OSError as exc:
                self._dir_failed(directory, exc)
            return False
        if op == "flush":
            self._write_journal(lines)
            lines.clear()
            self._write_documents()
            ev[2].set()
            return False
        if op == "close":
            self._write_journal(lines)
            lines.clear()
            self._finish_step()
            ev[2].set()
            return True
        if op == "tensor":
            _, path, tensor, nbytes = ev
            try:
                if not self.stopped and (self._state is None or self._state.directory not in self._failed_dirs):
                    if self._state is not None:
                        layout.check_no_symlink(self._state.directory, os.path.dirname(path))
                    self._save_tensor(tensor, path)
            except Exception as exc:
                self.log_error(f"cannot write tensor file {os.path.basename(path)}: {exc}",
                               os.path.dirname(os.path.dirname(path)))
            finally:
                with self._cv:
                    self._pending -= nbytes
                    self._cv.notify_all()
            return False
        if op == "link":
            _, src, dst, _unused = ev
            if self.stopped or (self._state is not None and self._state.directory in self._failed_dirs):
                return False
            try:
                if self._state is not None:
                    layout.check_no_symlink(self._state.directory, os.path.dirname(dst))
                try:
                    os.link(src, dst, follow_symlinks=False)
                except FileExistsError:
                    os.unlink(dst)
                    os.link(src, dst, follow_symlinks=False)
            except OSError:
                try:
                    import shutil

                    with open(src, "rb") as fi, layout.atomic_file(dst) as fo:
                        shutil.copyfileobj(fi, fo)
                except OSError as exc:
                    self.log_error(f"cannot write tensor file {os.path.basename(dst)}: {exc}",
                                   os.path.dirname(os.path.dirname(dst)))
            return False
        st = self._state
        if st is None:
            return False
        if op == "rename":
            _, old, new, _unused = ev
            if st.directory == old and not os.path.exists(new):
                try:
                    layout.makedirs(os.path.dirname(new))
                    os.rename(old, new)
                    st.directory = new
                    st.header["dump_data_dir"] = (os.path.join(new, "dump_tensor_data")
                                                  if st.header.get("dump_data_dir") else None)
                    st.dirty = True
                except OSError as exc:
                    self.log_error(f"cannot rename {old} to {new}: {exc}")
            return False
        _, key, value, pending = ev
        if op == "stack":
            known = self._stack_text.get(value)
            if known is None:  # identical stacks are formatted and encoded once per process
                if len(self._stack_text) > 50_000:
                    self._stack_text.clear()
                text = format_stack(value)
                known = self._stack_text[value] = (tuple(text), _encode(text))
            text, encoded = known
            st.dirty = True
            pos = st.add_stack(key, text)
            if pos is None:
                line = f'{{"op": "stack", "k": {_key(key)}, "v": {encoded}}}\n'
            else:  # a repeated stack is journaled by reference: stacks are most of a record's bytes
                line = f'{{"op": "stackref", "k": {_key(key)}, "v": {pos}}}\n'
            if st.journal is not None:
                lines.append(line.encode("ascii", "backslashreplace"))
            return False
        if pending:
            if self._overflow_left is not None and op in ("set", "move", "update"):
                if not _has_nonfinite(value):
                    return False
                if self._overflow_left == 0:
                    return False
                if op != "update" and key not in st.enc:
                    self._overflow_left -= 1
        elif self._overflow_left is not None and op in ("set", "move", "update"):
            return False
        encoded = _encode(value)
        st.apply(op, key, value, encoded)
        if st.journal is not None:
            lines.append(f'{{"op": "{op}", "k": {_key(key)}, "v": {encoded}}}\n'.encode("ascii",
                                                                                            "backslashreplace"))
        return False

    def _write_journal(self, lines: List[bytes]) -> None:
        st = self._state
        if not lines or st is None or st.journal is None:
            return
        try:
            st.journal.write(b"".join(lines))
        except OSError as exc:
            self._dir_failed(st.directory, exc)
        lines.clear()

    def _write_documents(self) -> None:
        st = self._state
        if st is None or not st.dirty or st.directory in self._failed_dirs:
            return
        try:
            for name, doc in st.documents().items():
                if name in ("stack.json", "construct.json") and not doc and os.path.exists(
                        os.path.join(st.directory, name)):
                    continue
                data = doc if isinstance(doc, bytes) else layout.dumps_json(doc)
                layout.write_atomic(os.path.join(st.directory, name), data)
            st.dirty = False
        except OSError as exc:
            self._dir_failed(st.directory, exc)

    def _finish_step(self) -> None:
        st = self._state
        if st is None:
            return
        self._write_documents()
        if st.journal is not None:
            try:
                st.journal.write(b'{"op": "end"}\n')
                st.journal.close()
            except OSError:
                pass
        step = st.header.get("_step")
        if isinstance(step, int) and step not in self.steps_written:
            self.steps_written.append(step)
        self._state = None

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


_FATAL_ERRNO = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}


def _has_nonfinite(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k in ("Max", "Min", "Mean", "Norm"):
                x = v.get(k)
                if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
                    return True
            stack.extend(x for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend(v)
    return False


def recover(rank_dir: str) -> Dict[str, Any]:
    """Rebuild the json files of a rank directory from its journal (after a crash).

    Returns {"records": n, "complete": bool}. A step whose journal lacks the end marker is
    marked incomplete in dump.json ("incomplete": true) so readers can tell.
    """
    path = os.path.join(rank_dir, JOURNAL)
    st: Optional[StepState] = None
    complete = False
    n = 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                ev = json.loads(raw)
            except ValueError:
                break  # torn last line
            op = ev.get("op")
            if op == "open":
                head = dict(ev["v"])
                kind = head.pop("_kind", "dump")
                st = StepState(rank_dir, head, kind)
            elif op == "end":
                complete = True
            elif st is not None:
                st.apply(op, ev.get("k"), ev.get("v"))
                n += 1
    if st is None:
        return {"records": 0, "complete": False}
    if not complete:
        st.header["incomplete"] = True
    for name, doc in st.documents().items():
        layout.write_atomic(os.path.join(rank_dir, name), doc if isinstance(doc, bytes) else layout.dumps_json(doc))
    return {"records": n, "complete": complete}
