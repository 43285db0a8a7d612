"""Values to msprobe's JSON encodings; tensor statistics reduced on the tensor's device.

Statistics are computed when the hook runs (a snapshot: later in-place updates do not change
them) but stay device tensors until the writer thread resolves them, so the training thread
never waits on a host synchronisation per tensor.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import weakref
import zlib
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from .. import entries
from ..dumpformat import files
from . import checksums, ptfile
from .state import _native

MAX_DEPTH = 400
_FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                              "float8_e8m0fnu", "float4_e2m1fn_x2") if hasattr(torch, n))
_DTYPE_STR: Dict[torch.dtype, str] = {}
_TENSOR = torch.Tensor
_F32 = torch.float32
_STRIDED = torch.strided
_PARAM = torch.nn.Parameter
_BUILTIN = (bool, int, float, str, slice, type(Ellipsis))
_NP_SCALAR = (np.integer, np.floating, np.bool_, np.complexfloating, np.str_)
try:
    import torch.distributed as _dist

    _PG = getattr(_dist, "ProcessGroup", ())
    _P2P = getattr(_dist, "P2POp", ())
    _REDUCE_OP = getattr(_dist, "ReduceOp", ())
except Exception:  # pragma: no cover - distributed unavailable
    _dist = None
    _PG = _P2P = _REDUCE_OP = ()


try:  # the one-pass statistics kernel, built with the package where a C compiler is available
    from .._fastats import crc32 as _fast_crc
    from .._fastats import f32 as _fast_f32
    from .._fastats import f32_crc as _fast_f32_crc
    from .._fastats import tmean as _tmean
    from .._fastats import xor64 as _fast_xor
except ImportError:  # pragma: no cover - torch reduces instead
    _fast_f32 = _fast_f32_crc = _fast_crc = _tmean = _fast_xor = None
try:  # the kernel's figures and torch's mean in one read (a kernel built before it lacks the function)
    from .._fastats import f32_mean as _fast_f32_mean
except ImportError:  # pragma: no cover - the kernel, then torch.mean
    _fast_f32_mean = None
try:  # large reads shared with torch's OpenMP team (a kernel built before it lacks the function)
    from .._fastats import use_omp as _fast_use_omp
except ImportError:  # pragma: no cover - the training thread reads alone
    _fast_use_omp = None
try:  # a whole value's entries in one call (a kernel built before it lacks the function)
    from .._fastats import cache_setup as _fast_cache_setup
    from .._fastats import entries as _fast_entries
    from .._fastats import entries_setup as _fast_entries_setup
except ImportError:  # pragma: no cover - the Python encoder alone
    _fast_entries = _fast_entries_setup = _fast_cache_setup = None
try:  # a tensor's metadata from its TensorImpl (the C++ node hooks' build), where both are built
    from .._fastats import set_meta as _fast_set_meta
except ImportError:  # pragma: no cover - torch's Python getters
    _fast_set_meta = None
_isfinite = math.isfinite
_NAN = float("nan")
_sqrt = math.sqrt
# kind of statistics that are already numbers, (max, min, mean, norm), and finite: a tensor with NaN/Inf
# goes through torch and the writer, whose overflow check skips records with nothing left to resolve
READY = "v"


def dtype_str(dtype: torch.dtype) -> str:
    s = _DTYPE_STR.get(dtype)
    if s is None:
        s = _DTYPE_STR[dtype] = str(dtype)
    return s


Pending = entries.Pending
_untrack = entries.untrack


class Unreadable(str):
    """The kind of a pending item whose statistics cannot be computed: the reason, logged by the writer
    with the record's name (a tensor with elements never gets silent nulls)."""


DTENSOR_TYPE = "torch.distributed.tensor.DTensor"
AC_TENSOR_TYPE = "torch.distributed._functional_collectives.AsyncCollectiveTensor"
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__
_DT_FIELDS: Dict[tuple, tuple] = {}  # (id(mesh), placements) -> (mesh, msprobe's device_mesh/placements fields)


def _loaded_class(module: str, name: str):
    # a class from a module nobody imported has no instances: no import (and its cost) on our side
    m = sys.modules.get(module)
    return getattr(m, name, None) if m is not None else None


def _placement(p) -> Dict[str, Any]:
    """One placement as mindstudio-probe writes it ({"Shard": {"dim": d}}, {"Replicate": {}}, {"Partial": ...}).

    Always one entry per mesh dimension: msprobe drops a placement it does not know, which moves every later
    one onto the wrong mesh dimension. FSDP2 over tensor-parallel parameters shards with ``_StridedShard``: a
    shard of that dimension, written as one with its split factor."""
    if p.is_shard():
        return {"Shard": {"dim": int(p.dim)}}
    split = getattr(p, "split_factor", None)
    if split is not None and isinstance(getattr(p, "dim", None), int):
        return {"Shard": {"dim": int(p.dim), "split_factor": int(split)}}
    if p.is_replicate():
        return {"Replicate": {}}
    if p.is_partial():
        return {"Partial": {"reduce_op": str(getattr(p, "reduce_op", "sum"))}}
    return {"Unknown": {"type": type(p).__name__}}


def _dtensor_fields(t) -> Dict[str, Any]:
    mesh = t.device_mesh
    placements = tuple(t.placements)
    key = (id(mesh), placements)
    hit = _DT_FIELDS.get(key)
    if hit is not None and hit[0] is mesh:
        return hit[1]
    fields = {"device_mesh": mesh.mesh.tolist(),  # the mesh's rank ids: a plain CPU tensor, no communication
              "placements": [_placement(x) for x in placements]}
    if len(_DT_FIELDS) > 1024:
        _DT_FIELDS.clear()
    _DT_FIELDS[key] = (mesh, fields)
    return fields


def _type_name(t) -> str:
    cls = type(t)
    return f"{cls.__module__}.{cls.__qualname__}"


