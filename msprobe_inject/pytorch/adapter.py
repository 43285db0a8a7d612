"""The PyTorch side of the recording protocol (``framework.Framework``): how torch is hooked, encoded and
reduced. Nothing in torch is replaced: APIs through a TorchFunctionMode, modules through torch's global
module hooks, optimizers through its global optimizer hooks, gradients through autograd hooks."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch

from .. import values
from ..recorder import Recorder
from . import apis, encode, state
from .apis import ApiHooks
from .modules import ModuleHooks
from .state import Quiet, tls
from .stepping import OptimizerHooks

_dist = torch.distributed
try:
    _dist_ok = _dist.is_available()
except Exception:  # pragma: no cover
    _dist_ok = False


class TorchFramework:
    name = "pytorch"
    tensor_type = torch.Tensor
    tensor_type_name = "torch.Tensor"
    file_suffix = ".pt"
    tls = tls
    # the C++ node hooks (built per torch, at a launch or by ``python -m msprobe_inject.nodehook``), a recorded API
    # call's C common case and a value's entries in C (built with the package)
    native = {"node_hooks": state.hook_after is not None, "api_call": apis._apicall is not None,
              "entries": encode._fast_entries is not None}

    def __init__(self) -> None:
        self.apis: Optional[ApiHooks] = None
        self.modules: Optional[ModuleHooks] = None
        self.stepping: Optional[OptimizerHooks] = None
        self._encoder: Optional[encode.Encoder] = None

    # ---- values ----
    @staticmethod
    def rank() -> Optional[int]:
        # asked before every record until the rank is known: kept to one attribute check
        try:
            if _dist_ok and _dist.is_initialized():
                return _dist.get_rank()
        except Exception:
            pass
        return None

    resolve = staticmethod(encode.resolve)
    resolve_host = staticmethod(encode.resolve_host)
    save_tensor = staticmethod(encode.save_pt)

    def make_encoder(self, cfg: Any, tensor_dir: Callable[[], str], writer: Any) -> encode.Encoder:
        self._encoder = encode.Encoder(cfg, tensor_dir, writer)
        return self._encoder

    quiet = Quiet  # the sections object itself (not a function, so not bound to the adapter): fw.quiet.enter() etc.

    # ---- hooks ----
    def install(self, rec: Recorder) -> None:
        self.apis = ApiHooks(rec)
        self.modules = ModuleHooks(rec, self.apis)
        self.stepping = OptimizerHooks(rec, self.apis)
        self.modules.install()
        self.stepping.install()
        # torch warns when a module's inputs need no grad; that is our hook's business, not the user's
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with")

    def set_api(self, on: bool) -> None:
        self.apis.set_api(on)

    def restore(self) -> None:
        self.modules.restore()
        self.stepping.restore()

    def on_step(self) -> None:
        self._encoder.cache.clear()

    def want_module_calls(self) -> None:
        self.modules.put_back()

    # ---- models ----
    @staticmethod
    def models(model: Any) -> Iterable[Tuple[Optional[int], Any]]:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        indexed = isinstance(model, (list, tuple))
        for m in models:
            if not isinstance(m, torch.nn.Module):
                raise TypeError(f"model must be a torch.nn.Module or a list/tuple of them, got {type(m).__name__}")
        return [(i if indexed else None, m) for i, m in enumerate(models)]

    def register_model(self, model: Any, index: Optional[int], skip_optimizers: bool) -> None:
        self.modules.name_model(model, index)

    @staticmethod
    def cannot_record() -> Optional[str]:
        return None

    @staticmethod
    def token_range(token_range: Any) -> Optional[list]:
        return list(token_range) if token_range else None

    # ---- gradients ----
    @staticmethod
    def grad_enabled() -> bool:
        return torch.is_grad_enabled()

    @staticmethod
    def grad_leaves(value: Any) -> List[Tuple[Any, List[Any]]]:
        return [(t, p) for t, p in values.tensor_paths(value, torch.Tensor, []) if t.requires_grad]

    @staticmethod
    def on_grad(t: Any, hook: Callable[[Any], None]) -> None:
        t.register_hook(hook)


def new_recorder(cfg: Any, zero_code: bool = False) -> Recorder:
    return Recorder(cfg, TorchFramework(), zero_code)
