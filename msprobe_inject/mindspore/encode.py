"""MindSpore values to msprobe's JSON encodings; tensor statistics reduced on the tensor's device.

Statistics follow msprobe's MindSpore processor: integer, float64 and (with precision "high") every
tensor are reduced in float32, so ints get a Mean and a Norm; bool gets any/all; a 0-d tensor reports
its value four times; complex tensors get |z| statistics. The reductions are launched when the hook
runs (a snapshot, queued in order on the device) and stay device tensors until the writer thread
resolves them, so the training thread never waits on a host synchronisation per tensor.
"""

from __future__ import annotations

import dataclasses
import io
import zlib
from typing import Any, Dict, List, Optional

import mindspore as ms
import numpy as np
from mindspore import mint

from .. import entries
from ..dumpformat import files

MAX_DEPTH = 400
_untrack = entries.untrack
# Bound before any API wrapper is installed: statistics never go through our own wrappers.
_MAX, _MIN, _MEAN, _SUM, _SQRT, _ANY, _ALL = mint.max, mint.min, mint.mean, mint.sum, mint.sqrt, mint.any, mint.all
_TENSOR_COPY = ms.Tensor.copy
_TENSOR_MUL = ms.Tensor.__mul__
_BUILTIN = (bool, int, float, str, slice, type(Ellipsis))
_NP_SCALAR = (np.integer, np.floating, np.bool_, np.complexfloating, np.str_)
try:
    from mindspore._c_expression.typing import Number as _DTYPE
except ImportError:  # pragma: no cover - older layouts
    _DTYPE = type(ms.float32)
try:
    from mindspore.mint.distributed import P2POp as _P2P
except ImportError:  # pragma: no cover
    _P2P = ()

_LOW_FLOATS = (ms.float16, ms.bfloat16)
_FLOATS = (ms.float16, ms.bfloat16, ms.float32)
_COMPLEX = (ms.complex64, ms.complex128)
_FP8 = tuple(getattr(ms, n) for n in ("float8_e4m3fn", "float8_e5m2", "hifloat8") if hasattr(ms, n))
_DTYPE_STR: Dict[Any, str] = {}


def is_tensor(v: Any) -> bool:
    return isinstance(v, ms.Tensor)


def dtype_str(dtype: Any) -> str:
    s = _DTYPE_STR.get(dtype)
    if s is None:
        s = _DTYPE_STR[dtype] = str(dtype)
    return s


Pending = entries.Pending


def _item(v: Any) -> Any:
    if isinstance(v, ms.Tensor):
        if v.dtype == ms.bfloat16:
            v = v.float()
        v = v.asnumpy().item()
    elif isinstance(v, np.generic):
        v = v.item()
    return v


def resolve_host(pending: list) -> list:
    """Nothing is read on the training thread: every reduction is queued on the device (asnumpy would wait
    for PyNative's pipeline), so the writer thread reads them all."""
    return pending


def resolve(pending: list) -> None:
    """Writer thread: device scalars to Python numbers (and the CRC-32 or XOR of snapshots), in place."""
    for entry, values, kind in pending:
        try:
            if kind == "md5":
                entry["md5"] = crc32_hex(values)
                continue
            if kind == "xor":
                entry["md5"] = _xor_hex(values)
                continue
            if kind == "c":
                a = np.abs(values[0].asnumpy())
                values = [a.max(), a.min(), a.mean(), np.linalg.norm(a)]
            vals = [_item(v) for v in values]
            if kind == "b":
                vals = [bool(v) for v in vals]
            entry["Max"], entry["Min"], entry["Mean"], entry["Norm"] = vals
        except Exception:
            pass  # the entry keeps null statistics; a broken tensor must not stop the writer


