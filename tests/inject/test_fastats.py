"""The one-pass C statistics kernel gives torch's numbers: max and min exactly, the mean from torch's
own sum, the norm within float32 rounding of the float64 value; NaN/Inf keep torch's semantics.
Its CRC-32 (the md5 summary mode) is zlib.crc32 of the raw bytes."""

from __future__ import annotations

import math
import os
import shutil
import signal
import struct
import sys
import time
import zlib

import pytest
import torch

from msprobe_inject.pytorch import encode


def _stats(t: torch.Tensor) -> list:
    """The four statistics as the writer would write them, whichever path computed them."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):  # the encoder reduces a subclass through a plain view
        t = encode.local_view(t)[0]
    stat, kind = encode.stat_of(t, False)
    entry: dict = {}
    if kind is encode.READY:
        entry["Max"], entry["Min"], entry["Mean"], entry["Norm"] = stat
    else:
        encode.resolve([(entry, stat, kind)])
    return [entry["Max"], entry["Min"], entry["Mean"], entry["Norm"]]


# the kernel carries the squares in double; torch's float32 dot (the fallback) drifts by ~1e-6 on 1M elements
NORM_TOL = 2e-7 if encode._fast_f32 is not None else 2e-5


def _reference(t: torch.Tensor) -> list:
    d = t.double()
    return [t.max().item(), t.min().item(), t.mean().item(), d.norm().item()]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_kernel_is_built_where_a_compiler_exists():
    assert encode._fast_f32 is not None, "msprobe_inject._fastats was not built"


@pytest.mark.parametrize("n", [1, 15, 16, 17, 2047, 2048, 2049, 65535, 65536 + 5, (1 << 20) + 3])
def test_kernel_matches_torch(n):
    torch.manual_seed(n)
    t = torch.randn(n) * 3 + 0.5
    got = _stats(t)
    ref = _reference(t)
    assert got[:3] == ref[:3]  # max, min exact; mean torch.mean's, as msprobe's
    assert math.isclose(got[3], ref[3], rel_tol=NORM_TOL)
    if encode._fast_f32 is not None:
        assert encode.stat_of(t, False)[1] is encode.READY


def test_views_with_an_offset_and_permuted_tensors():
    base = torch.randn(64, 33)
    for view in (base[3:], base[5, 2:], base.t(), base[:, 1:4].t().contiguous()):
        got = _stats(view)
        ref = _reference(view.contiguous())
        assert got[:2] == ref[:2]
        assert math.isclose(got[2], ref[2], rel_tol=1e-5, abs_tol=1e-7)
        assert math.isclose(got[3], ref[3], rel_tol=NORM_TOL)


@pytest.mark.parametrize("make", [
    lambda: torch.tensor(0.1).expand(4, 4),  # the gradient of a sum: one value broadcast
    lambda: torch.randn(8, 10)[:, 2:7],  # a slice
    lambda: torch.randn(5, 6, 7).transpose(0, 2)[1:],  # no permutation makes it dense
    lambda: torch.randn(3000, 7)[:, 1],  # a column
])
def test_strided_float_tensors_keep_torchs_mean_through_a_contiguous_copy(make):
    """A view no permutation makes dense: max, min and norm over a contiguous copy (the kernel, when built); the
    mean still torch.mean over the view itself, as on torch's path."""
    t = make()
    got = _stats(t)
    assert got[:3] == [t.max().item(), t.min().item(), t.mean().item()]
    assert math.isclose(got[3], t.double().norm().item(), rel_tol=NORM_TOL)
    if encode._fast_f32 is not None:
        assert encode.stat_of(t, False)[1] is encode.READY


def test_a_strided_float_tensor_with_nan_follows_torch():
    base = torch.randn(8, 10)
    base[3, 4] = float("nan")
    got = _stats(base[:, 2:7])
    assert all(math.isnan(v) for v in got), got


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_follow_torch(bad):
    t = torch.randn(5000)
    t[1234] = bad
    got = _stats(t)
    mn, mx = torch.aminmax(t)
    want = [mx.item(), mn.item(), t.mean().item(), torch.dot(t, t).sqrt().item()]
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == w, (got, want)


