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
import threading
from typing import Any, Callable, Dict, List, Tuple

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


class ThreadState(threading.local):
    """Per-thread flags shared by the wrappers and the hooks."""

    def __init__(self) -> None:
        self.busy = False  # the tool itself is running: everything passes straight through
        self.in_api = False  # inside a recorded API: nested APIs are neither recorded nor counted
        self.stack: List[str] = []  # enclosing cell records (construct.json parents, mix-level list)
        self.frames: List[Any] = []  # cell forward frames between pre- and post-hook
        self.top = False  # zero-code: inside a top-level Cell call


tls = ThreadState()


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
        base = f"{prefix}.{api}."
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

