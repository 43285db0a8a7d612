"""Tensor files (.pt) staged on the training thread as their final bytes.

A dumped tensor must be copied before the training thread goes on (later in-place updates
must not reach the file). Copying it straight into the bytes of torch.save's non-zip format
(header, then the storage) in a page-aligned buffer makes that copy the only one: the writer
thread hands the buffer to the disk with O_DIRECT, without torch.save's pickling, without a
second copy into the page cache and without the writeback that used to compete with training
for the CPU. torch.load reads the file like any torch.save file; only the storage key (an
arbitrary name torch takes from a memory address) differs.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
from typing import Any, Dict, Optional, Tuple

import torch

from ..dumpformat import files

ALIGN = 4096
_KEY = "0"
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a Parameter's clone is a plain tensor too
try:  # dtypes with a legacy storage type: the others give a non-zip file torch.load rejects (float8, uint16...)
    LEGACY_DTYPES = frozenset(torch.storage._dtype_to_storage_type_map())
except Exception:  # pragma: no cover - a torch without the map: the zip format for every dtype
    LEGACY_DTYPES = frozenset()
_headers: Dict[Tuple[torch.dtype, Tuple[int, ...]], Optional[torch.Tensor]] = {}


class Staged:
    """A .pt file's bytes: the first `size` bytes of `buf`, a uint8 tensor (page-aligned and whole pages
    for a file written with O_DIRECT)."""

    __slots__ = ("buf", "size", "nbytes")

    def __init__(self, buf: torch.Tensor, size: int, nbytes: int):
        self.buf = buf
        self.size = size
        self.nbytes = nbytes  # memory held, for the writer's pending budget


class _Pickler(pickle.Pickler):
    # torch.save's legacy persistent id for a typed CPU storage, under a fixed key
    count = -1

    def persistent_id(self, obj: Any) -> Optional[tuple]:
        if isinstance(obj, torch.storage.TypedStorage):
            self.count = obj._size()
            return ("storage", getattr(torch, obj._pickle_storage_type()), _KEY, "cpu", self.count, None)
        return None


def legacy_header(dtype: torch.dtype, shape: Tuple[int, ...]) -> bytes:
    """Everything torch.save(t, f, _use_new_zipfile_serialization=False) writes before the data of a
    contiguous CPU tensor t of this dtype and shape (the storage's element count included)."""
    from torch import serialization as ser

    det = torch.utils.deterministic
    fill = det.fill_uninitialized_memory and torch.are_deterministic_algorithms_enabled()
    if fill:  # deterministic mode would write every byte of the stand-in, which only lends its metadata
        det.fill_uninitialized_memory = False
    try:
        stand = torch.empty(shape, dtype=dtype, device="cpu")
    finally:
        if fill:
            det.fill_uninitialized_memory = True
    f = io.BytesIO()
    proto = ser.DEFAULT_PROTOCOL
    pickle.dump(ser.MAGIC_NUMBER, f, protocol=proto)
    pickle.dump(ser.PROTOCOL_VERSION, f, protocol=proto)
    pickle.dump(dict(protocol_version=ser.PROTOCOL_VERSION, little_endian=sys.byteorder == "little",
                     type_sizes=dict(short=ser.SHORT_SIZE, int=ser.INT_SIZE, long=ser.LONG_SIZE)),
                f, protocol=proto)
    pickler = _Pickler(f, protocol=proto)
    pickler.dump(stand)
    if pickler.count < 0:  # an untyped storage (float8, uint16...): torch.load cannot read that file
        raise ValueError(f"{dtype} has no legacy storage type")
    pickle.dump([_KEY], f, protocol=proto)
    f.write(struct.pack("<q", pickler.count))
    return f.getvalue()


def _header(t: torch.Tensor) -> Optional[torch.Tensor]:
    key = (t.dtype, tuple(t.shape))
    h = _headers.get(key)
    if h is None and key not in _headers:
        try:
            h = torch.frombuffer(bytearray(legacy_header(*key)), dtype=torch.uint8)
        except Exception:  # torch.save's own path then
            h = None
        if len(_headers) > 4096:
            _headers.clear()
        _headers[key] = h
    return h


def stage(t: torch.Tensor) -> Optional[Staged]:
    """The .pt file of t's current values, or None where torch.save must write it."""
    if type(t) not in _PLAIN or t.device.type != "cpu" or t.layout != torch.strided \
            or t.dtype not in LEGACY_DTYPES or t.is_quantized:
        return None
    hdr = _header(t)
    if hdr is None:
        return None
    h = hdr.numel()
    size = h + t.numel() * t.element_size()
    if size >= files.DIRECT_MIN:  # O_DIRECT: whole pages from a page boundary
        padded = -(-size // ALIGN) * ALIGN
        raw = torch.empty(padded + ALIGN, dtype=torch.uint8, device="cpu")
        start = -raw.data_ptr() % ALIGN
        buf = raw[start:start + padded]
    else:
        raw = buf = torch.empty(size, dtype=torch.uint8, device="cpu")
    buf[:h].copy_(hdr)
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.is_contiguous():
        buf[h:size].copy_(t.reshape(-1).view(torch.uint8))
    elif h % t.element_size() == 0:
        buf[h:size].view(t.dtype).view(t.shape).copy_(t)
    else:
        buf[h:size].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    buf[size:].zero_()
    return Staged(buf, size, raw.numel())


def write(staged: Staged, path: str) -> None:
    files.write_atomic(path, staged.buf.numpy(), staged.size, direct=True)
