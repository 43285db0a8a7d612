"""The statistics cache gives exactly the numbers a run without it gives: after in-place updates,
for views and aliases, for tensors re-used across APIs and for memory freed and re-allocated."""

from __future__ import annotations

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