def stat_of(t: ms.Tensor, high_precision: bool, dt: Any = None, norm_only: bool = False):
    """(values, kind) launched on the device, or (None, None) when msprobe writes nulls. norm_only: a float
    tensor's Norm alone (the other values None), no other kernel."""
    if dt is None:
        dt = t.dtype  # each dtype read may wait for PyNative's pipeline: callers pass it when they have it
    if t.size == 0 or dt in _FP8:
        return None, None
    if norm_only and (dt == ms.bool_ or dt in _COMPLEX):
        return None, None  # msprobe writes no Norm for these
    if dt == ms.bool_:
        if t.ndim == 0:
            return [t, t, None, None], "b"
        return [_ANY(t), _ALL(t), None, None], "b"
    if dt in _COMPLEX:  # msprobe computes them on the host, in NumPy: the writer thread does, from a snapshot
        return [snapshot(t)], "c"
    if t.ndim == 0:
        v = _TENSOR_COPY(t)
        return ([None, None, None, v] if norm_only else [v, v, v, v]), "s"
    x = t
    if high_precision or dt not in _FLOATS:
        x = t.float()  # msprobe: ints, float64 and precision "high" are reduced in float32
    elif dt == ms.bfloat16:
        x = t.float()  # MindSpore's CPU reduce kernels have no bfloat16
    # Norm as sqrt(sum(x*x)): mint.norm needs LinalgVectorNorm, which the CPU build lacks.
    xf = x if x.dtype not in _LOW_FLOATS else x.float()
    if norm_only:
        return [None, None, None, _SQRT(_SUM(_TENSOR_MUL(xf, xf)))], "f"
    return [_MAX(x), _MIN(x), _MEAN(x), _SQRT(_SUM(_TENSOR_MUL(xf, xf)))], "f"


def host_array(t: ms.Tensor) -> np.ndarray:
    """The tensor's data as msprobe saves it: bfloat16 widened to float32, fp8 too."""
    if t.dtype == ms.bfloat16 or t.dtype in _FP8:
        t = t.float()
    return t.asnumpy()


def crc32_hex(t: Any) -> str:
    arr = host_array(t) if isinstance(t, ms.Tensor) else np.asarray(t)
    return f"{zlib.crc32(np.ascontiguousarray(arr).tobytes()):08x}"


def save_npy(tensor: Any, path: str) -> None:
    """Writer thread: np.save into a file created 0640, atomically, without following symlinks."""
    arr = host_array(tensor) if isinstance(tensor, ms.Tensor) else np.asarray(tensor)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    files.write_atomic(path, buf.getvalue())


def snapshot(t: ms.Tensor) -> ms.Tensor:
    """A copy queued on the device now, read by the writer later (in-place updates do not leak in)."""
    return _TENSOR_COPY(t)


