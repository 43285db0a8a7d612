"""The statistics cache gives exactly the numbers a run without it gives: after in-place updates,
for views and aliases, for tensors re-used across APIs and for memory freed and re-allocated."""

from __future__ import annotations

import pytest
import torch
from util import PREAMBLE, load_dump, run_py

SCRIPT = PREAMBLE + """
from msprobe_inject.pytorch import encode
import msprobe_inject.config as mc
cfg_path = sys.argv[2] + ".json"
json.dump({"dump_path": sys.argv[2], "level": "L1", "stat_cache": sys.argv[1] == "on"}, open(cfg_path, "w"))
debugger = PrecisionDebugger(config_path=cfg_path)
debugger.start()
x = torch.randn(64, 96)  # above encode._CHEAP_UPTO: small ones are reduced again, not cached
torch.exp(x)          # x reduced
torch.exp(x)          # same x: cached
x.add_(1.0)           # in-place: version bump
torch.exp(x)
v = x[:, 1:3]         # a view: different geometry
torch.exp(v)
x.mul_(2.0)           # in-place on the base changes the view too
torch.exp(v)
t = x.t()             # transposed view
torch.exp(t)
with torch.no_grad():
    x.sub_(3.0)       # in-place under no_grad still bumps the version
torch.exp(x)
for _ in range(5):    # freed and re-allocated memory of the same shape
    y = torch.randn(64, 96)
    torch.exp(y)
    del y
w = torch.randn(64, 96)
torch.exp(w.detach())     # an alias object, freed at once: its storage lives on in w
torch.exp(w.view_as(w))   # another alias of the same memory and geometry: cached
w.view_as(w).add_(1.0)    # in-place through an alias bumps the shared version
torch.exp(w.detach())
p = torch.nn.Parameter(torch.randn(3))
opt = torch.optim.SGD([p], lr=0.5)
torch.exp(p).sum().backward()
opt.step()
torch.exp(p)          # updated by the optimizer (in-place, version bump)
debugger.stop(); debugger.step()
from msprobe_inject.pytorch import PrecisionDebugger
print("HITS", PrecisionDebugger.get_runtime().encoder.cache.hits)
"""


def test_cache_equals_no_cache(tmp_path):
    hits = int(run_py(SCRIPT, str(tmp_path), args=("on", "with_cache")).stdout.split("HITS")[1])
    assert hits > 0, "the cache was not used"
    assert int(run_py(SCRIPT, str(tmp_path), args=("off", "without_cache")).stdout.split("HITS")[1]) == 0
    a = load_dump(str(tmp_path / "with_cache"))["data"]
    b = load_dump(str(tmp_path / "without_cache"))["data"]
    assert list(a) == list(b)
    assert a == b
    # the in-place updates are visible: the three exp inputs of x differ
    mx = [a[f"Torch.exp.{i}.forward"]["input_args"][0]["Max"] for i in (0, 2)]
    assert mx[0] != mx[1]
    alias = [a[f"Torch.exp.{i}.forward"]["input_args"][0]["Max"] for i in (12, 13, 14)]
    assert alias[0] == alias[1] != alias[2]


def test_aliases_share_an_entry_and_freed_memory_does_not():
    from msprobe_inject.pytorch.encode import StatCache, _owner

    cache = StatCache()
    w = torch.randn(4, 6)
    cache.put(cache.key(w.detach()), w.detach(), ("stat",))
    assert cache.get(cache.key(w.view_as(w))) is not None  # a different object over the same storage
    w.add_(1)
    assert cache.get(cache.key(w)) is None  # version bumped
    y = torch.randn(1 << 16)
    key = cache.key(y)
    cache.put(key, y, ("stat",))
    del y
    z = torch.randn(1 << 16)  # may land at y's address with y's geometry and version
    assert cache.get(key) is None and cache.get(cache.key(z)) is None
    assert _owner(z) is z.untyped_storage()


def test_a_storage_resized_away_is_not_a_hit():
    """FSDP2 frees an unsharded parameter by resizing its storage to 0 bytes (the storage object lives on)
    and copies the next all-gather in with the version counter preserved: the address and the version of
    another module's parameter may then match an entry whose memory is gone."""
    from msprobe_inject.pytorch.encode import StatCache

    cache = StatCache()
    p = torch.randn(8)
    key = cache.key(p)
    cache.put(key, p, ("stat",))
    assert cache.get(key) is not None
    p.untyped_storage().resize_(0)
    assert cache.get(key) is None