def test_overflowing_squares_fall_back_to_torch():
    t = torch.full((4096,), 3e30)
    got = _stats(t)
    assert got[0] == got[1] == pytest.approx(3e30)
    assert got[3] == math.inf  # torch's float32 dot overflows too


class _Tagged(torch.Tensor):
    """A user's tensor subclass: reduced by torch (through its own dispatch), not by the kernel."""


def test_parameters_use_the_kernel_and_subclasses_use_torch():
    base = torch.randn(3000)
    p = torch.nn.Parameter(base.clone())
    sub = base.clone().as_subclass(_Tagged)
    ref = _reference(base)
    for t, ready in ((p.detach(), True), (p, True), (sub, False)):
        stat, kind = encode.stat_of(t, False)
        assert (kind is encode.READY) == (ready and encode._fast_f32 is not None)
        got = _stats(t)
        assert got[:3] == ref[:3]
        assert math.isclose(got[3], ref[3], rel_tol=NORM_TOL)


# -- CRC-32 (the md5 summary mode) --

_CRC_SIZES = [0, 1, 15, 16, 17, 63, 64, 65, 4095, 4096 * 4 + 3, (1 << 20) + 5]


@pytest.fixture(params=["builtin", "isal"])
def crc_impl(request):
    """The kernel's own carry-less-multiply CRC and ISA-L's, handed to the kernel by address."""
    if encode._fast_crc is None:
        pytest.skip("no kernel")
    from msprobe_inject import _fastats

    if request.param == "isal":
        if not encode.use_isal_crc():
            pytest.skip("isal not installed")
        yield request.param
    else:
        _fastats.set_crc(0)
        yield request.param
        encode._isal_in_kernel = False
        encode.use_isal_crc()


@pytest.mark.parametrize("n", _CRC_SIZES)
def test_kernel_crc_is_zlib_crc32(crc_impl, n):
    raw = bytes((i * 131 + n) & 0xFF for i in range(n + 3))
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8)[3:]  # unaligned start
    assert encode.crc32_hex(t) == f"{zlib.crc32(raw[3:]):08x}"


@pytest.mark.parametrize("n", [1, 4096, 8193, 65536 + 7, (1 << 20) + 3])
def test_fused_statistics_and_crc_match_the_separate_ones(crc_impl, n):
    torch.manual_seed(n)
    t = torch.randn(n) * 2 - 0.25
    stat, kind, crc = encode.stat_crc_of(t, False)
    assert kind is encode.READY
    assert list(stat) == _stats(t)  # same numbers as the statistics mode, bit for bit
    assert crc == f"{zlib.crc32(t.numpy().tobytes()):08x}"


def test_crc_of_nan_views_integers_and_subclasses():
    t = torch.randn(300, 41)
    t[7, 3] = float("nan")
    cases = [t, t.t(), t[5:, 2:], torch.arange(70000), torch.randn(999).as_subclass(_Tagged), torch.tensor(3.5)]
    for x in cases:
        stat, kind, crc = encode.stat_crc_of(x, False)
        assert crc == f"{zlib.crc32(x.contiguous().numpy().tobytes()):08x}", x.shape
    stat, kind, _ = encode.stat_crc_of(t, False)
    assert kind is not encode.READY  # NaN: torch's statistics, the kernel's CRC


def test_negative_and_conjugate_views_give_their_values():
    """A negative view (torch._neg_view) stores its values negated: statistics and CRC of the values."""
    base = torch.randn(5000)
    neg = torch._neg_view(base)
    assert neg.is_neg() and neg.is_contiguous()
    want = -base
    assert _stats(neg)[:2] == _stats(want)[:2]
    stat, kind, crc = encode.stat_crc_of(neg, False)
    assert crc == f"{zlib.crc32(want.numpy().tobytes()):08x}"
    z = torch.randn(300, dtype=torch.cfloat).conj()
    assert z.is_conj()
    assert encode.crc32_hex(z) == f"{zlib.crc32(z.resolve_conj().numpy().tobytes()):08x}"


