"""Seed 000's functional single-point saving: ``save``, ``save_grad`` and ``step`` of ``msprobe.mindspore``.

Files go to ``{save_dir}/step{N}/rank{R}/{name}_{dtype}_{count}.npy`` (``{name}_grad_...`` for gradients),
nested containers expand to ``{name}.{key}``. As with msprobe's TensorDump, ``count`` is one sequence
for all names of the step and process (observed: h_..._0, nest.a_..._1, hg_grad_..._4), bfloat16 is
saved as float32, and ``step()`` moves to the next step directory. Unlike msprobe, ``step()`` also
works on CPU (msprobe's step marker is a TensorDump kernel the CPU build does not have), and the
count restarts at 0 in each step.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import mindspore as ms
from mindspore import ops

from ..dumpformat import files, paths
from . import encode

_state = {"step": 0, "count": 0}
_lock = threading.Lock()


def _rank() -> int:
    from .state import rank_or_env

    r = rank_or_env()
    return 0 if r is None else r


def _next_count() -> int:
    with _lock:
        n = _state["count"]
        _state["count"] = n + 1
        return n


def _write(save_dir: str, name: str, tensor: ms.Tensor) -> None:
    """One tensor file; a failure is reported as a warning, never raised into the training script."""
    try:
        arr = encode.host_array(tensor)
        d = paths.rank_dir(save_dir, _state["step"], _rank(), os.getpid())
        files.makedirs(d)
        fname = files.safe_component(f"{name}_{arr.dtype.name}_{_next_count()}") + ".npy"
        encode.save_npy(arr, os.path.join(d, fname))
    except Exception as exc:
        warnings.warn(f"[msprobe-launch] save('{name}') failed: {type(exc).__name__}: {exc}", RuntimeWarning,
                      stacklevel=3)


def _save(save_dir: str, name: str, data: Any) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            _save(save_dir, f"{name}.{k}", v)
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            _save(save_dir, f"{name}.{i}", v)
    elif data is None:
        return
    elif isinstance(data, ms.Tensor):
        _write(save_dir, name, data)
    else:
        raise TypeError(f"For 'save', the type of argument 'data' must be mindspore.Tensor, but got {type(data)}")


def save(save_dir: str, name: str, data: Any) -> None:
    """Save a Tensor, or a list/tuple/dict nesting Tensors, as .npy files of the current step."""
    if not isinstance(save_dir, str) or not isinstance(name, str):
        raise TypeError("save(save_dir, name, data): save_dir and name must be str")
    from .state import Quiet

    with Quiet():  # our own tensor reads must not be recorded by an L1 dump
        _save(save_dir, name, data)


def save_grad(save_dir: str, name: str, data: ms.Tensor) -> ms.Tensor:
    """Return ``data`` through an identity whose gradient is saved as ``{name}_grad``; use the return value."""
    if not isinstance(data, ms.Tensor):
        raise TypeError(f"For 'save_grad', the type of argument 'data' must be mindspore.Tensor, but got {type(data)}")
    if not isinstance(save_dir, str) or not isinstance(name, str):
        raise TypeError("save_grad(save_dir, name, data): save_dir and name must be str")
    gname = f"{name}_grad"

    def hook(grad):
        from .state import Quiet

        with Quiet():
            if isinstance(grad, tuple):
                grad = grad[0] if grad else None
            if isinstance(grad, ms.Tensor):
                _write(save_dir, gname, grad)
        return None  # the gradient flows on unchanged

    return ops.HookBackward(hook)(data)


def step() -> None:
    """Later saves go to the next step directory."""
    with _lock:
        _state["step"] += 1
        _state["count"] = 0