def local_view(t: torch.Tensor) -> Tuple[Optional[torch.Tensor], str, Optional[Dict[str, Any]], Optional[str]]:
    """(plain torch.Tensor holding this rank's data of a tensor subclass, msprobe's type name, DTensor
    fields, reason when there is no such tensor).

    An op on a DTensor may redistribute (a collective, and a hang when ranks issue them in different
    orders), so statistics are never computed through the subclass: a DTensor gives its local shard,
    an AsyncCollectiveTensor the result of its already issued collective, a subclass without a
    ``__torch_dispatch__`` its own data. Anything else is not reduced.
    """
    dt = _loaded_class("torch.distributed.tensor._api", "DTensor")
    if dt is not None and isinstance(t, dt):
        local = t._local_tensor
        fields = _dtensor_fields(t)
        if type(local) is not _TENSOR:
            local, _, _, reason = local_view(local)
            return local, DTENSOR_TYPE, fields, reason
        return local, DTENSOR_TYPE, fields, None
    act = _loaded_class("torch.distributed._functional_collectives", "AsyncCollectiveTensor")
    if act is not None and isinstance(t, act):
        local = t.trigger_wait()  # waits for the collective the job issued; starts none
        if type(local) is _TENSOR:
            return local, AC_TENSOR_TYPE, None, None
        return None, AC_TENSOR_TYPE, None, f"its value is a {_type_name(local)}"
    if type(t).__torch_dispatch__ is _PLAIN_DISPATCH:  # the same TensorImpl: a plain view of it is free
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(t, _TENSOR), "torch.Tensor", None, None
    name = _type_name(t)
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None:
        try:
            inner = [getattr(t, n) for n in flatten()[0]]
        except Exception:
            inner = []
        if len(inner) == 1 and type(inner[0]) is _TENSOR and inner[0].shape == t.shape and inner[0].dtype == t.dtype:
            return inner[0], name, None, None
    return None, name, None, "a tensor subclass whose operations may communicate"


def _read_scalars(pending: list) -> Dict[int, list]:
    """All 0-d results of a batch read with one stack + tolist per device and dtype, not one .item() each:
    for a device, one kernel and one copy to the host per batch. Only plain tensors: an op on a subclass here
    could start a collective from the writer thread."""
    groups: Dict[tuple, tuple] = {}
    for i, item in enumerate(pending):
        stat = item[1]
        ts = type(stat)
        # the 0-d results of one tensor: one dtype (a CRC's chunks, a norm's), plain when the first is
        if (ts is tuple or ts is list) and stat and type(stat[0]) is _TENSOR:
            k = (stat[0].device, stat[0].dtype)
            g = groups.get(k)
            if g is None:
                g = groups[k] = ([], [])
            g[0].append(i)
            g[1].extend(stat)
    synced = set()
    out: Dict[int, list] = {}
    for (dev, _), (idxs, tensors) in groups.items():
        if dev.type != "cpu" and dev not in synced:
            _await_device(dev)
            synced.add(dev)
        flat = torch.stack(tensors).tolist()
        pos = 0
        for i in idxs:
            n = len(pending[i][1])
            out[i] = flat[pos:pos + n]
            pos += n
    return out


def _await_device(dev: torch.device) -> None:
    """Writer thread: the statistics kernels queued on the device so far have run, whichever stream the
    job queued them on (the writer's own stream is not ordered after a side stream's). Blocks this thread
    only; once per device and batch."""
    try:
        torch.accelerator.synchronize(dev)
    except Exception:  # a device torch.accelerator does not drive: the read below orders itself
        pass


def _plain_values(stat) -> list:
    """The figures of one statistic (a tuple of 0-d tensors; a list while a device norm is due)."""
    bad = next((x for x in stat if type(x) is not _TENSOR), None)
    if bad is not None:
        raise TypeError(f"a {_type_name(bad)} statistic is not read by the writer thread")
    if stat and not stat[0].is_cpu:
        _await_device(stat[0].device)
        return torch.stack(list(stat)).tolist()
    return [x.item() for x in stat]


def resolve(pending: list) -> Optional[Dict[int, str]]:
    """Fill the statistics of a batch of (entry, stat, kind) in place (writer thread).

    Returns id(entry) -> reason for each entry whose statistics could not be read (its nulls stay,
    with an "error" member); one failing tensor never costs the others of the batch their figures.
    """
    try:
        scalars = _read_scalars(pending)
    except Exception:  # one tensor spoils the stacked read: each is read on its own below
        scalars = {}
    failed: Optional[Dict[int, str]] = None
    for i, item in enumerate(pending):
        try:
            _fill(item, scalars.get(i))
        except Exception as exc:
            entry, _, kind = item
            reason = str(kind) if type(kind) is Unreadable else f"{type(exc).__name__}: {exc}"[:300]
            entry["error"] = reason
            if failed is None:
                failed = {}
            failed[id(entry)] = reason
    return failed


def _finish_norms(due: list) -> None:
    """Training thread, at the end of an encoded value (a call's inputs, its outputs): the norms of its device
    float tensors (due: their 5-item figure lists from stat_of), one batched kernel per device and dtype
    (torch._foreach_norm). Before the call runs: an in-place op must not change its inputs' norms."""
    groups: Dict[tuple, tuple] = {}
    for stat in due:
        t = stat[4]
        k = (t.device, t.dtype)
        g = groups.get(k)
        if g is None:
            g = groups[k] = ([], [])
        g[0].append(stat)
        g[1].append(t)
    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        for stats, tensors in groups.values():
            try:
                norms = torch._foreach_norm(tensors)
            except Exception:  # one at a time; a tensor whose norm fails keeps none (the writer names it)
                norms = [_norm_or_none(t) for t in tensors]
            for stat, norm in zip(stats, norms):
                if len(stat) != 5:  # one figure list twice in a value (the statistics cache): done once
                    continue
                if stat[0] is None:  # norm_only's [None, None, None, None, t]: the norm alone, kind "n"
                    stat[:] = [norm]
                else:
                    stat[3] = norm
                    del stat[4]  # the tensor itself is no longer held
    finally:
        torch._C._set_grad_enabled(prev)


def _norm_or_none(t: torch.Tensor) -> Optional[torch.Tensor]:
    try:
        return torch.linalg.vector_norm(t)
    except Exception:
        return None


def resolve_host(pending: list) -> list:
    """Training thread: fill the statistics of CPU tensors in place (their reductions have run: reading them
    waits for nothing) and return the items still pending (device tensors, unreadable ones, a failed read),
    for the writer thread. The same list when none was filled."""
    rest: list = []
    filled = False
    for item in pending:
        stat = item[1]
        if type(stat) is tuple and stat and type(stat[0]) is _TENSOR and stat[0].is_cpu:
            try:  # one record's few values: .item() each is cheaper than the writer's stacked batch read
                _fill(item, None)
                filled = True
                continue
            except Exception:  # the writer thread reads it once more and logs the reason with the record's name
                pass
        rest.append(item)
    return rest if filled else pending


