"""PyTorch hooks: a TorchFunctionMode for APIs, global module hooks for modules, autograd hooks for backward.

Nothing in torch is replaced: ``F.gelu``, ``torch.matmul`` and ``torch.Tensor.add`` stay the original
objects. Every hook body is wrapped so that a failure in the tool is logged and never reaches user code.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional

import torch
from torch.overrides import TorchFunctionMode

from .. import values
from ..config import DumpConfig
from ..session import Session
from ..writer import Construct, Merge, Record, Stack, capture_stack
from . import apis, encode

_DROPOUT = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
_tls = threading.local()
_NO_TF = torch._C.DisableTorchFunction
_STRIDED = torch.strided
_dist = torch.distributed
try:
    _dist_ok = _dist.is_available()
except Exception:  # pragma: no cover
    _dist_ok = False
_FunctionType = type(lambda: None)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _busy() -> bool:
    return getattr(_tls, "busy", False)


def _quiet():
    """Enter a hook body: our own tensor calls skip torch-function handling (the dump mode's Python
    handler costs microseconds per attribute read in hooks that run while it is pushed)."""
    _tls.busy = True
    guard = _NO_TF()
    guard.__enter__()
    return guard


def _loud(guard) -> None:
    guard.__exit__(None, None, None)
    _tls.busy = False


def _stack() -> List[str]:
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def _rank() -> Optional[int]:
    # asked before every record until the rank is known: kept to one attribute check
    try:
        if _dist_ok and _dist.is_initialized():
            return _dist.get_rank()
    except Exception:
        pass
    return None


_env_rank: List[Optional[int]] = []


def _rank_or_env() -> Optional[int]:
    """Zero-code: the launcher's rank variables count before torch.distributed is initialised.

    They are read once: a rank the script sets later is seen through torch.distributed."""
    r = _rank()
    if r is None:
        if not _env_rank:
            from ..session import rank_from_env

            _env_rank.append(rank_from_env())
        r = _env_rank[0]
    return r


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


def _fix_view(t):
    # BackwardHookFunction returns views; reset their creation meta so in-place ops on module
    # inputs/outputs (nn.ReLU(inplace=True), y.add_()) keep working, as msprobe does.
    if isinstance(t, torch.Tensor) and t._base is not None:
        try:
            if torch._C._autograd._get_creation_meta(t) != torch._C._autograd.CreationMeta(0):
                torch._C._autograd._set_creation_meta(t, torch._C._autograd.CreationMeta(0))
        except Exception:
            pass
    return t


def _hookable(t) -> bool:
    return isinstance(t, torch.Tensor) and torch.is_grad_enabled() and t.requires_grad


def _collect(item, out, depth=0):
    if depth > 32:
        return
    if _hookable(item):
        out.append(item)
    elif isinstance(item, (list, tuple)):
        for v in item:
            _collect(v, out, depth + 1)
    elif isinstance(item, dict):
        for v in item.values():
            _collect(v, out, depth + 1)


def _rebuild(item, it, depth=0):
    if _hookable(item):
        return _fix_view(next(it))
    if depth > 32:
        return item
    if isinstance(item, list):
        return [_rebuild(v, it, depth + 1) for v in item]
    if isinstance(item, tuple):
        if hasattr(item, "_fields"):
            return type(item)(*[_rebuild(v, it, depth + 1) for v in item])
        return type(item)(_rebuild(v, it, depth + 1) for v in item)
    if isinstance(item, dict):
        if type(item) is dict:
            return {k: _rebuild(v, it, depth + 1) for k, v in item.items()}
        for k in list(item.keys()):  # ModelOutput and other mappings: in place, as msprobe does
            item[k] = _rebuild(item[k], it, depth + 1)
        return item
    return item


_HookFn = torch.nn.modules._functions.BackwardHookFunction


class _ModuleBackward:
    """One module call's full backward hook: ``pre(module, grad_output)`` once the output gradients are
    in, then ``hook(module, grad_input, grad_output)``, with the tuples torch's ``BackwardHook`` gives.

    A single plain tensor passes through a view (a C++ autograd node) with a node pre-hook; several
    tensors, or a subclass, through ``BackwardHookFunction`` as in torch. The view costs a tenth of the
    Python Function ``BackwardHook`` applies to every module input and output."""

    __slots__ = ("module", "hook", "pre", "grad_out", "n_in")

    def __init__(self, module, hook, pre):
        self.module = module
        self.hook = hook
        self.pre = pre
        self.grad_out = None
        self.n_in = 0

    def inputs(self, args):
        tensors: List[torch.Tensor] = []
        _collect(args, tensors)
        self.n_in = len(tensors)
        return self._through(args, tensors, self._on_input) if tensors else args

    def outputs(self, output):
        tensors: List[torch.Tensor] = []
        _collect(output, tensors)
        return self._through(output, tensors, self._on_output) if tensors else output

    @staticmethod
    def _through(value, tensors, fn):
        t = tensors[0]
        if len(tensors) == 1 and type(t) is torch.Tensor and t.layout is _STRIDED and not t.is_nested:
            hooked = (t.view_as(t),)
            node = hooked[0].grad_fn
        else:  # sparse and nested tensors have no view; subclasses keep their own dispatch
            hooked = _HookFn.apply(*tensors)
            node = next((h.grad_fn for h in hooked if h.grad_fn is not None
                         and h.grad_fn.name() == "BackwardHookFunctionBackward"), None)
        if node is None:
            return value
        node.register_prehook(fn)
        try:
            return _rebuild(value, iter(hooked))
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


class DumpMode(TorchFunctionMode):
    """Sees every torch function call on the thread that pushed it; dumps the listed ones."""

    def __init__(self, rt: Runtime):
        super().__init__()
        self.rt = rt

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        rt = self.rt
        if getattr(_tls, "busy", False) or getattr(_tls, "in_api", False) or not rt.api_on or _is_compiling():
            return func(*args, **kwargs)
        info = rt.resolve(func, args)
        if info is None:
            return func(*args, **kwargs)
        rec = None
        if type(func) is _FunctionType and kwargs and rt.session.running:
            rec = apis.respell(func, args, kwargs, sys._getframe(1))  # for the record only
        return rt.call_api(func, info, args, kwargs, rec)


class Runtime:
    """The PyTorch adapter of one process: hooks in, records out through the session."""

    def __init__(self, cfg: DumpConfig, zero_code: bool = False):
        self.cfg = cfg
        self.session = Session(cfg, "pytorch", _rank_or_env if zero_code else _rank, encode.resolve, encode.save_pt)
        self.writer = self.session.writer
        self.encoder = encode.Encoder(cfg, self.session.tensor_dir, self.writer)
        self.table = apis.ApiTable(cfg.risk_level, cfg.all_apis)
        lists = apis.load_lists()
        low = set(lists["low"])
        self.tensor_dunders = {n: (cfg.risk_level == "ALL" or n not in low)
                               for n in lists["tensor"] if n.startswith("__")}
        self.level = cfg.level
        self.api_level = cfg.level in ("L1", "mix")
        self.module_level = cfg.level in ("L0", "mix")
        self.construct = cfg.level in ("L0", "mix") and cfg.extra_info
        self.extra = cfg.extra_info
        self.fwd = cfg.forward_enabled
        self.bwd = cfg.backward_enabled
        self.inp = cfg.input_enabled
        self.outp = cfg.output_enabled
        self.params_on = self.fwd and self.outp
        self.zero_code = zero_code
        self.manual = not zero_code
        self.api_on = False
        self.api_suspended = False
        self.module_names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self.hooked_models: set = set()
        self.mode = DumpMode(self)
        self.mode_pushed = False
        self._handles: list = []
        self._acc: Dict[int, Any] = {}
        self._name_cache: Dict[tuple, str] = {}
        self.optimizer_running = False
        self.token_range = None
        self._token_count = 0
        self.pid = os.getpid()
        self.owner_thread = threading.get_ident()
        self._install_global_hooks()
        # torch warns when a module's inputs need no grad; that is our hook's business, not the user's
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with")
        atexit.register(self.shutdown)
        _chain_sigterm(self.shutdown)

    # ---------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self.session.running

    def _install_global_hooks(self) -> None:
        from torch.nn.modules import module as mm
        from torch.optim import optimizer as om

        self._handles.append(mm.register_module_forward_pre_hook(self._module_pre))
        self._handles.append(mm.register_module_forward_hook(self._module_post, always_call=True, with_kwargs=True)
                             if _fwd_hook_kwargs() else mm.register_module_forward_hook(self._module_post_nokw,
                                                                                      always_call=True))
        self._handles.append(om.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(om.register_optimizer_step_post_hook(self._opt_post))

    def start(self, model=None, token_range=None, rank_id: Optional[int] = None, lazy: bool = False) -> None:
        s = self.session
        if s.ended or os.getpid() != self.pid:
            return
        if rank_id is not None and not s.rank_fixed:
            s.fix_rank(int(rank_id))
        if model is not None:
            self.register_model(model)
        self.token_range = list(token_range) if token_range else None
        self._token_count = 0
        if self.cfg.level == "debug" or not s.step_selected() or not s.rank_selected():
            s.running = False
            self._set_api(False)
            return
        s.running = True
        if not lazy:
            s.ensure_open()  # msprobe creates the step directory at start(); zero-code waits for a record
        self._set_api(self.api_level and not self.api_suspended and self.token_range is None)

    def stop(self) -> None:
        self.session.running = False
        self._set_api(False)
        if self.session.ended:
            return
        self.session.flush()

    def step(self) -> None:
        if os.getpid() != self.pid:
            return
        self._set_api(False)
        self.session.running = False
        self.encoder.cache.clear()
        self.session.next_step()

    def _set_api(self, on: bool) -> None:
        self.api_on = on
        if on and not self.mode_pushed:
            self.mode.__enter__()
            self.mode_pushed = True
        elif not on and self.mode_pushed:
            try:
                from torch.overrides import _get_current_function_mode

                if _get_current_function_mode() is self.mode:
                    self.mode.__exit__(None, None, None)
                    self.mode_pushed = False
            except Exception:
                pass

    def shutdown(self) -> None:
        if os.getpid() != self.pid:
            return
        try:
            self.session.running = False
            self.api_on = False
            self.session.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- model names
    def register_model(self, model) -> None:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        indexed = isinstance(model, (list, tuple))
        for i, m in enumerate(models):
            if not isinstance(m, torch.nn.Module):
                raise TypeError(f"model must be a torch.nn.Module or a list/tuple of them, got {type(m).__name__}")
            if id(m) in self.hooked_models:
                continue
            self.hooked_models.add(id(m))
            idx = f"{i}." if indexed else ""
            for name, sub in m.named_modules():
                if sub is m or type(sub).__name__ == "FullyShardedDataParallel":
                    continue
                if sub not in self.module_names:
                    self.module_names[sub] = f"Module.{idx}{name}.{type(sub).__name__}."

    # ---------------------------------------------------------------- APIs
    def resolve(self, func, args):
        """(base name, dumped?) for a torch callable, or None when it is not an API msprobe wraps."""
        name = self.table.lookup(func)
        if name is None:
            if not self.cfg.all_apis:
                return None
            name = self.table.name_for_unlisted(func)
            listed = True
        else:
            listed = self.table.listed.get(func, True)
        prefix, api = name
        if prefix == "Tensor" and api in apis._OPERATOR_METHODS:
            dunder = apis.operator_name(api, sys._getframe(2), args)
            if dunder is not None:
                if dunder not in self.tensor_dunders and not self.cfg.all_apis:
                    return None
                api = dunder
                listed = self.tensor_dunders.get(dunder, True)
        key = (prefix, api)
        base = self._name_cache.get(key)
        if base is None:
            base = self._name_cache[key] = f"{prefix}.{api}."
        return base, listed, prefix, api

    def call_api(self, func, info, args, kwargs, rec=None):
        base, listed, prefix, api = info
        s = self.session
        if not s.running or os.getpid() != self.pid:
            return func(*args, **kwargs)
        idx = s.api_counts.get(base, 0)
        fkey = f"{base}{idx}.forward"
        stack = _stack()
        keep = listed and (s.filters.keep(fkey, stack) if s.filters.active else True)
        if not keep:
            _tls.in_api = True
            try:
                out = func(*args, **kwargs)
            finally:
                _tls.in_api = False
            s.finish_api(base)
            if self.construct and self.level == "mix":
                # msprobe records the tree position of filtered APIs too
                quiet = _quiet()
                try:
                    s.ensure_open()
                    s.writer.send(Construct(fkey, self._api_parent(stack)))
                    self._register_api_backward(out, f"{base}{idx}.backward", prefix, api, args, kwargs, False)
                except Exception as exc:
                    self.writer.log_error(f"{fkey}: construct capture failed: {exc}")
                finally:
                    _loud(quiet)
            return out
        body: Dict[str, Any] = {}
        pending = encode.Pending()
        quiet = _quiet()
        try:
            ra, rk = rec if rec is not None else (args, kwargs)
            self._api_inputs(fkey, prefix, api, ra, rk, body, pending)
        except Exception as exc:
            self.writer.log_error(f"{fkey}: input capture failed: {type(exc).__name__}: {exc}")
        finally:
            _loud(quiet)
        _tls.in_api = True
        try:
            out = func(*args, **kwargs)
        finally:
            _tls.in_api = False
        s.finish_api(base)
        quiet = _quiet()
        try:
            self._api_outputs(fkey, base, idx, prefix, api, args, kwargs, out, body, pending, stack)
        except Exception as exc:
            self.writer.log_error(f"{fkey}: output capture failed: {type(exc).__name__}: {exc}")
        finally:
            _loud(quiet)
        return out

    def _api_inputs(self, fkey, prefix, api, args, kwargs, body, pending):
        if not (self.fwd and self.inp):
            return
        enc = self.encoder
        files = enc.wants_files(fkey)
        ignore = _IGNORE.get((prefix, api)) if prefix in ("Distributed", "NPU") else None
        a = args
        kw = kwargs
        if ignore:
            pos = ignore.get("input", ())
            a = [None if i in pos else v for i, v in enumerate(args)]
            kw = {k: (None if k in pos else v) for k, v in kwargs.items()}
        body["input_args"] = enc.encode(list(a), pending, f"{fkey}.input" if files else None)
        body["input_kwargs"] = enc.encode(dict(kw), pending, f"{fkey}.kwargs" if files else None)
        if self.extra:
            self.writer.send(Stack(fkey, capture_stack(2)))

    def _api_outputs(self, fkey, base, idx, prefix, api, args, kwargs, out, body, pending, stack):
        s = self.session
        enc = self.encoder
        files = enc.wants_files(fkey)
        if self.fwd and self.outp:
            if prefix == "Distributed":
                value = list(args) + list(kwargs.values())
                pos = (_IGNORE.get((prefix, api)) or {}).get("output", ())
                value = [None if i in pos else v for i, v in enumerate(value)]
            else:
                value = out if isinstance(out, (list, tuple)) and not hasattr(out, "_fields") else [out]
                if isinstance(out, tuple) and not hasattr(out, "_fields") and type(out) is not tuple:
                    value = list(out)
            body["output"] = enc.encode(list(value), pending, f"{fkey}.output" if files else None)
        if self.fwd:
            s.ensure_open()
            s.writer.send(Record(fkey, body, pending))
        if self.construct:
            s.writer.send(Construct(fkey, self._api_parent(stack)))
        s.filters.finished(fkey)
        if self.bwd and prefix != "Distributed":
            self._register_api_backward(out, f"{base}{idx}.backward", prefix, api, args, kwargs, True)

    def _api_parent(self, stack):
        if self.optimizer_running and self.level == "mix":
            return "optimizer"
        return stack[-1] if stack else None

    def _register_api_backward(self, out, bkey, prefix, api, args, kwargs, record: bool) -> None:
        if api in _DROPOUT and prefix == "Functional":
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            if p == 0:
                return
        t = _first_tensor(out)
        if t is not None and t.requires_grad and torch.is_grad_enabled() and t.grad_fn is not None:
            t.grad_fn.register_hook(self._api_backward_hook(bkey, record))

    def _api_backward_hook(self, bkey: str, record: bool = True):
        def hook(grad_inputs, grad_outputs):
            if _busy() or os.getpid() != self.pid or self.session.ended:
                return None
            quiet = _quiet()
            try:
                s = self.session
                if self.construct:
                    st = _stack()
                    s.ensure_open()
                    s.writer.send(Construct(bkey, st[-1] if st else None))
                if not record or (s.filters.active and not s.filters.keep(bkey, [])):
                    return None
                self._backward_record(bkey, grad_outputs, grad_inputs)
            except Exception as exc:
                self.writer.log_error(f"{bkey}: backward capture failed: {type(exc).__name__}: {exc}")
            finally:
                _loud(quiet)
            return None

        return hook

    def _backward_record(self, bkey, grad_in, grad_out):
        enc = self.encoder
        files = enc.wants_files(bkey)
        pending = encode.Pending()
        body: Dict[str, Any] = {}
        if self.inp:
            body["input"] = enc.encode(list(grad_in), pending, f"{bkey}.input" if files else None)
        if self.outp:
            body["output"] = enc.encode(list(grad_out), pending, f"{bkey}.output" if files else None)
        self.session.ensure_open()
        self.writer.send(Record(bkey, body, pending))

    def call_custom(self, func, prefix: str, api: str, args, kwargs):
        """register_custom_api's wrapper body."""
        if getattr(_tls, "in_api", False) or _busy() or not self.session.running:
            return func(*args, **kwargs)
        key = (prefix, api)
        base = self._name_cache.get(key) or self._name_cache.setdefault(key, f"{prefix}.{api}.")
        return self.call_api(func, (base, True, prefix, api), args, kwargs)

    # ---------------------------------------------------------------- modules
    def _module_pre(self, module, args):
        if _busy() or _is_compiling() or os.getpid() != self.pid:
            return None
        depth = getattr(_tls, "depth", 0)
        _tls.depth = depth + 1
        try:
            prefix = self.module_names.get(module)
            if prefix is None:
                if depth == 0 and self.zero_code and not self.manual:
                    self._auto_root(module)
                frames = getattr(_tls, "mframes", None)
                if frames is None:
                    frames = _tls.mframes = []
                frames.append(None)
                if self.token_range is not None and id(module) in self.hooked_models:
                    self._token_tick()
                return None
            return self._module_enter(module, prefix, args)
        except Exception as exc:
            self.writer.log_error(f"module pre-hook failed: {type(exc).__name__}: {exc}")
            return None

    def _module_enter(self, module, prefix, args):
        frames = getattr(_tls, "mframes", None)
        if frames is None:
            frames = _tls.mframes = []
        s = self.session
        md_only = self.api_suspended and prefix != getattr(self, "_md_prefix", None)
        if not (s.running and self.module_level) or md_only:
            frames.append(None)
            return None
        idx = s.next_module_index(prefix)
        fkey = f"{prefix}forward.{idx}"
        bkey = f"{prefix}backward.{idx}"
        stack = _stack()
        parent = stack[-1] if stack else None
        keep = s.filters.keep(fkey, stack) if s.filters.active else True
        stack.append(fkey)
        s.ensure_open()
        if self.construct:
            s.writer.send(Construct(fkey, parent))
        body: Dict[str, Any] = {}
        pending = encode.Pending()
        quiet = _quiet()
        try:
            if keep and self.fwd:
                if self.inp:
                    files = self.encoder.wants_files(fkey)
                    body["input_args"] = self.encoder.encode(list(args), pending, f"{fkey}.input" if files else None)
                    body["input_kwargs"] = {}
                    s.writer.send(Merge(fkey, dict(body), pending, False))
                    pending = encode.Pending()
                if self.extra:
                    s.writer.send(Stack(fkey, capture_stack(2)))
        finally:
            _loud(quiet)
        new_args = None
        bw = None
        if self.bwd and torch.is_grad_enabled():
            _tls.busy = True  # not _quiet(): the hooked tensors go back to the user, subclasses intact
            try:
                bw = _ModuleBackward(module, self._module_bw_hook(bkey), self._module_bw_pre(bkey))
                hooked = bw.inputs(args)
                if hooked is not args:
                    new_args = hooked
            except Exception as exc:  # the frame is pushed regardless: the post-hook pops one per call
                bw = None
                self.writer.log_error(f"{bkey}: backward capture not set up: {type(exc).__name__}: {exc}")
            finally:
                _tls.busy = False
        frames.append((fkey, keep, body, bw))
        return new_args

    def _module_post_nokw(self, module, args, output):
        return self._module_post(module, args, {}, output)

    def _module_post(self, module, args, kwargs, output):
        if _busy() or _is_compiling() or os.getpid() != self.pid:
            return None
        _tls.depth = max(0, getattr(_tls, "depth", 1) - 1)
        frames = getattr(_tls, "mframes", None)
        if not frames:
            return None
        frame = frames.pop()
        try:
            if frame is None:
                if self.zero_code and not self.manual and _tls.depth == 0 and self.cfg.step_on == "forward" \
                        and id(module) in self.hooked_models and self.session.running:
                    self.step()
                    self.start(lazy=True)
                return None
            fkey, keep, body, bw = frame
            stack = _stack()
            if stack and stack[-1] == fkey:
                stack.pop()
            elif fkey in stack:
                stack.remove(fkey)
            s = self.session
            quiet = _quiet()
            try:
                if keep and self.fwd:
                    files = self.encoder.wants_files(fkey)
                    pending = encode.Pending()
                    if self.inp and kwargs:
                        body["input_kwargs"] = self.encoder.encode(dict(kwargs), pending,
                                                                   f"{fkey}.kwargs" if files else None)
                    if self.outp:
                        value = output if isinstance(output, (list, tuple)) and not hasattr(output, "_fields") \
                            else [output]
                        body["output"] = self.encoder.encode(list(value), pending, f"{fkey}.output" if files else None)
                    if self.params_on:
                        params = {n: p for n, p in module.named_parameters(recurse=False)}
                        body["parameters"] = {n: self.encoder.tensor(p, pending, f"{fkey}.parameters.{n}.pt"
                                                                      if files else None) for n, p in params.items()}
                    s.writer.send(Merge(fkey, body, pending, self.outp))
                if self.bwd:
                    self._param_grad_hooks(module, fkey)
                s.filters.finished(fkey)
            finally:
                _loud(quiet)
            if bw is not None and output is not None:
                _tls.busy = True  # as in _module_enter: user-visible tensors, torch-function handling on
                try:
                    hooked = bw.outputs(output)
                finally:
                    _tls.busy = False
                if hooked is not output:
                    return hooked
        except Exception as exc:
            self.writer.log_error(f"module hook failed: {type(exc).__name__}: {exc}")
        return None

    def _module_bw_pre(self, bkey):
        def pre(module, grad_output):
            if os.getpid() != self.pid:
                return None
            stack = _stack()
            if self.construct and self.session.running:
                self.session.writer.send(Construct(bkey, stack[-1] if stack else None))
            stack.append(bkey)
            return None

        return pre

    def _module_bw_hook(self, bkey):
        def hook(module, grad_input, grad_output):
            if os.getpid() != self.pid:
                return None
            stack = _stack()
            if bkey in stack:
                stack.remove(bkey)
            s = self.session
            if not s.running or _busy():
                return None
            quiet = _quiet()
            try:
                if s.filters.active and not s.filters.keep(bkey, []):
                    return None
                self._backward_record(bkey, grad_output, grad_input)
            except Exception as exc:
                self.writer.log_error(f"{bkey}: backward capture failed: {type(exc).__name__}: {exc}")
            finally:
                _loud(quiet)
            return None

        return hook

    def _param_grad_hooks(self, module, fkey):
        mkey = fkey.rsplit(".", 2)[0]
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            slot = (mkey, name)  # a tied parameter gets one hook per owning module, like msprobe
            prev = self._acc.get(slot)
            if prev is not None and prev[2]() is p:
                continue  # we hold its AccumulateGrad node, so the parameter keeps that node
            try:
                acc = p.expand_as(p).grad_fn
                if acc is None:
                    continue
                acc = acc.next_functions[0][0]
            except Exception:
                continue
            if prev is not None:
                prev[1].remove()
            pref = weakref.ref(p)
            handle = acc.register_hook(self._param_grad_hook(mkey, name, pref))
            self._acc[slot] = (acc, handle, pref)

    def _param_grad_hook(self, mkey, pname, pref):
        def hook(*_):
            s = self.session
            if not s.running or _busy() or os.getpid() != self.pid:
                return None
            p = pref()
            if p is None:
                return None
            quiet = _quiet()
            try:
                k = s.pgrad_index(mkey, pname)
                key = f"{mkey}.parameters_grad.{k}"
                if s.filters.active and not s.filters.keep(key, []):
                    return None
                grad = getattr(p, "main_grad", None) if hasattr(p, "main_grad") else p.grad
                pending = encode.Pending()
                files = self.encoder.wants_files(key)
                entry = self.encoder.encode(grad, pending, None) if not isinstance(grad, torch.Tensor) else \
                    self.encoder.tensor(grad, pending, f"{key}.{pname}.pt" if files else None)
                s.ensure_open()
                s.writer.send(Merge(key, {pname: [entry]}, pending, False))
            except Exception as exc:
                self.writer.log_error(f"{mkey}.parameters_grad: capture failed: {type(exc).__name__}: {exc}")
            finally:
                _loud(quiet)
            return None

        return hook

    # ---------------------------------------------------------------- zero-code
    def _auto_root(self, module) -> None:
        """A module called at the top level: the model. Dumping starts at the first one."""
        if self.module_level and id(module) not in self.hooked_models:
            self.register_model(module)
        elif id(module) not in self.hooked_models:
            self.hooked_models.add(id(module))
        if not self.session.running and not self.session.ended and not getattr(self, "_auto_started", False):
            self._auto_started = True
            self.start(lazy=True)

    def _token_tick(self) -> None:
        a, b = self.token_range
        n = self._token_count
        self._token_count += 1
        self._set_api(self.api_level and a <= n <= b and self.session.running)

    # ---------------------------------------------------------------- optimizer
    def _opt_pre(self, optimizer, args, kwargs):
        self.optimizer_running = True
        if self.construct and self.level == "mix" and self.session.running:
            self.session.writer.send(Construct("optimizer", None))

    def _opt_post(self, optimizer, args, kwargs):
        self.optimizer_running = False
        if self.zero_code and not self.manual and self.cfg.step_on == "optimizer" and os.getpid() == self.pid \
                and getattr(self, "_auto_started", False):
            try:
                self.step()
                self.start(lazy=True)
            except Exception as exc:
                self.writer.log_error(f"step boundary failed: {exc}")

    # ---------------------------------------------------------------- debug level
    def save(self, variable, name: str, save_backward: bool = True) -> None:
        s = self.session
        if self.cfg.level != "debug" or s.ended or not s.step_selected() or os.getpid() != self.pid:
            return
        if not isinstance(name, str) or not isinstance(save_backward, bool):
            self.writer.log_error("save(): name must be a str and save_backward a bool")
            return
        if not values.saveable(variable, torch.Tensor):
            self.writer.log_error(f"save(): unsupported type {type(variable).__name__} for '{name}', skipped")
            return
        quiet = _quiet()
        try:
            s.ensure_open("debug")
            count = s.debug_index(name)
            key = f"{name}.{count}.debug"
            files = self.cfg.task == "tensor"
            pending = encode.Pending()
            value = self.encoder.encode(variable, pending, key if files else None)
            s.writer.send(Record(key, value, pending))
            if save_backward:
                self._save_grad(variable, f"{name}_grad.{count}.debug", files)
        except Exception as exc:
            self.writer.log_error(f"save('{name}') failed: {type(exc).__name__}: {exc}")
        finally:
            _loud(quiet)

    def _save_grad(self, variable, gkey: str, files: bool) -> None:
        holder = {"v": values.null_shape(variable)}
        s = self.session
        s.writer.send(Record(gkey, holder["v"], None))
        lock = threading.Lock()

        def attach(t, path):
            def hook(grad):
                if os.getpid() != self.pid:
                    return None
                quiet = _quiet()
                try:
                    pending = encode.Pending()
                    fname = ".".join([gkey, *map(str, path)]) + ".pt" if files else None
                    entry = self.encoder.tensor(grad, pending, fname)
                    with lock:
                        holder["v"] = values.put_at(holder["v"], path, entry)
                        s.writer.send(Record(gkey, values.copy_shape(holder["v"], "torch.Tensor"), pending))
                except Exception as exc:
                    self.writer.log_error(f"save(): gradient capture for {gkey} failed: {exc}")
                finally:
                    _loud(quiet)
                return None

            t.register_hook(hook)

        for t, path in values.tensor_paths(variable, torch.Tensor, []):
            if t.requires_grad and torch.is_grad_enabled():
                attach(t, path)


def _chain_sigterm(flush) -> None:
    """torchrun stops workers with SIGTERM, whose default action skips atexit: flush first, then do
    what the previous handler would have done (the user's handler, or terminate by the signal)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return

    def handler(signum, frame):
        try:
            flush()
        except Exception:
            pass
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
        pass


def _fwd_hook_kwargs() -> bool:
    import inspect

    from torch.nn.modules import module as mm

    try:
        return "with_kwargs" in inspect.signature(mm.register_module_forward_hook).parameters
    except (TypeError, ValueError):
        return False


def _load_ignore() -> Dict[tuple, Dict[str, tuple]]:
    raw = apis.load_lists().get("ignore", {})
    out: Dict[tuple, Dict[str, tuple]] = {}
    for prefix, apis_ in raw.items():
        for api, rules in (apis_ or {}).items():
            out[(prefix, api)] = {k: tuple(v) for k, v in rules.items()}
    return out


_IGNORE = _load_ignore()
