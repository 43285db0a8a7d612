"""MindSpore PyNative hooks: Cell hooks for L0, API wrappers and Primitive hooks for L1, grad hooks for backward.

Cells are hooked with MindSpore's own per-Cell hooks (``register_forward_pre_hook``/``register_forward_hook``
with kwargs, ``register_backward_pre_hook``/``register_backward_hook``); parameter gradients with
``Parameter.register_hook``. L1 needs wrappers (see apis.py); an API's backward record takes the
gradients of its outputs and of its inputs from two ``ops.HookBackward`` identities, one applied to the
floating-point outputs and one to the floating-point tensor arguments (in-place APIs keep their
arguments and outputs untouched and get no backward record).
Primitives held by the model's Cells are hooked as msprobe does, by giving each instance a subclass
whose ``__call__`` records; ``restore()`` gives every instance its class back.
Every hook body is wrapped so that a failure in the tool is logged and never reaches user code.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any, Dict, List, Optional

import mindspore as ms
from mindspore import nn, ops

from .. import values
from ..config import DumpConfig
from ..session import Session, rank_from_env
from ..writer import Construct, Merge, Record, Stack, capture_stack
from . import apis, encode
from .apis import tls

_DIFF_DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64, ms.complex64, ms.complex128)
_HookBackward = ops.HookBackward
try:
    from mindspore.common.api import _pynative_executor
except ImportError:  # pragma: no cover
    _pynative_executor = None


def requires_grad() -> bool:
    """True while PyNative records a graph for value_and_grad/grad (backward hooks can fire)."""
    try:
        return bool(_pynative_executor.requires_grad())
    except Exception:
        return True


def graph_mode() -> bool:
    try:
        return ms.get_context("mode") == ms.GRAPH_MODE
    except Exception:
        return False


def rank() -> Optional[int]:
    try:
        from mindspore.communication import GlobalComm, get_rank

        if GlobalComm.INITED:
            return int(get_rank())
    except Exception:
        pass
    return None


def rank_or_env() -> Optional[int]:
    """Zero-code: msrun's RANK_ID counts before mindspore.communication.init()."""
    r = rank()
    return rank_from_env() if r is None else r


def is_optimizer(cell: Any) -> bool:
    if isinstance(cell, nn.Optimizer):
        return True
    try:
        from mindspore.experimental.optim import Optimizer as ExpOptimizer

        return isinstance(cell, ExpOptimizer)
    except ImportError:
        return False


def _diff_tensor(v: Any) -> bool:
    return isinstance(v, ms.Tensor) and v.dtype in _DIFF_DTYPES


