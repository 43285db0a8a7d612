"""The explicit API, mirroring ``msprobe.pytorch``: replace the import and nothing else changes."""

from __future__ import annotations

import os
import random
from typing import Any, Optional

import numpy as np
import torch

from ..debugger_base import DebuggerBase
from ..dumpformat import names
from .adapter import new_recorder


class PrecisionDebugger(DebuggerBase):
    """msprobe.pytorch.PrecisionDebugger; the shared behaviour lives in DebuggerBase."""

    runtime_class = staticmethod(new_recorder)

    @classmethod
    def _check_start(cls, model: Any, token_range: Any) -> None:
        if token_range is not None:
            if model is None:
                raise ValueError("PrecisionDebugger.start(): token_range requires the parameter 'model'")
            if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in token_range)
                    or token_range[0] > token_range[1]):
                raise ValueError(f"token_range must be [start, end] with 0 <= start <= end, got {token_range!r}")

    @classmethod
    def register_custom_api(cls, module: Any, api: str, api_prefix: Optional[str] = None) -> None:
        rt = cls._rt()
        if rt is None:
            return
        orig = getattr(module, api)
        prefix = api_prefix or getattr(module, "__name__", type(module).__name__)
        _custom_originals[(id(module), api)] = orig

        def wrapper(*args, **kwargs):
            return rt.fw.apis.call_custom(orig, prefix, api, args, kwargs)

        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(orig, "__name__", api)
        setattr(module, api, wrapper)

    @classmethod
    def restore_custom_api(cls, module: Any, api: str) -> None:
        orig = _custom_originals.pop((id(module), api), None)
        if orig is not None:
            setattr(module, api, orig)


_custom_originals: dict = {}
_module_dump: dict = {}  # the module of module_dump(), until module_dump_end()


def module_dump(module: torch.nn.Module, dump_name: str) -> None:
    """Dump one module (not its children, no APIs inside it) under Module.{dump_name}.{Class}."""
    rt = PrecisionDebugger._rt()
    if rt is None:
        return
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module_dump: module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(dump_name, str):
        raise TypeError("module_dump: dump_name must be a str")
    hooks = rt.fw.modules
    if module in hooks.names:
        return  # already hooked by start(model)
    prefix = names.module_prefix("Module", dump_name, type(module).__name__)
    hooks.names[module] = prefix
    hooks.md_prefix = prefix
    _module_dump["module"] = module
    rt.api_suspended = True
    rt.set_api(False)
    if rt.cfg.level not in ("L0", "mix"):
        rt.module_level = True
        rt.fw.want_module_calls()  # an API level's hooks may be out since its first forward


def module_dump_end() -> None:
    rt = PrecisionDebugger._rt()
    if rt is None:
        return
    mod = _module_dump.pop("module", None)
    if mod is not None:
        rt.fw.modules.names.pop(mod, None)
    rt.fw.modules.md_prefix = None
    rt.api_suspended = False
    rt.module_level = rt.cfg.level in ("L0", "mix")
    if rt.session.running:
        rt.set_api(rt.api_level)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False, is_enhanced: bool = False) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= 2**32 - 1:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32-1], got {seed!r}")
    for name, v in (("mode", mode), ("rm_dropout", rm_dropout), ("is_enhanced", is_enhanced)):
        if not isinstance(v, bool):
            raise ValueError(f"seed_all: {name} must be a bool, got {v!r}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(mode)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.enabled = True
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if rm_dropout:
        import torch.nn.functional as F

        for fname in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
            orig = getattr(F, fname, None)
            if orig is None:
                continue

            def _zero(*args, __orig=orig, **kwargs):
                if len(args) > 1:
                    args = (args[0], 0.0, *args[2:])
                else:
                    kwargs["p"] = 0.0
                return __orig(*args, **kwargs)

            setattr(F, fname, _zero)


def random_save(output_path: str = "./output") -> None:
    """Record every call to a random API (torch and Python) with its stack, to random_{rank}_{ts}.csv."""
    from .random_log import install

    install(output_path)


def save(variable: Any, name: str, save_backward: bool = True) -> None:
    PrecisionDebugger.save(variable, name, save_backward)



