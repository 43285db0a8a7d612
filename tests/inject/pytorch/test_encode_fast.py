"""The encoder's shortcuts (pytorch/encode.py) against its definitions, bit for bit: _fastats.entries, its C path for a
value's small CPU float32 tensors and scalars, against the Python encoder; an expanded tensor's statistics computed
once per value and shape against computing them each time."""

from __future__ import annotations

import enum
import json
import random
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

from msprobe_inject.config import DumpConfig
from msprobe_inject.dumpformat.entry import Entry, plain
from msprobe_inject.entries import Pending
from msprobe_inject.pytorch import encode

pytestmark = pytest.mark.skipif(encode._fast_entries is None or not encode.use_fast_entries(),
                                reason="the statistics kernel is not built here")


class _Writer:
    def __init__(self) -> None:
        self.errors: list = []

    def log_error(self, message, *a, **k) -> None:
        self.errors.append(message)


def _encoder(**settings) -> encode.Encoder:
    cfg = DumpConfig(dump_path="unused", **settings)
    return encode.Encoder(cfg, lambda: "unused", _Writer())


def _text(enc: encode.Encoder, value, fast: bool) -> str:
    saved = enc._entries
    if not fast:
        enc._entries = None
    try:
        pending = Pending()
        out = enc.encode(value, pending, None)
        rest = encode.resolve_host(pending)
        assert not rest, rest
        return json.dumps(out, default=plain)  # an entry of C values as the dict it stands for
    finally:
        enc._entries = saved


class Color(enum.IntEnum):
    RED = 1


class Sub(torch.Tensor):
    pass


