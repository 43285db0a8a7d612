"""The device-side checksums (checksums.py) against zlib's CRC-32 and the host XOR, run here on CPU tensors:
the same torch ops run on any device."""

from __future__ import annotations

import zlib

import pytest
import torch

from msprobe_inject.pytorch import checksums, encode


def _crc(t: torch.Tensor) -> str:
    raws, lengths = checksums.crc_pieces(t)
    return checksums.crc_hex([int(r) for r in raws], lengths)


@pytest.mark.parametrize("n", [*range(1, 70), 255, 256, 257, 4097, 100_003])
def test_the_folded_crc_and_xor_are_zlibs_and_the_hosts(n):
    t = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    assert _crc(t) == f"{zlib.crc32(t.numpy().tobytes()):08x}"
    assert checksums.xor_hex(int(checksums.xor_word(t))) == encode.xor_hex(t)


def test_chunks_combine_to_the_whole_tensors_crc(monkeypatch):
    monkeypatch.setattr(checksums, "CHUNK", 1000)
    t = torch.randn(3001)  # 12,004 bytes: 13 chunks, the last one short
    raws, lengths = checksums.crc_pieces(t)
    assert len(raws) == 13 and lengths[-1] == 4
    assert checksums.crc_hex([int(r) for r in raws], lengths) == encode.crc32_hex(t)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(10, 7)[:, 1:5],  # not contiguous
    lambda: torch.randn(33, dtype=torch.bfloat16)[3:],  # an offset that is no multiple of 8 bytes
    lambda: torch.randn(6, 4).t(),
    lambda: torch.tensor([True, False, True]),
    lambda: -torch.randn(5),
    lambda: torch.randn(4, dtype=torch.complex64).conj(),
])
def test_views_are_checksummed_by_their_values(make):
    t = make()
    assert _crc(t) == encode.crc32_hex(t)
    assert checksums.xor_hex(int(checksums.xor_word(t))) == encode.xor_hex(t)


def test_a_one_word_xor_is_a_snapshot():
    t = torch.tensor([1.5, 2.5])  # 8 bytes: no fold, no padding
    word = checksums.xor_word(t)
    before = int(word)
    t.mul_(3)
    assert int(word) == before