def _fill(item, vals: Optional[list], sqrt=math.sqrt) -> None:
    entry, stat, kind = item
    if type(kind) is Unreadable:
        raise ValueError(kind)
    if vals is None:
        vals = _plain_values(stat)
    if kind == "n":  # norm_only: the Norm alone
        entry["Norm"] = vals[0]
        return
    if type(kind) is NormOnly:  # norm_only, figures computed whole (a non-finite float32 tensor's, torch's)
        _fill((entry, stat, kind.kind), vals)
        entry["Max"] = entry["Min"] = entry["Mean"] = None
        return
    if type(kind) is int:  # CPU float32: max, min, mean, sum of squares of `kind` elements
        mx, mn, m, ss = vals
        entry["Max"] = mx
        entry["Min"] = mn
        entry["Mean"] = m
        entry["Norm"] = sqrt(ss) if ss >= 0 else float("nan")
    elif kind == "f":
        entry["Max"], entry["Min"], entry["Mean"], entry["Norm"] = vals
    elif kind == "i":
        entry["Max"], entry["Min"] = vals
    elif kind == "b":
        entry["Max"], entry["Min"] = bool(vals[0]), bool(vals[1])
    elif kind == "s":
        v = vals[0]
        entry["Max"] = entry["Min"] = entry["Mean"] = entry["Norm"] = v
    elif kind == "c":
        entry["Max"], entry["Min"], entry["Mean"] = vals
    elif type(kind) is CrcPieces:
        entry["md5"] = checksums.crc_hex(vals, kind)
    elif kind == "x":
        entry["md5"] = checksums.xor_hex(vals[0])
    elif kind == "xs":
        entry["md5"] = vals[0]


class NormOnly:
    """The kind of pending figures computed whole whose entry keeps the Norm alone (Encoder.norm_only)."""

    __slots__ = ("kind",)

    def __init__(self, kind) -> None:
        self.kind = kind


class CrcPieces(tuple):
    """The kind of a device tensor's pending CRC-32: its chunks' lengths (checksums.crc_pieces)."""


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A permuted view of t that is contiguous when t is a transpose/permute of a dense tensor.

    Reductions over all elements do not depend on order (up to rounding), and a strided aminmax is
    several times slower than a contiguous one.
    """
    if t.is_contiguous() or t.dim() < 2:
        return t
    st = t.stride()
    if 0 in st:  # broadcast: no order makes it dense
        return t
    if len(st) == 2:  # the one other order of two dimensions (a weight's transpose)
        p = t.t()
        return p if p.is_contiguous() else t
    order = sorted(range(t.dim()), key=lambda i: (-st[i], -t.shape[i]))
    p = t.permute(order)
    return p if p.is_contiguous() else t


class StatCache:
    """Each distinct tensor is reduced once per step.

    Key: storage address, dtype, shape, strides and the version counter (bumped by every in-place
    op, shared by views); for a contiguous tensor of one or more dimensions, its element count instead of
    its shape and strides (its values in the same order: ``view``, ``reshape`` and ``flatten`` of a tensor
    already read are found). Plus a weak reference proving the memory was not freed and reused: to the
    storage where torch keeps one Python object per storage for its lifetime, so the short-lived aliases
    autograd passes between module hooks (a gradient and its reshape) share an entry. Cleared
    at every step boundary, so writes that bypass the version counter (``p.data.add_``: ``.data`` has a
    counter of its own) cannot leak stale numbers across steps; within a step, a tensor written through
    ``.data`` and then passed to another API would show its earlier statistics (``stat_cache: false``
    turns the cache off).
    """

    __slots__ = ("entries", "hits", "misses", "bytes_reduced")

    def __init__(self):
        self.entries: Dict[tuple, tuple] = {}
        self.hits = 0
        self.misses = 0
        self.bytes_reduced = 0  # what the statistics had to read (each distinct tensor once)

    def key(self, t: torch.Tensor):
        try:
            if t.is_neg() or t.is_conj():  # a lazy view: the base's memory and version, other values; read each time
                return None
            if t.is_contiguous() and t.dim():
                # every statistic and checksum reads a contiguous tensor's memory in order, whatever its shape (torch
                # reduces it as one dimension); a 0-d tensor's figures are msprobe's own (its Norm is its value)
                return (t.data_ptr(), t.dtype, t.numel(), None, t._version, t.device)
            return (t.data_ptr(), t.dtype, t.shape, t.stride(), t._version, t.device)
        except Exception:  # tensors without storage (sparse, meta subclasses)
            return None

    def get(self, key):
        e = self.entries.get(key)
        if e is None:
            return None
        owner = e[0]()
        # the owner still holds the same memory: FSDP2 frees a storage by resizing it to 0 bytes, the allocator
        # hands the address to the next module's parameters, and their copy keeps the version counter
        if owner is None or owner.data_ptr() != e[-1]:
            return None
        self.hits += 1
        return e

    def put(self, key, t, value: tuple) -> None:
        self.misses += 1
        self.bytes_reduced += t.numel() * t.element_size()
        if len(self.entries) > 200_000:
            self.entries.clear()
        try:
            owner = _owner(t)
            self.entries[key] = (weakref.ref(owner), *value, owner.data_ptr())
        except (TypeError, RuntimeError):
            pass

    def clear(self) -> None:
        self.entries.clear()


def _storage_objects_live() -> bool:
    """Whether torch keeps a storage's Python object alive as long as the storage (2.x does)."""
    try:
        t = torch.empty(1)
        ref = weakref.ref(t.untyped_storage())
        return ref() is not None and ref() is t.untyped_storage()
    except Exception:
        return False


_STORAGE_REFS = _storage_objects_live()


def _owner(t: torch.Tensor):
    if _STORAGE_REFS and (type(t) is _TENSOR or type(t) is _PARAM):
        try:
            return t.untyped_storage()
        except Exception:  # no storage (functorch, fake tensors)
            pass
    return t


def _f32_cpu_stats(t: torch.Tensor):
    """Max, min, mean and norm of a contiguous CPU float32 tensor: (stat, kind) as stat_of."""
    stat, kind, _ = _f32_kernel(t, False)
    return stat, kind