def test_the_c_mean_is_found_where_the_kernel_is_built():
    if encode._fast_f32 is None:
        pytest.skip("no kernel")
    assert encode.use_torch_mean() and encode._tmean_lanes in (4, 8, 16)


@pytest.mark.parametrize("seed", range(6))
def test_the_mean_is_torchs_bit_for_bit(seed):
    """msprobe's Mean is torch.mean. The C mean (below torch's grain) adds in torch's order and divides in float:
    the same bits as t.mean() on every size, offset and spread of magnitudes, where any other order of float
    additions, or a division in double, differs; from the grain up, torch's own."""
    if not encode.use_torch_mean():
        pytest.skip("torch sums here")
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(encode._TMEAN_BELOW + 128, generator=gen)
    pool *= torch.pow(10.0, torch.randint(-6, 7, pool.shape, generator=gen).float())
    sizes = list(range(1, 300)) + torch.randint(300, encode._TMEAN_BELOW, (200,), generator=gen).tolist()
    sizes += [encode._TMEAN_BELOW - 1, encode._TMEAN_BELOW, encode._TMEAN_BELOW + 17]
    differ = []
    for n in sizes:
        off = int(torch.randint(0, 64, (1,), generator=gen))
        x = pool[off:off + n]
        if encode._mean(x, n) != x.mean().item():
            differ.append((n, off))
    assert differ == []


def _bits(v: float) -> bytes:
    return b"nan" if math.isnan(v) else struct.pack("<d", v)


@pytest.mark.parametrize("seed", range(4))
def test_a_tiny_tensors_mean_keeps_torchs_bits_for_signed_zeros_nans_and_infinities(seed):
    """Below one row of four vectors (a tiny tensor) the C sum adds the elements onto 0.0 without torch's zeroed
    accumulators: the same bits as torch.mean, the sign of a zero included (a NaN is a NaN: its sign and payload
    are the order of the vector unit's operands, and the dump writes NaN), through both C calls that take a
    mean (tmean; f32_mean with the kernel's figures)."""
    if not encode.use_torch_mean():
        pytest.skip("torch sums here")
    gen = torch.Generator().manual_seed(seed)
    special = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1e-45, -1.5, 3e38])
    lanes = encode._tmean_lanes
    differ = []
    for n in range(1, 4 * lanes + 5):
        for _ in range(40):
            x = special[torch.randint(0, len(special), (n,), generator=gen)].contiguous()
            got = [encode._mean(x, n)]
            if encode._fast_f32_mean is not None:
                got.append(encode._fast_f32_mean(x.data_ptr(), n, lanes, 1)[3])
            if any(_bits(g) != _bits(x.mean().item()) for g in got):
                differ.append((n, x.tolist()))
    assert differ == []


