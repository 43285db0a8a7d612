"""The explicit API, mirroring ``msprobe.mindspore``: replace the import and nothing else changes."""

from __future__ import annotations

import os
import random

import numpy as np

from ..debugger_base import DebuggerBase
from .adapter import new_recorder


class PrecisionDebugger(DebuggerBase):
    """msprobe.mindspore.PrecisionDebugger; the shared behaviour lives in DebuggerBase."""

    runtime_class = staticmethod(new_recorder)


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