def _f32_kernel(t: torch.Tensor, crc: bool):
    """(stat, kind, crc hex or None) of a contiguous CPU float32 tensor, with its CRC-32 for the md5 mode.

    The C kernel reads max, min and the sum of squares in one pass, carried in double (the norm is
    closer to the float64 value than torch's). Where use_torch_mean found it exact, the same read gives
    torch.mean's bits (_fastats.f32_mean: torch's additions, split over torch's threads as its sum splits
    them) and the CRC; otherwise the mean as _mean says. Without the kernel,
    or with NaN/Inf in the tensor (torch's semantics for those), torch reduces: a BLAS dot beats
    torch's whole-tensor vector_norm (a scalar loop on CPU), the mean is torch.mean, and the kind is the
    element count. A NaN/Inf tensor's CRC from the kernel stands.
    """
    n = t.numel()
    # subclasses may own no storage; a negative view (torch._neg_view) stores the values negated
    if _fast_f32 is not None and (type(t) is _TENSOR or type(t) is _PARAM) and not t.is_neg():
        mean = None
        try:
            if _mean_fused:
                r = _fast_f32_mean(t.data_ptr(), n, _tmean_lanes, _num_threads() if n >= _TMEAN_BELOW else 1, crc)
                mean = r[3]
            else:
                r = (_fast_f32_crc if crc else _fast_f32)(t.data_ptr(), n)
        except (RuntimeError, ValueError):  # no data pointer (a functorch or fake tensor), or 256+ threads
            r = None
        if r is not None:
            crc_hex = f"{r[-1]:08x}" if crc else None
            if _isfinite(r[2]):
                return (r[0], r[1], _mean(t, n) if mean is None else mean, _sqrt(r[2])), READY, crc_hex
            return (*_f32_torch_stats(t), crc_hex)
    return (*_f32_torch_stats(t), None)


def _mean(t: torch.Tensor, n: int) -> float:
    # msprobe's Mean, torch.mean: on the CPU torch's float sum divided by n in float. Where a mean is near zero by
    # cancellation (LayerNorm outputs, gradients) the kernel's more exact double sum differs from it in every
    # digit. Below torch's grain, the same additions and division in C (_fastats.tmean), once use_torch_mean found
    # them bit for bit equal: torch's mean and item() are two dispatches and two GIL hand-offs per tensor.
    if n < _TMEAN_BELOW and _tmean_lanes:
        return _tmean(t.data_ptr(), n, _tmean_lanes)
    return t.mean().item()


def _cheap(t: torch.Tensor) -> bool:
    """Reducing t again costs less than the statistics cache's bookkeeping (a key, a lookup, a weak reference:
    ~4 us): a small CPU float32 tensor, which the C kernel and the C mean read in well under that."""
    return t.dtype is _F32 and _tmean_lanes != 0 and t.is_cpu and t.numel() <= _CHEAP_UPTO


_CHEAP_UPTO = 4096  # elements: 16 KiB, about 1 us through the kernel
_TMEAN_BELOW = 32768  # at::internal::GRAIN_SIZE: from here torch may split its sum over threads
_tmean_lanes = 0  # torch's float vector width, once use_torch_mean has found it; 0: torch reduces
_tmean_checked = False
_mean_fused = False  # _fastats.f32_mean reproduced torch.mean from the grain up too, split over torch's threads
_num_threads = torch.get_num_threads


def use_torch_mean() -> bool:
    """Switch _mean to the C mean when it reproduces torch.mean bit for bit, here, on sizes reaching every
    branch of torch's kernel (scalar rows, vector rows, level carries, tails), with magnitudes spread so
    that any other order of additions shows; the lane count is the one that does. Once per process."""
    global _tmean_lanes, _tmean_checked, _mean_fused
    if _tmean_checked or _tmean is None:
        return bool(_tmean_lanes)
    _tmean_checked = True
    try:
        gen = torch.Generator().manual_seed(20261125)
        pool = torch.randn(300_000, generator=gen)  # up to 9 threads' runs for _split_mean_exact
        pool *= torch.pow(10.0, torch.randint(-4, 5, pool.shape, generator=gen).float())
        samples = []
        for i, n in enumerate((1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 255, 257, 511, 513,
                               1023, 1025, 2047, 2049, 4097, 8191, 12345, 16385, _TMEAN_BELOW - 1)):
            x = pool[i:i + n]  # odd offsets too: torch's loads are unaligned
            samples.append((x, x.mean().item()))
        for lanes in (8, 16, 4):
            if all(_tmean(x.data_ptr(), x.numel(), lanes) == ref for x, ref in samples):
                _tmean_lanes = lanes
                break
    except Exception:  # torch reduces
        _tmean_lanes = 0
    if _tmean_lanes and _fast_f32_mean is not None:
        shared = _share_reads()
        _mean_fused = _split_mean_exact(pool)
        if shared and not _mean_fused:
            _fast_use_omp(None)
    return bool(_tmean_lanes)


def _share_reads() -> bool:
    """Let f32_mean read a large tensor with torch's own intra-op threads: its OpenMP team (libgomp, the library
    torch loaded), idle while the training thread is in the tool's hook, as a torch reduction of the tensor would
    use it. The figures do not depend on it (f32_mean's are the same on any number of threads)."""
    if _fast_use_omp is None:
        return False
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return False
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        found = []
        with open("/proc/self/maps") as fh:  # Linux: where the loaded libraries are
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libgomp"):
                    path = parts[5].strip()
                    if path not in found:
                        found.append(path)
        mine = [p for p in found if p.startswith(lib + os.sep)]
        if mine or len(found) == 1:  # torch's own copy, or the only one there is
            return bool(_fast_use_omp((mine or found)[0]))
    except Exception:  # the training thread reads alone
        pass
    return False


def _split_mean_exact(pool: torch.Tensor) -> bool:
    """f32_mean gives torch.mean's bits around the grain and above it, where torch splits its sum over its threads
    (as many as it has now; the split for any count is tested, the user's setting is not touched here)."""
    try:
        threads = _num_threads()
        for i, n in enumerate((_TMEAN_BELOW - 1, _TMEAN_BELOW, _TMEAN_BELOW + 1, 65_537, 100_003, 262_144, 299_990)):
            x = pool[i:i + n]
            got = _fast_f32_mean(x.data_ptr(), n, _tmean_lanes, threads if n >= _TMEAN_BELOW else 1)
            if got[3] != x.mean().item():
                return False
        return True
    except Exception:  # the kernel, then torch.mean
        return False


def use_fast_entries() -> bool:
    """Let _fastats.entries encode whole values whose tensors _cheap takes (the C mean found exact): the same
    kernel and mean as _f32_kernel, without its Python per tensor. Once per process."""
    global _entries_on
    if _entries_on is None:
        _entries_on = False
        if _fast_entries_setup is not None and use_torch_mean():
            try:
                _fast_entries_setup(_TENSOR, _PARAM, _F32, _STRIDED, _tmean_lanes, _CHEAP_UPTO)
                _fast_cache_setup(READY, _STORAGE_REFS, _CONSTANTS)
                # the form Encoder.bind's tuple goes in (a build before it raises TypeError: the Python encoder)
                _entries_on = _fast_entries((None, 0, 0, None), [], []) == []
            except Exception:  # the Python encoder alone
                pass
            if _entries_on:
                use_tensor_meta(True)
    return _entries_on


