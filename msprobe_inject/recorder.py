"""The recording protocol, once for every framework: what is recorded, when, and under which name.

A ``Recorder`` owns the lifecycle (start/stop/step, atexit, SIGTERM, fork), the step and rank bookkeeping
(through its ``Session``), filters and counters, and the bodies of module, backward, parameter-gradient and
``save()`` records. Its framework adapter (``framework.Framework``) hooks the framework and calls in here;
every record leaves through ``record``/``merge`` to the writer. A change in recording semantics is made
here, and both frameworks get it.

Every entry point called from a hook is guarded: a tool failure is logged (dump_error_info.log and one
warning) and never reaches the training code; a forked child and the tool's own tensor work pass through.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

from . import values
from .config import DumpConfig
from .dumpformat import names, paths
from .framework import Framework
from .session import Session
from .writer import Construct, Merge, Record, post, stack_at


class ModuleFrame:
    """One module call between its forward pre-hook and its forward hook."""

    __slots__ = ("fkey", "index", "prefix", "keep", "backward")

    def __init__(self, fkey: str, index: int, prefix: str, keep: bool):
        self.fkey = fkey
        self.index = index
        self.prefix = prefix
        self.keep = keep
        self.backward: Any = None  # the adapter's backward capture of this call

    @property
    def bkey(self) -> str:
        """The key of this call's backward record: spelled only where backward is captured."""
        return names.module_key(self.prefix, names.BACKWARD, self.index)


