"""API interception: a TorchFunctionMode pushed while dumping sees every torch function call on its thread.

Nothing in torch is replaced: ``F.gelu``, ``torch.matmul`` and ``torch.Tensor.add`` stay the original objects.
An API's backward record comes from a hook on its output's ``grad_fn``, which never changes a gradient.
This is the hot path (every call of every listed API), so its ceremony is spelled out here rather than
through the recorder's guarded helpers: one quiet section for the inputs, one for the outputs. Its common case runs in
C (_apicall.c, the same steps without this module's interpreter frames), and so does that case's backward record
(_on_backward's steps); what the C does not take comes back here before anything has run, and with the C not built
every call runs here.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any, Dict

import torch
from torch.overrides import TorchFunctionMode

from .. import writer as _writer_module
from ..dumpformat import names
from ..recorder import Recorder
from ..writer import Construct, Record, post, stack_at
from . import apinames
from .state import COMPILER, Quiet, dynamo_compiling, hook_after, tls

# a quiet section per record (state.Quiet): its two methods bound once, so that a record looks up neither
_enter_quiet, _leave_quiet = Quiet.enter, Quiet.leave
_DROPOUT = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
_FunctionType = type(lambda: None)
_UNSEEN = object()
_TENSOR = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
# where a module forward runs (nn.Module.__call__ calls it, hooks or not), and where a backward pass begins on the
# calling thread (an autograd worker thread's stack begins inside the pass)
_MODULE_CALL = torch.nn.Module._call_impl.__code__
_PASS_BEGINS = frozenset(f.__code__ for f in (getattr(torch.autograd.graph, "_engine_run_backward", None),
                                              torch.autograd.backward, torch.autograd.grad) if f is not None)


def _recomputing(frame: Any) -> bool:
    """Whether a call inside a backward pass is made by a module forward begun inside that pass: activation
    checkpointing's recomputation (reentrant or not), the same calls again, not new ones. What the module hooks'
    recompute count says when they are in place; found from the frames when they are out. A custom autograd
    function's backward, or a module forward that itself runs a backward pass, finds no module call before the
    pass's beginning."""
    while frame is not None:
        code = frame.f_code
        if code is _MODULE_CALL:
            return True
        if code in _PASS_BEGINS:
            return False
        frame = frame.f_back
    return False


def _first_tensor(value):
    seen = 0
    while not isinstance(value, torch.Tensor):
        seen += 1
        if seen > 64:
            return None
        if isinstance(value, dict):
            value = next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
            if value is None:
                return None
        elif isinstance(value, (list, tuple)) and value:
            value = value[0]
        else:
            return None
    return value


class DumpMode(TorchFunctionMode):
    """Sees every torch function call on the thread that pushed it; dumps the listed ones."""

    # read by every call's C (_apicall.c) at their slots' offsets (_attrs.h)
    __slots__ = ("hooks", "known")

    def __init__(self, hooks: ApiHooks):
        super().__init__()
        self.hooks = hooks
        # what resolve() found a callable to be whatever the call: None for no API msprobe wraps (a tensor's
        # attribute read, torch.is_complex, the optimizer's zeros_like; over half the calls of a training step), its
        # (base, listed, prefix, api) for an API whose name does not depend on the calling line (all but operators)
        self.known = hooks.known

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        # first: dynamo traces this method, and a dict of any callables is nothing it guards
        if dynamo_compiling() or COMPILER._is_compiling_flag:
            return func(*args, **kwargs)
        fast = _fast_call
        if fast is not None:  # the common case in C (_apicall.c); _SLOW where it is this body's, nothing run yet
            out = fast(self, func, args, kwargs)
            if out is not _SLOW:
                return out
        try:
            info = self.known.get(func, _UNSEEN)
        except TypeError:  # an unhashable callable: resolve() says what it is
            info = _UNSEEN
        if info is None:
            return func(*args, **kwargs)
        h = self.hooks
        if tls.busy or tls.in_api or not h.rec.api_on:
            return func(*args, **kwargs)
        if h.by_frames and _graph_task() != -1 and _recomputing(sys._getframe(1)):
            tls.in_api = True  # what the module hooks set for a recomputation: the calls inside it pass through
            try:
                return func(*args, **kwargs)
            finally:
                tls.in_api = False
        if info is _UNSEEN:
            info = h.resolve(func, args)
            if info is None:
                return func(*args, **kwargs)
        rec = None
        if type(func) is _FunctionType and kwargs and h.rec.session.running:
            rec = apinames.respell(func, args, kwargs, sys._getframe(1))  # for the record only
        return h.call_api(func, info, args, kwargs, rec)