def use_tensor_meta(on: bool) -> bool:
    """_fastats.entries reads a tensor's metadata (numel, dtype, layout, device, neg bit, contiguity, data pointer,
    shape, requires_grad) from its TensorImpl through the C++ node hooks where they are loaded, or through torch's
    Python getters (off, or not loaded). The same figures either way. True when on."""
    meta = getattr(_native, "tensor_meta", None) if on else None
    if _fast_set_meta is None:
        return False
    try:
        return bool(_fast_set_meta(meta))
    except Exception:  # another build's capsule: the getters
        _fast_set_meta(None)
        return False


_entries_on: Optional[bool] = None
_ENTRY_MODES = {"statistics": 0, "md5": 1, "xor": 2}  # _fastats.entries' modes
_NORM_MODE = 3  # _fastats.entries: the Norm alone (Encoder.norm_only)
_COMPACT = 16  # _fastats.entries: or'ed into a mode, entries of C values (dumpformat/_entry.h)
_COPY_UPTO = 1 << 20  # elements: a 4 MiB copy at most


def _f32_strided(t: torch.Tensor) -> Optional[tuple]:
    """A strided CPU float32 tensor that no permutation makes dense (a broadcast gradient, a slice): max, min and
    norm from the kernel over a contiguous copy, one pass where torch's strided reductions take three slow
    ones; the mean torch's over t itself, as on torch's path. None: torch's path."""
    c = t.contiguous()
    if type(c) is _TENSOR and not c.is_neg():
        try:
            r = _fast_f32(c.data_ptr(), c.numel())
        except RuntimeError:  # no storage of its own to read (a torch.func transform's tensor): torch's reductions
            return None
        if _isfinite(r[2]):
            return (r[0], r[1], t.mean().item(), _sqrt(r[2])), READY
    return None  # NaN/Inf: torch's reductions, for its semantics


_CONSTANTS: Dict[tuple, tuple] = {}


def _constant_f32(t: torch.Tensor) -> Optional[tuple]:
    """A CPU float32 tensor whose strides are all 0 (an expanded gradient: the backward of a sum or a mean): its
    statistics depend on its one value and its shape alone. Computed once as _f32_strided does (a contiguous copy,
    torch's mean over the view: the same figures), then looked up. None: the other paths."""
    if t.is_neg() or type(t) is not _TENSOR and type(t) is not _PARAM:
        return None
    try:
        v = _fast_f32(t.data_ptr(), 1)[0]
    except RuntimeError:  # as in _f32_strided
        return None
    if v != v:
        return None
    n = t.numel()
    # from the grain up torch's mean splits its sum over its threads: their number is part of the figures
    key = (v, math.copysign(1.0, v), tuple(t.shape), torch.get_num_threads() if n >= _TMEAN_BELOW else 1)
    got = _CONSTANTS.get(key)
    if got is None:
        got = _f32_strided(t) if n <= _COPY_UPTO else None
        if got is None:
            return None
        if len(_CONSTANTS) >= 256:
            _CONSTANTS.clear()
        _CONSTANTS[key] = got
    return got


def _f32_torch_stats(t: torch.Tensor):
    flat = t.view(-1)
    mn, mx = torch.aminmax(t)
    return (mx, mn, flat.mean(), torch.dot(flat, flat)), t.numel()


def stat_crc_of(t: torch.Tensor, high_precision: bool):
    """stat_of and the tensor's CRC-32 (the md5 summary mode); a device tensor's CRC as pending pieces
    (0-d device tensors, CrcPieces)."""
    if not t.is_cpu and t.layout is _STRIDED and not t.is_meta:
        stat, kind = stat_of(t, high_precision)
        raws, lengths = checksums.crc_pieces(t)
        return stat, kind, (raws, CrcPieces(lengths))
    if t.dtype is _F32 and t.layout is _STRIDED and t.is_cpu and not high_precision and t.dim() and t.numel() \
            and t.is_contiguous() and _fast_f32_crc is not None:
        stat, kind, crc = _f32_kernel(t, True)
        return stat, kind, crc if crc is not None else crc32_hex(t)
    stat, kind = stat_of(t, high_precision)
    return stat, kind, crc32_hex(t) if t.layout == torch.strided else crc32_hex(t.to_dense())


def stat_of(t: torch.Tensor, high_precision: bool, norm_only: bool = False):
    """(stat tensor, kind) for a detached tensor, or (None, None) when msprobe writes nulls. norm_only: a float
    tensor's Norm alone is needed (kind "n", or figures READY whose Norm the caller takes), no other kernel."""
    dt = t.dtype
    if dt is _F32 and t.layout is _STRIDED and t.is_cpu and not high_precision and t.dim() and t.numel() \
            and t.is_contiguous():
        return _f32_cpu_stats(t)  # the common case first
    if t.is_meta or t.numel() == 0:
        return None, None
    if dt in _FLOAT8:  # every float8 value is exact in float32
        try:
            t = t.to(_F32)
        except Exception as exc:
            return None, Unreadable(f"{dtype_str(dt)}: {type(exc).__name__}: {exc}"[:200])
        return stat_of(t, high_precision, norm_only)
    if t.layout != torch.strided:
        try:
            t = t.to_dense()
        except Exception:
            return None, None
    # Each result is a tuple of 0-d tensors: on a device they stay there until the writer thread reads a batch
    # of them with one kernel and one copy (_read_scalars). Kernels per device tensor: aminmax; a float's mean
    # (its norm: one batched kernel per encoded value, _finish_norms); a bool's any and all; a 0-d tensor's copy.
    if norm_only:
        if t.dim() == 0 and not t.is_complex() and dt is not torch.bool:
            return (t.clone(),), "n"  # a 0-d tensor's figures are its value
        if not t.is_floating_point() or dt is torch.float64:
            return None, None  # msprobe writes no Norm for these (complex: none; float64: null)
        if not t.is_cpu:
            return [None, None, None, None, _dense(t)], "n"  # the norm: _finish_norms, one batched kernel per value
        # on the CPU, the full path below: a float32 tensor's figures READY from the kernel (the caller keeps their
        # Norm, the full statistics' bits), any other's norm alone
    if t.is_complex():
        a = t.abs()
        mn, mx = torch.aminmax(a)
        return (mx, mn, a.mean()), "c"
    if dt is torch.bool:
        return (t.any(), t.all()), "b"
    if t.dim() == 0:
        return (t.clone(),), "s"
    t = _dense(t)
    cpu = t.is_cpu
    if cpu and dt is torch.float32 and not high_precision and _fast_f32 is not None:
        if t.is_contiguous():  # a permuted view made dense
            return _f32_cpu_stats(t)
        if not any(t.stride()):  # _dense leaves a broadcast as it is
            got = _constant_f32(t)
            if got is not None:
                return got
        if t.numel() <= _COPY_UPTO:
            got = _f32_strided(t)
            if got is not None:
                return got
    if t.is_floating_point() and dt is not torch.float64 and not high_precision:
        if norm_only:
            return (torch.linalg.vector_norm(t),), "n"
        mn, mx = torch.aminmax(t)
        if cpu:
            return (mx, mn, t.mean(), torch.linalg.vector_norm(t)), "f"
        return [mx, mn, t.mean(), None, t], "f"  # the norm: _finish_norms, before the call returns
    mn, mx = torch.aminmax(t)
    return (mx, mn), "i"


