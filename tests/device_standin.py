"""A stand-in accelerator for CPU-only machines: plain ``torch.Tensor`` objects on device ``npy`` (PrivateUse1).

Its tensors are what the tool sees of a GPU or NPU tensor: exact type ``torch.Tensor``, a device that is not
the CPU, no host-readable data. Every op reaches one Python fallback, which runs it on CPU copies held beside
each tensor, so a training loop runs (forward, backward, optimizer). Each operation that would make the host
wait for a device, ``item``/``_local_scalar_dense``, a blocking copy to the host, data-dependent shapes, raises
when the armed thread calls it, and is counted. Kernels (ops that are not views) dispatched on the armed thread
are counted too.

Import it in a child process only: renaming PrivateUse1 holds for the process.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Optional

import torch
from torch.utils._pytree import tree_map
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

_setup_privateuseone_for_python_backend("npy")
DEVICE = torch.device("npy", 0)

_SYNC = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::equal", "aten::is_nonzero",
         "aten::masked_select", "aten::unique", "aten::_unique2"}
_HOST: weakref.WeakKeyDictionary[Any, torch.Tensor] = weakref.WeakKeyDictionary()
armed: Dict[str, Any] = {"thread": None}
hits: List[str] = []  # host synchronisations attempted on the armed thread
kernels: List[str] = []  # ops that compute (not views, not allocations) dispatched on the armed thread
_ALLOC = {"aten::empty.memory_format", "aten::empty_strided"}


def arm(thread_id: Optional[int] = None) -> None:
    armed["thread"] = threading.get_ident() if thread_id is None else thread_id


def disarm() -> None:
    armed["thread"] = None


def to_device(h: torch.Tensor) -> torch.Tensor:
    """A stand-in tensor holding a copy of the CPU tensor h (its metadata is contiguous: so is the copy)."""
    h = h.detach().clone().contiguous()
    t = torch._C._acc.create_empty_tensor(list(h.shape), h.dtype)
    _HOST[t.untyped_storage()] = h
    return t


def host(t: torch.Tensor) -> torch.Tensor:
    h = _HOST[t.untyped_storage()]
    if h.dtype != t.dtype:  # a dtype view (Tensor.view(dtype)) never reaches the fallback
        h = h.contiguous().view(t.dtype)
    if h.shape != t.shape:
        h = h.reshape(t.shape)
    return h


def _wrap(h: torch.Tensor) -> torch.Tensor:
    if not h.is_contiguous():
        h = h.contiguous()
    t = torch._C._acc.create_empty_tensor(list(h.shape), h.dtype)
    _HOST[t.untyped_storage()] = h
    return t


def _is_npy(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "npy"


def _trap(name: str) -> None:
    hits.append(name)
    raise RuntimeError(f"host synchronisation on the training thread: {name}")


def _fallback(op, *args, **kwargs):
    name = op.name()
    schema = op._schema
    on = armed["thread"] is not None and threading.get_ident() == armed["thread"]
    target = kwargs.get("device")
    to_cpu = name == "aten::_to_copy" and target is not None and torch.device(target).type == "cpu"
    if on:
        if name in _SYNC or to_cpu:
            _trap(name)
        if name not in _ALLOC and not all(r.alias_info is not None and not r.alias_info.is_write
                                          for r in schema.returns):
            kernels.append(name)
    if name in ("aten::_copy_from", "aten::_copy_from_and_resize"):
        src, dst = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        if on and dst.device.type == "cpu" and not non_blocking:
            _trap(name)
        d = host(dst) if _is_npy(dst) else dst
        if name.endswith("resize"):
            d.resize_(src.shape)
        d.copy_(host(src) if _is_npy(src) else src)
        return dst
    # a Python scalar the dispatcher wrapped into a 0-d tensor arrives as the scalar
    args = tuple(torch.tensor(v) if isinstance(v, (int, float, bool)) and i < len(schema.arguments)
                 and str(schema.arguments[i].type) == "Tensor" else v for i, v in enumerate(args))
    uargs = tree_map(lambda x: host(x) if _is_npy(x) else x, args)
    ukw = tree_map(lambda x: host(x) if _is_npy(x) else x, kwargs)
    if ukw.get("device") is not None and torch.device(ukw["device"]).type == "npy":
        ukw["device"] = torch.device("cpu")
    out = op(*uargs, **ukw)
    if to_cpu:
        return out

    def back(i: int, r: Any) -> Any:
        ai = schema.returns[i].alias_info
        if ai is not None and ai.is_write:  # in place or out=: the argument itself
            for a, v in zip(schema.arguments, args):
                if a.alias_info is not None and a.alias_info.is_write:
                    return v
            for a in schema.arguments:
                if a.alias_info is not None and a.alias_info.is_write and a.name in kwargs:
                    return kwargs[a.name]
        return _wrap(r) if isinstance(r, torch.Tensor) else r

    if isinstance(out, tuple):
        return tuple(back(i, r) for i, r in enumerate(out))
    if isinstance(out, list):
        return [_wrap(r) if isinstance(r, torch.Tensor) else r for r in out]
    if isinstance(out, torch.Tensor):
        return back(0, out)
    return out


_lib = torch.library.Library("_", "IMPL", "PrivateUse1")
_lib.fallback(_fallback)
# a multi-tensor op is one kernel on an accelerator (CUDA's multi_tensor_apply), not the per-tensor loop torch
# runs where a backend has no kernel of its own
_aten = torch.library.Library("aten", "IMPL", "PrivateUse1")
_aten.impl("_foreach_norm.Scalar", lambda *a, **k: _fallback(torch.ops.aten._foreach_norm.Scalar, *a, **k))
