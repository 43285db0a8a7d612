"""Module hooks: torch's global module forward hooks, a backward capture per module call, and
parameter-gradient hooks on each parameter's AccumulateGrad node. No module is changed or wrapped."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Dict, List, Optional

import torch

from ..dumpformat import names
from ..recorder import ModuleFrame, Recorder
from ..writer import Merge
from .apis import _SLOW, ApiHooks, _apicall, _graph_task
from .state import COMPILER, dynamo_compiling, hook_single, tls

_STRIDED = torch.strided
_RAISED = object()  # torch calls an always_call hook without kwargs when forward raised
_RECOMPUTE = object()  # the frame of a module forward run again by activation checkpointing
_ABSENT = object()  # getattr's default where None is a value of its own (a main_grad of None)
_ref = weakref.ref
_TENSOR = torch.Tensor
_grad_enabled = torch.is_grad_enabled


try:
    _DEFAULT_META = torch._C._autograd.CreationMeta(0)  # built once: a pybind enum costs a microsecond per call
    _set_meta = torch._C._autograd._set_creation_meta
except Exception:  # a torch without creation metadata: its views carry nothing to reset
    _DEFAULT_META = None


def _fix_view(t):
    # BackwardHookFunction returns views; reset their creation meta so in-place ops on module
    # inputs/outputs (nn.ReLU(inplace=True), y.add_()) keep working, as msprobe does.
    # Set whatever it was: reading it first returns a pybind enum and compares two, four times the set's cost.
    if _DEFAULT_META is not None and isinstance(t, torch.Tensor) and t._base is not None:
        try:
            _set_meta(t, _DEFAULT_META)
        except Exception:
            pass
    return t


def _own_parameters(module) -> List[tuple]:
    """(name, parameter) of the module's own parameters, as named_parameters(recurse=False) yields them (no None,
    each object once under its first name), read from _parameters without its generators: at every forward of
    every module they cost a tenth of the monitor preset's time in the tool."""
    seen = set()
    own = []
    for name, p in module._parameters.items():
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            own.append((name, p))
    return own


def _collect(item, out, depth=0):
    """The tensors of item that a backward hook can see (requiring grad, in grad mode), in _put_back's order."""
    if depth > 32:
        return
    if isinstance(item, _TENSOR):
        if _grad_enabled() and item.requires_grad:
            out.append(item)
    elif isinstance(item, (list, tuple)):
        for v in item:
            _collect(v, out, depth + 1)
    elif isinstance(item, dict):
        for v in item.values():
            _collect(v, out, depth + 1)


def _put_back(value, tensors: list, hooked) -> Any:
    """value with each tensor _collect gathered (tensors) replaced by its hooked twin (hooked, in the same order)."""
    return _rebuild(value, list(zip(tensors, hooked))[::-1])


def _rebuild(item, pending, depth=0):
    """_put_back's walk. pending: the (gathered, hooked) pairs, the next one last. A value is replaced when it is the
    next one gathered, so which tensors are hooked is decided in _collect alone."""
    if depth > 32:
        return item
    if type(item) is tuple:  # first: a module's positional inputs pass here on every call
        return tuple([_rebuild(v, pending, depth + 1) for v in item])
    if pending and item is pending[-1][0]:
        return pending.pop()[1]
    if isinstance(item, list):
        return [_rebuild(v, pending, depth + 1) for v in item]
    if isinstance(item, tuple):
        if hasattr(item, "_fields"):
            return type(item)(*[_rebuild(v, pending, depth + 1) for v in item])
        return type(item)(_rebuild(v, pending, depth + 1) for v in item)
    if isinstance(item, dict):
        if type(item) is dict:
            return {k: _rebuild(v, pending, depth + 1) for k, v in item.items()}
        for k in list(item.keys()):  # ModelOutput and other mappings: in place, as msprobe does
            item[k] = _rebuild(item[k], pending, depth + 1)
        return item
    return item


_HookFn = torch.nn.modules._functions.BackwardHookFunction


