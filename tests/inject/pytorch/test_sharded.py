"""Tensor subclasses whose ops may communicate (DTensor, FSDP2 parameters, wrapper subclasses) are
reduced only through a plain local tensor: no op ever dispatches to the subclass, on the training
thread or on the writer thread, and a statistic that cannot be computed is named, never a silent null."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from msprobe_inject.config import DumpConfig
from msprobe_inject.pytorch import encode


class _Writer:
    def __init__(self):
        self.errors: list = []

    def log_error(self, message, *a, **k):
        self.errors.append(message)


def _encoder(**cfg):
    base = dict(precision="low", summary_mode="statistics", task="statistics", tensor_list=[], stat_cache=True)
    base.update(cfg)
    return encode.Encoder(DumpConfig(dump_path="unused", **base), lambda: "/nonexistent", _Writer())


@pytest.fixture(scope="module")
def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    if own:
        dist.destroy_process_group()


class _Counting:
    """Counts the ops dispatched to DTensor while active."""

    def __init__(self, monkeypatch):
        from torch.distributed.tensor import DTensor

        self.ops: list = []
        orig = DTensor.__torch_dispatch__

        def spy(cls, func, types_, args=(), kwargs=None):
            self.ops.append(str(func))
            return orig.__func__(cls, func, types_, args, kwargs)

        monkeypatch.setattr(DTensor, "__torch_dispatch__", classmethod(spy))


def _encode(enc, value):
    pending: list = []
    out = enc.encode(value, pending, None)
    failed = encode.resolve(pending)
    return out, failed


def test_dtensor_reduced_on_its_local_shard_without_any_dtensor_op(mesh, monkeypatch):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    local = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5
    shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    partial = DTensor.from_local(local.double(), mesh, [Partial()], run_check=False)
    repl = DTensor.from_local(torch.tensor([3, -1, 7]), mesh, [Replicate()], run_check=False)
    counter = torch.tensor(4.0)  # AdamW's 0-d step counter, next to DTensors in the same batch
    spy = _Counting(monkeypatch)
    out, failed = _encode(_encoder(), [shard, partial, repl, counter])
    assert spy.ops == [], spy.ops
    assert failed is None
    s, p, r, c = out
    assert s["type"] == "torch.distributed.tensor.DTensor"
    assert s["shape"] == [3, 4] and s["device_mesh"] == [0] and s["placements"] == [{"Shard": {"dim": 0}}]
    assert (s["Max"], s["Min"]) == (6.0, -5.0)
    assert s["Mean"] == pytest.approx(local.mean().item()) and s["Norm"] == pytest.approx(local.norm().item())
    assert p["placements"] == [{"Partial": {"reduce_op": "sum"}}] and p["dtype"] == "torch.float64"
    assert p["Max"] == 6.0
    assert r["placements"] == [{"Replicate": {}}] and (r["Max"], r["Min"]) == (7, -1)
    assert c["Max"] == c["Min"] == c["Mean"] == c["Norm"] == 4.0
    assert list(s)[:3] == ["type", "dtype", "shape"] and list(s)[-2:] == ["device_mesh", "placements"]


def test_dtensor_parameter_and_md5_mode(mesh, monkeypatch):
    from torch.distributed.tensor import Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(torch.randn(4, 2), mesh, [Shard(0)]))
    spy = _Counting(monkeypatch)
    out, failed = _encode(_encoder(summary_mode="md5"), [p])
    assert spy.ops == [] and failed is None
    e = out[0]
    assert e["requires_grad"] is True and e["type"].endswith("DTensor")
    assert e["Max"] == pytest.approx(p._local_tensor.max().item()) and len(e["md5"]) == 8


class _Wrapper(torch.Tensor):
    """A wrapper subclass whose every op could be a collective: counts them."""

    ops: list = []

    @staticmethod
    def __new__(cls, elem, extra):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)
        r.elem, r.extra = elem, extra
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types_, args=(), kwargs=None):
        cls.ops.append(str(func))
        unwrap = lambda x: x.elem if isinstance(x, _Wrapper) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    def __tensor_flatten__(self):
        return ["elem", "extra"], None


def test_unknown_wrapper_subclass_is_named_not_reduced():
    _Wrapper.ops.clear()
    w = _Wrapper(torch.ones(3), torch.zeros(1))
    pending: list = []
    enc = _encoder()
    out = enc.encode([w, torch.ones(2)], pending, None)
    failed = encode.resolve(pending)
    assert _Wrapper.ops == [], _Wrapper.ops
    assert out[0]["type"].endswith("_Wrapper") and out[0]["Max"] is None
    assert failed and "tensor subclass" in next(iter(failed.values()))
    assert "tensor subclass" in out[0]["error"]
    assert out[1]["Max"] == 1.0  # the plain tensor of the same batch keeps its figures


def test_writer_side_never_reads_a_subclass_statistic():
    _Wrapper.ops.clear()
    good = {"Max": None}
    bad = {"Max": None}
    stat = _Wrapper(torch.ones(1), torch.zeros(1))
    pending = [(bad, (stat, stat), "f"), (good, torch.tensor([2.0]), "s")]
    failed = encode.resolve(pending)
    assert _Wrapper.ops == []
    assert set(failed) == {id(bad)} and good["Max"] == 2.0


def test_plain_subclass_without_dispatch_is_a_torch_tensor():
    class Tagged(torch.Tensor):
        pass

    t = torch.tensor([1.0, -2.0]).as_subclass(Tagged)
    out, failed = _encode(_encoder(), [t])
    assert failed is None and out[0]["type"] == "torch.Tensor" and out[0]["Min"] == -2.0


def test_float8_has_statistics():
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is None:
        pytest.skip("no float8")
    out, failed = _encode(_encoder(), [torch.tensor([1.0, -3.0]).to(f8)])
    assert failed is None and (out[0]["Max"], out[0]["Min"]) == (1.0, -3.0)


UNREADABLE = """
import sys, torch, warnings
sys.path.insert(0, sys.argv[2])
from test_sharded import _Wrapper
from msprobe_inject.pytorch import PrecisionDebugger
import json
json.dump({"dump_path": sys.argv[1], "level": "L1", "task": "statistics"}, open(sys.argv[1] + ".json", "w"))
debugger = PrecisionDebugger(config_path=sys.argv[1] + ".json")
debugger.start()
w = _Wrapper(torch.ones(3), torch.zeros(1))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.exp(w)
    torch.exp(torch.ones(2))
    debugger.stop(); debugger.step()
print("WARN", [str(c.message) for c in caught if "msprobe" in str(c.message)])
print("OPS", _Wrapper.ops)
"""


def test_a_statistic_not_computed_is_an_error_line_naming_the_record(tmp_path):
    import os

    from util import clean_env, load_dump, run_py

    dump = str(tmp_path / "dump")
    proc = run_py(UNREADABLE, str(tmp_path), env=clean_env(), args=(dump, os.path.dirname(__file__)))
    data = load_dump(dump)["data"]
    entry = data["Torch.exp.0.forward"]["input_args"][0]
    assert entry["Max"] is None and "tensor subclass" in entry["error"]
    assert data["Torch.exp.1.forward"]["output"][0]["Max"] is not None
    logs = [os.path.join(r, f) for r, _, fs in os.walk(dump) for f in fs if f == "dump_error_info.log"]
    assert logs, os.listdir(dump)
    text = open(logs[0]).read()
    assert "Torch.exp.0.forward: statistics not computed:" in text and "_Wrapper" in text, text
    assert proc.stdout.count("statistics not computed") == 1, proc.stdout  # one warning per reason
    assert "OPS ['aten.exp.default']" in proc.stdout, proc.stdout  # the job's own op only
