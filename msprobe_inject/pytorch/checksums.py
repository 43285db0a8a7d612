"""The md5 mode's CRC-32 and the xor mode's checksum of a device tensor, computed on its device in torch ops.

Copying a device tensor to the host to checksum it would synchronise the training thread with the device at
every call. Both checksums are folds instead: adjacent pieces combine pairwise, level by level, so a tensor
of n bytes costs about log2(n) small batches of kernels and no host read. The results stay 0-d device tensors
until the writer thread reads a batch of them.

CRC-32 (zlib's) is linear over GF(2). With R(M) the CRC register after M from a zero register,
R(A + B) = shift_|B|(R(A)) ^ R(B), where shift_s (the register after s zero bytes) is a linear map on 32 bits,
applied on the device through four 256-entry tables (one per byte of the register). Leading zero bytes leave R
unchanged, so a level with an odd number of pieces takes a zero piece in front (and a chunk zero bytes up to a
multiple of 4: the first level reads 4-byte pieces). The writer turns R into zlib's
value (crc_hex): crc32(M) = ~(shift_n(0xFFFFFFFF) ^ R(M)).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

_POLY = 0xEDB88320  # zlib's polynomial, bit-reflected
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
CHUNK = 4 << 20  # bytes folded at once: the fold's temporaries peak near 16x a chunk
_lock = threading.Lock()
_basis: Dict[int, Tuple[int, ...]] = {}  # s -> images of the 32 register bits under shift_s (s a power of 2)
_tables: Dict[tuple, torch.Tensor] = {}  # (device, name) -> a table of the fold, on the device


def _one_zero_byte(r: int) -> int:
    for _ in range(8):
        r = (r >> 1) ^ (_POLY if r & 1 else 0)
    return r


def _apply(basis: Sequence[int], v: int) -> int:
    out = 0
    i = 0
    while v:
        if v & 1:
            out ^= basis[i]
        v >>= 1
        i += 1
    return out


def _shift_basis(s: int) -> Tuple[int, ...]:
    """shift_s for s a power of two: shift_1 directly, shift_2s = shift_s twice."""
    b = _basis.get(s)
    if b is None:
        if s == 1:
            b = tuple(_one_zero_byte(1 << i) for i in range(32))
        else:
            half = _shift_basis(s // 2)
            b = tuple(_apply(half, x) for x in half)
        _basis[s] = b
    return b


def shift(n: int, v: int) -> int:
    """The register v after n zero bytes (host, O(log n))."""
    s = 1
    while n:
        if n & 1:
            v = _apply(_shift_basis(s), v)
        n >>= 1
        s <<= 1
    return v


def crc_hex(raws: Sequence[int], lengths: Sequence[int]) -> str:
    """zlib's CRC-32 of the concatenated chunks, from each chunk's register R (writer thread)."""
    r = 0
    for raw, n in zip(raws, lengths):
        r = shift(n, r) ^ (raw & _MASK32)
    total = sum(lengths)
    return f"{(~(shift(total, _MASK32) ^ r)) & _MASK32:08x}"


def xor_hex(word: int) -> str:
    return f"0x{word & _MASK64:016x}"


_keep: List[torch.Tensor] = []  # pinned sources of copies that may still be in flight


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small constant on the device, once per device: copied from pinned memory without waiting (a pageable
    source makes the copy wait for the device)."""
    try:
        pinned = host.pin_memory()
    except Exception:  # no pinned memory for this device: an ordinary copy, once
        return host.to(device)
    _keep.append(pinned)
    return pinned.to(device, non_blocking=True)


def _constant(device: torch.device, name: Any, rows: Callable[[], list]) -> torch.Tensor:
    """The int64 table name on the device, made from rows() on the first use there."""
    key = (device, name)
    t = _tables.get(key)
    if t is None:
        with _lock:
            t = _tables.get(key)
            if t is None:
                t = _tables[key] = to_device(torch.tensor(rows(), dtype=torch.int64), device)
    return t


def _table(device: torch.device, s: int) -> torch.Tensor:
    """shift_s (s a power of 2) as 4x256 entries, one row per byte of the register."""
    return _constant(device, s, lambda: [_apply(_shift_basis(s), j << (8 * k)) for k in range(4) for j in range(256)])


def _word_table(device: torch.device) -> torch.Tensor:
    """R of a 4-byte piece, byte k (0 first) being j: shift_(4-k) of j in the register's low byte; 4x256."""
    return _constant(device, "word", lambda: [shift(4 - k, j) for k in range(4) for j in range(256)])


def _byte_index(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the shifts that take each byte of a register to the low bits, each byte's offset into a 4x256 table)."""
    t = _constant(device, "bytes", lambda: [[0, 8, 16, 24], [0, 256, 512, 768]])
    return t[0], t[1]


def _xor_columns(g: torch.Tensor) -> torch.Tensor:
    """The XOR of the 4 looked-up parts of each register (g: n x 4)."""
    return (g[:, 0] ^ g[:, 1]) ^ (g[:, 2] ^ g[:, 3])


def _shifted(a: torch.Tensor, s: int, device: torch.device) -> torch.Tensor:
    """shift_s of every register in a (int64 holding 32 bits)."""
    shifts, offsets = _byte_index(device)
    return _xor_columns(_table(device, s)[((a.unsqueeze(1) >> shifts) & 255) + offsets])


def _crc_chunk(b: torch.Tensor) -> torch.Tensor:
    """R of one chunk of bytes (uint8, 1-d, non-empty), a 0-d int64 on its device. The first level reads 4-byte
    pieces (zero bytes in front make the length a multiple of 4), so the temporaries peak near 16 bytes per
    byte of the chunk."""
    device = b.device
    pad = (-b.numel()) % 4
    if pad:
        b = torch.cat([b.new_zeros(pad), b])
    _, offsets = _byte_index(device)
    x = _xor_columns(_word_table(device)[b.view(-1, 4).long() + offsets])
    s = 4
    while x.numel() > 1:
        if x.numel() & 1:  # a zero piece in front
            x = torch.cat([x.new_zeros(1), x])
        p = x.view(-1, 2)
        x = _shifted(p[:, 0], s, device) ^ p[:, 1]
        s <<= 1
    return x.reshape(())


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as flat uint8 on its device (the bytes the host-side checksum reads)."""
    t = t.detach().resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def crc_pieces(t: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Tuple[int, ...]]:
    """(R of each chunk as 0-d device tensors, the chunk lengths) for crc_hex."""
    b = as_bytes(t)
    n = b.numel()
    if n == 0:
        return (), ()
    raws: List[torch.Tensor] = []
    lengths: List[int] = []
    for start in range(0, n, CHUNK):
        piece = b[start:start + CHUNK]
        raws.append(_crc_chunk(piece))
        lengths.append(piece.numel())
    return tuple(raws), tuple(lengths)


def xor_word(t: torch.Tensor) -> torch.Tensor:
    """The XOR of the tensor's little-endian 64-bit words (zero-padded), a 0-d int64 on its device."""
    b = as_bytes(t)
    pad = (-b.numel()) % 8
    if pad or b.storage_offset() % 8:
        b = torch.cat([b, b.new_zeros(pad)])
    x = b.view(torch.int64)
    if x.numel() == 1:
        return x.reshape(()).clone()  # a snapshot: the job may write into its tensor before the writer reads
    while x.numel() > 1:
        h = x.numel() // 2
        y = x[:h] ^ x[h:2 * h]
        if x.numel() & 1:
            y[:1] ^= x[2 * h:]
        x = y
    return x.reshape(())
