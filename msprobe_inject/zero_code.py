"""Zero-code activation inside a rank: called by the bootstrap once the framework is imported.

The environment (MSPROBE_*) is the whole configuration. Dumping starts at the first top-level module
call; a step ends at each optimizer.step() (or top-level forward with MSPROBE_STEP_ON=forward).
A script that creates its own PrecisionDebugger takes over start/stop/step.
"""

from __future__ import annotations

import os
import sys
import warnings

_state = {"inert": False, "pytorch": None, "mindspore": None}


def mark_inert() -> None:
    """This process (a fork child, a helper) must not dump."""
    _state["inert"] = True


def is_inert() -> bool:
    return _state["inert"]


def activate_pytorch():
    """Install the PyTorch runtime in zero-code mode. Never raises."""
    if _state["inert"] or _state["pytorch"] is not None:
        return _state["pytorch"]
    try:
        from . import compat, config
        from .pytorch.debugger import PrecisionDebugger

        cfg = config.resolve()
        rt = PrecisionDebugger.install_runtime(cfg, zero_code=True)
        _state["pytorch"] = rt
        compat.install_msprobe_alias()
        os.register_at_fork(after_in_child=mark_inert)
        return rt
    except Exception as exc:  # the user's job must run even when the tool cannot
        warnings.warn(f"[msprobe-launch] dumping disabled in pid {os.getpid()}: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)
        _state["pytorch"] = False
        return None


def activate_mindspore():
    """Install the MindSpore runtime in zero-code mode. Never raises."""
    if _state["inert"] or _state["mindspore"] is not None:
        return _state["mindspore"]
    try:
        from . import config
        from .mindspore import stepping as ms_zero_code

        _state["mindspore"] = ms_zero_code.activate(config.resolve())
        return _state["mindspore"]
    except ImportError:
        _state["mindspore"] = False
        print("[msprobe-launch] MindSpore dumping is not available in this version", file=sys.stderr)
        return None
    except Exception as exc:
        warnings.warn(f"[msprobe-launch] MindSpore dumping disabled: {type(exc).__name__}: {exc}", RuntimeWarning,
                      stacklevel=2)
        _state["mindspore"] = False
        return None