class Recorder:
    """One per process and framework."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("api_on", "session", "encoder", "writer", "fwd", "bwd", "inp", "outp", "extra", "construct", "forked",
                 "module_level", "api_suspended", "module_bwd", "params_on", "pgrads", "token_range", "__dict__",
                 "__weakref__")

    def __init__(self, cfg: DumpConfig, fw: Framework, zero_code: bool = False):
        self.cfg = cfg
        self.fw = fw
        self.session = Session(cfg, fw.name, self._rank_or_env if zero_code else fw.rank, fw.resolve,
                               fw.save_tensor, fw.resolve_host, fw.native)
        self.writer = self.session.writer
        self.encoder = fw.make_encoder(cfg, self.session.tensor_dir, self.writer)
        self.tls = fw.tls
        self._quiet = fw.quiet
        # bound once: the per-record bodies enter a section each, inside their own error handling
        self._enter_quiet, self._leave_quiet = fw.quiet.enter, fw.quiet.leave
        self.level = cfg.level
        self.api_level = cfg.level in ("L1", "mix")
        self.module_level = cfg.level in ("L0", "mix")
        self.construct = cfg.level in ("L0", "mix") and cfg.extra_info
        self.extra = cfg.extra_info
        self.fwd = cfg.forward_enabled
        self.bwd = cfg.backward_enabled
        self.inp = cfg.inputs_recorded
        self.outp = cfg.output_enabled
        self.params_on = self.fwd and self.outp
        self.module_bwd = self.bwd  # module backward records
        self.pgrads = self.bwd  # parameter-gradient records
        if cfg.preset == "monitor":  # module output norms and parameter-gradient norms, nothing else
            self.fwd, self.outp, self.params_on = True, True, False
            self.module_bwd, self.pgrads = False, True
        self.zero_code = zero_code
        self.manual = not zero_code  # the script calls start/stop/step (zero-code: until it makes a debugger)
        self.api_on = False
        self.api_suspended = False  # module_dump(): only the named module's records
        self.hooked_models: set = set()
        self.token_range: Optional[list] = None
        self._token_count = 0
        self._auto_started = False
        self._env_rank: List[Optional[int]] = []
        self.pid = os.getpid()
        # set in a fork child by the at-fork handler below: the hooks read it on every call, where os.getpid()
        # is a system call (start, stop, step and shutdown still compare the pid)
        self.forked = False
        self._warned_cannot: set = set()
        fw.install(self)
        atexit.register(self.shutdown)
        if self.writer.flight is not None:
            _chain_sigterm(self._sigterm)
            _chain_excepthook(weakref.ref(self))
        else:
            _chain_sigterm(self.shutdown)
        os.register_at_fork(after_in_child=_forked_child(weakref.ref(self)))

    # ---------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self.session.running

    def active(self) -> bool:
        """Recording is possible in this thread right now: this process, not the tool's own work."""
        return not self.forked and not self.tls.busy

    def start(self, model: Any = None, token_range: Any = None, rank_id: Optional[int] = None,
              lazy: bool = False) -> None:
        s = self.session
        if s.ended or os.getpid() != self.pid:
            return
        if rank_id is not None and not s.rank_fixed:
            s.fix_rank(int(rank_id))
        if model is not None:
            self.register_model(model)
        self.token_range = self.fw.token_range(token_range) if token_range is not None else None
        if token_range is not None and self.token_range is None:
            self.writer.log_error(f"start(token_range=...) is not supported for {self.fw.name}; dumping every call")
        self._token_count = 0
        if self.module_calls_needed():  # a token range now: the adapter's module hooks back if it took them out
            self.fw.want_module_calls()
        if self.cfg.level == "debug" or not s.step_selected() or not s.rank_selected():
            s.running = False
            self.set_api(False)
            return
        reason = self.fw.cannot_record()
        if reason is not None:
            if reason not in self._warned_cannot:
                self._warned_cannot.add(reason)
                self.writer.log_error(reason)
            return
        s.running = True
        if not lazy:
            s.ensure_open()  # msprobe creates the step directory at start(); zero-code waits for a record
        self.set_api(self.api_level and not self.api_suspended and self.token_range is None)

    def stop(self) -> None:
        self.session.running = False
        self.set_api(False)
        if not self.session.ended:
            self.session.flush()

    def step(self) -> None:
        if os.getpid() != self.pid:
            return
        self.set_api(False)
        self.session.running = False
        self.fw.on_step()
        self.session.next_step()

    def set_api(self, on: bool) -> None:
        self.api_on = on
        try:
            self.fw.set_api(on)
        except Exception as exc:
            self.writer.log_error(f"API interception could not be switched: {type(exc).__name__}: {exc}")

    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Stop recording and write what was recorded; timeout bounds the wait for the writer (SIGTERM)."""
        if os.getpid() != self.pid:
            return
        try:
            self.session.running = False
            self.api_on = False
            self.session.close(timeout)
        except Exception:
            pass

    def trigger(self, reason: str, kind: str = "explicit") -> None:
        """Flight recorder: write the window around the current step (every rank of the job does)."""
        if os.getpid() == self.pid and self.writer.flight is not None:
            self.writer.trigger(kind, str(reason)[:500], self.session.step)

    def _sigterm(self, timeout: Optional[float] = None) -> None:
        self.trigger("SIGTERM", kind="sigterm")
        self.shutdown(timeout)

    def restore(self) -> None:
        """Remove every hook and wrapper (the process runs on as if the tool had never been loaded)."""
        self.set_api(False)
        self.fw.restore()

    def _rank_or_env(self) -> Optional[int]:
        """Zero-code: the launcher's rank variables count before the framework's communication is initialised.
        They are read once: a rank the script sets later is seen through the framework."""
        r = self.fw.rank()
        if r is None:
            if not self._env_rank:
                from .session import rank_from_env

                self._env_rank.append(rank_from_env())
            r = self._env_rank[0]
        return r

    # ---------------------------------------------------------------- models
    def register_model(self, model: Any, skip_optimizers: bool = False) -> None:
        """Name every submodule of model (a module or a list/tuple of them) once; raises TypeError."""
        for index, m in self.fw.models(model):
            if id(m) in self.hooked_models:
                continue
            self.hooked_models.add(id(m))
            self.fw.register_model(m, index, skip_optimizers)

    # ---------------------------------------------------------------- stepping policy (zero-code)
    def top_level_call(self, module: Any) -> None:
        """A model called at the top level: zero-code dumping starts at the first one."""
        if not self.zero_code or self.manual:
            return
        if id(module) not in self.hooked_models:
            self.register_model(module, skip_optimizers=True)
        if not self.session.running and not self.session.ended and not self._auto_started:
            self._auto_started = True
            self.start(lazy=True)

    def module_calls_needed(self) -> bool:
        """Whether anything of the recording needs to see module calls now: module records (the levels L0 and mix,
        module_dump), a token range counted in the model's calls, zero-code's start at the first top-level call and
        its step at each top-level forward's end. An API level's job needs none once started; the adapter may then
        take its module hooks out (torch's module call without hooks is the cheaper path)."""
        if self.module_level or self.token_range is not None:
            return True
        if self.zero_code and not self.manual:
            return not self._auto_started or self.cfg.step_on == "forward"
        return False

    def step_boundary(self, when: str) -> None:
        """An optimizer step ("optimizer") or a top-level forward ("forward") ended: zero-code runs step here
        when MSPROBE_STEP_ON says so."""
        if not self.zero_code or self.manual or not self._auto_started or os.getpid() != self.pid:
            return
        if self.cfg.step_on != when:
            return
        try:
            self.step()
            self.start(lazy=True)
        except Exception as exc:
            self.writer.log_error(f"step boundary failed: {type(exc).__name__}: {exc}")

    def token_tick(self) -> None:
        """A call of a model given with token_range: APIs are recorded for calls start..end only."""
        a, b = self.token_range
        n = self._token_count
        self._token_count += 1
        self.set_api(self.api_level and a <= n <= b and self.session.running)

    # ---------------------------------------------------------------- the record ceremony
    def record(self, key: str, body: Any, pending: Optional[list]) -> None:
        """A whole record body (replaces an earlier one of the same key)."""
        s = self.session
        if s.ready_kind != "dump" or self.writer.stopped:  # ensure_open's test: a frame per record less
            s.ensure_open()
        post(self.writer, Record, key, body, pending or None)

    def merge(self, key: str, members: Dict[str, Any], pending: Optional[list], move: bool = False) -> None:
        """Members of a record; with move, the record takes its place at the end of the step (msprobe's
        position for a module forward: where the call completed)."""
        s = self.session
        if s.ready_kind != "dump" or self.writer.stopped:
            s.ensure_open()
        post(self.writer, Merge, key, members, pending or None, move)

    def place(self, key: str, parent: Any) -> None:
        """The record's parent in construct.json (levels L0 and mix with extra_info)."""
        if self.construct:
            s = self.session
            if s.ready_kind != "dump" or self.writer.stopped:
                s.ensure_open()
            post(self.writer, Construct, key, parent)

    def stack(self, key: str, skip: int) -> None:
        """The caller's stack for stack.json; skip: frames of the tool above the user's call."""
        if self.extra:
            s = self.session
            if s.ready_kind != "dump" or self.writer.stopped:
                s.ensure_open()
            if stack_at is None or not stack_at(self.writer, key, skip + 1):
                self.writer.stack(key, skip + 1)

    def call_through(self, func: Callable[..., Any], args: Any, kwargs: Any, base: str) -> Any:
        """Run an API call that is not recorded: calls nested in it are neither recorded nor counted, and it
        counts once it returns (msprobe numbers calls whether or not they are dumped)."""
        tls = self.tls
        tls.in_api = True
        try:
            out = func(*args, **kwargs)
        finally:
            tls.in_api = False
        self.session.finish_api(base)
        return out

    def keep(self, key: str, enclosing: List[str]) -> bool:
        f = self.session.filters
        return f.keep(key, enclosing) if f.active else True

    def log(self, message: str, record: Optional[str] = None) -> None:
        """A tool failure, to the error log. The failure of a record (a loop of calls fails each one the
        same way) is one warning, naming the first record; the log has every one."""
        if record is None:
            self.writer.log_error(message)
            return
        self.writer.log_error(f"{record}: {message}", once=message,
                              warn_as=f"{record}: {message} (the same failure of other records is logged in "
                                      f"{paths.ERROR_LOG} only)")

    def files(self, key: str, suffix: str) -> Optional[str]:
        """The tensor-file stem of a record's value, or None when its tensors are not saved."""
        enc = self.encoder
        return f"{key}.{suffix}" if enc.some_files and enc.wants_files(key) else None

    # ---------------------------------------------------------------- modules
    # Called from an adapter's module/cell hooks once it has checked the process, the busy flag and that
    # recording is on; each guards its own body, so a tool failure never reaches the forward or backward pass.
    def module_enter(self, prefix: str, args: Any, kwargs: Optional[dict]) -> Optional[ModuleFrame]:
        """Forward pre-hook body: counts the call, places it, records its inputs and stack. kwargs None: the
        framework hands them to the forward hook instead. None when the call cannot be recorded."""
        fkey = None
        try:
            s = self.session
            counts = s.module_counts  # Session.next_module_index and keep(), spelled out: two frames per module call
            idx = counts.get(prefix, -1) + 1
            counts[prefix] = idx
            fkey = names.module_key(prefix, names.FORWARD, idx)
            stack = self.tls.stack
            parent = stack[-1] if stack else None
            f = s.filters
            keep = f.keep(fkey, stack) if f.active else True
            stack.append(fkey)
            frame = ModuleFrame(fkey, idx, prefix, keep)
            # what follows opens the step's directory itself where it sends anything (a place, a merge, a stack),
            # and runs torch (quiet) only to encode inputs: a call that records only its outputs (the monitor
            # preset, data_mode output) does neither here
            if self.construct:
                self.place(fkey, parent)
            if keep and self.fwd:
                if self.inp:
                    sec = self._enter_quiet()
                    try:
                        pending: list = []
                        enc = self.encoder
                        members = {"input_args": enc.encode(list(args), pending, self.files(fkey, "input")),
                                   "input_kwargs": enc.encode(dict(kwargs), pending, self.files(fkey, "kwargs"))
                                   if kwargs else {}}
                        self.merge(fkey, members, pending)
                    finally:
                        self._leave_quiet(sec)
                if self.extra:
                    self.stack(fkey, 4)
            return frame
        except Exception as exc:
            self.log(f"module pre-hook failed: {type(exc).__name__}: {exc}", fkey)
            return None

    def module_exit(self, frame: ModuleFrame, kwargs: Optional[dict], output: Any,
                    params: Callable[[], Dict[str, Any]]) -> None:
        """Forward hook body: records the outputs and parameters (moving the record to its completion)."""
        try:
            sec = self._enter_quiet()  # files() and merge() spelled out: a module call's hot path
            try:
                stack = self.tls.stack
                fkey = frame.fkey
                if stack and stack[-1] == fkey:
                    stack.pop()
                elif fkey in stack:
                    stack.remove(fkey)
                s = self.session
                if frame.keep and self.fwd and (self.outp or self.inp and kwargs):
                    enc = self.encoder
                    files = enc.some_files and enc.wants_files(fkey)
                    pending: list = []
                    members: Dict[str, Any] = {}
                    if self.inp and kwargs:
                        members["input_kwargs"] = enc.encode(dict(kwargs), pending,
                                                             f"{fkey}.kwargs" if files else None)
                    if self.outp:
                        value = output if isinstance(output, (list, tuple)) and not hasattr(output, "_fields") \
                            else [output]
                        members["output"] = enc.encode(list(value), pending, f"{fkey}.output" if files else None)
                    if self.params_on:
                        stem = f"{fkey}.parameters" if files else None
                        suffix = self.fw.file_suffix
                        members["parameters"] = {n: enc.tensor(p, pending, f"{stem}.{n}{suffix}" if stem else None)
                                                 for n, p in params().items()}
                    w = self.writer
                    if s.ready_kind != "dump" or w.stopped:
                        s.ensure_open()
                    post(w, Merge, fkey, members, pending or None, self.outp)
                if s.filters.active:
                    s.filters.finished(fkey)
            finally:
                self._leave_quiet(sec)
        except Exception as exc:
            self.log(f"module hook failed: {type(exc).__name__}: {exc}", frame.fkey)

    def module_abandon(self, frame: ModuleFrame) -> None:
        """A module forward that raised: its place in the stack is given up; its inputs stay recorded."""
        try:
            stack = self.tls.stack
            if stack and stack[-1] == frame.fkey:
                stack.pop()
            elif frame.fkey in stack:
                stack.remove(frame.fkey)
            self.session.filters.finished(frame.fkey)
        except Exception as exc:
            self.log(f"module hook failed: {type(exc).__name__}: {exc}", frame.fkey)

    def module_backward_pre(self, bkey: str) -> None:
        """The output gradients of a module call arrived: its backward call starts (construct.json parent)."""
        if self.forked:
            return
        try:
            stack = self.tls.stack
            if self.session.running:
                self.place(bkey, stack[-1] if stack else None)
            stack.append(bkey)
        except Exception as exc:
            self.log(f"backward pre-hook failed: {type(exc).__name__}: {exc}", bkey)

    def module_backward(self, bkey: str, grad_input: Any, grad_output: Any) -> None:
        """The gradients of a module call's inputs are in: its backward record."""
        if self.forked:
            return
        t = self.tls
        stack = t.stack
        if bkey in stack:
            stack.remove(bkey)
        s = self.session
        if not s.running or t.busy:
            return
        try:
            sec = self._enter_quiet()
            try:
                f = s.filters  # keep(), spelled out
                if not f.active or f.keep(bkey, []):
                    self.backward_record(bkey, grad_output, grad_input)
            finally:
                self._leave_quiet(sec)
        except Exception as exc:
            self.log(f"backward capture failed: {type(exc).__name__}: {exc}", bkey)

    def backward_record(self, bkey: str, grad_out: Any, grad_in: Any) -> None:
        """msprobe's backward record: "input" holds the gradients arriving (of the outputs), "output" the
        gradients leaving (of the inputs). Runs quiet (the caller's guard). Its common case is spelled in C too, for
        the API calls recorded there (pytorch/_apicall.c's backward_record)."""
        enc = self.encoder
        pending: list = []
        body: Dict[str, Any] = {}
        files = enc.some_files and enc.wants_files(bkey)  # files()' test, asked once for both stems
        if self.inp:
            body["input"] = enc.encode(list(grad_out or ()), pending, f"{bkey}.input" if files else None)
        if self.outp:
            body["output"] = enc.encode(list(grad_in or ()), pending, f"{bkey}.output" if files else None)
        s = self.session
        if s.ready_kind != "dump" or self.writer.stopped:
            s.ensure_open()
        post(self.writer, Record, bkey, body, pending or None)

    # ---------------------------------------------------------------- parameter gradients
    def param_grad(self, prefix: str, pname: str, grad_of: Callable[[], Any]) -> None:
        """A parameter's gradient accumulated: one member of ``{module}.parameters_grad.{k}``."""
        s = self.session
        t = self.tls
        if not s.running or t.busy or self.forked:
            return
        try:
            sec = self._enter_quiet()
            try:
                # Session.pgrad_index, keep(), files() and merge() spelled out: at monitor each frame per gradient is
                # about 1 % of a module call's instructions
                counts = s.pgrad_counts
                cur = counts.get(prefix)
                if cur is None:
                    counts[prefix] = [0, pname]
                    idx = 0
                else:
                    if cur[1] == pname:
                        cur[0] += 1
                    idx = cur[0]
                key = names.param_grad_key(prefix, idx)
                if s.filters.active and not s.filters.keep(key, []):
                    return
                grad = grad_of()
                pending: list = []
                enc = self.encoder
                if isinstance(grad, self.fw.tensor_type):
                    entry = enc.tensor(grad, pending, f"{key}.{pname}{self.fw.file_suffix}"
                                       if enc.some_files and enc.wants_files(key) else None)
                else:
                    entry = enc.encode(grad, pending, None)
                if s.ready_kind != "dump" or self.writer.stopped:
                    s.ensure_open()
                post(self.writer, Merge, key, {pname: [entry]}, pending or None, False)
            finally:
                self._leave_quiet(sec)
        except Exception as exc:
            self.log(f"capture failed: {type(exc).__name__}: {exc}", f"{prefix[:-1]}.parameters_grad")

    # ---------------------------------------------------------------- save() at level debug
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        s = self.session
        if self.cfg.level != "debug" or s.ended or not s.step_selected() or os.getpid() != self.pid:
            return
        if not isinstance(name, str) or not isinstance(save_backward, bool):
            self.log("save(): name must be a str and save_backward a bool")
            return
        if not values.saveable(variable, self.fw.tensor_type):
            self.log(f"save(): unsupported type {type(variable).__name__} for '{name}', skipped")
            return
        try:
            with self._quiet():
                s.ensure_open("debug")
                count = s.debug_index(name)
                key = names.debug_key(name, count)
                files = self.cfg.task == "tensor"
                pending: list = []
                s.writer.send(Record(key, self.encoder.encode(variable, pending, key if files else None), pending))
                if save_backward:
                    self._save_grad(variable, names.debug_grad_key(name, count), files)
        except Exception as exc:
            self.log(f"save('{name}') failed: {type(exc).__name__}: {exc}")

    def _save_grad(self, variable: Any, gkey: str, files: bool) -> None:
        """The gradient record of a save()d value: nulls first, each leaf filled in as its gradient arrives."""
        holder = {"v": values.null_shape(variable)}
        self.writer.send(Record(gkey, values.null_shape(variable), None))
        if not self.fw.grad_enabled():
            return
        lock = threading.Lock()  # the leaves' hooks may run on autograd's worker threads
        suffix = self.fw.file_suffix
        leaf_type = self.fw.tensor_type_name

        def attach(t: Any, path: List[Any]) -> None:
            def hook(grad: Any) -> None:
                if os.getpid() != self.pid:
                    return
                try:
                    with self._quiet():
                        pending: list = []
                        fname = ".".join([gkey, *map(str, path)]) + suffix if files else None
                        entry = self.encoder.tensor(grad, pending, fname)
                        with lock:
                            holder["v"] = values.put_at(holder["v"], path, entry)
                            self.writer.send(Record(gkey, values.copy_shape(holder["v"], leaf_type), pending))
                except Exception as exc:
                    self.log(f"save(): gradient capture for {gkey} failed: {exc}")

            self.fw.on_grad(t, hook)

        for t, path in self.fw.grad_leaves(variable):
            attach(t, path)


def _forked_child(ref: Callable[[], Optional[Recorder]]) -> Callable[[], None]:
    """A fork child (a DataLoader worker) inherits the hooks but must not record."""

    def after_in_child() -> None:
        rec = ref()
        if rec is not None:
            rec.forked = True
            rec.session.running = False
            rec.api_on = False

    return after_in_child


def _chain_excepthook(ref: Callable[[], Optional[Recorder]]) -> None:
    """Flight recorder: an exception leaving the script triggers (atexit then writes the window)."""
    import sys

    prev = sys.excepthook

    def hook(etype: Any, value: Any, tb: Any) -> Any:
        rec = ref()
        if rec is not None and not issubclass(etype, KeyboardInterrupt):
            try:
                rec.trigger(f"{etype.__name__}: {value}", kind="exception")
            except Exception:
                pass
        return prev(etype, value, tb)

    sys.excepthook = hook


SIGTERM_FLUSH_S = 5.0  # torchrun sends SIGKILL 30 s after SIGTERM: the dump gets a bounded share of that
_SIGTERM_GRACE_S = 1.0  # how long the watcher lets the main thread's Python handler come first


def _chain_sigterm(flush: Callable[[float], None]) -> None:
    """torchrun stops workers with SIGTERM, whose default action skips atexit: flush first, then do
    what the previous handler would have done (the user's handler, or terminate by the signal).

    A Python handler only runs when the main thread runs Python; a job hung in a collective (its own
    hang, not ours) sits in C and would ignore SIGTERM until torchrun's SIGKILL. Where SIGTERM's action
    was the default, a watcher thread learns of the signal through the wakeup fd and, when the main thread
    has not handled it within a second, flushes (bounded) and terminates the process by the signal.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return
    state = {"handled": False, "flushed": threading.Lock()}

    def flush_once() -> None:
        if state["flushed"].acquire(blocking=False):
            try:
                flush(SIGTERM_FLUSH_S)
            except Exception:
                pass

    def handler(signum: int, frame: Any) -> Any:
        state["handled"] = True
        flush_once()
        if callable(prev):
            return prev(signum, frame)
        if prev == signal.SIG_IGN:
            return None
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None

    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        return
    if prev in (signal.SIG_DFL, None):
        _watch_sigterm(handler, state, flush_once)


def _watch_sigterm(handler: Callable[..., Any], state: Dict[str, Any], flush_once: Callable[[], None]) -> None:
    import socket

    try:
        r, w = socket.socketpair()
        w.setblocking(False)
    except OSError:
        return
    try:
        old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        r.close()
        w.close()
        return
    if old != -1:  # the wakeup fd belongs to someone else (an asyncio loop): leave it to them
        signal.set_wakeup_fd(old)
        r.close()
        w.close()
        return
    pid = os.getpid()

    def release_in_child() -> None:
        # a fork child (DataLoader worker) must not signal the parent's watcher through the shared socket
        try:
            cur = signal.set_wakeup_fd(-1)
            if cur != w.fileno():
                signal.set_wakeup_fd(cur)  # not ours any more
        except (ValueError, OSError):
            pass
        r.close()
        w.close()

    os.register_at_fork(after_in_child=release_in_child)

    def watch() -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data or os.getpid() != pid:
                return
            if signal.SIGTERM not in data:
                continue
            end = time.monotonic() + _SIGTERM_GRACE_S
            while not state["handled"] and time.monotonic() < end:
                time.sleep(0.05)
            if state["handled"]:
                continue  # the main thread runs the handler: it flushes and terminates
            try:
                if signal.getsignal(signal.SIGTERM) is not handler:
                    continue  # the job installed its own handler since: its decision
            except Exception:
                pass
            flush_once()
            _die_by(signal.SIGTERM)

    threading.Thread(target=watch, name="msprobe-sigterm", daemon=True).start()


def _die_by(signum: int) -> None:
    """Terminate the process by signum's default action from any thread (signal.signal is main-thread only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(signum, 0)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(1.0)
    except Exception:
        pass
    os._exit(128 + signum)