def test_contiguous_views_of_any_shape_share_an_entry():
    from msprobe_inject.pytorch.encode import StatCache

    cache = StatCache()
    x = torch.randn(64, 96)
    k = cache.key(x)
    assert cache.key(x.view(96, 64)) == k == cache.key(x.reshape(-1)) == cache.key(x.unsqueeze(0)) \
        == cache.key(x.view(8, 8, 96).detach())
    assert cache.key(x.t()) != k  # the same values in another order
    assert cache.key(x[:32]) != k and cache.key(x[1:]) != k  # fewer values, another address
    assert cache.key(x.double()) != k
    s = torch.tensor(-2.0)
    assert cache.key(s) != cache.key(s.view(1))  # a 0-d tensor's figures are its value: Norm -2, not 2


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_a_view_found_in_the_cache_has_the_figures_read_from_it(threads, summary):
    """The cache's premise: a contiguous tensor's statistics and checksum are those of its memory in order, whatever
    its shape. Each value holds a tensor and views of it in other shapes: with the cache, read once and found; its
    JSON text equals that of an encoder without the cache, which reads every view."""
    from .test_encode_fast import _encoder, _text

    enc = _encoder(summary_mode=summary)
    ref = _encoder(summary_mode=summary, stat_cache=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(7)
        for n in (4104, 65_544, 300_024):  # above the C path's 4,096 elements; past torch's split of its sum
            base = torch.randn(n, generator=gen) * 1e3 - 3.0
            for dtype in _DTYPES:
                x = base.to(dtype) if dtype is not torch.bool else base > 0
                value = [x.view(-1, 24), x.view(3, -1, 8), x, x.view(-1, 24)]
                hits = enc.cache.hits
                assert _text(enc, value, True) == _text(ref, value, False), (n, dtype)
                assert enc.cache.hits - hits == 3, (n, dtype)
        for dtype in (torch.float64, torch.bfloat16):  # a 0-d tensor and its one-element view differ in Norm
            s = torch.tensor(-2.5, dtype=dtype)
            assert _text(enc, [s, s.view(1)], True) == _text(ref, [s, s.view(1)], False)
    finally:
        torch.set_num_threads(before)


def test_a_views_tensor_file_holds_its_own_shape(tmp_path):
    """task "tensor": an output saved a moment ago is linked as the next API's input, but only in the same shape."""
    script = PREAMBLE + """
cfg_path = sys.argv[1] + ".json"
json.dump({"dump_path": sys.argv[1], "level": "L1", "task": "tensor"}, open(cfg_path, "w"))
debugger = PrecisionDebugger(config_path=cfg_path)
debugger.start()
y = torch.exp(torch.randn(64, 96))
torch.relu(y.view(96, 64))   # the exp output's memory in another shape
torch.relu(y)                # in its own
debugger.stop(); debugger.step()
"""
    import os

    from util import rank_dir

    run_py(script, str(tmp_path), args=("d",))
    data = load_dump(str(tmp_path / "d"))["data"]
    names = [data["Torch.exp.0.forward"]["output"][0]["data_name"],
             data["Torch.relu.0.forward"]["input_args"][0]["data_name"],
             data["Torch.relu.1.forward"]["input_args"][0]["data_name"]]
    tdir = os.path.join(rank_dir(str(tmp_path / "d")), "dump_tensor_data")
    got = [torch.load(os.path.join(tdir, n), weights_only=True) for n in names]
    assert [tuple(t.shape) for t in got] == [(64, 96), (96, 64), (64, 96)]
    assert torch.equal(got[1].reshape(64, 96), got[0]) and torch.equal(got[2], got[0])


@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_a_lazy_negative_or_conjugate_view_is_not_its_bases_entry(summary):
    """torch._neg_view and conj() share the base's memory, shape and version counter; their values differ."""
    from .test_encode_fast import _encoder, _text

    enc = _encoder(summary_mode=summary)
    ref = _encoder(summary_mode=summary, stat_cache=False)
    x = torch.randn(64, 96).abs() + 1.0
    z = torch.randn(64, 96, dtype=torch.complex64)
    for value in ([x, torch._neg_view(x), x], [torch._neg_view(x), x], [z, z.conj(), z.conj().imag, z.imag]):
        assert _text(enc, value, True) == _text(ref, value, False)
