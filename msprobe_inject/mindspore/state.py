"""Per-thread state of the MindSpore adapter, shared by its API wrappers, cell hooks and stepping wrapper,
and the facts about MindSpore's execution they all ask."""

from __future__ import annotations

from typing import Any, Optional

import mindspore as ms

from ..threadstate import quiet_sections, thread_state

DIFF_DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64, ms.complex64, ms.complex128)
try:
    from mindspore.common.api import _pynative_executor
except ImportError:  # pragma: no cover
    _pynative_executor = None


# The wrappers' and hooks' per-thread state (threadstate.thread_state): each attribute and a thread's first value
_FIELDS = (
    ("busy", False),  # the tool itself is running: everything passes straight through
    ("in_api", False),  # inside a recorded API: nested APIs are neither recorded nor counted
    ("stack", list),  # enclosing cell records (construct.json parents, mix-level list)
    ("frames", list),  # cell forward frames between pre- and post-hook
    ("top", False),  # zero-code: inside a top-level Cell call
)

tls = thread_state(_FIELDS)


# The tool's own tensor work: wrappers and hooks pass straight through while it runs. Quiet() is one section, entered
# with `with` (the busy flag alone: MindSpore has no dispatch guard to enter).
Quiet = quiet_sections(tls, None)


def requires_grad() -> bool:
    """True while PyNative records a graph for value_and_grad/grad (backward hooks can fire)."""
    try:
        return bool(_pynative_executor.requires_grad())
    except Exception:
        return True


def graph_mode() -> bool:
    try:
        return ms.get_context("mode") == ms.GRAPH_MODE
    except Exception:
        return False


def diff_tensor(v: Any) -> bool:
    return isinstance(v, ms.Tensor) and v.dtype in DIFF_DTYPES


def rank() -> Optional[int]:
    try:
        from mindspore.communication import GlobalComm, get_rank

        if GlobalComm.INITED:
            return int(get_rank())
    except Exception:
        pass
    return None


def rank_or_env() -> Optional[int]:
    """msrun's RANK_ID counts before mindspore.communication.init()."""
    from ..session import rank_from_env

    r = rank()
    return rank_from_env() if r is None else r


def is_optimizer(cell: Any) -> bool:
    from mindspore import nn

    if isinstance(cell, nn.Optimizer):
        return True
    try:
        from mindspore.experimental.optim import Optimizer as ExpOptimizer

        return isinstance(cell, ExpOptimizer)
    except ImportError:
        return False
