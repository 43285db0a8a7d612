"""Which MindSpore callables are dumped at L1, under which msprobe name, and how they are wrapped.

MindSpore has no dispatch hook comparable to torch's TorchFunctionMode, so L1 needs wrappers: the
names msprobe 26.2.0 lists (``support_wrap_ops.yaml``) are replaced on ``mindspore.ops``,
``mindspore.Tensor``, ``mindspore.mint``, ``mindspore.mint.nn.functional``,
``mindspore.communication.comm_func`` and ``mindspore.mint.distributed`` while dumping is on, and
the original objects are put back by ``ApiWrappers.restore()``. A wrapper is a plain function that
calls straight through unless the runtime is recording.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Tuple

import mindspore as ms
from mindspore import ops

from ..dumpformat import names
from ..recorder import Recorder
from ..writer import Construct, Merge, Record
from .state import DIFF_DTYPES, Quiet, diff_tensor, requires_grad, tls

_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "mindspore_apis.json")

# (record prefix, key in the API list, module path); prefixes are msprobe's Const.API_DATA_PREFIX for MindSpore.
GROUPS: Tuple[Tuple[str, str, str], ...] = (
    ("Functional", "ops", "mindspore.ops"),
    ("Tensor", "tensor", "mindspore.Tensor"),
    ("Mint", "mint.ops", "mindspore.mint"),
    ("MintFunctional", "mint.nn.functional", "mindspore.mint.nn.functional"),
    ("Distributed", "communication.comm_func", "mindspore.communication.comm_func"),
    ("MintDistributed", "mint.distributed", "mindspore.mint.distributed"),
)
DIST_PREFIXES = ("Distributed", "MintDistributed")
# msprobe writes "all args and kwargs after the call" as the output of these (op_is_distributed).
ARGS_AS_OUTPUT = ("MintDistributed",)




def load_lists() -> Dict[str, Any]:
    with open(_DATA, encoding="utf-8") as fh:
        return json.load(fh)


def _resolve_module(path: str):
    import importlib

    if path == "mindspore.Tensor":
        import mindspore

        return mindspore.Tensor
    return importlib.import_module(path)


def is_inplace(api: str) -> bool:
    """APIs whose first argument must stay the caller's object (no identity hook on inputs)."""
    if api.startswith("__i") and api.endswith("__") and api not in ("__index__", "__int__", "__invert__"):
        return True
    return (api.endswith("_") and not api.endswith("__")) or api in ("__setitem__", "assign", "assign_add",
                                                                     "assign_sub", "scatter_update")


class ApiWrappers:
    """Installs and restores the L1 wrappers of one runtime."""

    def __init__(self, call: Callable[..., Any], enabled: Callable[[], bool]):
        self._call = call  # runtime.call_api(orig, base, prefix, api, args, kwargs)
        self._enabled = enabled
        self._originals: List[Tuple[Any, str, Any, bool]] = []  # (owner, attr, original, own attribute)
        self._wrapped: List[Tuple[Any, str, Any]] = []
        self.installed = False
        self._built = False
        self._compile_patches: List[Tuple[Any, str, Any]] = []

    def _build(self) -> None:
        lists = load_lists()
        seen = set()
        for prefix, key, path in GROUPS:
            try:
                module = _resolve_module(path)
            except Exception:
                continue  # e.g. no communication package in this build
            for name in lists.get(key, []):
                owner, attr = module, name
                if "." in name:
                    sub, attr = name.rsplit(".", 1)
                    owner = getattr(module, sub, None)
                    if owner is None:
                        continue
                if (id(owner), attr) in seen:
                    continue
                orig = getattr(owner, attr, None) if attr in dir(owner) else None
                if orig is None or not callable(orig) or isinstance(orig, type):
                    continue
                seen.add((id(owner), attr))
                own = not isinstance(owner, type) or attr in owner.__dict__
                self._originals.append((owner, attr, orig, own))
                self._wrapped.append((owner, attr, self._make(orig, prefix, attr)))
        self._built = True

    def _make(self, orig: Any, prefix: str, api: str) -> Callable[..., Any]:
        call = self._call
        base = names.api_base(prefix, api)
        state = tls

        def wrapper(*args, **kwargs):
            if state.busy or state.in_api or not enabled():
                return orig(*args, **kwargs)
            return call(orig, base, prefix, api, args, kwargs)

        enabled = self._enabled
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(wrapper, attr, getattr(orig, attr))
            except (AttributeError, TypeError):
                pass
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        return wrapper

    def install(self) -> None:
        if self.installed:
            return
        if not self._built:
            self._build()
        for owner, attr, wrapped in self._wrapped:
            try:
                setattr(owner, attr, wrapped)
            except (AttributeError, TypeError):
                pass
        self.installed = True
        self._patch_graph_compilers()

    def _patch_graph_compilers(self) -> None:
        """@jit functions and graph-mode Cells are compiled from Python source: compile them with the originals.

        MindSpore's graph parser would otherwise parse a wrapper (and the hook code behind it) into the graph,
        which fails. Compiled graphs are not recorded, as with msprobe's PyNative API dump.
        """
        if self._compile_patches:
            return
        try:
            from mindspore.graph import api as graph_api
        except ImportError:  # pragma: no cover - older layouts
            from mindspore.common import api as graph_api
        for cls_name in ("_JitExecutor", "_CellGraphExecutor"):
            cls = getattr(graph_api, cls_name, None)
            orig = getattr(cls, "compile", None) if cls is not None else None
            if orig is None:
                continue
            self._compile_patches.append((cls, "compile", orig))
            cls.compile = self._compile_with_originals(orig)

    def _compile_with_originals(self, orig_compile: Callable[..., Any]) -> Callable[..., Any]:
        wrappers = self

        def compile(executor, *args, **kwargs):
            if not wrappers.installed:
                return orig_compile(executor, *args, **kwargs)
            wrappers._set_all(original=True)
            try:
                return orig_compile(executor, *args, **kwargs)
            finally:
                wrappers._set_all(original=False)

        compile.__wrapped__ = orig_compile  # type: ignore[attr-defined]
        return compile

    def _set_all(self, original: bool) -> None:
        for (owner, attr, orig, own), (_, _, wrapped) in zip(self._originals, self._wrapped):
            try:
                if not original:
                    setattr(owner, attr, wrapped)
                elif own:
                    setattr(owner, attr, orig)
                else:
                    delattr(owner, attr)
            except (AttributeError, TypeError):
                pass

    def restore(self) -> None:
        """Put every original object back (the wrappers stay harmless if someone kept a reference)."""
        for cls, attr, orig in self._compile_patches:
            setattr(cls, attr, orig)
        self._compile_patches.clear()
        if not self.installed:
            return
        self._set_all(original=True)  # an inherited attribute (e.g. TensorPy's) is deleted, uncovering it again
        self.installed = False

    @property
    def count(self) -> int:
        if not self._built:
            self._build()
        return len(self._wrapped)