def raw_bytes(t: torch.Tensor):
    b = checksums.as_bytes(t)  # the values, not a lazy view's stored bits
    if b.numel() == 0:
        return memoryview(b"")
    return b.cpu().numpy()


try:  # ISA-L's CRC-32 is the zlib polynomial, an order of magnitude faster
    from isal import isal_zlib as _isal_zlib
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - optional speed-up
    _isal_zlib = None
    _crc32 = zlib.crc32
_isal_in_kernel = False


def use_isal_crc() -> bool:
    """Let the kernel call ISA-L's CRC-32 directly (exported by isal's extension module), once checked
    against zlib.crc32; otherwise the kernel's own carry-less-multiply CRC-32 (several times slower)."""
    global _isal_in_kernel
    if _isal_in_kernel or _fast_crc is None or _isal_zlib is None:
        return _isal_in_kernel
    try:
        import ctypes

        from .. import _fastats

        fn = ctypes.CDLL(_isal_zlib.__file__).crc32_gzip_refl
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint64]
        probe = bytes(range(256)) * 5 + b"msprobe"
        if addr and fn(0, probe, len(probe)) == zlib.crc32(probe) and \
                fn(zlib.crc32(probe[:77]), probe[77:], len(probe) - 77) == zlib.crc32(probe):
            _fastats.set_crc(addr)
            _isal_in_kernel = True
    except Exception:  # another isal build: the kernel's own CRC stays
        pass
    return _isal_in_kernel


def _direct(t: torch.Tensor) -> bool:
    """A checksum can read t's bytes at its data pointer: a plain CPU tensor, contiguous, whose stored bytes are its
    values (not a lazy negative or conjugate view)."""
    return t.is_cpu and (type(t) is _TENSOR or type(t) is _PARAM) and t.is_contiguous() and not t.is_neg() \
        and not t.is_conj()


def crc32_hex(t: torch.Tensor) -> Optional[str]:
    if t.is_meta:
        return None
    if _fast_crc is not None and _direct(t):
        try:  # no numpy view, no copy
            return f"{_fast_crc(t.data_ptr(), t.numel() * t.element_size()):08x}"
        except (RuntimeError, ValueError):
            pass
    return f"{_crc32(raw_bytes(t)):08x}"


def xor_hex(t: torch.Tensor) -> Optional[str]:
    if t.is_meta or t.numel() == 0:
        return None
    if _fast_xor is not None and _direct(t):
        try:  # no numpy view, no padded copy
            return f"0x{_fast_xor(t.data_ptr(), t.numel() * t.element_size()):016x}"
        except (RuntimeError, ValueError):
            pass
    b = raw_bytes(t)
    pad = (-len(b)) % 8
    if pad:
        b = np.concatenate([b, np.zeros(pad, dtype=np.uint8)])
    words = np.frombuffer(b, dtype="<u8")
    return f"0x{int(np.bitwise_xor.reduce(words)):016x}"


def save_pt(tensor: torch.Tensor, path: str) -> None:
    """torch.save straight into a file created without following symlinks, 0640, renamed into place.

    torch's non-zip format: no per-record CRC and zip bookkeeping, several times cheaper for the
    small files that dominate a dump; torch.load (weights_only too) reads it like any .pt file.
    """
    if type(tensor) is ptfile.Staged:
        ptfile.write(tensor, path)
        return
    with files.atomic_file(path) as fh:
        torch.save(tensor, fh, _use_new_zipfile_serialization=tensor.dtype not in ptfile.LEGACY_DTYPES)


