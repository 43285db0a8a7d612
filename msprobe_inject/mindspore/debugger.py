"""The explicit API, mirroring ``msprobe.mindspore``: replace the import and nothing else changes."""

from __future__ import annotations

import os
import random
import threading
import warnings
from typing import Any, Optional

import numpy as np

from .. import config as _config
from . import hooks

_lock = threading.Lock()
_runtime: Optional[hooks.Runtime] = None


def get_runtime() -> Optional[hooks.Runtime]:
    return _runtime


def install_runtime(cfg: _config.DumpConfig, zero_code: bool) -> hooks.Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = hooks.Runtime(cfg, zero_code=zero_code)
        return _runtime


class PrecisionDebugger:
    """Singleton, like msprobe's: later constructions return the first instance and ignore their arguments."""

    _instance: Optional[PrecisionDebugger] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> PrecisionDebugger:
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._initialized = False
            cls._instance = inst
        return cls._instance

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None, step: Optional[list] = None):
        if self._initialized:
            return
        rt = get_runtime()
        if rt is not None and rt.zero_code:
            # launched zero-code: the script's own debugger takes control of start/stop/step
            rt.manual = True
            self.runtime = rt
            self.config = rt.cfg
            self._initialized = True
            return
        overrides = {"task": task, "dump_path": dump_path, "level": level, "step": step}
        cfg = _config.resolve(config_path, overrides)
        self.config = cfg
        self.runtime = install_runtime(cfg, zero_code=False)
        self._initialized = True

    @classmethod
    def _rt(cls) -> Optional[hooks.Runtime]:
        inst = cls._instance
        return getattr(inst, "runtime", None) if inst is not None else None

    @classmethod
    def start(cls, model=None, token_range=None, rank_id: Optional[int] = None) -> None:
        rt = cls._rt()
        if rt is None:
            warnings.warn("PrecisionDebugger.start() called before PrecisionDebugger(...) was created", stacklevel=2)
            return
        if rt.cfg.level in ("L0", "mix") and model is None and not rt.hooked_models and not rt.zero_code:
            raise ValueError("PrecisionDebugger.start(): missing the parameter 'model' (required at level "
                             f"{rt.cfg.level})")
        if rank_id is not None and (not isinstance(rank_id, int) or isinstance(rank_id, bool) or rank_id < 0):
            raise ValueError(f"rank_id must be an int >= 0, got {rank_id!r}")
        try:
            rt.start(model=model, token_range=token_range, rank_id=rank_id)
        except TypeError:
            raise
        except Exception as exc:
            rt.writer.log_error(f"start() failed: {exc}")

    @classmethod
    def stop(cls) -> None:
        rt = cls._rt()
        if rt is not None:
            try:
                rt.stop()
            except Exception as exc:
                rt.writer.log_error(f"stop() failed: {exc}")

    @classmethod
    def step(cls) -> None:
        rt = cls._rt()
        if rt is not None:
            try:
                rt.step()
            except Exception as exc:
                rt.writer.log_error(f"step() failed: {exc}")

    @classmethod
    def set_init_step(cls, step: int) -> None:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"set_init_step: {step!r} must be an int greater than or equal to 0")
        rt = cls._rt()
        if rt is not None:
            rt.session.set_init_step(step)

    @classmethod
    def save(cls, variable: Any, name: str, save_backward: bool = True) -> None:
        rt = cls._rt()
        if rt is not None:
            rt.save(variable, name, save_backward)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """Seed Python, NumPy and MindSpore; ``mode`` asks MindSpore for deterministic kernels."""
    import mindspore as ms

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= 2**32 - 1:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32-1], got {seed!r}")
    for name, v in (("mode", mode), ("rm_dropout", rm_dropout)):
        if not isinstance(v, bool):
            raise ValueError(f"seed_all: {name} must be a bool, got {v!r}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    if mode:
        try:
            ms.set_deterministic(True)
        except Exception:
            ms.set_context(deterministic="ON")
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
    if rm_dropout:
        from mindspore import mint, ops

        for owner, fname in ((ops, "dropout"), (mint.nn.functional, "dropout")):
            orig = getattr(owner, fname, None)
            if orig is None:
                continue

            def _identity(x, *args, __orig=orig, **kwargs):
                return x

            setattr(owner, fname, _identity)