class Encoder(entries.EncoderBase):
    """Encodes one record's values to msprobe's entries, with the statistics of its tensors pending."""

    tensor_type_name = "mindspore.Tensor"

    def encode(self, value: Any, pending: Pending, file_prefix: Optional[str], keys: Optional[list] = None) -> Any:
        """Encode a value. file_prefix is the tensor file stem ('{key}.input') or None for no files."""
        return self._enc(value, pending, file_prefix, keys if keys is not None else [], 0, set())

    def tensor(self, t: ms.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        try:
            return self._tensor(t, pending, file_name)
        except Exception as exc:  # a bad tensor yields a clear skip, never an exception in user code
            return self.skipped(exc, file_name)

    def _enc(self, v, pending, prefix, keys, depth, seen):
        if isinstance(v, ms.Tensor):
            name = None
            if prefix is not None:
                name = ".".join([prefix, *(str(k) for k in keys)]) + ".npy"
            return self.tensor(v, pending, name)
        if v is None:
            return None
        if isinstance(v, _BUILTIN):
            return entries.builtin(v, _bound)
        if isinstance(v, _DTYPE):
            return {"type": "mindspore.dtype", "value": str(v)}
        if depth >= MAX_DEPTH:
            return None
        if isinstance(v, (list, tuple, dict)) or dataclasses.is_dataclass(v):
            vid = id(v)
            if vid in seen:
                return None  # cyclic structure: the back reference is written as null
            seen.add(vid)
            try:
                return self._container(v, pending, prefix, keys, depth, seen)
            finally:
                seen.discard(vid)
        if isinstance(v, np.ndarray):
            return _ndarray(v)
        if isinstance(v, _NP_SCALAR):
            try:
                return {"type": type(v).__name__, "value": v.item()}
            except Exception:
                return None
        if _P2P and isinstance(v, _P2P):
            return self._p2p(v, pending)
        return None

    def _container(self, v, pending, prefix, keys, depth, seen):
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            v = {f: getattr(v, f) for f in v._fields}
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = {f: getattr(v, f, None) for f in v.__dataclass_fields__}
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                keys.append(k)
                try:
                    if k in ("dtype", "output_dtype") and isinstance(item, _DTYPE):
                        out[str(k)] = {"type": "mindspore.dtype", "value": str(item)}
                    else:
                        out[k if isinstance(k, str) else str(k)] = self._enc(item, pending, prefix, keys, depth + 1,
                                                                              seen)
                finally:
                    keys.pop()
            return _untrack(out)
        out_l: List[Any] = []
        for i, item in enumerate(v):
            keys.append(i)
            try:
                out_l.append(self._enc(item, pending, prefix, keys, depth + 1, seen))
            finally:
                keys.pop()
        return _untrack(out_l)  # entries, and lists or dicts of them, are not followed by the collector

    def _tensor(self, t: ms.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        dt = t.dtype
        entry: Dict[str, Any] = {"type": "mindspore.Tensor", "dtype": dtype_str(dt), "shape": list(t.shape)}
        if self.structure:
            return _untrack(entry)
        if self.summary == "xor":  # a copy queued on the device; the writer thread reads and folds it
            entry["md5"] = None
            if t.size:
                pending.append((entry, snapshot(t), "xor"))
            return _untrack(entry)
        entry["Max"] = entry["Min"] = entry["Mean"] = entry["Norm"] = None
        values, kind = stat_of(t, self.high, dt, self.norm_only)
        if values is not None:
            pending.append((entry, values, kind))
        if file_name is not None:
            fname = files.safe_component(file_name)
            snap = snapshot(t)
            entry["data_name"] = fname
            self._writer.save_tensor(f"{self._tensor_dir()}/{fname}", snap, int(t.size) * _itemsize(t))
        if self.summary == "md5":
            entry["md5"] = None
            pending.append((entry, snapshot(t), "md5"))
        return _untrack(entry)

    def _p2p(self, v, pending):
        out: Dict[str, Any] = {"class_type": "mindspore.mint.distributed.P2POp"}
        try:
            out["tensor"] = self.tensor(v.tensor, pending, None)
            out["op"] = getattr(v.op, "__name__", str(v.op))
            out["peer"] = v.peer
            out["tag"] = v.tag
            out["group_id"] = None
        except Exception:
            pass
        return out


def _itemsize(t: ms.Tensor) -> int:
    try:
        return int(t.itemsize)
    except Exception:
        return 4


def _xor_hex(t: ms.Tensor) -> Optional[str]:
    if t.size == 0:
        return None
    b = np.ascontiguousarray(host_array(t)).view(np.uint8).reshape(-1)
    pad = (-len(b)) % 8
    if pad:
        b = np.concatenate([b, np.zeros(pad, dtype=np.uint8)])
    return f"0x{int(np.bitwise_xor.reduce(np.frombuffer(b.tobytes(), dtype='<u8'))):016x}"


def _ndarray(a: np.ndarray) -> Dict[str, Any]:
    e: Dict[str, Any] = {"type": "numpy.ndarray", "dtype": str(a.dtype), "shape": list(a.shape),
                         "Max": None, "Min": None, "Mean": None, "Norm": None}
    try:
        if a.size and a.dtype.kind not in ("U", "S", "O"):
            e.update(Max=np.max(a).item(), Min=np.min(a).item(), Mean=np.mean(a).item(),
                     Norm=np.linalg.norm(a).item())
    except Exception:
        pass
    return e


def _bound(x: Any) -> Any:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None