@pytest.fixture
def threads():
    """Sets torch's intra-op thread count for the test, and restores it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("nthreads", [1, 2, 3, 4, 9])  # 9: the slots are summed as a vector and a tail
def test_one_read_gives_the_kernels_figures_and_torchs_mean_split_over_its_threads(nthreads, threads):
    """f32_mean: f32_crc's figures and CRC and torch.mean's bits in one read. From the grain up torch splits its
    sum into one run per thread and sums the runs' slots: on sizes around the grain and the split points, at odd
    offsets, with magnitudes spread so that any other order of additions shows."""
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        pytest.skip("torch sums here")
    threads(nthreads)
    gen = torch.Generator().manual_seed(nthreads)
    pool = torch.randn(1_300_000, generator=gen)
    pool *= torch.pow(10.0, torch.randint(-6, 7, pool.shape, generator=gen).float())
    g = encode._TMEAN_BELOW
    sizes = [1, 9, 4097, g - 1, g, g + 1, 2 * g - 1, 2 * g, 2 * g + 1, 3 * g + 7, 4 * g + 1, 262_144, 1_048_579]
    sizes += torch.randint(g, 1_200_000, (25,), generator=gen).tolist()
    differ = []
    for n in sizes:
        off = int(torch.randint(0, 64, (1,), generator=gen))
        x = pool[off:off + n]
        got = encode._fast_f32_mean(x.data_ptr(), n, encode._tmean_lanes, nthreads, True)
        if got[3] != x.mean().item() or (*got[:3], got[4]) != encode._fast_f32_crc(x.data_ptr(), n):
            differ.append((n, off))
    assert differ == []
    for v in (-0.0, 0.0):  # one run's slot plus the zeroed others: torch's -0.0 sum becomes 0.0 from the grain up
        for n in (g - 1, g, 3 * g):
            x = torch.full((n,), v)
            assert repr(encode._fast_f32_mean(x.data_ptr(), n, encode._tmean_lanes, nthreads)[3]) == \
                repr(x.mean().item())


_SHARED_FROM = 1 << 15  # _fastats' PAR_FROM (torch's grain): above it f32_mean shares a read with torch's threads


@pytest.mark.parametrize("nthreads", [2, 3, 4, 9])
def test_a_read_shared_with_torchs_threads_gives_the_one_threads_figures(nthreads, threads):
    """f32_mean read by several threads (each over whole runs of torch's split and the kernel's blocks from there,
    the caller adding the others' block sums in order and combining their CRCs) gives the figures and CRC of one
    thread, bit for bit, and torch.mean's; on sizes at the sharing threshold, the split points and the block edges,
    at odd offsets, with magnitudes spread so that any other order of additions shows."""
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        pytest.skip("torch sums here")
    if not encode._share_reads():
        pytest.skip("no OpenMP team to share a read with here")
    threads(nthreads)
    gen = torch.Generator().manual_seed(100 + nthreads)
    pool = torch.randn(2_400_000, generator=gen)
    pool *= torch.pow(10.0, torch.randint(-6, 7, pool.shape, generator=gen).float())
    s = _SHARED_FROM
    sizes = [s - 1, s, s + 1, s + 15, s + 16, s + 17, 2 * s + 2047, 2 * s + 2049, 1 << 20, (1 << 20) + 3, 2_300_001]
    sizes += torch.randint(s, 2_300_000, (20,), generator=gen).tolist()
    lanes, differ = encode._tmean_lanes, []
    for n in sizes:
        off = int(torch.randint(0, 64, (1,), generator=gen))
        x = pool[off:off + n]
        one = encode._fast_f32_mean(x.data_ptr(), n, lanes, nthreads, True, 1)
        if one[3] != x.mean().item() or (*one[:3], one[4]) != encode._fast_f32_crc(x.data_ptr(), n):
            differ.append(("one thread", n, off))
        for workers in (2, 3, 8):  # with the CRC (the md5 mode: each thread's, combined) and without
            if repr(encode._fast_f32_mean(x.data_ptr(), n, lanes, nthreads, True, workers)) != repr(one) or \
                    repr(encode._fast_f32_mean(x.data_ptr(), n, lanes, nthreads, False, workers)) != repr(one[:4]):
                differ.append((workers, n, off))
    assert differ == []
    z = torch.zeros(3 * s + 5)  # -0.0 and 0.0 compare equal: which one the max and min keep is the one thread's
    z[::3] = -0.0
    z[7::11] = -0.0
    for pattern in (z, -z, z.flip(0)):
        x = pattern.contiguous()
        assert repr(encode._fast_f32_mean(x.data_ptr(), x.numel(), lanes, nthreads, False, nthreads)) == \
            repr(encode._fast_f32_mean(x.data_ptr(), x.numel(), lanes, nthreads, False, 1))


@pytest.mark.parametrize("nthreads", [2, 3, 4])
def test_a_shared_read_keeps_the_one_threads_zero_wherever_its_shares_start(nthreads, threads):
    """The one thread reads in pieces of 4,096 elements and folds each piece's lanes into the max and min in turn;
    the threads' shares start on those pieces, so that a max (or min) of zero keeps the one thread's zero however
    many threads read: 0.0 in one block's sixth lane and -0.0 in the next block's first (a piece's lanes fold first
    lane first, so a piece holding both keeps -0.0, and pieces split between them keep 0.0), for every block of
    buffers whose shares start at odd and even blocks."""
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        pytest.skip("torch sums here")
    if not encode._share_reads():
        pytest.skip("no OpenMP team to share a read with here")
    threads(nthreads)
    lanes, differ = encode._tmean_lanes, []
    for n in ((1 << 17) + 4096 * 3 + 9, (1 << 17) + 2048 * 7 + 16 * 3, 3 * (1 << 16) + 2048 + 5,
              (1 << 15) + 2048 * 3 + 7):
        for sign in (1.0, -1.0):  # the max at zero, then the min
            base = torch.full((n,), -sign)
            for b in range(n // 2048 - 1):
                x = base.clone()
                x[b * 2048 + 5] = 0.0
                x[(b + 1) * 2048] = -0.0
                one = encode._fast_f32_mean(x.data_ptr(), n, lanes, nthreads, False, 1)
                for workers in (2, 3):
                    got = encode._fast_f32_mean(x.data_ptr(), n, lanes, nthreads, False, workers)
                    if repr(got) != repr(one):
                        differ.append((n, sign, b, workers, got[:2], one[:2]))
    assert differ == [], differ[:3]


@pytest.mark.skipif(not sys.platform.startswith("linux") or "backend: OpenMP" not in torch.__config__.parallel_info(),
                    reason="torch's threads are not an OpenMP team in a loaded libgomp here")
def test_large_reads_are_shared_with_torchs_openmp_team_and_not_in_a_forked_child(threads):
    """The team is found where torch runs on libgomp, and a forked child (which has its parent's team in name
    only: libgomp would wait for it forever) reads alone and does not hang."""
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        pytest.skip("torch sums here")
    assert encode._share_reads()
    threads(2)
    x = torch.randn(1 << 20)
    want = encode._fast_f32_mean(x.data_ptr(), x.numel(), encode._tmean_lanes, 2)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            got = encode._fast_f32_mean(x.data_ptr(), x.numel(), encode._tmean_lanes, 2)
            os._exit(0 if got == want else 3)
        finally:
            os._exit(4)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in f32_mean")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_large_float_tensors_take_the_one_read(threads):
    """The statistics of a large contiguous CPU float32 tensor come from f32_mean (torch.mean is not called), and
    are those of the kernel and torch.mean."""
    if not encode.use_torch_mean() or encode._fast_f32_mean is None:
        pytest.skip("torch sums here")
    threads(2)
    assert encode._mean_fused
    t = torch.randn(300, 1000)
    ref = t.mean().item()
    with _no_torch_mean():
        stat, kind = encode.stat_of(t, False)
    r = encode._fast_f32(t.data_ptr(), t.numel())
    assert kind is encode.READY and stat == (r[0], r[1], ref, math.sqrt(r[2]))


class _no_torch_mean(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.mean, torch.Tensor.mean):
            raise AssertionError("torch.mean called")
        return func(*args, **(kwargs or {}))


def test_small_float_tensors_skip_the_cache_and_others_keep_it(tmp_path):
    if not encode.use_torch_mean():
        pytest.skip("torch sums here")
    small, large = torch.randn(64, 64), torch.randn(64, 65)
    assert encode._cheap(small) and not encode._cheap(large)
    assert not encode._cheap(small.double()) and not encode._cheap(torch.ones(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64])
def test_the_c_xor_is_the_numpy_one(dtype, monkeypatch):
    """xor mode: the C XOR of a contiguous tensor's bytes equals the numpy reduction over the values' bytes, for
    every size modulo 8 bytes (zero padding), offsets into a storage, and views it must leave to numpy."""
    if encode._fast_xor is None:
        pytest.skip("no kernel")
    gen = torch.Generator().manual_seed(7)
    base = (torch.randn(300, generator=gen) * 100)
    base = base.to(dtype) if dtype is not torch.complex64 else torch.complex(base, base.flip(0))
    cases = [base[:n] for n in range(1, 41)] + [base[3:3 + n] for n in (1, 7, 9, 33)]
    cases += [base[:64].view(8, 8).t(), base[::3]]
    if dtype.is_floating_point:
        cases.append(base[:16]._neg_view())
    if dtype is torch.complex64:
        cases.append(base[:16].conj())
    fast = [encode.xor_hex(t) for t in cases]
    monkeypatch.setattr(encode, "_fast_xor", None)
    assert fast == [encode.xor_hex(t) for t in cases]


def _sum_of_squares(x) -> float:
    """The kernel's sum of squares as its C spells it: per block of 2,048 elements, sixteen float32 lanes, each
    adding its element's square rounded to float32 first, the lanes then added in order in double; the elements
    after the last whole group of lanes squared and added in double."""
    import numpy as np

    lanes, block = 16, 2048
    full = len(x) - len(x) % lanes
    total = 0.0
    for i in range(0, full, block):
        rows = x[i:min(i + block, full)].reshape(-1, lanes)
        q = np.zeros(lanes, dtype=np.float32)
        for row in rows:
            q = q + row * row  # float32: the product rounded, then the sum (no fused multiply-add)
        for v in q:
            total += float(v)
    for v in x[full:]:
        total += float(v) * float(v)
    return total


@pytest.mark.skipif(encode._fast_f32 is None, reason="the C kernel is not built")
@pytest.mark.parametrize("n", [16, 2048 + 21, 32_768, 32_769, 40_000 + 7, 65536 + 5, 300_017])
def test_kernels_sum_of_squares_rounds_each_square_first_whatever_the_cpu(n):
    """Every clone of the kernel (AVX-512, AVX2, plain) adds the same float32 squares: a fused multiply-add, which
    a compiler contracts q + v * v into where the instruction set has one, changes the last bits of the Norm from
    one CPU to the next. The shared read (above 32,768 elements) and the Norm alone (the monitor preset) too."""
    from msprobe_inject import _fastats

    assert encode.use_fast_entries()  # and the shared reads set up (torch's OpenMP team), where there is one
    torch.manual_seed(n)
    t = torch.randn(n) * 3 + 0.5
    want = _sum_of_squares(t.numpy())
    assert _fastats.f32(t.data_ptr(), n)[2] == want
    assert _fastats.f32_mean(t.data_ptr(), n, 16, 2, 0, 2)[2] == want
    entry = _fastats.entries((None, encode._NORM_MODE, 2, None), [t], [])
    assert entry[0]["Norm"] == math.sqrt(want)


def _first_max_min(x, piece: int = 0) -> tuple:
    """The kernel's max and min as its C keeps them over each piece of ``piece`` elements (0: the whole buffer) in
    turn: sixteen lanes, each keeping the first of its elements equal to its largest (smallest) value, then the lanes
    in order, each taken only where strictly larger (smaller) than the figure so far, then the piece's elements after
    its last whole group of lanes: of -0.0 and 0.0, whichever comes first that way."""
    lanes = 16
    big, small = -math.inf, math.inf
    for start in range(0, len(x), piece or len(x)):
        part = x[start:start + piece] if piece else x
        full = len(part) - len(part) % lanes
        if full:
            rows = part[:full].reshape(-1, lanes)
            top, bottom = rows.max(axis=0), rows.min(axis=0)
            first_top = (rows == top).argmax(axis=0)  # the first row where each lane meets its extreme
            first_bottom = (rows == bottom).argmax(axis=0)
            for k in range(lanes):
                v, w = float(rows[first_top[k], k]), float(rows[first_bottom[k], k])
                big = v if v > big else big
                small = w if w < small else small
        for v in part[full:]:
            big = float(v) if v > big else big
            small = float(v) if v < small else small
    return big, small


@pytest.mark.skipif(encode._fast_f32 is None, reason="the C kernel is not built")
@pytest.mark.parametrize("seed", range(4))
def test_the_kernels_blocks_read_two_at_a_time_keep_the_first_of_equal_zeros(seed):
    """The kernel reads two blocks of 2,048 elements at a time (two chains of additions instead of one) and folds
    each block's max and min into the lanes in block order: the figures are those of one block after the other,
    down to which zero (-0.0 or 0.0) a max or min of zero keeps, lane by lane; and the sum of squares is the same
    additions. Zeros of both signs spread over the lanes of both blocks of a group, on sizes around the groups'
    edges; the plain read over the whole buffer, the CRC read and the mean's (serial and shared) over pieces of
    4,096 elements (each piece's lanes folded in turn)."""
    import numpy as np

    from msprobe_inject import _fastats

    assert encode.use_fast_entries()  # and the shared reads set up (torch's OpenMP team), where there is one
    rng = np.random.default_rng(seed)
    for n in (4096, 4096 + 16, 4096 * 2 + 16 * 7 + 5, 2048 * 5 + 3, 32_769, 40_000 + 7, 65536 + 2048 + 17,
              (1 << 17) + 4096 * 3 + 9, (1 << 20) + 3):
        for sign in (1.0, -1.0) if n < 1 << 20 else ():  # the max at zero, then the min
            x = -sign * rng.uniform(0.5, 2.0, n).astype(np.float32)
            zeros = rng.random(n) < rng.choice([0.002, 0.05, 0.5])
            x[zeros] = np.where(rng.random(int(zeros.sum())) < 0.5, np.float32(-0.0), np.float32(0.0))
            t = torch.from_numpy(x)
            whole, pieces, q = _first_max_min(x), _first_max_min(x, 4096), _sum_of_squares(x)
            a = t.data_ptr()
            for got, want in ((_fastats.f32(a, n), whole), (_fastats.f32_crc(a, n), pieces),
                              (_fastats.f32_mean(a, n, 16, 2, 0, 1), pieces),
                              (_fastats.f32_mean(a, n, 16, 2, 1, 2), pieces)):
                assert (repr(got[0]), repr(got[1]), got[2]) == (repr(want[0]), repr(want[1]), q), (n, sign)
        # blocks whose squares are up to twelve orders of magnitude apart: their lanes' sums added in double are not
        # exact, so the order of the blocks' additions shows in the last bits
        scale = 10.0 ** rng.integers(-3, 4, n // 2048 + 1).repeat(2048)[:n]
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        t = torch.from_numpy(x)
        q = _sum_of_squares(x)
        assert [f(t.data_ptr(), n)[2] for f in (_fastats.f32, _fastats.f32_crc)] == [q, q], n
        a = t.data_ptr()
        assert _fastats.f32_mean(a, n, 16, 2, 0, 1)[2] == _fastats.f32_mean(a, n, 16, 2, 0, 2)[2] == q, n
        for threads in (1, 2):  # the Norm alone (the monitor preset), above 32,768 elements shared with torch's threads
            assert _fastats.entries((None, encode._NORM_MODE, threads, None), [t], [])[0]["Norm"] == math.sqrt(q), n


@pytest.mark.parametrize("mode", [0, encode._COMPACT])
def test_each_entry_has_its_own_tensors_shape_while_the_recent_shapes_are_reused(mode):
    """The C entries keep the last shape tuples they made (cxx_meta's round robin, where the tensor's metadata is
    read from its TensorImpl) and hand out the one of the same sizes: over more distinct shapes than it keeps, of 0
    to 10 dimensions (above 8 none is kept), in orders that evict them and come back, each entry's shape is its
    own tensor's."""
    from msprobe_inject import _fastats

    assert encode.use_fast_entries()
    shapes = [(), (3,), (1, 5), (5, 1), (2, 3), (3, 2), (2, 2, 2), (1, 1, 1, 1), (2,) * 8, (1,) * 9 + (2,),
              (2, 1) * 5] + [(k, 2) for k in range(1, 15)]
    tensors = [torch.arange(float(math.prod(s))).reshape(s) for s in shapes]
    for order in (tensors, tensors[::-1], tensors[::3] + tensors):
        got = _fastats.entries((None, mode, 1, None), order, [])
        assert [list(e["shape"]) for e in got] == [list(t.shape) for t in order]