class _ModuleBackward:
    """One module call's full backward hook: ``pre(module, grad_output)`` once the output gradients are
    in, then ``hook(module, grad_input, grad_output)``, with the tuples torch's ``BackwardHook`` gives.

    A single plain tensor passes through an alias (a C++ autograd node) with a node pre-hook; several
    tensors, or a subclass, through ``BackwardHookFunction`` as in torch. The alias costs a tenth of the
    Python Function ``BackwardHook`` applies to every module input and output."""

    __slots__ = ("module", "hook", "pre", "grad_out", "n_in")

    def __init__(self, module, hook, pre):
        self.module = module
        self.hook = hook
        self.pre = pre
        self.grad_out = None
        self.n_in = 0

    def inputs(self, args):
        if hook_single is not None:  # one plain tensor, in C++ (_collect's and _through's reads included)
            got = hook_single(args, self._on_input)
            if got is not NotImplemented:
                self.n_in = 0 if got is args else 1
                return got
        tensors: List[torch.Tensor] = []
        _collect(args, tensors)
        self.n_in = len(tensors)
        return self._through(args, tensors, self._on_input) if tensors else args

    def outputs(self, output):
        if hook_single is not None:
            got = hook_single(output, self._on_output)
            if got is not NotImplemented:
                return got
        tensors: List[torch.Tensor] = []
        _collect(output, tensors)
        return self._through(output, tensors, self._on_output) if tensors else output

    @staticmethod
    def _through(value, tensors, fn):
        t = tensors[0]
        if len(tensors) == 1 and type(t) is torch.Tensor and t.layout is _STRIDED and not t.is_nested:
            # aten.alias: its AliasBackward0 hands the gradient on as it is, where view_as's ViewBackward0 reshapes
            # it. In C++ with the hook and the view's meta (hook_single), or as t[...], the indexing's fast path to it.
            if hook_single is not None:
                v = hook_single(t, fn)
                if v is t:  # no node
                    return value
                hooked = (v,)
                node = None
            else:
                v = t[...]
                node = v.grad_fn
                if node is None:
                    return value
                # in grad mode a view of a tensor that is no view is created with the default meta: only a view's
                # view can inherit one that forbids in-place ops (a split's chunk)
                hooked = (v,) if t._base is None else (_fix_view(v),)
        else:  # sparse and nested tensors have no view; subclasses keep their own dispatch
            hooked = tuple([_fix_view(h) for h in _HookFn.apply(*tensors)])
            node = next((h.grad_fn for h in hooked if h.grad_fn is not None
                         and h.grad_fn.name() == "BackwardHookFunctionBackward"), None)
            if node is None:
                return value
        if node is not None:
            node.register_prehook(fn)
        if len(hooked) == 1:  # the common cases without _put_back's frames: one tensor, or a tuple of one
            if value is t:
                return hooked[0]
            if type(value) is tuple and len(value) == 1 and value[0] is t:
                return hooked
        try:
            return _put_back(value, tensors, hooked)
        except Exception:
            return value

    def _on_output(self, grad_outputs):
        try:
            g = tuple(grad_outputs)
            self.grad_out = g
            self.pre(self.module, g)
            if self.n_in == 0:  # nothing to wait for: torch's BackwardHook calls the hook here too
                self.grad_out = None
                self.hook(self.module, (), g)
        except Exception:  # the hooks log their own failures; nothing may reach autograd
            pass
        return None

    def _on_input(self, grad_inputs):
        g = self.grad_out
        if g is None:  # gradient reached the inputs without passing the outputs (double backward)
            return None
        self.grad_out = None
        try:
            self.hook(self.module, tuple(grad_inputs), g)
        except Exception:
            pass
        return None


