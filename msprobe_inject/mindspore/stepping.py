"""Step boundaries of zero-code MindSpore runs: ``activate(cfg)`` is called by
``msprobe_inject.zero_code.activate_mindspore()``.

MindSpore 2.10 has no global Cell hooks (only per-Cell ones), so a thin wrapper on ``nn.Cell.__call__``
sees top-level Cell calls; everything below the top level is hooked with MindSpore's per-Cell hooks.
* a top-level Cell that is not an optimizer is a model: its Cells (and Primitives, at L1/mix) are
  hooked the first time it is called, and dumping starts at the first such call;
* a step ends when a top-level optimizer Cell (``nn.Optimizer``, ``mindspore.experimental.optim`` and
  ``mint.optim``) returns, or a top-level train-step Cell that holds one (``nn.TrainOneStepCell``);
  with MSPROBE_STEP_ON=forward at the end of each top-level model call;
* a script that creates its own PrecisionDebugger takes over start/stop/step.
``deactivate()`` puts ``nn.Cell.__call__`` back and removes every hook.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

from ..config import DumpConfig
from ..recorder import Recorder

_state: dict = {"orig_call": None, "runtime": None}


def activate(cfg: DumpConfig):
    """Install the MindSpore runtime in zero-code mode and return it."""
    from mindspore import nn

    from . import debugger
    from .state import graph_mode, is_optimizer, tls

    rt: Recorder = debugger.PrecisionDebugger.install_runtime(cfg, zero_code=True)
    if _state["orig_call"] is not None:
        return rt
    try:
        from .. import compat

        compat.install_msprobe_alias()  # scripts written for msprobe.mindspore run unchanged without it
    except Exception:
        pass
    orig_call = nn.Cell.__call__
    kinds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def kind_of(cell) -> str:
        k = kinds.get(cell)
        if k is None:
            if is_optimizer(cell):
                k = "optimizer"
            elif any(is_optimizer(c) for _, c in cell.cells_and_names()):
                k = "train_step"
            else:
                k = "model"
            kinds[cell] = k
        return k

    def before(cell) -> Optional[str]:
        if rt.manual or os.getpid() != rt.pid or rt.session.ended or graph_mode():
            return None
        k = kind_of(cell)
        if k != "optimizer":
            rt.top_level_call(cell)
        return k

    def after(k: Optional[str]) -> None:
        if k in ("optimizer", "train_step"):
            rt.step_boundary("optimizer")
        elif k == "model":
            rt.step_boundary("forward")

    def __call__(self, *args: Any, **kwargs: Any):
        if tls.top or tls.busy:
            return orig_call(self, *args, **kwargs)
        k = None
        try:
            k = before(self)
        except Exception as exc:
            rt.writer.log_error(f"zero-code: top-level cell {type(self).__name__}: {type(exc).__name__}: {exc}")
        tls.top = True
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            tls.top = False
            try:
                after(k)
            except Exception as exc:
                rt.writer.log_error(f"zero-code: step boundary failed: {type(exc).__name__}: {exc}")

    __call__.__wrapped__ = orig_call  # type: ignore[attr-defined]
    _state["orig_call"] = orig_call
    _state["runtime"] = rt
    nn.Cell.__call__ = __call__
    return rt


def deactivate() -> None:
    """Restore ``nn.Cell.__call__`` and every hook and wrapper of the zero-code runtime."""
    from mindspore import nn

    if _state["orig_call"] is not None:
        nn.Cell.__call__ = _state["orig_call"]
        _state["orig_call"] = None
    rt = _state["runtime"]
    if rt is not None:
        rt.restore()
