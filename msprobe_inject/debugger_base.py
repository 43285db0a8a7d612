"""What both frameworks' PrecisionDebugger share: the singleton, the one runtime per process, and the
class-callable start/stop/step/save that never let a tool failure reach the script."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Optional

from . import config as _config


class DebuggerBase:
    """Singleton, like msprobe's: later constructions return the first instance and ignore their arguments.

    A subclass names its framework's runtime class in ``runtime_class``; it gets its own instance slot
    and its own runtime.
    """

    runtime_class: Any = None
    _instance: Optional[DebuggerBase] = None
    _runtime: Any = None
    _lock = threading.Lock()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._instance = None
        cls._runtime = None
        cls._lock = threading.Lock()

    @classmethod
    def get_runtime(cls) -> Any:
        return cls._runtime

    @classmethod
    def install_runtime(cls, cfg: _config.DumpConfig, zero_code: bool) -> Any:
        with cls._lock:
            if cls._runtime is None:
                cls._runtime = cls.runtime_class(cfg, zero_code=zero_code)
            return cls._runtime

    def __new__(cls, *args: Any, **kwargs: Any) -> DebuggerBase:
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._initialized = False
            cls._instance = inst
        return cls._instance

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None, step: Optional[list] = None):
        if self._initialized:
            return
        rt = self.get_runtime()
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
        self.runtime = self.install_runtime(cfg, zero_code=False)
        self._initialized = True

    @classmethod
    def _rt(cls) -> Any:
        inst = cls._instance
        return getattr(inst, "runtime", None) if inst is not None else None

    @classmethod
    def _check_start(cls, model: Any, token_range: Any) -> None:
        """Framework-specific argument checks of start(); raise ValueError on a bad argument."""

    @classmethod
    def start(cls, model: Any = None, token_range: Any = None, rank_id: Optional[int] = None) -> None:
        rt = cls._rt()
        if rt is None:
            warnings.warn("PrecisionDebugger.start() called before PrecisionDebugger(...) was created", stacklevel=2)
            return
        if rt.cfg.level in ("L0", "mix") and model is None and not rt.hooked_models and not rt.zero_code:
            raise ValueError("PrecisionDebugger.start(): missing the parameter 'model' (required at level "
                             f"{rt.cfg.level})")
        cls._check_start(model, token_range)
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
    def trigger(cls, reason: str = "debugger.trigger()") -> None:
        """Flight recorder (``--flight-recorder K``): every rank writes the last K steps, this one and the
        next M. Without the flight recorder, nothing happens."""
        rt = cls._rt()
        if rt is not None:
            try:
                rt.trigger(reason)
            except Exception as exc:
                rt.writer.log_error(f"trigger() failed: {exc}")

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