def _large(rng: random.Random) -> torch.Tensor:
    """A tensor above the C path's small size: plain at an odd offset, permuted, or holding a NaN/Inf."""
    n = rng.choice([4112, 32767, 32771, 131071, 131075, 262147, rng.randint(4112, 400_000)])  # above 4,096 as cut
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    t = torch.randn(n + 3, generator=gen) * 10.0 ** rng.randint(-6, 6)
    kind = rng.randrange(4)
    if kind == 1:
        return t[:12 * (n // 12)].view(-1, 3, 4).permute(2, 0, 1)  # dense in another order
    if kind == 2:
        t[rng.randrange(n)] = rng.choice([float("nan"), float("inf")])
    if kind == 3:
        return torch.nn.Parameter(t[:n])
    return t[rng.randrange(4):][:n - 3]


def _tensor(rng: random.Random, large: bool = False) -> torch.Tensor:
    kind = rng.randrange(15 if large else 14)
    if kind == 14:
        return _large(rng)
    shape = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
    scale = 10.0 ** rng.randint(-6, 6)
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) * scale
    if kind == 0:
        return torch.tensor(rng.uniform(-5, 5))  # 0-d
    if kind == 1 and t.dim() >= 2:
        return t.transpose(0, 1)  # dense in another order
    if kind == 2 and t.dim() >= 3:
        return t.permute(*reversed(range(t.dim())))
    if kind == 3:
        return t[..., ::2]  # a slice: dense in no order
    if kind == 4:
        return torch.tensor(rng.choice([1.0, -0.0, 0.1])).expand(*shape)  # a broadcast
    if kind == 5:
        t = t.flatten().clone()
        t[rng.randrange(t.numel())] = rng.choice([float("nan"), float("inf"), -float("inf")])
        return t
    if kind == 6:
        return t.to(rng.choice([torch.float16, torch.float64, torch.bfloat16, torch.int64, torch.bool]))
    if kind == 7:
        return torch.nn.Parameter(t)
    if kind == 8:
        return t.requires_grad_()
    if kind == 9:
        return torch.randn(rng.randint(4000, 4200))  # around the size the C path takes
    if kind == 10:
        return torch._neg_view(t)
    if kind == 11:
        return torch.empty(0, 3)
    if kind == 12:
        return t.as_subclass(Sub)
    if kind == 13:
        return torch.tensor(float("nan"))
    return t


def _leaf(rng: random.Random, large: bool = False):
    kind = rng.randrange(12)
    if kind < 6:
        return _tensor(rng, large)
    return [None, True, 7, -2.5, "s", Color.RED][kind - 6]


def _value(rng: random.Random, large: bool = False):
    n = rng.randint(0, 5)
    kind = rng.randrange(4)
    if kind == 0:
        return [_leaf(rng, large) if rng.random() < 0.9 else [_leaf(rng, large), _leaf(rng)] for _ in range(n)]
    if kind == 1:
        return tuple(_leaf(rng, large) for _ in range(n))
    if kind == 2:
        keys = ["x", "alpha", "device", "dtype", "out"]
        d = {rng.choice(keys): _leaf(rng, large) for _ in range(n)}
        if rng.random() < 0.3:
            d["device"] = rng.choice([0, "cpu", 1.5])
        if rng.random() < 0.2:
            d["dtype"] = torch.float16
        return d
    return {3: _leaf(rng, large)} if n else _leaf(rng, large)  # a non-str key; a bare leaf


@pytest.mark.parametrize("summary", ["statistics", "md5", "xor"])
@pytest.mark.parametrize("seed", range(4))
def test_the_c_entries_are_the_python_encoders_bit_for_bit(seed, summary):
    enc = _encoder(summary_mode=summary)
    rng = random.Random(seed)
    for i in range(300):
        value = _value(rng)
        assert _text(enc, value, True) == _text(enc, value, False), (seed, i, value)


@pytest.mark.parametrize("seed", range(4))
def test_the_monitor_presets_entries_hold_the_norm_alone_the_same_in_c_as_in_python(seed):
    enc = _encoder(preset="monitor", level="L0")
    full = _encoder(data_mode=["output"])
    assert enc.norm_only and enc._entry_mode == 3 and not full.norm_only
    assert not _encoder(preset="monitor", level="L0", precision="high").norm_only  # msprobe writes no Norm then
    rng = random.Random(100 + seed)
    for i in range(200):
        value = _value(rng, large=rng.random() < 0.2)
        got = _text(enc, value, True)
        assert got == _text(enc, value, False), (seed, i, value)
        # beside each full entry, the monitor's: its Norm, bit for bit, and nothing else
        mine, theirs = json.loads(got), json.loads(_text(full, value, True))
        stack = [(mine, theirs)]
        while stack:
            m, t = stack.pop()
            if isinstance(m, dict) and "Norm" in m:
                assert m["Max"] is None and m["Min"] is None and m["Mean"] is None, m
                want = t["Norm"] if "int" not in t["dtype"] and "bool" not in t["dtype"] else None
                assert m["Norm"] == want or (m["Norm"] != m["Norm"] and want != want), (m, t)
                assert {k: v for k, v in m.items() if k not in ("Max", "Min", "Mean")} == \
                    {k: v for k, v in t.items() if k not in ("Max", "Min", "Mean", "Norm")} | {"Norm": m["Norm"]}
            elif isinstance(m, dict):
                stack.extend((m[k], t[k]) for k in m)
            elif isinstance(m, list):
                stack.extend(zip(m, t))


def test_the_c_call_reads_a_large_tensors_norm_alone_on_any_thread_count():
    big = torch.randn(300_001)[1:]  # at an odd address
    full = encode._fast_entries([big], lambda *a: "python", [], 0, 2)[0]
    encode._share_reads()  # torch's team, as an encoder sets it up: above 32,768 elements the read is shared
    for threads in (0, 1, 2, 3, 8):
        got = encode._fast_entries([big, big.view(-1, 20).t()], lambda *a: "python", [], 3, threads)
        assert got[0] == got[1] | {"shape": [300_000]} and got[0]["Norm"] == full["Norm"], got
        assert (got[0]["Max"], got[0]["Min"], got[0]["Mean"]) == (None, None, None)


@pytest.mark.parametrize("summary", ["statistics", "md5", "xor"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_without_the_cache_large_tensors_take_the_c_path_with_the_python_encoders_bits(threads, summary):
    # outputs only: no statistics cache, so the C call reads large tensors too, split over torch's threads
    enc = _encoder(summary_mode=summary, data_mode=["output"])
    assert not enc.use_cache and enc._large == (summary != "xor" and encode._mean_fused)
    rng = random.Random(threads * 7 + len(summary))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i in range(60):
            value = _value(rng, large=True)
            assert _text(enc, value, True) == _text(enc, value, False), (threads, i)
            t = _large(rng)
            if t.is_contiguous() or summary == "statistics":
                fast = enc.tensor(t, Pending(), None)
                assert fast == enc._tensor_entry(t, Pending(), None), (threads, i, t.shape)
    finally:
        torch.set_num_threads(before)


def test_large_tensors_are_read_in_c_only_when_the_encoder_passes_the_thread_count():
    big = torch.randn(300_001)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = encode._fast_entries([big], lambda *a: "python", [], 0, threads)[0]
            assert got != "python" and got["Mean"] == big.mean().item() and got["Max"] == big.max().item()
    finally:
        torch.set_num_threads(before)
    assert encode._fast_entries([big], lambda *a: "python", [], 0) == ["python"]  # no thread count: the Python's
    assert encode._fast_entries([big], lambda *a: "python", [], 2, 2) == ["python"]  # xor: xor_hex
    crc = encode._fast_entries([big], None, [], 1, 2)[0]["md5"]
    assert crc == encode.crc32_hex(big)
    cache = encode.StatCache()  # with the cache: read once, then looked up, in C
    got = encode._fast_entries([big, big, big.t()], lambda *a: "python", [], 1, torch.get_num_threads(), cache)
    assert "python" not in got and got[0] == got[1] == got[2] and got[0]["md5"] == crc
    assert (cache.misses, cache.hits, cache.bytes_reduced) == (1, 2, 4 * big.numel()) and len(cache.entries) == 1
    with pytest.raises(ValueError):
        encode._fast_entries([big], None, [], 0, -1)


def test_the_ctx_form_asks_the_thread_count_only_of_a_tensor_whose_figures_depend_on_it():
    """entries(ctx, value, pending) is entries(value, *ctx) with pending in its place, torch's thread count given as
    a function the C calls for a tensor from the grain up (or above the small size) and for no other."""
    if not encode._mean_fused:
        pytest.skip("the C call does not take large tensors here (torch's split mean not reproduced)")
    asked: list = []

    def threads() -> int:
        asked.append(1)
        return torch.get_num_threads()

    def python(*_a):
        return "python"

    small, big = torch.randn(4, 4), torch.randn(300_001)[1:]
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for mode in (0, 1, 3):
                for cache in (None, encode.StatCache()):
                    asked.clear()
                    value = [small, 0.5, {"k": small}]
                    got = encode._fast_entries((python, mode, threads, cache), value, Pending())
                    assert got == encode._fast_entries(value, python, Pending(), mode, n, cache) and asked == []
                    value = [small, big, big.view(-1, 20)]
                    got = encode._fast_entries((python, mode, threads, cache), value, Pending())
                    want = encode._fast_entries(value, python, Pending(), mode, n, None)
                    assert got == want and "python" not in got and len(asked) == 2  # once per large tensor
    finally:
        torch.set_num_threads(before)
    assert encode._fast_entries((python, 0, 0, None), [big], Pending()) == ["python"]  # no thread count: Python's

    def broken() -> int:
        raise RuntimeError("no thread count")

    assert encode._fast_entries((python, 0, broken, None), [small, big], Pending())[1] == "python"  # declined
    assert encode._fast_entries((python, 0, lambda: 0, None), [big], Pending()) == ["python"]
    with pytest.raises(TypeError):
        encode._fast_entries((python, 0, "2", None), [big], Pending())


def test_the_cache_is_kept_where_records_hold_inputs():
    assert _encoder().use_cache and _encoder()._large == encode._mean_fused
    assert not _encoder(data_mode=["output"]).use_cache
    assert not _encoder(preset="monitor", level="L0").use_cache
    assert not _encoder(stat_cache=False).use_cache


@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_large_tensors_read_in_c_share_the_statistics_cache_with_the_python_encoder(summary):
    if not encode._mean_fused:
        pytest.skip("f32_mean does not reproduce torch.mean here")
    enc = _encoder(summary_mode=summary)
    ref = _encoder(summary_mode=summary, stat_cache=False)
    rng = random.Random(11)
    for i in range(40):
        ts = [_large(rng) for _ in range(3)]
        if summary == "md5":  # a checksum reads only contiguous tensors in C
            ts = [t if t.is_contiguous() else t.contiguous() for t in ts]
        value = [ts[j] for j in (0, 1, 0, 2, 1, 0)]  # the repeats from the cache
        hits = enc.cache.hits
        assert _text(enc, value, True) == _text(ref, value, False), i
        finite = [t for t in ts if bool(torch.isfinite(t).all())]  # non-finite ones are the Python encoder's
        assert enc.cache.hits - hits >= len(value) - len(ts) - 3 * (len(ts) - len(finite)), i
        for t in finite:  # found by the Python encoder (a dict with a non-str key is its value)
            hits = enc.cache.hits
            assert _text(enc, {3: t}, True) == _text(ref, {3: t}, False) and enc.cache.hits == hits + 1, i
    t = torch.randn(50_000)
    first = enc.tensor(t, Pending(), None)
    second = enc.tensor(t, Pending(), None)
    assert second == first and type(first) is type(second) is Entry  # read, then the cache's hit: C values both
    with torch.no_grad():
        t.mul_(2.0)  # a new version: read again
    again = enc.tensor(t, Pending(), None)
    assert again["Max"] == first["Max"] * 2 and again == ref.tensor(t, Pending(), None)


def test_the_c_path_encodes_the_common_values_itself():
    # the comparison above would hold vacuously if every value went to the Python encoder
    t = torch.randn(4, 4)
    calls = []
    got = encode._fast_entries([t, 0.5, None, torch.tensor(2.0), t.t()], lambda *a: calls.append(a), [], 0)
    assert calls == [] and [e["type"] if e else None for e in got] == ["torch.Tensor", "float", None,
                                                                      "torch.Tensor", "torch.Tensor"]
    assert got[0]["Mean"] == t.mean().item() and got[0]["Max"] == t.max().item()
    assert got[3] == {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [], "Max": 2.0, "Min": 2.0,
                      "Mean": 2.0, "Norm": 2.0, "requires_grad": False}
    broadcast = torch.tensor(1.0).expand(3, 3)
    got = encode._fast_entries({"a": broadcast, "device": 0}, lambda v, k, p, top: ("fallback", k), [], 0)
    assert got == {"a": ("fallback", "a"), "device": ("fallback", "device")}


def test_the_structure_task_and_high_precision_keep_the_python_encoder():
    for mode in ("statistics", "md5", "xor"):
        assert _encoder(summary_mode=mode)._entries is not None
    for settings in ({"task": "structure"}, {"precision": "high"}):
        assert _encoder(**settings)._entries is None, settings


def test_the_checksum_modes_read_a_tensors_bytes_in_its_own_order_in_c():
    """md5 and xor of a transpose, a permutation or a broadcast (a backward's gradients: a weight's transpose, the
    expanded gradient of a sum), up to the C path's size, are checksums of the contiguous copy's bytes, without the
    Python encoder; a 0-d tensor's CRC too. A slice dense in no order and a larger such tensor stay Python's."""
    t = torch.randn(3, 5)
    crc = encode._fast_entries([t], None, [], 1)[0]["md5"]
    assert crc == encode.crc32_hex(t) and encode._fast_entries([t], None, [], 2)[0]["md5"] == encode.xor_hex(t)
    bits = torch.arange(60, dtype=torch.int32).view(torch.float32)  # +0.0 and subnormals: distinct bit patterns
    broadcasts = [torch.tensor(0.1).expand(3, 4), torch.tensor(-0.0).expand(5, 1, 2)]
    _encoder(summary_mode="md5").encode(broadcasts, Pending(), None)  # md5: the figures the Python encoder keeps
    cases = [t.t(), torch.randn(2, 3, 4).permute(2, 0, 1), bits.view(3, 4, 5).transpose(0, 2), *broadcasts,
             torch.tensor(2.5), torch.tensor(float("nan"))]
    fell_back: list = []

    def fallback(*args):
        fell_back.append(args)

    for case in cases:
        assert not case.is_contiguous() or case.dim() == 0
        md5 = encode._fast_entries([case], fallback, [], 1)[0]
        xor = encode._fast_entries([case], fallback, [], 2)[0]
        assert fell_back == [] and md5["md5"] == encode.crc32_hex(case), case.shape
        assert case.dim() == 0 or xor["md5"] == encode.xor_hex(case)  # a 0-d tensor's is its value
        assert json.dumps([md5], default=plain) == _text(_encoder(summary_mode="md5"), [case], False)
        assert json.dumps([xor], default=plain) == _text(_encoder(summary_mode="xor"), [case], False)
    nan = bits.view(3, 4, 5).transpose(0, 2)
    before = encode._fast_entries([nan], None, [], 2)[0]["md5"]
    bits[7] = torch.tensor(0x7FC01234, dtype=torch.int32).view(torch.float32)  # a NaN: its payload is checksummed
    assert encode._fast_entries([nan], None, [], 2)[0]["md5"] == encode.xor_hex(nan) != before
    assert encode._fast_entries([nan], lambda *a: "python", [], 1) == ["python"]  # md5: torch's figures of a NaN
    unknown = torch.tensor(0.3).expand(4, 4)  # a broadcast whose figures are not known yet: Python computes them
    assert encode._fast_entries([unknown], lambda *a: "python", [], 1) == ["python"]
    edge = torch.randn(64, 64).t()  # 4,096 elements: the C path's largest
    assert json.dumps(encode._fast_entries([edge], fallback, [], 1, 2)) == _text(_encoder(summary_mode="md5"), [edge],
                                                                                  False) and fell_back == []
    for case in (torch.randn(4, 6)[:, ::2], torch.randn(80, 60).t()):  # dense in no order; above 4,096 elements
        # with torch's thread count, which lets a large contiguous tensor's md5 through (xor takes none that large)
        for mode in (1, 2):
            assert encode._fast_entries([case], lambda *a: "python", [], mode, 2) == ["python"]
    assert encode._fast_entries([torch.randn(80, 60)], lambda *a: "python", [], 1, 2)[0]["md5"] is not None


def test_under_a_users_torch_function_mode_the_entries_stay_the_same():
    enc = _encoder()
    seen = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    value = [torch.randn(3, 5), torch.randn(5, 3).t(), 2]
    plain = _text(enc, value, False)
    with Watch():
        assert _text(enc, value, True) == plain


def test_a_value_changed_by_a_fallback_midway_is_still_encoded_without_harm():
    enc = _encoder()
    value: list = []

    class Shrinking(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            value.clear()  # a subclass's handler runs Python code while the C loop holds the list
            return super().__torch_function__(func, types, args, kwargs or {})

    value.extend([torch.randn(2), torch.randn(3).as_subclass(Shrinking), torch.randn(4), torch.randn(5)])
    out = enc.encode(value, Pending(), None)
    assert isinstance(out, list) and len(out) == 2 and out[0]["shape"] == [2]


def test_an_expanded_tensors_statistics_are_those_of_its_own_reduction():
    before = torch.get_num_threads()
    encode._CONSTANTS.clear()
    rng = random.Random(5)
    try:
        for i in range(120):
            torch.set_num_threads(1 + i % 2)  # from torch's grain up, its mean depends on its thread count
            v = rng.choice([1.0, -0.0, 0.0, 1 / 3, -2.5e-7, 0.1, rng.uniform(-1e4, 1e4)])
            shape = rng.choice([(4, 4), (3,), (7, 1, 5), (300, 300), (40000,), (2, 3, 4)])
            base = torch.tensor(v).expand(*shape)
            for t in (base, torch.full((1,), v)[0].expand(*shape)):  # another storage, the same value
                got = encode.stat_of(t, False)
                assert got[1] is encode.READY
                mx, mn, mean, norm = got[0]  # repr: -0.0 is not 0.0 in a dump
                assert repr((mx, mn, mean)) == repr((t.max().item(), t.min().item(), t.mean().item())), (v, shape, i)
                assert repr(got) == repr(encode._f32_strided(t)), (v, shape)  # what it was before the lookup
        assert 0 < len(encode._CONSTANTS) <= 256
    finally:
        torch.set_num_threads(before)


def test_the_device_norms_the_fallback_queues_are_taken_outside_autograd_even_when_it_raises(monkeypatch):
    # a device float tensor's norm is computed when its value is encoded (_finish_norms), outside autograd, whichever
    # path encoded the value, and also when encoding an item after it raised
    real = encode.stat_of

    def device_like(t, high, norm_only=False):  # float64 stands in for a device tensor: the C path hands it on
        if t.dtype is torch.float64:
            return [t.max(), t.min(), t.mean(), None, t], "f"
        return real(t, high, norm_only)

    class Broken(tuple):  # a namedtuple-like container whose fields cannot be read
        _fields = ("a",)

        def __getattr__(self, name):
            raise RuntimeError("unreadable")

    monkeypatch.setattr(encode, "stat_of", device_like)
    for fast in (True, False):
        for tail in ([], [Broken((1,))]):
            enc = _encoder()
            enc._devices = True
            if not fast:
                enc._entries = None
            pending = Pending()
            value = [torch.randn(3), torch.randn(3, dtype=torch.float64, requires_grad=True), *tail]
            try:
                enc.encode(value, pending, None)
            except RuntimeError:
                assert tail
            figures = [item[1] for item in pending if type(item[1]) is list]
            assert len(figures) == 1 and len(figures[0]) == 4, (fast, tail)  # the norm taken, the tensor let go
            assert figures[0][3] is not None and not figures[0][3].requires_grad, (fast, tail)
            assert torch.is_grad_enabled()


@pytest.mark.parametrize("summary", ["statistics", "md5", "xor"])
def test_the_garbage_collector_does_not_follow_the_c_paths_entries_or_the_cache(summary):
    """A record's body waits for the writer thread, and the statistics cache lives for the step: followed by the
    collector, they were promoted to its older generations, whose growth sets off full collections of the whole
    process. What the C call builds holds atomic values only, and is not followed; a dict the caller puts a
    container into is followed again (the dict's own rule)."""
    import gc

    enc = _encoder(summary_mode=summary)
    big = torch.randn(50_000 if summary != "xor" else 4_000)  # the xor of a large tensor is the Python encoder's
    scalar = [torch.tensor(2.0)] if summary != "md5" else []  # a 0-d tensor's md5 is the Python encoder's
    value = [torch.randn(4, 4), 0.5, "s", None, *scalar, big, big]
    out = enc.encode(value, Pending(), None)
    tensors = [e for e in out if e and e["type"] == "torch.Tensor"]
    assert len(tensors) == 3 + len(scalar) and enc._entries is not None
    assert not gc.is_tracked(out)
    for e in out:
        assert not gc.is_tracked(e), e
    assert not any(gc.is_tracked(e["shape"]) for e in tensors if type(e) is dict)  # an entry of C values holds no list
    kwargs = enc.encode({"a": torch.randn(3), "b": 1}, Pending(), None)
    assert not gc.is_tracked(kwargs) and not gc.is_tracked(kwargs["a"])
    if enc.use_cache and enc._large and summary != "xor":
        assert enc.cache.entries and not any(gc.is_tracked(v) or gc.is_tracked(v[0]) or gc.is_tracked(v[1])
                                             for v in enc.cache.entries.values())
        assert enc.cache.entries[next(iter(enc.cache.entries))][0]() is not None  # the weak reference still works
    out[1]["extra"] = [1]  # the float's entry, a dict (a tensor's is C values, read-only and never followed)
    assert gc.is_tracked(out[1])


@pytest.mark.parametrize("summary,task", [("statistics", "statistics"), ("md5", "statistics"), ("xor", "statistics"),
                                          ("statistics", "structure")])
def test_the_garbage_collector_does_not_follow_the_python_encoders_entries_either(summary, task):
    """What the C call does not take (other dtypes; on an accelerator, every tensor) the Python encoder encodes: its
    entries, their shapes and a value's list or dict of them are left untracked as the C call's are (at L1 on the
    GPT-2 step of overhead.py, the Python encoder alone: the collector's time per step 4.6 -> 2.4 ms). A dict given
    something tracked is followed again, and so is an entry holding it (a subclass's placements)."""
    import gc

    enc = _encoder(summary_mode=summary, task=task)
    enc._entries = None  # every value through the Python encoder
    tensors = [torch.randn(3, 2, dtype=torch.bfloat16), torch.arange(6), torch.tensor([True, False]),
               torch.randn(4, dtype=torch.float16), torch.randn(2, 2)]
    pending = Pending()
    out = enc.encode([*tensors, 0.5, None, "s"], pending, None)
    encode.resolve_host(pending)
    assert [e["dtype"] for e in out[:5]] == ["torch.bfloat16", "torch.int64", "torch.bool", "torch.float16",
                                            "torch.float32"]
    assert not gc.is_tracked(out)
    for e in out:
        assert not gc.is_tracked(e), e
    assert not any(gc.is_tracked(e["shape"]) for e in out[:5])
    if task == "statistics":  # the figures the writer fills in keep it so
        assert all(e.get("Max") is not None or e.get("md5") is not None for e in out[:5])
    kwargs = enc.encode({"x": tensors[0], "n": 2}, Pending(), None)
    assert not gc.is_tracked(kwargs) and not gc.is_tracked(kwargs["x"])
    nested = enc.encode([[tensors[1]], {"k": (tensors[2],)}], Pending(), None)
    assert not gc.is_tracked(nested) and not gc.is_tracked(nested[0]) and not gc.is_tracked(nested[1])
    out[0]["placements"] = [{"Shard": 0}]
    assert gc.is_tracked(out[0])
    mixed = enc.encode([tensors[0], object()], Pending(), None)  # an object the encoder writes as null
    assert not gc.is_tracked(mixed)


needs_meta = pytest.mark.skipif(getattr(encode._native, "tensor_meta", None) is None,
                                reason="the C++ node hooks are not built (conftest.py)")


def _entries_text(enc: encode.Encoder, value, meta: bool) -> str:
    """The C call's entries with the tensors' metadata read from their TensorImpl (meta) or through torch's getters;
    what it leaves to the Python encoder is marked, not encoded, so that a tensor either read declines shows."""
    encode.use_tensor_meta(meta)
    try:
        pending = Pending()
        out = encode._fast_entries(value, lambda v, key, pending, top: "python's", pending, enc._entry_mode,
                                   torch.get_num_threads(), None)
        return repr(out)
    finally:
        encode.use_tensor_meta(True)


def _odd_tensors() -> list:
    """Tensors whose metadata Python's getters answer otherwise than a plain one's, or refuse."""
    base = torch.randn(6, 5)
    # non-contiguous: a transpose at an offset, permutations of 3 and 4 dimensions (dense; one with a dimension of
    # size 1), a slice no permutation makes dense, broadcasts of one value and of a row, a permutation of 9 dimensions
    cube = torch.randn(3, 4, 5)
    out = [base[1:].t(), cube.permute(2, 0, 1), torch.randn(2, 3, 1, 4).permute(3, 1, 0, 2), cube.transpose(0, 2)[1:],
           torch.tensor(0.5).expand(4, 3), torch.randn(1, 5).expand(3, 5),
           torch.randn([2] * 9).permute(*range(8, -1, -1))]
    # the first two contiguous at an offset into their storage
    out += [base[1:], base[2], base[1:, 2:], base.t(), base[::2],
           torch._neg_view(base), torch.empty(0), torch.randn(()),
           torch.randn(3, device="meta"), base.to(torch.float64), base.to_sparse(), torch.nn.Parameter(base.clone()),
           base.clone().requires_grad_()]
    with torch.inference_mode():
        out.append(torch.randn(4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors' prototype warning
        out.append(torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]))
    lazy = torch.randn(5, 5)
    out.append(torch._lazy_clone(lazy) if hasattr(torch, "_lazy_clone") else lazy)
    return out


@needs_meta
@pytest.mark.parametrize("summary", ["statistics", "md5", "xor"])
@pytest.mark.parametrize("seed", range(3))
def test_a_tensors_metadata_read_in_cxx_gives_the_entries_torchs_getters_give(seed, summary):
    enc = _encoder(summary_mode=summary)
    assert enc._entries is not None
    rng = random.Random(seed)
    values = [[t] for t in _odd_tensors()] + [_value(rng, large=True) for _ in range(200)]
    for i, value in enumerate(values):
        assert _entries_text(enc, value, True) == _entries_text(enc, value, False), (seed, i, value)


@needs_meta
def test_the_cxx_read_declines_functorchs_wrappers_as_the_getters_do_and_reads_a_dispatch_modes_tensors():
    from torch.utils._python_dispatch import TorchDispatchMode

    enc = _encoder()
    seen = []

    def f(x):
        seen.append((_entries_text(enc, [x], True), _entries_text(enc, [x], False)))
        return (x * x).sum()

    torch.func.grad(f)(torch.randn(3))
    torch.vmap(lambda x: f(x))(torch.randn(2, 3))
    torch.func.functionalize(f)(torch.randn(3))

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Through():
        y = torch.randn(3)
        seen.append((_entries_text(enc, [y], True), _entries_text(enc, [y], False)))
    assert len(seen) == 4  # grad's wrapper, vmap's batched tensor, a functional wrapper, the mode's tensor
    for ours, getters in seen:
        assert ours == getters


@needs_meta
def test_the_cxx_read_is_installed_where_the_hooks_are_loaded():
    assert encode.use_fast_entries()
    assert encode.use_tensor_meta(True) is True
    assert encode.use_tensor_meta(False) is False
    assert encode.use_tensor_meta(True) is True


@pytest.mark.parametrize("monitor", [False, True])
def test_a_broadcast_tensors_entry_is_the_c_calls_once_its_figures_are_known(monitor):
    enc = _encoder(preset="monitor", level="L0") if monitor else _encoder()
    before = torch.get_num_threads()
    encode._CONSTANTS.clear()
    rng = random.Random(7)
    try:
        for i in range(60):
            torch.set_num_threads(1 + i % 2)  # from torch's grain up the figures depend on the thread count
            v = rng.choice([1.0, -0.0, 0.0, 1 / 3, -2.5e-7, rng.uniform(-1e4, 1e4)])
            shape = rng.choice([(4, 4), (3,), (7, 1, 5), (40000,), (2, 3, 4)])
            t = torch.tensor(v).expand(*shape)
            fallbacks: list = []

            def fallback(x, key, pending, top, seen=fallbacks):
                seen.append(key)
                return enc._item(x, key, pending, top)

            texts = []
            for _ in range(2):
                out = encode._fast_entries([t], fallback, Pending(), enc._entry_mode, torch.get_num_threads(), None)
                texts.append(json.dumps(out, default=plain))
                if not texts[1:]:
                    first = len(fallbacks)
            # the first sight of a value and shape may compute its figures in Python; after it, none
            assert len(fallbacks) == first <= 1, (v, shape, i)
            assert texts[0] == texts[1] == _text(enc, [t], False), (v, shape, i)  # -0.0 and 0.0 apart
            # the same entry as C values (the encoder's own calls ask for those), from the same known figures
            held = encode._fast_entries([t], fallback, Pending(), enc._entry_mode | encode._COMPACT,
                                        torch.get_num_threads(), None)
            assert type(held[0]) is Entry and json.dumps(held, default=plain) == texts[0], (v, shape, i)
        nan = torch.tensor(float("nan")).expand(3, 3)
        calls: list = []
        encode._fast_entries([nan], lambda *a: calls.append(1) or enc._item(*a), Pending(), enc._entry_mode, 1, None)
        encode._fast_entries([nan], lambda *a: calls.append(1) or enc._item(*a), Pending(), enc._entry_mode, 1, None)
        assert calls == [1, 1]  # a NaN is torch's, every time
    finally:
        torch.set_num_threads(before)
