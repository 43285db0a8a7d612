"""Every dtype and odd tensor, non-tensor arguments and hostile values through the encoder (pytorch/encode.py)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from util import PREAMBLE, load_dump, run_py

from msprobe_inject.dumpformat.entry import plain

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                  st.text(max_size=20), st.just(Ellipsis), st.builds(slice, st.integers(0, 5), st.integers(0, 9)))


@st.composite
def _tensors(draw):
    import torch

    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    dt = draw(st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16, torch.bfloat16]))
    return torch.zeros(shape, dtype=dt) if dt is torch.bool else (torch.rand(shape) * 4 - 2).to(dt)


_values = st.recursive(st.one_of(_leaf, _tensors()), lambda ch: st.one_of(
    st.lists(ch, max_size=4), st.tuples(ch, ch), st.dictionaries(st.text(max_size=5), ch, max_size=4)),
    max_leaves=12)


def test_every_dtype_and_odd_tensor(tmp_path):
    code = PREAMBLE + """
import warnings
debugger = PrecisionDebugger(dump_path="d", level="L1", task="tensor", )
dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
vals = [torch.ones(3, dtype=dt) for dt in dtypes]
base = torch.arange(12.0).reshape(3, 4)
vals += [torch.empty(0), torch.tensor(2.5), base.t(), base[:, 1], torch.full((2,), float("nan")),
         torch.full((2,), float("inf")), torch.empty(3, device="meta"),
         torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))]
import types
mod = types.ModuleType("m")
mod.f = lambda t: None
debugger.register_custom_api(mod, "f", api_prefix="Any")
debugger.start()
for v in vals:
    mod.f(v)
debugger.stop(); debugger.step()
print("N", len(vals))
"""
    proc = run_py(code, str(tmp_path))
    n = int(proc.stdout.split("N")[-1])
    d = load_dump(str(tmp_path / "d"))["data"]
    recs = [k for k in d if k.startswith("Any.f")]
    assert len(recs) == n
    for k in recs:
        leaf = d[k]["input_args"][0]
        assert leaf["type"] == "torch.Tensor" and isinstance(leaf["shape"], list)
    nan = [d[k]["input_args"][0] for k in recs if d[k]["input_args"][0]["dtype"] == "torch.float32"
           and d[k]["input_args"][0]["shape"] == [2]]
    assert any(e["Max"] != e["Max"] for e in nan) and any(e["Max"] == float("inf") for e in nan)


def test_non_tensor_arguments(tmp_path):
    code = PREAMBLE + """
import types
class Custom:
    pass
cyc = [1, 2]
cyc.append(cyc)
big = list(range(20000))
mod = types.ModuleType("m")
def f(*a, **k):
    return torch.zeros(1)
mod.f = f
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.register_custom_api(mod, "f", api_prefix="Custom")
debugger.start()
mod.f(None, slice(0, 2), torch.float16, torch.device("cpu"), ..., Custom(), big, cyc, {"k": (1, 2.5)},
      dtype=torch.float32, device="cpu", flag=True, s="x")
debugger.stop(); debugger.step()
print("OK")
"""
    assert "OK" in run_py(code, str(tmp_path)).stdout
    rec = load_dump(str(tmp_path / "d"))["data"]["Custom.f.0.forward"]
    a = rec["input_args"]
    assert a[0] is None and a[1] == {"type": "slice", "value": [0, 2, None]}
    assert a[2] == {} and a[3] == {} and a[4] == {"type": "ellipsis", "value": "..."} and a[5] is None
    assert len(a[6]) == 20000 and a[7][2] is None
    assert a[8] == {"k": [{"type": "int", "value": 1}, {"type": "float", "value": 2.5}]}
    kw = rec["input_kwargs"]
    assert kw["dtype"] == {"type": "torch.dtype", "value": "torch.float32"}
    assert kw["device"] == {"type": "torch.device", "value": "cpu"} and kw["flag"]["value"] is True


# ---------------------------------------------------------------- property-based


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_encoder_never_raises_and_mirrors_structure(value):
    import torch

    from msprobe_inject.config import DumpConfig
    from msprobe_inject.pytorch import encode

    class _W:
        def save_tensor(self, *a):
            pass

        def log_error(self, msg):
            raise AssertionError(msg)

    enc = encode.Encoder(DumpConfig(), lambda: "unused", _W())
    pending = encode.Pending()
    out = enc.encode(value, pending, None)
    encode.resolve(pending)
    json.dumps(out, default=plain)  # serialisable (NaN tokens allowed; an entry of C values as its dict)

    def check(v, o):
        if isinstance(v, torch.Tensor):
            assert o["type"] == "torch.Tensor" and o["shape"] == list(v.shape)
        elif isinstance(v, (list, tuple)):
            assert isinstance(o, list) and len(o) == len(v)
            for a, b in zip(v, o):
                check(a, b)
        elif isinstance(v, dict):
            assert isinstance(o, dict) and len(o) == len(v)
            for k in v:
                check(v[k], o[k])

    check(value, out)