class Runtime:
    """The MindSpore adapter of one process: hooks in, records out through the session."""

    def __init__(self, cfg: DumpConfig, zero_code: bool = False):
        self.cfg = cfg
        self.session = Session(cfg, "mindspore", rank_or_env if zero_code else rank, encode.resolve,
                               encode.save_npy)
        self.writer = self.session.writer
        self.encoder = encode.Encoder(cfg, self.session.tensor_dir, self.writer)
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
        self.pid = os.getpid()
        self.cell_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Cell -> "Cell.{path}.{Class}."
        self.bw_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Cell -> open backward keys (LIFO)
        self.hooked_models: set = set()
        self._cell_handles: list = []
        self._param_handles: Dict[tuple, Any] = {}
        self._primitives: List[tuple] = []  # (primitive, original class)
        self._prim_classes: Dict[tuple, type] = {}
        self.wrappers = apis.ApiWrappers(self.call_api, lambda: self.api_on)
        atexit.register(self.shutdown)

    # ---------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self.session.running

    def start(self, model=None, token_range=None, rank_id: Optional[int] = None, lazy: bool = False) -> None:
        s = self.session
        if s.ended or os.getpid() != self.pid:
            return
        if rank_id is not None and not s.rank_fixed:
            s.fix_rank(int(rank_id))
        if model is not None:
            self.register_model(model)
        if token_range is not None:
            self.writer.log_error("start(token_range=...) is not supported for MindSpore; dumping every call")
        if self.cfg.level == "debug" or not s.step_selected() or not s.rank_selected():
            s.running = False
            self._set_api(False)
            return
        if graph_mode():
            if not getattr(self, "_graph_warned", False):
                self._graph_warned = True
                self.writer.log_error("MindSpore is in GRAPH_MODE: only PyNative mode is dumped; nothing recorded")
            return
        s.running = True
        if not lazy:
            s.ensure_open()  # msprobe creates the step directory at start(); zero-code waits for a record
        self._set_api(self.api_level)

    def stop(self) -> None:
        self.session.running = False
        self._set_api(False)
        if not self.session.ended:
            self.session.flush()

    def step(self) -> None:
        if os.getpid() != self.pid:
            return
        self._set_api(False)
        self.session.running = False
        for lst in list(self.bw_keys.values()):
            lst.clear()
        self.session.next_step()

    def _set_api(self, on: bool) -> None:
        self.api_on = on
        try:
            if on:
                self.wrappers.install()
        except Exception as exc:
            self.writer.log_error(f"API wrappers could not be installed: {type(exc).__name__}: {exc}")

    def restore(self) -> None:
        """Remove every hook and wrapper this runtime installed."""
        self.api_on = False
        self.wrappers.restore()
        for h in self._cell_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._cell_handles.clear()
        for h in self._param_handles.values():
            try:
                h.remove()
            except Exception:
                pass
        self._param_handles.clear()
        for prim, cls in self._primitives:
            try:
                prim.__class__ = cls
            except Exception:
                pass
        self._primitives.clear()

    def shutdown(self) -> None:
        if os.getpid() != self.pid:
            return
        try:
            self.session.running = False
            self.api_on = False
            self.session.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- models
    def register_model(self, model, skip_optimizers: bool = False) -> None:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        indexed = isinstance(model, (list, tuple))
        for i, m in enumerate(models):
            if not isinstance(m, nn.Cell):
                raise TypeError(f"model must be a mindspore.nn.Cell or a list/tuple of them, got {type(m).__name__}")
            if id(m) in self.hooked_models:
                continue
            self.hooked_models.add(id(m))
            idx = f"{i}." if indexed else ""
            skipped: List[str] = []
            for name, cell in m.cells_and_names():
                if cell is m:
                    continue
                if skip_optimizers and (is_optimizer(cell) or any(name.startswith(p + ".") for p in skipped)):
                    skipped.append(name)  # zero-code: the optimizer is the step boundary, not a layer
                    continue
                if self.module_level and cell not in self.cell_names:
                    self.cell_names[cell] = f"Cell.{idx}{name}.{type(cell).__name__}."
                    self._hook_cell(cell)
            if self.api_level:
                self._hook_primitives(m)

    def _hook_cell(self, cell) -> None:
        hs = self._cell_handles
        hs.append(cell.register_forward_pre_hook(self._cell_pre, with_kwargs=True))
        hs.append(cell.register_forward_hook(self._cell_post, with_kwargs=True, always_call=True))
        if self.bwd:
            hs.append(cell.register_backward_pre_hook(self._cell_bw_pre))
            hs.append(cell.register_backward_hook(self._cell_bw))

    def _hook_primitives(self, model) -> None:
        from mindspore.ops.primitive import Primitive

        found = {}
        for _, cell in model.cells_and_names():
            for attr, value in vars(cell).items():
                if isinstance(value, Primitive) and id(value) not in found \
                        and type(value).__name__ != "CellBackwardHook":  # MindSpore's own Cell-hook identities
                    found[id(value)] = (attr, value)
        for attr, prim in found.values():
            cls = type(prim)
            if getattr(cls, "_msprobe_inject_orig", None) is not None:
                continue  # already hooked
            name = f"{attr}.{cls.__name__}"
            new_cls = self._prim_classes.get((cls, name))
            if new_cls is None:
                new_cls = type(cls.__name__, (cls,), {"__call__": self._primitive_call(cls.__call__, name),
                                                      "_msprobe_inject_orig": cls})
                self._prim_classes[(cls, name)] = new_cls
            try:
                prim.__class__ = new_cls
                self._primitives.append((prim, cls))
            except TypeError as exc:
                self.writer.log_error(f"primitive {name} cannot be hooked: {exc}")

    def _primitive_call(self, orig_call, name: str):
        base = f"Primitive.{name}."
        rt = self

        def __call__(prim, *args, **kwargs):
            if tls.busy or tls.in_api or os.getpid() != rt.pid:
                return orig_call(prim, *args, **kwargs)
            s = rt.session
            if not (s.running and rt.api_level):
                if not s.ended:
                    s.finish_api(base)  # msprobe counts primitive calls whether or not it is dumping
                return orig_call(prim, *args, **kwargs)

            def call(*a, **k):
                return orig_call(prim, *a, **k)

            return rt.call_api(call, base, "Primitive", name, args, kwargs)

        return __call__

    # ---------------------------------------------------------------- APIs
    def call_api(self, func, base: str, prefix: str, api: str, args: tuple, kwargs: dict):
        s = self.session
        if not s.running or os.getpid() != self.pid:
            return func(*args, **kwargs)
        idx = s.api_counts.get(base, 0)
        fkey = f"{base}{idx}.forward"
        bkey = f"{base}{idx}.backward"
        stack = tls.stack
        keep = s.filters.keep(fkey, stack) if s.filters.active else True
        grad = self.bwd and prefix not in apis.DIST_PREFIXES and requires_grad()
        if not keep:
            tls.in_api = True
            try:
                out = func(*args, **kwargs)
            finally:
                tls.in_api = False
            s.finish_api(base)
            if self.construct and self.level == "mix":
                s.ensure_open()
                s.writer.send(Construct(fkey, stack[-1] if stack else None))  # msprobe places filtered APIs too
            return out
        body: Dict[str, Any] = {}
        pending = encode.Pending()
        call_args = args
        bstate = None
        tls.busy = True
        try:
            if self.fwd and self.inp:
                files = self.encoder.wants_files(fkey)
                body["input_args"] = self.encoder.encode(list(args), pending, f"{fkey}.input" if files else None)
                body["input_kwargs"] = self.encoder.encode(dict(kwargs), pending, f"{fkey}.kwargs" if files else None)
            if self.fwd and self.extra:
                s.writer.send(Stack(fkey, capture_stack(2)))
            if grad:
                bstate = {"key": bkey, "set": False, "in": None, "out": None}
                if not apis.is_inplace(api):
                    call_args = self._hook_inputs(args, bstate, per_input=prefix == "Primitive")
        except Exception as exc:
            self.writer.log_error(f"{fkey}: input capture failed: {type(exc).__name__}: {exc}")
        finally:
            tls.busy = False
        tls.in_api = True
        try:
            out = func(*call_args, **kwargs)
        except BaseException:
            tls.in_api = False
            s.finish_api(base)
            if self.fwd:
                s.ensure_open()
                s.writer.send(Record(fkey, body, pending))  # msprobe keeps the inputs of a call that raised
            raise
        tls.in_api = False
        s.finish_api(base)
        tls.busy = True
        try:
            if prefix in apis.DIST_PREFIXES:
                out = self._dist_sync(func, api, args, kwargs, out)
            if self.fwd and self.outp:
                files = self.encoder.wants_files(fkey)
                if prefix in apis.ARGS_AS_OUTPUT:
                    value = list(args) + list(kwargs.values())
                else:
                    value = list(out) if isinstance(out, (list, tuple)) and not hasattr(out, "_fields") else [out]
                body["output"] = self.encoder.encode(value, pending, f"{fkey}.output" if files else None)
            if self.fwd:
                s.ensure_open()
                s.writer.send(Record(fkey, body, pending))
            if self.construct:
                s.ensure_open()
                s.writer.send(Construct(fkey, stack[-1] if stack else None))
            s.filters.finished(fkey)
            if bstate is not None and not apis.is_inplace(api):
                out = self._hook_outputs(out, bstate)
        except Exception as exc:
            self.writer.log_error(f"{fkey}: output capture failed: {type(exc).__name__}: {exc}")
        finally:
            tls.busy = False
        return out

    @staticmethod
    def _dist_sync(func, api, args, kwargs, out):
        """Like msprobe: wait for an asynchronous collective so that its output is recorded complete."""
        is_async = bool(kwargs.get("async_op", False)) or api in ("isend", "irecv", "batch_isend_irecv")
        if not is_async:
            return out
        handles = out if isinstance(out, list) else [out[1] if isinstance(out, tuple) and len(out) == 2 else out]
        for h in handles:
            wait = getattr(h, "wait", None)
            if callable(wait):
                wait()
        return out

    def _hook_inputs(self, args: tuple, bstate: dict, per_input: bool = False) -> tuple:
        pos = [i for i, a in enumerate(args) if _diff_tensor(a)]
        if not pos:
            return args
        new = list(args)
        if per_input:
            # msprobe's Primitive hooks: one identity per input, gradients listed in arrival order
            bstate["in"] = []
            for i in pos:
                new[i] = _HookBackward(self._api_in_grad(bstate, append=True))(args[i])
            return tuple(new)
        bstate["in"] = [None] * len(pos)
        hooked = _HookBackward(self._api_in_grad(bstate))(*[args[i] for i in pos])
        if not isinstance(hooked, (tuple, list)):
            hooked = (hooked,)
        for i, t in zip(pos, hooked):
            new[i] = t
        return tuple(new)

    def _hook_outputs(self, out: Any, bstate: dict) -> Any:
        """Route the floating-point outputs through one HookBackward identity (gradients of the outputs).

        Not Tensor.register_hook: a tensor hook travels with the tensor into @jit graphs, which then try to
        compile the hook's Python code.
        """
        if isinstance(out, ms.Tensor):
            if out.dtype not in _DIFF_DTYPES:
                return out
            bstate["out"] = [None]
            return _HookBackward(self._api_out_grad(bstate))(out)
        if not isinstance(out, (tuple, list)) or hasattr(out, "_fields"):
            return out
        pos = [i for i, t in enumerate(out) if _diff_tensor(t)]
        if not pos:
            return out
        bstate["out"] = [None] * len(pos)
        hooked = _HookBackward(self._api_out_grad(bstate))(*[out[i] for i in pos])
        if not isinstance(hooked, (tuple, list)):
            hooked = (hooked,)
        new = list(out)
        for i, t in zip(pos, hooked):
            new[i] = t
        return type(out)(new) if type(out) in (tuple, list) else out

    def _api_out_grad(self, bstate: dict):
        def hook(grads):
            if os.getpid() != self.pid or self.session.ended:
                return None
            tls.busy = True
            try:
                pending = encode.Pending()
                files = self.encoder.wants_files(bstate["key"])
                grads = grads if isinstance(grads, (tuple, list)) else (grads,)
                bstate["out"] = [self.encoder.tensor(g, pending, f"{bstate['key']}.input.{j}.npy" if files else None)
                                 if isinstance(g, ms.Tensor) else None for j, g in enumerate(grads)]
                self._emit_api_backward(bstate, pending, "input")
            except Exception as exc:
                self.writer.log_error(f"{bstate['key']}: backward capture failed: {type(exc).__name__}: {exc}")
            finally:
                tls.busy = False
            return None

        return hook

    def _api_in_grad(self, bstate: dict, append: bool = False):
        def hook(grads):
            if os.getpid() != self.pid or self.session.ended:
                return None
            tls.busy = True
            try:
                pending = encode.Pending()
                files = self.encoder.wants_files(bstate["key"])
                grads = grads if isinstance(grads, (tuple, list)) else (grads,)
                first = len(bstate["in"]) if append else 0
                entries = [self.encoder.tensor(g, pending, f"{bstate['key']}.output.{first + j}.npy" if files else None)
                           if isinstance(g, ms.Tensor) else None for j, g in enumerate(grads)]
                bstate["in"] = bstate["in"] + entries if append else entries
                self._emit_api_backward(bstate, pending, "output")
            except Exception as exc:
                self.writer.log_error(f"{bstate['key']}: backward capture failed: {type(exc).__name__}: {exc}")
            finally:
                tls.busy = False
            return None

        return hook

    def _emit_api_backward(self, bstate: dict, pending, changed: str) -> None:
        s = self.session
        bkey = bstate["key"]
        if s.filters.active and not bstate["set"] and not s.filters.keep(bkey, []):
            bstate["set"] = True
            bstate["dropped"] = True
            return
        if bstate.get("dropped"):
            return
        body: Dict[str, Any] = {}
        if self.inp and (changed == "input" or not bstate["set"]):
            body["input"] = list(bstate["out"] or [])
        if self.outp and (changed == "output" or not bstate["set"]):
            body["output"] = list(bstate["in"] or [])
        s.ensure_open()
        if not bstate["set"]:
            bstate["set"] = True
            if self.construct:
                st = tls.stack
                s.writer.send(Construct(bkey, st[-1] if st else None))
            s.writer.send(Record(bkey, body, pending))
        else:
            s.writer.send(Merge(bkey, body, pending, False))

    # ---------------------------------------------------------------- cells
    def _cell_pre(self, cell, args, kwargs):
        if tls.busy or os.getpid() != self.pid:
            return None
        frames = tls.frames
        try:
            prefix = self.cell_names.get(cell)
            s = self.session
            if prefix is None or not (s.running and self.module_level):
                frames.append(None)
                return None
            idx = s.next_module_index(prefix)
            fkey = f"{prefix}forward.{idx}"
            stack = tls.stack
            parent = stack[-1] if stack else None
            keep = s.filters.keep(fkey, stack) if s.filters.active else True
            stack.append(fkey)
            s.ensure_open()
            if self.construct:
                s.writer.send(Construct(fkey, parent))
            body: Dict[str, Any] = {}
            tls.busy = True
            try:
                if keep and self.fwd:
                    if self.inp:
                        files = self.encoder.wants_files(fkey)
                        pending = encode.Pending()
                        body["input_args"] = self.encoder.encode(list(args), pending,
                                                                 f"{fkey}.input" if files else None)
                        body["input_kwargs"] = self.encoder.encode(dict(kwargs or {}), pending,
                                                                   f"{fkey}.kwargs" if files else None)
                        s.writer.send(Merge(fkey, dict(body), pending, False))
                    if self.extra:
                        s.writer.send(Stack(fkey, capture_stack(2)))
            finally:
                tls.busy = False
            frames.append((fkey, prefix, idx, keep, body))
        except Exception as exc:
            frames.append(None)
            self.writer.log_error(f"cell pre-hook failed: {type(exc).__name__}: {exc}")
        return None

    def _cell_post(self, cell, args, kwargs, output):
        if tls.busy or os.getpid() != self.pid:
            return None
        frames = tls.frames
        if not frames:
            return None
        frame = frames.pop()
        if frame is None:
            return None
        fkey, prefix, idx, keep, body = frame
        try:
            stack = tls.stack
            if stack and stack[-1] == fkey:
                stack.pop()
            elif fkey in stack:
                stack.remove(fkey)
            s = self.session
            tls.busy = True
            try:
                if keep and self.fwd and (self.outp or self.params_on):
                    files = self.encoder.wants_files(fkey)
                    pending = encode.Pending()
                    if self.outp:
                        value = list(output) if isinstance(output, (list, tuple)) and not hasattr(output, "_fields") \
                            else [output]
                        body["output"] = self.encoder.encode(value, pending, f"{fkey}.output" if files else None)
                    if self.params_on:
                        body["parameters"] = {
                            n: self.encoder.tensor(p, pending, f"{fkey}.parameters.{n}.npy" if files else None)
                            for n, p in self._own_params(cell).items()}
                    s.writer.send(Merge(fkey, body, pending, self.outp))
                if self.bwd and requires_grad():
                    self._param_grad_hooks(cell, prefix)
                    self.bw_keys.setdefault(cell, []).append(f"{prefix}backward.{idx}")
                s.filters.finished(fkey)
            finally:
                tls.busy = False
        except Exception as exc:
            self.writer.log_error(f"{fkey}: cell hook failed: {type(exc).__name__}: {exc}")
        return None

    @staticmethod
    def _own_params(cell) -> Dict[str, Any]:
        return {k.split(".")[-1]: v for k, v in cell.parameters_dict(recurse=False).items()}

    def _cell_bw_pre(self, cell, grad_output):
        if os.getpid() != self.pid:
            return None
        try:
            keys = self.bw_keys.get(cell)
            if not keys:
                return None
            bkey = keys[-1]
            stack = tls.stack
            if self.construct and self.session.running:
                self.session.writer.send(Construct(bkey, stack[-1] if stack else None))
            stack.append(bkey)
        except Exception as exc:
            self.writer.log_error(f"cell backward pre-hook failed: {type(exc).__name__}: {exc}")
        return None

    def _cell_bw(self, cell, grad_input, grad_output):
        if os.getpid() != self.pid:
            return None
        try:
            keys = self.bw_keys.get(cell)
            if not keys:
                return None
            bkey = keys.pop()
            stack = tls.stack
            if bkey in stack:
                stack.remove(bkey)
            s = self.session
            if not s.running or tls.busy:
                return None
            if s.filters.active and not s.filters.keep(bkey, []):
                return None
            tls.busy = True
            try:
                enc = self.encoder
                files = enc.wants_files(bkey)
                pending = encode.Pending()
                body: Dict[str, Any] = {}
                if self.inp:
                    body["input"] = enc.encode(list(grad_output or ()), pending, f"{bkey}.input" if files else None)
                if self.outp:
                    body["output"] = enc.encode(list(grad_input or ()), pending, f"{bkey}.output" if files else None)
                s.ensure_open()
                s.writer.send(Record(bkey, body, pending))
            finally:
                tls.busy = False
        except Exception as exc:
            self.writer.log_error(f"cell backward hook failed: {type(exc).__name__}: {exc}")
        return None

    def _param_grad_hooks(self, cell, prefix: str) -> None:
        mkey = prefix[:-1]
        for name, p in self._own_params(cell).items():
            if not getattr(p, "requires_grad", True):
                continue
            slot = (mkey, name)
            prev = self._param_handles.get(slot)
            if prev is not None and prev[0]() is p:
                continue
            if prev is not None:
                try:
                    prev[1].remove()
                except Exception:
                    pass
            handle = p.register_hook(self._param_grad_hook(mkey, name))
            self._param_handles[slot] = (weakref.ref(p), handle)

    def _param_grad_hook(self, mkey: str, pname: str):
        def hook(grad):
            s = self.session
            if not s.running or tls.busy or os.getpid() != self.pid:
                return None
            tls.busy = True
            try:
                k = s.pgrad_index(mkey, pname)
                key = f"{mkey}.parameters_grad.{k}"
                if s.filters.active and not s.filters.keep(key, []):
                    return None
                pending = encode.Pending()
                files = self.encoder.wants_files(key)
                entry = self.encoder.tensor(grad, pending, f"{key}.{pname}.npy" if files else None) \
                    if isinstance(grad, ms.Tensor) else None
                s.ensure_open()
                s.writer.send(Merge(key, {pname: [entry]}, pending, False))
            except Exception as exc:
                self.writer.log_error(f"{mkey}.parameters_grad: capture failed: {type(exc).__name__}: {exc}")
            finally:
                tls.busy = False
            return None

        return hook

    # ---------------------------------------------------------------- debug level
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        s = self.session
        if self.cfg.level != "debug" or s.ended or not s.step_selected() or os.getpid() != self.pid:
            return
        if not isinstance(name, str) or not isinstance(save_backward, bool):
            self.writer.log_error("save(): name must be a str and save_backward a bool")
            return
        if not values.saveable(variable, ms.Tensor):
            self.writer.log_error(f"save(): unsupported type {type(variable).__name__} for '{name}', skipped")
            return
        tls.busy = True
        try:
            s.ensure_open("debug")
            count = s.debug_index(name)
            key = f"{name}.{count}.debug"
            files = self.cfg.task == "tensor"
            pending = encode.Pending()
            s.writer.send(Record(key, self.encoder.encode(variable, pending, key if files else None), pending))
            if save_backward:
                self._save_grad(variable, f"{name}_grad.{count}.debug", files)
        except Exception as exc:
            self.writer.log_error(f"save('{name}') failed: {type(exc).__name__}: {exc}")
        finally:
            tls.busy = False

    def _save_grad(self, variable: Any, gkey: str, files: bool) -> None:
        holder = {"v": values.null_shape(variable)}
        s = self.session
        s.writer.send(Record(gkey, values.null_shape(variable), None))
        if not requires_grad():
            return

        def attach(t, path):
            def hook(grad):
                if os.getpid() != self.pid:
                    return None
                tls.busy = True
                try:
                    pending = encode.Pending()
                    fname = ".".join([gkey, *map(str, path)]) + ".npy" if files else None
                    entry = self.encoder.tensor(grad, pending, fname)
                    holder["v"] = values.put_at(holder["v"], path, entry)
                    s.writer.send(Record(gkey, values.copy_shape(holder["v"], "mindspore.Tensor"), pending))
                except Exception as exc:
                    self.writer.log_error(f"save(): gradient capture for {gkey} failed: {exc}")
                finally:
                    tls.busy = False
                return None

            t.register_hook(hook)

        for t, path in values.tensor_paths(variable, ms.Tensor, []):
            if t.dtype in _DIFF_DTYPES:
                attach(t, path)