class ApiHooks:
    """API records of one recorder: naming (apinames), the dump mode, and each call's record."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("rec", "_operators", "_sites", "_backward_c", "__dict__", "__weakref__")

    def __init__(self, rec: Recorder):
        cfg = rec.cfg
        self.rec = rec
        self.all_apis = cfg.all_apis
        self.table = apinames.ApiTable(cfg.risk_level, cfg.all_apis)
        lists = apinames.load_lists()
        low = set(lists["low"])
        self.tensor_dunders = {n: (cfg.risk_level == "ALL" or n not in low)
                               for n in lists["tensor"] if n.startswith("__")}
        self._bases: Dict[tuple, str] = {}
        self.known: Dict[Any, Any] = {}  # DumpMode.known: what resolve() found a callable to be, whatever the call
        self._operators: Dict[Any, tuple] = {}  # an operator's method: (prefix, api, listed)
        self._sites: Dict[tuple, tuple] = {}  # (method, code id, instruction, 2nd argument a tensor): (info, code)
        self.mode = DumpMode(self)
        self.mode_pushed = False
        self.optimizer_running = False  # mix level: APIs inside optimizer.step() are placed under "optimizer"
        self._backward_body = self._on_backward  # bound once (see _register_backward)
        # the C common case's node hook: _on_backward's steps in C (_apicall.backward), this object bound once
        self._backward_c = partial(_apicall.backward, self) if _apicall is not None else self._on_backward
        self.by_frames = False  # the module hooks are out: a recomputation is found from the frames

    def recompute_by_frames(self, on: bool) -> None:
        """The module hooks taken out (on) or put back: a call inside a backward pass then finds whether it is a
        recomputation itself (the C common case leaves such a call to the Python above)."""
        self.by_frames = on
        if _apicall is not None:
            _apicall.recompute_by_frames(on)

    def set_api(self, on: bool) -> None:
        if on and not self.mode_pushed:
            self.mode.__enter__()
            self.mode_pushed = True
        elif not on and self.mode_pushed:
            from torch.overrides import _get_current_function_mode

            if _get_current_function_mode() is self.mode:
                self.mode.__exit__(None, None, None)
                self.mode_pushed = False

    def _base(self, prefix: str, api: str) -> str:
        key = (prefix, api)
        base = self._bases.get(key)
        if base is None:
            base = self._bases[key] = names.api_base(prefix, api)
        return base

    def resolve(self, func, args):
        """(base name, listed, prefix, api) for a torch callable, or None when it is not an API msprobe wraps;
        kept in ``known`` where it holds for every call of the callable (bounded whatever the callables' identities
        turn out to be)."""
        try:
            op = self._operators.get(func)
        except TypeError:
            op = None
        if op is None:
            try:  # ApiTable.lookup, spelled out
                name = self.table.names.get(func)
            except TypeError:
                name = None
            if name is None:
                if not self.all_apis:
                    self._know(func, None)
                    return None
                name = self.table.name_for_unlisted(func)
                listed = True
            else:
                listed = self.table.listed.get(func, True)
            prefix, api = name
            if not (prefix == "Tensor" and api in apinames._OPERATOR_METHODS):
                info = self._base(prefix, api), listed, prefix, api
                self._know(func, info)
                return info
            op = (prefix, api, listed)
            if len(self._operators) < 4096:
                self._operators[func] = op
        # an operator's method: its name is the calling instruction's, kept per site
        frame = sys._getframe(2)
        if frame.f_code.co_name == "wrapped":
            frame = apinames.calling_site(frame)
        if frame is None:
            return self._operator(op, None, args, None)
        # the code object's id, not the object (its hash reads its constants): the entry holds the object, so the id
        # is not reused while the entry lives
        site = (func, id(frame.f_code), frame.f_lasti, len(args) > 1 and isinstance(args[1], _TENSOR))
        got = self._sites.get(site)
        if got is not None:
            return got[0]
        return self._operator(op, frame, args, site)

    def _operator(self, op, frame, args, site):
        """An operator method's record name at this calling instruction (its dunder), kept for the site where the
        arguments do not change it."""
        prefix, api, listed = op
        dunder, static = apinames.operator_site(api, frame, args)
        if dunder is None:
            info = self._base(prefix, api), listed, prefix, api
        elif dunder not in self.tensor_dunders and not self.all_apis:
            info = None
        else:
            info = self._base(prefix, dunder), self.tensor_dunders.get(dunder, True), prefix, dunder
        if static and site is not None and len(self._sites) < 4096:
            self._sites[site] = (info, frame.f_code)
        return info

    def _know(self, func, info) -> None:
        if len(self.known) < 4096:
            try:
                self.known[func] = info
            except TypeError:
                pass

    def call_api(self, func, info, args, kwargs, respelled=None):
        """One recorded call: its inputs' entries, the call (nested APIs pass through), its outputs' entries, the
        record, its tree place and its backward hook. Spelled out in one frame: it runs for every listed call."""
        base, listed, prefix, api = info
        rec = self.rec
        s = rec.session
        if not s.running or rec.forked:
            return func(*args, **kwargs)
        idx = s.api_counts.get(base, 0)
        fkey = names.api_key(base, idx, names.FORWARD)
        stack = tls.stack
        filters = s.filters
        if not listed or (filters.active and not filters.keep(fkey, stack)):
            return self._filtered(func, base, idx, fkey, prefix, api, args, kwargs, stack)
        body: Dict[str, Any] = {}
        pending: list = []
        enc = rec.encoder
        files = False
        t = tls
        try:
            sec = _enter_quiet()
            try:
                files = enc.some_files and enc.wants_files(fkey)  # Recorder.files' test, once for the three stems
                if rec.fwd and rec.inp:
                    a, kw = respelled if respelled is not None else (args, kwargs)
                    if kw and "out" in kw:
                        # an out= buffer (inductor's generated calls pass one) holds uninitialised memory until the
                        # call writes it: it is the output, recorded after the call, never an input
                        kw = {k: v for k, v in kw.items() if k != "out"}
                    if prefix in ("Distributed", "NPU"):
                        pos = (_IGNORE.get((prefix, api)) or {}).get("input", ())
                        if pos:
                            a = [None if i in pos else v for i, v in enumerate(a)]
                            kw = {k: (None if k in pos else v) for k, v in kw.items()}
                    body["input_args"] = enc.encode(list(a), pending, f"{fkey}.input" if files else None)
                    body["input_kwargs"] = enc.encode(dict(kw), pending, f"{fkey}.kwargs" if files else None) \
                        if kw else {}
                    if rec.extra and (stack_at is None or not stack_at(rec.writer, fkey, 2)):
                        rec.writer.stack(fkey, 2)
            finally:
                _leave_quiet(sec)
        except Exception as exc:
            self._capture_failed("input", exc, fkey)
        t.in_api = True
        try:
            out = func(*args, **kwargs)
        finally:
            t.in_api = False
        counts = s.api_counts  # Session.finish_api, spelled out: a frame per recorded call
        counts[base] = counts.get(base, 0) + 1
        try:
            sec = _enter_quiet()
            try:
                if rec.fwd:
                    if rec.outp:
                        if prefix == "Distributed":
                            value = list(args) + list(kwargs.values())
                            pos = (_IGNORE.get((prefix, api)) or {}).get("output", ())
                            value = [None if i in pos else v for i, v in enumerate(value)]
                        elif type(out) is _TENSOR:
                            value = [out]
                        else:
                            value = list(out if isinstance(out, (list, tuple)) and not hasattr(out, "_fields")
                                         else [out])
                        body["output"] = enc.encode(value, pending, f"{fkey}.output" if files else None)
                    w = rec.writer
                    if s.ready_kind != "dump" or w.stopped:  # Session.ensure_open's test, spelled out
                        s.ensure_open()
                    post(w, Record, fkey, body, pending or None)
                if rec.construct:
                    post(rec.writer, Construct, fkey, self._parent(stack))
                if filters.active:
                    filters.finished(fkey)
                # under no_grad (an optimizer's step: 468 of the 594 recorded calls of overhead.py's GPT-2 step) no
                # output has a node to hook
                if rec.bwd and prefix != "Distributed" and _grad_enabled():
                    self._register_backward(out, names.api_key(base, idx, names.BACKWARD), prefix, api, args, kwargs,
                                            True)
            finally:
                _leave_quiet(sec)
        except Exception as exc:
            self._capture_failed("output", exc, fkey)
        return out

    def _capture_failed(self, stage: str, exc: BaseException, key: str) -> None:
        """A record's capture failed (the user's call has run or will): a tool error, logged with its key."""
        self.rec.log(f"{stage} capture failed: {type(exc).__name__}: {exc}", key)

    def _filtered(self, func, base, idx, fkey, prefix, api, args, kwargs, stack):
        """A call the filters (or the lists) leave out: called through, and at mix its tree place kept."""
        rec = self.rec
        out = rec.call_through(func, args, kwargs, base)
        if rec.construct and rec.level == "mix":
            # msprobe records the tree position of filtered APIs too
            try:  # the section inside: a failing guard is a logged tool error, the user's call has returned
                with Quiet():
                    rec.session.ensure_open()
                    post(rec.writer, Construct, fkey, self._parent(stack))
                    if _grad_enabled():  # as in call_api
                        self._register_backward(out, names.api_key(base, idx, names.BACKWARD), prefix, api, args,
                                                kwargs, False)
            except Exception as exc:
                rec.log(f"construct capture failed: {exc}", fkey)
        return out

    def _parent(self, stack):
        if self.optimizer_running and self.rec.level == "mix":
            return "optimizer"
        return stack[-1] if stack else None

    def _register_backward(self, out, bkey, prefix, api, args, kwargs, record: bool) -> None:
        if api in _DROPOUT and prefix == "Functional":
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            if p == 0:
                return
        t = out if type(out) is _TENSOR else _first_tensor(out)
        if t is not None and t.requires_grad:
            if hook_after is not None:  # the node asked in C++ (grad mode too), which holds the arguments itself
                hook_after(t, self._backward_body, bkey, record)
                return
            node = t.grad_fn  # the callers asked grad mode
            if node is not None:
                # a partial of a method bound once: one object per call, not a closure's function, cells and tuple,
                # which the garbage collector follows and, alive until the backward pass, promotes (see
                # modules.ModuleHooks' backward)
                node.register_hook(partial(self._backward_body, bkey, record))

    def _on_backward(self, bkey: str, record: bool, grad_inputs, grad_outputs) -> None:
        # _apicall.backward is these steps for the calls the C records (a change here is made there too; the parity
        # test in tests/inject/pytorch/test_apicall.py compares the two)
        rec = self.rec
        t = tls
        if t.busy or rec.forked or rec.session.ended:
            return None
        try:
            sec = _enter_quiet()
            try:
                if rec.construct:
                    rec.place(bkey, t.stack[-1] if t.stack else None)
                if record and (not rec.session.filters.active or rec.keep(bkey, [])):
                    rec.backward_record(bkey, grad_outputs, grad_inputs)
            finally:
                _leave_quiet(sec)
        except Exception as exc:
            self._capture_failed("backward", exc, bkey)
        return None

    def call_custom(self, func, prefix: str, api: str, args, kwargs):
        """register_custom_api's wrapper body."""
        if tls.in_api or tls.busy or not self.rec.session.running:
            return func(*args, **kwargs)
        return self.call_api(func, (self._base(prefix, api), True, prefix, api), args, kwargs)


def _load_ignore() -> Dict[tuple, Dict[str, tuple]]:
    raw = apinames.load_lists().get("ignore", {})
    out: Dict[tuple, Dict[str, tuple]] = {}
    for prefix, apis_ in raw.items():
        for api, rules in (apis_ or {}).items():
            out[(prefix, api)] = {k: tuple(v) for k, v in rules.items()}
    return out


_IGNORE = _load_ignore()


# The common recorded call in C where built (_apicall.c: the steps of __torch_function__ and call_api above, no
# interpreter frame of theirs); _fast_call None runs every call through the Python above. The C uses the functions
# given here as they are now: rebinding one of these names later (a diagnostic's way) changes the Python path alone.
_SLOW = object()
try:
    from . import _apicall
except ImportError:
    _apicall = None
_fast_call = None
if _apicall is not None:
    _apicall.setup(_SLOW, _FunctionType, _TENSOR, Record, Construct, hook_after, stack_at, _grad_enabled, _enter_quiet,
                   _leave_quiet, tls, apinames.respell, _writer_module)
    _fast_call = _apicall.call
del _writer_module