_HookBackward = ops.HookBackward


class ApiHooks:
    """API records of one recorder: the L1 wrappers, the Primitives of the registered models, and each
    call's record with its backward through ``ops.HookBackward`` identities."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.wrappers = ApiWrappers(self.call_api, lambda: rec.api_on)
        self._primitives: List[tuple] = []  # (primitive, original class)
        self._prim_classes: Dict[tuple, type] = {}

    def set_api(self, on: bool) -> None:
        if on:
            self.wrappers.install()

    def restore(self) -> None:
        self.wrappers.restore()
        for prim, cls in self._primitives:
            try:
                prim.__class__ = cls
            except Exception:
                pass
        self._primitives.clear()

    def hook_primitives(self, model) -> None:
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
                self.rec.log(f"primitive {name} cannot be hooked: {exc}")

    def _primitive_call(self, orig_call, name: str):
        base = names.api_base("Primitive", name)
        rt = self.rec
        hooks = self

        def __call__(prim, *args, **kwargs):
            if tls.busy or tls.in_api or rt.forked:
                return orig_call(prim, *args, **kwargs)
            s = rt.session
            if not (s.running and rt.api_level):
                if not s.ended:
                    s.finish_api(base)  # msprobe counts primitive calls whether or not it is dumping
                return orig_call(prim, *args, **kwargs)

            def call(*a, **k):
                return orig_call(prim, *a, **k)

            return hooks.call_api(call, base, "Primitive", name, args, kwargs)

        return __call__

    def call_api(self, func, base: str, prefix: str, api: str, args: tuple, kwargs: dict):
        rec = self.rec
        s = rec.session
        if not s.running or rec.forked:
            return func(*args, **kwargs)
        idx = s.api_counts.get(base, 0)
        fkey = names.api_key(base, idx, names.FORWARD)
        bkey = names.api_key(base, idx, names.BACKWARD)
        stack = tls.stack
        keep = s.filters.keep(fkey, stack) if s.filters.active else True
        grad = self.rec.bwd and prefix not in DIST_PREFIXES and requires_grad()
        if not keep:
            out = rec.call_through(func, args, kwargs, base)
            if self.rec.construct and self.rec.level == "mix":
                s.ensure_open()
                s.writer.send(Construct(fkey, stack[-1] if stack else None))  # msprobe places filtered APIs too
            return out
        body: Dict[str, Any] = {}
        pending = []
        call_args = args
        bstate = None
        try:
            with Quiet():
                if self.rec.fwd and self.rec.inp:
                    files = self.rec.encoder.wants_files(fkey)
                    enc = self.rec.encoder
                    body["input_args"] = enc.encode(list(args), pending, f"{fkey}.input" if files else None)
                    body["input_kwargs"] = enc.encode(dict(kwargs), pending, f"{fkey}.kwargs" if files else None)
                if self.rec.fwd and self.rec.extra:
                    s.writer.stack(fkey, 2)
                if grad:
                    bstate = {"key": bkey, "set": False, "in": None, "out": None}
                    if not is_inplace(api):
                        call_args = self._hook_inputs(args, bstate, per_input=prefix == "Primitive")
        except Exception as exc:
            self.rec.log(f"input capture failed: {type(exc).__name__}: {exc}", fkey)
        tls.in_api = True
        try:
            out = func(*call_args, **kwargs)
        except BaseException:
            tls.in_api = False
            s.finish_api(base)
            if self.rec.fwd:
                s.ensure_open()
                s.writer.send(Record(fkey, body, pending or None))  # msprobe keeps the inputs of a call that raised
            raise
        tls.in_api = False
        s.finish_api(base)
        try:
            with Quiet():
                if prefix in DIST_PREFIXES:
                    out = self._dist_sync(func, api, args, kwargs, out)
                if self.rec.fwd and self.rec.outp:
                    files = self.rec.encoder.wants_files(fkey)
                    if prefix in ARGS_AS_OUTPUT:
                        value = list(args) + list(kwargs.values())
                    else:
                        value = list(out) if isinstance(out, (list, tuple)) and not hasattr(out, "_fields") else [out]
                    body["output"] = self.rec.encoder.encode(value, pending, f"{fkey}.output" if files else None)
                if self.rec.fwd:
                    s.ensure_open()
                    s.writer.send(Record(fkey, body, pending or None))
                if self.rec.construct:
                    s.ensure_open()
                    s.writer.send(Construct(fkey, stack[-1] if stack else None))
                s.filters.finished(fkey)
                if bstate is not None and not is_inplace(api):
                    out = self._hook_outputs(out, bstate)
        except Exception as exc:
            self.rec.log(f"output capture failed: {type(exc).__name__}: {exc}", fkey)
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
        pos = [i for i, a in enumerate(args) if diff_tensor(a)]
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
            if out.dtype not in DIFF_DTYPES:
                return out
            bstate["out"] = [None]
            return _HookBackward(self._api_out_grad(bstate))(out)
        if not isinstance(out, (tuple, list)) or hasattr(out, "_fields"):
            return out
        pos = [i for i, t in enumerate(out) if diff_tensor(t)]
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
        """The gradients of the outputs arrived: the record's "input" (msprobe's backward naming)."""
        def on_grads(grads):
            bstate["out"], pending = self._grad_entries(bstate, grads, "input", 0)
            self._emit_api_backward(bstate, pending, "input")

        return self._grad_hook(bstate, on_grads)

    def _api_in_grad(self, bstate: dict, append: bool = False):
        """The gradients of the inputs arrived (one hook per input for Primitives: append): its "output"."""
        def on_grads(grads):
            first = len(bstate["in"]) if append else 0
            entries, pending = self._grad_entries(bstate, grads, "output", first)
            bstate["in"] = bstate["in"] + entries if append else entries
            self._emit_api_backward(bstate, pending, "output")

        return self._grad_hook(bstate, on_grads)

    def _grad_hook(self, bstate: dict, on_grads):
        """A HookBackward hook: this process only, the tool's own work passes through, never raises."""
        rec = self.rec

        def hook(grads):
            if rec.forked or rec.session.ended:
                return None
            try:
                with Quiet():
                    on_grads(grads)
            except Exception as exc:
                rec.log(f"backward capture failed: {type(exc).__name__}: {exc}", bstate['key'])
            return None

        return hook

    def _grad_entries(self, bstate: dict, grads, side: str, first: int):
        enc = self.rec.encoder
        pending: list = []
        files = enc.wants_files(bstate["key"])
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        entries = [enc.tensor(g, pending, f"{bstate['key']}.{side}.{first + j}.npy" if files else None)
                   if isinstance(g, ms.Tensor) else None for j, g in enumerate(grads)]
        return entries, pending

    def _emit_api_backward(self, bstate: dict, pending, changed: str) -> None:
        s = self.rec.session
        bkey = bstate["key"]
        if s.filters.active and not bstate["set"] and not s.filters.keep(bkey, []):
            bstate["set"] = True
            bstate["dropped"] = True
            return
        if bstate.get("dropped"):
            return
        body: Dict[str, Any] = {}
        if self.rec.inp and (changed == "input" or not bstate["set"]):
            body["input"] = list(bstate["out"] or [])
        if self.rec.outp and (changed == "output" or not bstate["set"]):
            body["output"] = list(bstate["in"] or [])
        s.ensure_open()
        if not bstate["set"]:
            bstate["set"] = True
            if self.rec.construct:
                st = tls.stack
                s.writer.send(Construct(bkey, st[-1] if st else None))
            s.writer.send(Record(bkey, body, pending or None))
        else:
            s.writer.send(Merge(bkey, body, pending or None, False))

