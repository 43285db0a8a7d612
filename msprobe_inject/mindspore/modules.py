"""Cell hooks: MindSpore's per-Cell forward and backward hooks on every named Cell of the registered
models, and ``Parameter.register_hook`` for parameter gradients."""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional

from mindspore import nn

from ..dumpformat import names
from ..recorder import ModuleFrame, Recorder
from .state import is_optimizer, requires_grad, tls


class CellHooks:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Cell -> "Cell.{path}.{Class}."
        self.bw_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Cell -> open backward keys (LIFO)
        self._handles: list = []
        self._param_handles: Dict[tuple, Any] = {}

    def name_model(self, model: Any, index: Optional[int], skip_optimizers: bool) -> None:
        skipped: List[str] = []
        for path, cell in model.cells_and_names():
            if cell is model:
                continue
            if skip_optimizers and (is_optimizer(cell) or any(path.startswith(p + ".") for p in skipped)):
                skipped.append(path)  # zero-code: the optimizer is the step boundary, not a layer
                continue
            if self.rec.module_level and cell not in self.names:
                self.names[cell] = names.module_prefix("Cell", path, type(cell).__name__, index)
                self._hook(cell)

    def _hook(self, cell: nn.Cell) -> None:
        hs = self._handles
        hs.append(cell.register_forward_pre_hook(self._pre, with_kwargs=True))
        hs.append(cell.register_forward_hook(self._post, with_kwargs=True, always_call=True))
        if self.rec.module_bwd:
            hs.append(cell.register_backward_pre_hook(self._bw_pre))
            hs.append(cell.register_backward_hook(self._bw))

    def on_step(self) -> None:
        for keys in list(self.bw_keys.values()):
            keys.clear()

    def restore(self) -> None:
        for h in [*self._handles, *self._param_handles.values()]:
            try:
                (h[1] if isinstance(h, tuple) else h).remove()
            except Exception:
                pass
        self._handles.clear()
        self._param_handles.clear()

    # ---- forward ----
    def _pre(self, cell, args, kwargs):
        rec = self.rec
        if tls.busy or rec.forked:
            return None
        prefix = self.names.get(cell)
        if prefix is None or not (rec.session.running and rec.module_level):
            tls.frames.append(None)
            return None
        tls.frames.append(rec.module_enter(prefix, args, kwargs or {}))
        return None

    def _post(self, cell, args, kwargs, output):
        rec = self.rec
        if tls.busy or rec.forked or not tls.frames:
            return None
        frame: Optional[ModuleFrame] = tls.frames.pop()
        if frame is None:
            return None
        rec.module_exit(frame, None, output, lambda: _own_params(cell))
        if rec.pgrads and requires_grad():
            try:
                self._param_grad_hooks(cell, frame.prefix)
                self.bw_keys.setdefault(cell, []).append(frame.bkey)
            except Exception as exc:
                rec.log(f"cell hook failed: {type(exc).__name__}: {exc}", frame.fkey)
        return None

    # ---- backward ----
    def _bw_pre(self, cell, grad_output):
        keys = self.bw_keys.get(cell)
        if keys:
            self.rec.module_backward_pre(keys[-1])
        return None

    def _bw(self, cell, grad_input, grad_output):
        keys = self.bw_keys.get(cell)
        if keys:
            self.rec.module_backward(keys.pop(), grad_input, grad_output)
        return None

    # ---- parameter gradients ----
    def _param_grad_hooks(self, cell, prefix: str) -> None:
        for name, p in _own_params(cell).items():
            if not getattr(p, "requires_grad", True):
                continue
            slot = (prefix, name)
            prev = self._param_handles.get(slot)
            if prev is not None and prev[0]() is p:
                continue
            if prev is not None:
                try:
                    prev[1].remove()
                except Exception:
                    pass
            handle = p.register_hook(self._param_grad_hook(prefix, name))
            self._param_handles[slot] = (weakref.ref(p), handle)

    def _param_grad_hook(self, prefix: str, pname: str):
        rec = self.rec

        def hook(grad):
            rec.param_grad(prefix, pname, lambda: grad)
            return None

        return hook


def _own_params(cell) -> Dict[str, Any]:
    return {k.split(".")[-1]: v for k, v in cell.parameters_dict(recurse=False).items()}
