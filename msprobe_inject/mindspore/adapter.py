"""The MindSpore side of the recording protocol (``framework.Framework``), for PyNative mode: L1 APIs
through wrappers (MindSpore has no dispatch hook), Cells through per-Cell hooks, Primitives held by the
model's Cells through a per-instance subclass, gradients through ``ops.HookBackward`` and tensor hooks.
``restore()`` removes every one of them."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import mindspore as ms
from mindspore import nn

from .. import values
from ..recorder import Recorder
from . import encode
from .apis import ApiHooks
from .modules import CellHooks
from .state import DIFF_DTYPES, Quiet, graph_mode, rank, requires_grad, tls


class MindSporeFramework:
    name = "mindspore"
    tensor_type = ms.Tensor
    tensor_type_name = "mindspore.Tensor"
    file_suffix = ".npy"
    tls = tls
    native: Dict[str, bool] = {}  # no compiled part of its own
    rank = staticmethod(rank)
    resolve = staticmethod(encode.resolve)
    resolve_host = staticmethod(encode.resolve_host)
    save_tensor = staticmethod(encode.save_npy)

    def __init__(self) -> None:
        self.apis: Optional[ApiHooks] = None
        self.cells: Optional[CellHooks] = None

    @staticmethod
    def make_encoder(cfg: Any, tensor_dir: Callable[[], str], writer: Any) -> encode.Encoder:
        return encode.Encoder(cfg, tensor_dir, writer)

    quiet = Quiet  # the sections object itself (not a function, so not bound to the adapter): fw.quiet.enter() etc.

    # ---- hooks ----
    def install(self, rec: Recorder) -> None:
        self.apis = ApiHooks(rec)
        self.cells = CellHooks(rec)
        self._rec = rec

    def set_api(self, on: bool) -> None:
        self.apis.set_api(on)

    def restore(self) -> None:
        self.apis.restore()
        self.cells.restore()

    def on_step(self) -> None:
        self.cells.on_step()

    def want_module_calls(self) -> None:
        """The cells' hooks are never taken out: nothing to put back."""

    # ---- models ----
    @staticmethod
    def models(model: Any) -> Iterable[Tuple[Optional[int], Any]]:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        indexed = isinstance(model, (list, tuple))
        for m in models:
            if not isinstance(m, nn.Cell):
                raise TypeError(f"model must be a mindspore.nn.Cell or a list/tuple of them, got {type(m).__name__}")
        return [(i if indexed else None, m) for i, m in enumerate(models)]

    def register_model(self, model: Any, index: Optional[int], skip_optimizers: bool) -> None:
        self.cells.name_model(model, index, skip_optimizers)
        if self._rec.api_level:
            self.apis.hook_primitives(model)

    @staticmethod
    def cannot_record() -> Optional[str]:
        if graph_mode():
            return "MindSpore is in GRAPH_MODE: only PyNative mode is dumped; nothing recorded"
        return None

    @staticmethod
    def token_range(token_range: Any) -> Optional[list]:
        return None  # not supported: the recorder logs it once and records every call

    # ---- gradients ----
    @staticmethod
    def grad_enabled() -> bool:
        return requires_grad()

    @staticmethod
    def grad_leaves(value: Any) -> List[Tuple[Any, List[Any]]]:
        return [(t, p) for t, p in values.tensor_paths(value, ms.Tensor, []) if t.dtype in DIFF_DTYPES]

    @staticmethod
    def on_grad(t: Any, hook: Callable[[Any], None]) -> None:
        t.register_hook(hook)


def new_recorder(cfg: Any, zero_code: bool = False) -> Recorder:
    return Recorder(cfg, MindSporeFramework(), zero_code)