class ModuleHooks:
    """The recorder's module records for every named module of the registered models."""

    # the attributes the hooks' C reads (_apicall.c), at their slots' offsets (_attrs.h): an instance's own dict is the
    # interpreter's managed one, which _attrs.h reads through the attribute protocol; the rest in __dict__
    __slots__ = ("rec", "_named", "_acc", "__dict__", "__weakref__")

    def __init__(self, rec: Recorder, apis: ApiHooks):
        self.rec = rec
        self.apis = apis
        self.out = False  # the global hooks taken out (take_out): nothing needs module calls
        self.names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._named = self.names.data  # its dict, by weak reference
        self.md_prefix: Optional[str] = None  # module_dump(): the one module recorded
        self._acc: Dict[tuple, Any] = {}  # (module prefix, parameter) -> (AccumulateGrad node, handle, ref)
        self.handles: list = []
        self._compiled_done: set = set()  # ids of compiled modules whose submodules' gradients are hooked
        self._pre_body = self._bw_pre_body  # bound once (see "backward" below)
        self._hook_body = self._bw_hook_body

    def install(self) -> None:
        from torch.nn.modules import module as mm

        self.handles.append(mm.register_module_forward_pre_hook(self._pre))
        self.handles.append(mm.register_module_forward_hook(self._post, always_call=True, with_kwargs=True)
                            if _fwd_hook_kwargs() else mm.register_module_forward_hook(self._post_nokw,
                                                                                     always_call=True))

    def take_out(self) -> None:
        """The global hooks removed while the recorder needs no module call (an API level's job once started, see
        Recorder.module_calls_needed): torch then calls each module on its path without hooks, where the hooks'
        path cost an API-level call about a fifth of its instructions. Taken out at the end of a top-level call,
        so that no hook of a call in progress is missed on this thread. A recomputation is then found by the
        API calls (ApiHooks.recompute_by_frames)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.out = True
        self.apis.recompute_by_frames(True)

    def put_back(self) -> None:
        """The global hooks again, where take_out removed them: something needs module calls."""
        if not self.out:
            return
        self.out = False
        self.apis.recompute_by_frames(False)
        self.install()

    def restore(self) -> None:
        self.out = False
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for _acc, handle, _ref in self._acc.values():
            handle.remove()
        self._acc.clear()

    def name_model(self, model: torch.nn.Module, index: Optional[int]) -> None:
        root = model._orig_mod if _compiled(model) else model
        for path, sub in model.named_modules():
            if sub is model or sub is root or type(sub).__name__ == "FullyShardedDataParallel":
                continue
            if sub not in self.names:
                # torch.compile's wrapper is transparent: the names (and a compiled submodule's boundary record,
                # under its original class) are the uncompiled model's, so a compiled dump aligns with an eager one
                path = path.replace("._orig_mod", "")
                if path.startswith("_orig_mod."):
                    path = path[len("_orig_mod."):]
                cls = type(sub._orig_mod if _compiled(sub) else sub).__name__
                self.names[sub] = names.module_prefix("Module", path, cls, index)

    def _compiled_param_hooks(self, module) -> None:
        """Parameter-gradient hooks for a compiled module's submodules, whose forward hooks never run (they are
        traced away with the compiled frame); their AccumulateGrad nodes still fire."""
        if id(module) in self._compiled_done:
            return
        self._compiled_done.add(id(module))
        for sub in module._orig_mod.modules():
            prefix = self.names.get(sub)
            if prefix is not None:
                self._param_grad_hooks(sub, prefix)

    # ---- forward ----
    def _pre(self, module, args):
        rec = self.rec
        # tracing first, as the dump mode asks: dynamo then never reads the thread state (an older torch's graph
        # break on a C object's attribute), nor calls the C below
        if dynamo_compiling() or COMPILER._is_compiling_flag:
            return None
        fast = _fast_pre
        if fast is not None:  # the common case in C (_apicall.c); _SLOW where it is this body's, nothing changed yet
            got = fast(self, module, args)
            if got is not _SLOW:
                return got
        if tls.busy or rec.forked:
            return None
        depth = tls.depth
        tls.depth = depth + 1
        frames = tls.mframes
        if _graph_task() != -1:
            # a module forward inside a backward pass is activation checkpointing's recomputation (reentrant
            # or not): the same call again, not a new one; neither it nor its APIs are recorded
            if tls.recompute == 0:
                tls.recompute_in_api = tls.in_api
                tls.in_api = True
            tls.recompute += 1
            frames.append(_RECOMPUTE)
            return None
        prefix = self._named.get(_ref(module))  # self.names.get(module) without WeakKeyDictionary.get's frame
        if prefix is None:
            frames.append(None)
            try:
                if depth == 0:
                    rec.top_level_call(module)
                if rec.token_range is not None and id(module) in rec.hooked_models:
                    rec.token_tick()
                if rec.pgrads and rec.module_level and rec.session.running and _compiled(module):
                    self._compiled_param_hooks(module)
            except Exception as exc:
                rec.log(f"module pre-hook failed: {type(exc).__name__}: {exc}")
            return None
        if not (rec.session.running and rec.module_level) or (rec.api_suspended and prefix != self.md_prefix):
            frames.append(None)
            return None
        frame = rec.module_enter(prefix, args, None)
        frames.append(frame)  # pushed whatever happens next: the forward hook pops one frame per call
        if frame is None or not rec.module_bwd or not torch.is_grad_enabled():
            return None
        tls.busy = True  # not quiet: the hooked tensors go back to the user, subclasses intact
        try:
            bkey = frame.bkey
            bw = _ModuleBackward(module, partial(self._hook_body, bkey), partial(self._pre_body, bkey))
            hooked = bw.inputs(args)
            frame.backward = bw
            return hooked if hooked is not args else None
        except Exception as exc:
            rec.log(f"backward capture not set up: {type(exc).__name__}: {exc}", frame.bkey)
            return None
        finally:
            tls.busy = False

    def _post_nokw(self, module, args, output):
        return self._post(module, args, {}, output)

    def _post(self, module, args, kwargs, output=_RAISED):
        """The forward hook; also called by torch as hook(module, args, result) when forward raised
        (always_call=True drops the kwargs then): the frame is closed, nothing is recorded for it. Its body in
        one frame with the guard that keeps a tool failure out of the user's forward."""
        try:
            rec = self.rec
            if dynamo_compiling() or COMPILER._is_compiling_flag:
                return None
            fast = _fast_post
            if fast is not None:
                got = fast(self, module, kwargs, output)
                if got is not _SLOW:
                    return got
            if tls.busy or rec.forked:
                return None
            raised = output is _RAISED
            tls.depth = max(0, tls.depth - 1)
            frames = tls.mframes
            if not frames:
                return None
            frame: Optional[ModuleFrame] = frames.pop()
            if frame is _RECOMPUTE:
                tls.recompute = max(0, tls.recompute - 1)
                if tls.recompute == 0:
                    tls.in_api = tls.recompute_in_api
                return None
            if frame is None:
                if not raised and tls.depth == 0:
                    if id(module) in rec.hooked_models and rec.session.running:
                        rec.step_boundary("forward")
                    if not rec.module_calls_needed():
                        self.take_out()
                return None
            if raised:
                rec.module_abandon(frame)
                return None
            rec.module_exit(frame, kwargs, output, lambda: dict(_own_parameters(module)))
            if rec.pgrads:
                # at every forward of every module: the parameters hooked already (the same objects under the same
                # names) are found here, without _param_grad_hooks's frames and collections
                acc = self._acc
                prefix = frame.prefix
                for name, p in module._parameters.items():
                    if p is not None and p.requires_grad:
                        prev = acc.get((prefix, name))
                        if prev is None or prev[2]() is not p:
                            self._param_grad_hooks(module, prefix)
                            break
                if type(module).__name__ == "OptimizedModule" and _compiled(module):  # the name first: a frame less
                    self._compiled_param_hooks(module)
            bw = frame.backward
            if bw is None or output is None:
                return None
            tls.busy = True  # as in _pre: user-visible tensors, torch-function handling on
            try:
                hooked = bw.outputs(output)
            except Exception as exc:
                rec.log(f"backward capture failed: {type(exc).__name__}: {exc}", frame.bkey)
                return None
            finally:
                tls.busy = False
            return hooked if hooked is not output else None
        except Exception as exc:  # never into the user's forward
            try:
                self.rec.log(f"module hook failed: {type(exc).__name__}: {exc}")
            except Exception:
                pass
            return None

    def _c_failed(self, what: str, exc: BaseException, key: Optional[str]) -> None:
        """A failure inside the hooks' C common case, logged as the Python body logs it."""
        self.rec.log(f"{what}: {type(exc).__name__}: {exc}", key)

    # ---- backward ----
    # A call's hooks are partials of methods bound once: one object each, whose arguments (a str) the garbage
    # collector stops following at its first pass, where a closure is a function, its cells and their tuple, all
    # followed and, alive until the backward pass, promoted to the older generations (whose growth sets off full
    # collections of the whole process). Made in _pre itself: a factory method is a frame per hook and call.
    def _bw_pre_body(self, bkey: str, module, grad_output) -> None:
        self.rec.module_backward_pre(bkey)

    def _bw_hook_body(self, bkey: str, module, grad_input, grad_output) -> None:
        self.rec.module_backward(bkey, grad_input, grad_output)

    # ---- parameter gradients ----
    def _param_grad_hooks(self, module, prefix: str) -> None:
        # at every forward of every module: FSDP2 swaps parameters between calls
        try:
            for name, p in _own_parameters(module):
                if not p.requires_grad:
                    continue
                slot = (prefix, name)  # a tied parameter gets one hook per owning module, like msprobe
                prev = self._acc.get(slot)
                if prev is not None and prev[2]() is p:
                    continue  # we hold its AccumulateGrad node, so the parameter keeps that node
                try:
                    with torch.enable_grad():  # a forward under no_grad (reentrant checkpointing) still trains p
                        acc = p.expand_as(p).grad_fn
                    if acc is None:
                        continue
                    acc = acc.next_functions[0][0]
                except Exception:
                    continue
                if prev is not None:
                    prev[1].remove()
                pref = weakref.ref(p)
                handle = acc.register_hook(self._param_grad_hook(prefix, name, pref))
                self._acc[slot] = (acc, handle, pref)
        except Exception as exc:
            self.rec.log(f"hooks not set up: {type(exc).__name__}: {exc}", f"{prefix}parameters_grad")

    def _param_grad_hook(self, prefix: str, pname: str, pref):
        fast = _fast_param_grad
        if fast is not None:  # the common case in C (_apicall.param_grad), the rest _param_grad_slow's
            return partial(fast, self, prefix, pname, pref)

        def hook(*_):
            self._param_grad_slow(prefix, pname, pref)

        return hook

    def _param_grad_slow(self, prefix: str, pname: str, pref) -> None:
        """A parameter's gradient accumulated: its member of the record, through the recorder's Python."""
        if pref() is None:
            return

        def grad_of():
            p = pref()
            if p is None:
                return None
            main = getattr(p, "main_grad", _ABSENT)  # Megatron's fp32 gradient, where the parameter has one
            return p.grad if main is _ABSENT else main

        self.rec.param_grad(prefix, pname, grad_of)


def _compiled(module) -> bool:
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None),
                                                                   torch.nn.Module)


def _fwd_hook_kwargs() -> bool:
    import inspect

    from torch.nn.modules import module as mm

    try:
        return "with_kwargs" in inspect.signature(mm.register_module_forward_hook).parameters
    except (TypeError, ValueError):
        return False


# A module call's common case in C where built (_apicall.c's module_pre and module_post: _pre's and _post's steps with
# the recorder's module_enter and module_exit, for a call that records its outputs alone, the monitor preset's; and
# the depth and frame count of a call not recorded: an API level's, a step outside the range), and a parameter
# gradient's (param_grad: Recorder.param_grad's steps); None runs every one through the Python above. A gradient hook
# is made with the function of its time: switching it off reaches the hooks made after.
_fast_pre = _fast_post = _fast_param_grad = None
if _apicall is not None:
    _apicall.module_setup(_graph_task, ModuleFrame, Merge, _RAISED)
    _fast_pre, _fast_post, _fast_param_grad = _apicall.module_pre, _apicall.module_post, _apicall.param_grad