class Encoder(entries.EncoderBase):
    """Encodes one record's values to msprobe's entries, with the statistics of its tensors pending."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("_ctx", "_ctx_one", "_entries", "_devices")

    tensor_type_name = "torch.Tensor"

    def __init__(self, cfg, tensor_dir_fn, writer):
        super().__init__(cfg, tensor_dir_fn, writer)
        self.md5 = self.summary == "md5"
        if self.md5:
            use_isal_crc()
        use_torch_mean()
        self.cache = StatCache()
        self._devices = False  # a device float tensor was seen: values end with their norms batched
        # a value recurs within a step as the input of a later call (an output passed on, a gradient handed back):
        # without inputs in the records, looking every tensor up costs more than the few repeats it saves
        self.use_cache = cfg.stat_cache and cfg.inputs_recorded
        # the common value (small CPU float32 tensors and scalars) in one C call; its entries are _enc's
        self._entries = _fast_entries if self.summary in _ENTRY_MODES and not (self.structure or self.high) \
            and use_fast_entries() else None
        self._entry_mode = _NORM_MODE if self.norm_only else _ENTRY_MODES.get(self.summary, 0)
        # larger CPU float32 tensors too, through _f32_kernel's read (torch's thread count given per call: it may
        # change) and this cache (StatCache's dict, keys and values); the xor mode's checksum of those stays xor_hex's
        self._large = self._entries is not None and _mean_fused and self.summary != "xor"
        self.bind()

    def bind(self) -> None:
        """What every C call of the entries is given, as one tuple (the ctx form of ``_fastats.entries``): bound again
        where use_cache or _large change. torch's thread count goes as its function, which the C asks only of a
        tensor whose statistics depend on it."""
        threads = _num_threads if self._large else 0
        cache = self.cache if self.use_cache else None
        # the entries the C makes are C values (dumpformat/_entry.h), not dicts of float objects: the journal's and
        # the writer's C write them as those dicts, and Python reads them as those dicts
        mode = self._entry_mode | _COMPACT
        self._ctx = (self._item, mode, threads, cache)
        self._ctx_one = (self._one, mode, threads, cache)

    # -- entry points --
    def encode(self, value: Any, pending: Pending, file_prefix: Optional[str], keys: Optional[list] = None) -> Any:
        """Encode a value. file_prefix is the tensor file stem ('{key}.input') or None for no files."""
        entries = self._entries
        if entries is not None and file_prefix is None and not keys:  # the common value (an empty one too)
            start = len(pending)
            try:
                got = entries(self._ctx, value, pending)
            finally:  # as below: the device items the fallback queued get their norms, also if it raised
                if self._devices and len(pending) > start:
                    self._finish(pending, start)
            if got is not NotImplemented:
                return got
        tv = type(value)
        if (tv is dict or tv is list) and not value:
            return tv()
        prev = torch.is_grad_enabled()
        if prev:
            torch._C._set_grad_enabled(False)  # one switch per value, not a context manager per tensor
        start = len(pending)
        try:
            return self._enc(value, pending, file_prefix, keys if keys is not None else [], 0, set())
        finally:
            if self._devices and len(pending) > start:
                self._finish(pending, start)
            if prev:
                torch._C._set_grad_enabled(True)

    def tensor(self, t: torch.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        if self._entries is not None and file_name is None:  # encode()'s C call, for the one tensor
            try:
                return self._entries(self._ctx_one, (t,), pending)[0]
            except Exception:  # the C call itself failed (memory): the Python path, which never raises
                pass
        return self._tensor_entry(t, pending, file_name)

    def _one(self, t: Any, key: Any, pending: Pending, top: Any) -> Dict[str, Any]:
        """_fastats.entries' fallback for tensor()"""
        return self._tensor_entry(t, pending, None)

    def _tensor_entry(self, t: torch.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        start = len(pending)
        try:
            return self._tensor(t, pending, file_name)
        except Exception as exc:  # a bad tensor yields a clear skip, never an exception in user code
            known: Dict[str, Any] = {}
            try:
                known.update(dtype=dtype_str(t.dtype), shape=list(t.shape))
            except Exception:
                pass
            return self.skipped(exc, file_name, **known)
        finally:
            if self._devices and len(pending) > start:
                self._finish(pending, start)
            torch._C._set_grad_enabled(prev)

    # -- internals --
    def _item(self, v: Any, key: Any, pending: Pending, top: Any) -> Any:
        """_fastats.entries' fallback: the entry of top[key], as _items and _container make it."""
        prev = torch.is_grad_enabled()
        if prev:
            torch._C._set_grad_enabled(False)
        try:
            return self._enc(v, pending, None, [key], 1, {id(top)})
        finally:
            if prev:
                torch._C._set_grad_enabled(True)

    @staticmethod
    def _finish(pending: list, start: int) -> None:
        # this call's own items (another thread may be encoding): the figures whose norm is due
        due = [it[1] for it in pending[start:] if type(it[1]) is list and len(it[1]) == 5]
        if not due:
            return
        try:
            _finish_norms(due)
        except Exception:  # their norms stay unset: the writer names each record whose figures are missing
            pass

    def _enc(self, v, pending, prefix, keys, depth, seen):
        tv = type(v)
        if tv is _TENSOR or tv is _PARAM or isinstance(v, torch.Tensor):
            name = None
            if prefix is not None:
                name = ".".join([prefix, *(str(k) for k in keys)]) + ".pt"
            try:
                return self._tensor(v, pending, name)
            except Exception:
                return self._tensor_entry(v, pending, name)  # logs and returns the error entry
        if v is None:
            return None
        if tv is list or tv is tuple:  # the common containers: no namedtuple/dataclass probing
            if depth >= MAX_DEPTH:
                return None
            return self._guarded(self._items, v, pending, prefix, keys, depth, seen)
        if isinstance(v, (torch.dtype, torch.device)):
            last = keys[-1] if keys else None
            if isinstance(v, torch.dtype) and last in ("dtype", "output_dtype"):
                return {"type": "torch.dtype", "value": str(v)}
            if isinstance(v, torch.device) and last == "device":
                return {"type": "torch.device", "value": f"{v.type}:{v.index}"}
            return {}
        if keys and keys[-1] == "device" and isinstance(v, (int, str)) and not isinstance(v, bool):
            return {"type": "torch.device", "value": v}
        if isinstance(v, _BUILTIN):
            return entries.builtin(v, _bound)
        if isinstance(v, torch.Size):
            return {"type": "torch.Size", "value": [int(x) for x in v]}
        if depth >= MAX_DEPTH:
            return None
        if isinstance(v, (list, tuple, dict)) or dataclasses.is_dataclass(v):
            return self._guarded(self._container, v, pending, prefix, keys, depth, seen)
        if isinstance(v, torch.memory_format):
            return {"type": "torch.memory_format", "format": str(v).replace("torch.", "")}
        if isinstance(v, np.ndarray):
            return self._ndarray(v)
        if isinstance(v, _NP_SCALAR):
            try:
                return {"type": type(v).__name__, "value": v.item()}
            except Exception:
                return None
        if _PG and isinstance(v, _PG):
            return _process_group(v)
        if _REDUCE_OP and isinstance(v, _REDUCE_OP):
            return {"type": "torch.distributed.ReduceOp", "value": str(v)}
        if _P2P and isinstance(v, _P2P):
            return self._p2p(v, pending, prefix, keys)
        return None

    def _container(self, v, pending, prefix, keys, depth, seen):
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            v = {f: getattr(v, f) for f in v._fields}
        elif type(v) not in (list, tuple, dict) and dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = {f: getattr(v, f, None) for f in v.__dataclass_fields__}
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                keys.append(k)
                try:
                    out[k if isinstance(k, str) else str(k)] = self._enc(item, pending, prefix, keys, depth + 1, seen)
                finally:
                    keys.pop()
            return _untrack(out)
        return self._items(v, pending, prefix, keys, depth, seen)

    def _items(self, v, pending, prefix, keys, depth, seen):
        out_l = []
        for i, item in enumerate(v):
            keys.append(i)
            try:
                out_l.append(self._enc(item, pending, prefix, keys, depth + 1, seen))
            finally:
                keys.pop()
        return _untrack(out_l)  # a list of untracked entries is not followed either

    @staticmethod
    def _guarded(fn, v, pending, prefix, keys, depth, seen):
        vid = id(v)
        if vid in seen:
            return None  # cyclic structure: the back reference is written as null
        seen.add(vid)
        try:
            return fn(v, pending, prefix, keys, depth, seen)
        finally:
            seen.discard(vid)

    def _subclass(self, t: torch.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        """A tensor subclass: recorded as msprobe does (type, this rank's shape and statistics, a DTensor's
        mesh and placements), reduced only through a plain tensor (local_view)."""
        local, tname, fields, reason = local_view(t)
        if local is None:
            entry: Dict[str, Any] = {"type": tname, "dtype": dtype_str(t.dtype), "shape": list(t.shape)}
            if not self.structure:
                entry.update(Max=None, Min=None, Mean=None, Norm=None)
                if t.numel():
                    pending.append((entry, None, Unreadable(f"{tname}: not reduced: {reason}")))
            entry["requires_grad"] = t.requires_grad
            return entry
        entry = self._tensor(local, pending, file_name)
        entry["type"] = tname
        entry["requires_grad"] = t.requires_grad  # the local shard of a DTensor parameter does not require it
        if fields is not None:
            entry.update(fields)
        return entry

    def _tensor(self, t: torch.Tensor, pending: Pending, file_name: Optional[str]) -> Dict[str, Any]:
        # callers switch grad mode off once (encode(), tensor()): no detach, no context per tensor
        if type(t) is not _TENSOR and type(t) is not _PARAM:
            return self._subclass(t, pending, file_name)
        if self.summary == "xor" and not self.structure:
            entry = {"type": "torch.Tensor", "dtype": dtype_str(t.dtype), "shape": list(t.shape), "md5": None,
                     "requires_grad": t.requires_grad}
            if t.is_cpu:
                entry["md5"] = xor_hex(t) if t.dim() else _scalar(t)
            elif t.dim() == 0:  # a device tensor's: pending
                pending.append((entry, (t.clone(),), "xs"))
            elif t.numel() and not t.is_meta:
                pending.append((entry, (checksums.xor_word(t),), "x"))
            return _untrack(entry)
        if self.structure:
            return _untrack({"type": "torch.Tensor", "dtype": dtype_str(t.dtype), "shape": list(t.shape),
                             "requires_grad": t.requires_grad})
        entry: Dict[str, Any] = {"type": "torch.Tensor", "dtype": dtype_str(t.dtype), "shape": list(t.shape),
                                 "Max": None, "Min": None, "Mean": None, "Norm": None,
                                 "requires_grad": t.requires_grad}
        key = None
        if self.use_cache and (file_name is not None or not _cheap(t)):
            key = self.cache.key(t)
        cached = self.cache.get(key) if key is not None else None
        crc = None
        if cached is not None:
            stat, kind, crc = cached[1], cached[2], cached[3]
        elif self.md5:
            stat, kind, crc = stat_crc_of(t, self.high)
        else:
            stat, kind = stat_of(t, self.high, self.norm_only)
        if kind is READY:
            if self.norm_only:
                entry["Norm"] = stat[3]
            else:
                entry["Max"], entry["Min"], entry["Mean"], entry["Norm"] = stat
        elif kind is not None:
            if self.norm_only and kind != "n" and type(kind) is not Unreadable:
                kind = NormOnly(kind)
            pending.append((entry, stat, kind))
            if type(stat) is list and not self._devices:
                self._devices = True
        saved = None
        if file_name is not None and not t.is_meta:
            fname = files.safe_component(file_name)
            saved = f"{self._tensor_dir()}/{fname}"
            entry["data_name"] = fname
            if cached is not None and len(cached) > 4 and cached[4] is not None and cached[4][1] == t.shape:
                # the same data was saved a moment ago (an output is the next API's input): link it
                self._writer.link_tensor(cached[4][0], saved)
            else:
                snap = ptfile.stage(t)
                if snap is not None:
                    self._writer.save_tensor(saved, snap, snap.nbytes)
                else:
                    snap = t.to_dense() if t.layout != torch.strided else t.clone().contiguous()
                    self._writer.save_tensor(saved, snap, snap.numel() * snap.element_size())
        if self.md5:
            if type(crc) is tuple:  # a device tensor's: pending
                entry["md5"] = None
                if crc[0]:
                    pending.append((entry, crc[0], crc[1]))
            else:
                entry["md5"] = crc  # from stat_crc_of or the cache
        if saved is not None:
            saved = (saved, t.shape)  # a file holds its shape: a view of another shape saves its own
        if cached is None and key is not None:
            self.cache.put(key, t, (stat, kind, crc, saved))  # t: the caller's object, alive while it is used
        elif cached is not None and saved is not None and cached[4] is None:
            self.cache.entries[key] = (*cached[:4], saved, cached[-1])
        # alive until the writer thread has it, and its statistics with it: not followed by the collector (a dict put
        # anything followed into, a subclass's fields, is followed again)
        return _untrack(entry)

    def _ndarray(self, a: np.ndarray) -> Dict[str, Any]:
        e: Dict[str, Any] = {"type": "numpy.ndarray", "dtype": str(a.dtype), "shape": list(a.shape)}
        try:
            if a.size and a.dtype.kind in "fiub":
                e.update(Max=a.max().item(), Min=a.min().item())
                if a.dtype.kind == "f":
                    e.update(Mean=a.mean().item(), Norm=float(np.linalg.norm(a)))
                else:
                    e.update(Mean=None, Norm=None)
        except Exception:
            pass
        return e

    def _p2p(self, v, pending, prefix, keys):
        out: Dict[str, Any] = {"class_type": "torch.distributed.P2POp"}
        try:
            out["tensor"] = self.tensor(v.tensor, pending, None)
            out["op"] = getattr(v.op, "__name__", str(v.op))
            out["peer"] = v.peer
            out["tag"] = v.tag
            group = v.group if v.group is not None else _dist.distributed_c10d._get_default_group()
            out["group_id"] = _process_group(group).get("group_id")
        except Exception:
            pass
        return out


def _scalar(d: torch.Tensor):
    try:
        return d.item()
    except Exception:
        return None


def _bound(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else None
    return x if isinstance(x, (int, float)) else None


def _process_group(pg) -> Dict[str, Any]:
    info: Dict[str, Any] = {"type": "torch.ProcessGroup"}
    try:
        ranks = _dist.get_process_group_ranks(pg)
        info["group_ranks"] = ranks
        info["group_id"] = f"{zlib.crc32(str(ranks).encode('utf-8')):08x}"
    except Exception:
        pass
    return info
