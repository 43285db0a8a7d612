"""Staged tensor files: the bytes torch.save writes (but for the storage key), read back by torch.load."""

from __future__ import annotations

import io
import os

import pytest
import torch

from msprobe_inject.dumpformat import files
from msprobe_inject.pytorch import encode, ptfile


def _cases():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(9, 9, generator=g, dtype=torch.float64)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "transposed": torch.randn(5, 6, generator=g).t(),
        "offset slice": base[::2, 1:],
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "i64": torch.arange(10),
        "bool": torch.tensor([True, False, True]),
        "bf16": torch.randn(4, generator=g).bfloat16(),
        "f16 strided": torch.randn(3, 5, generator=g).half()[:, 1:4],
        "u8 odd offset": torch.arange(11, dtype=torch.uint8)[3:],
        "complex conj": torch.randn(3, generator=g, dtype=torch.complex64).conj(),
        "negative view": torch._neg_view(torch.randn(4, generator=g)),
        "parameter": torch.nn.Parameter(torch.randn(2, 3, generator=g)),
        "direct-sized": torch.randn(300, 1000, generator=g),  # 1.2 MB: written with O_DIRECT
        "direct-sized strided": torch.randn(1000, 300, generator=g).t(),
    }


def _torch_save_bytes(t: torch.Tensor) -> bytes:
    with torch.no_grad():
        ref = t.resolve_conj().resolve_neg().clone().contiguous()
    f = io.BytesIO()
    torch.save(ref, f, _use_new_zipfile_serialization=False)
    key = str(ref.untyped_storage()._cdata).encode()
    # torch names the storage by its address; ours is "0" (a BINUNICODE string, twice)
    out = f.getvalue().replace(b"X" + len(key).to_bytes(4, "little") + key, b"X\x01\x00\x00\x000")
    assert out != f.getvalue()
    return out


@pytest.mark.parametrize("name", list(_cases()))
def test_staged_file_is_torch_save_bytes(tmp_path, name):
    t = _cases()[name]
    staged = ptfile.stage(t)
    assert staged is not None
    if staged.size >= files.DIRECT_MIN:
        assert staged.buf.data_ptr() % ptfile.ALIGN == 0 and staged.buf.numel() % ptfile.ALIGN == 0
    assert staged.nbytes >= staged.buf.numel() >= staged.size
    path = str(tmp_path / "x.pt")
    ptfile.write(staged, path)
    data = open(path, "rb").read()
    assert data == _torch_save_bytes(t)
    loaded = torch.load(path, weights_only=True)
    assert type(loaded) is torch.Tensor and not loaded.requires_grad
    assert loaded.dtype == t.dtype and loaded.shape == t.shape and loaded.is_contiguous()
    assert torch.equal(loaded, t.detach().resolve_conj().resolve_neg())
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_stage_is_a_snapshot():
    t = torch.ones(100_000)
    staged = ptfile.stage(t)
    t.add_(1)  # an in-place update after the hook must not reach the file
    f = io.BytesIO(staged.buf.numpy()[:staged.size].tobytes())
    assert torch.equal(torch.load(f, weights_only=True), torch.ones(100_000))


def test_page_cache_path_writes_the_same_file(tmp_path, monkeypatch):
    t = torch.randn(512, 1024)  # 2 MiB
    staged = ptfile.stage(t)
    ptfile.write(staged, str(tmp_path / "direct.pt"))
    monkeypatch.setattr(files, "_O_DIRECT", 0)
    ptfile.write(staged, str(tmp_path / "buffered.pt"))
    assert open(tmp_path / "direct.pt", "rb").read() == open(tmp_path / "buffered.pt", "rb").read()
    assert os.path.getsize(tmp_path / "direct.pt") == staged.size


def test_write_refuses_a_symlinked_temp_file(tmp_path):
    staged = ptfile.stage(torch.randn(300_000))
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    path = str(tmp_path / "x.pt")
    os.symlink(target, f"{path}.tmp{os.getpid()}")
    with pytest.raises(OSError):
        ptfile.write(staged, path)
    assert target.read_bytes() == b"keep" and not os.path.exists(path)


def test_unstageable_tensors_fall_back_to_torch_save():
    assert ptfile.stage(torch.randn(4, 4).to_sparse()) is None

    class Sub(torch.Tensor):
        pass

    assert ptfile.stage(torch.randn(3).as_subclass(Sub)) is None


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32])
def test_dtypes_without_legacy_storage_get_a_loadable_file(tmp_path, dtype):
    # torch.save's non-zip format writes these dtypes in a form torch.load rejects: zip format instead
    t = torch.arange(6).to(dtype)
    assert ptfile.stage(t) is None
    path = str(tmp_path / "x.pt")
    encode.save_pt(t.clone(), path)
    loaded = torch.load(path, weights_only=True)
    assert loaded.dtype == dtype and torch.equal(loaded.float(), t.float())


def test_stage_ignores_the_default_device(tmp_path):
    t = torch.randn(70_000)  # 280 KB: the O_DIRECT path
    torch.set_default_device("meta")
    try:
        staged = ptfile.stage(t)
    finally:
        torch.set_default_device(None)
    assert staged is not None and staged.buf.device.type == "cpu"
    ptfile.write(staged, str(tmp_path / "x.pt"))
    assert torch.equal(torch.load(tmp_path / "x.pt", weights_only=True), t)


def test_waiting_on_a_dead_writer_returns(tmp_path):
    import threading
    import time

    from msprobe_inject.writer import DumpWriter

    th = threading.Thread(target=lambda: None)
    th.start()
    th.join()
    t0 = time.monotonic()
    DumpWriter.wait(threading.Event(), th, timeout=60)  # a writer thread that died before setting it
    assert time.monotonic() - t0 < 5
