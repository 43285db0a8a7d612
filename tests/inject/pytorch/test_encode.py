"""Statistics, md5/xor summaries, tensor files and the structure task (pytorch/encode.py), on real runs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from util import PREAMBLE, leaves, load_dump, rank_dir, run_config, run_py


def test_l1_statistics_layout_and_values(tmp_path):
    dump = run_config(tmp_path, level="L1")
    d = load_dump(dump)
    assert d["task"] == "statistics" and d["level"] == "L1" and d["framework"] == "pytorch"
    assert d["dump_data_dir"] is None
    keys = list(d["data"])
    assert keys[:3] == ["Functional.linear.0.forward", "Functional.relu.0.forward", "Functional.linear.1.forward"]
    assert "Functional.linear.0.backward" in keys and not any(k.startswith("Module.") for k in keys)
    rd = rank_dir(dump)
    assert os.path.basename(rd).startswith("proc")
    assert json.load(open(os.path.join(rd, "construct.json"))) == {}
    stack = json.load(open(os.path.join(rd, "stack.json")))
    assert "Functional.linear.0.forward" in stack["0"][0] and "script.py" in "".join(stack["0"][1])
    # backward of F.linear: input = grad of output, output = autograd node's gradients (bias, input, weight^T)
    bwd = d["data"]["Functional.linear.0.backward"]
    assert bwd["input"][0]["shape"] == [5, 3]
    assert [e["shape"] if e else None for e in bwd["output"]] == [[3], None, [4, 3]]
    fwd = d["data"]["Functional.linear.0.forward"]
    assert [e["shape"] for e in fwd["input_args"]] == [[5, 4], [3, 4], [3]]
    assert fwd["output"][0]["requires_grad"] is True
    for leaf in leaves(fwd):
        assert list(leaf)[:8] == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]


def test_statistics_match_numpy_for_every_dtype(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1", task="tensor")
debugger.start()
vals = {
  "f32": torch.tensor([[1.5, -2.0], [3.25, 0.5]]),
  "f16": torch.tensor([1.5, -2.0, 3.0], dtype=torch.float16),
  "bf16": torch.tensor([1.5, -2.0, 3.1], dtype=torch.bfloat16),
  "f64": torch.tensor([1.0, 2.0], dtype=torch.float64),
  "i64": torch.tensor([3, -7, 2]),
  "u8": torch.tensor([3, 7, 2], dtype=torch.uint8),
  "b": torch.tensor([True, False]),
  "c": torch.tensor([3 + 4j, 1 + 0j]),
  "s": torch.tensor(-1.25),
  "e": torch.empty(0, 3),
  "nan": torch.tensor([1.0, float("nan")]),
  "inf": torch.tensor([1.0, float("inf")]),
}
for name, v in vals.items():
    torch.abs(v) if name not in ("b",) else torch.logical_not(v)
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    order = ["f32", "f16", "bf16", "f64", "i64", "u8", "b", "c", "s", "e", "nan", "inf"]
    recs = [d[k]["input_args"][0] for k in d if k.endswith(".forward")]
    assert len(recs) == len(order)
    data_dir = os.path.join(rank_dir(str(tmp_path / "d")), "dump_tensor_data")
    for name, e in zip(order, recs):
        if e["Max"] is None:
            assert name == "e"
            continue
        t = torch.load(os.path.join(data_dir, e["data_name"]), weights_only=True)
        if name == "b":
            assert (e["Max"], e["Min"]) == (bool(t.any()), bool(t.all()))
            continue
        a = t.abs().double().numpy() if t.is_complex() else t.double().numpy()
        if name in ("nan",):
            assert all(x != x for x in (e["Max"], e["Min"], e["Mean"], e["Norm"]))
            continue
        assert e["Max"] == pytest.approx(float(a.max()), rel=1e-2 if name in ("f16", "bf16") else 1e-6)
        assert e["Min"] == pytest.approx(float(a.min()), rel=1e-2 if name in ("f16", "bf16") else 1e-6)
        if name in ("f32", "f16", "bf16"):
            assert e["Mean"] == pytest.approx(float(a.mean()), rel=1e-2)
            assert e["Norm"] == pytest.approx(float(np.linalg.norm(a)), rel=1e-2)
        elif name == "s":
            assert e["Mean"] == e["Norm"] == -1.25
        elif name == "c":
            assert e["Mean"] == pytest.approx(float(a.mean())) and e["Norm"] is None
        elif name in ("f64", "i64", "u8"):
            assert e["Mean"] is None and e["Norm"] is None
        if name in ("i64", "u8"):
            assert isinstance(e["Max"], int)
    assert recs[-1]["Max"] == float("inf")


def test_md5_is_crc32_of_raw_bytes(tmp_path):
    dump = run_config(tmp_path, level="L1", summary_mode="md5")
    d = load_dump(dump)["data"]
    leaf = d["Functional.linear.0.forward"]["input_args"][1]
    assert list(leaf)[-1] == "md5" and len(leaf["md5"]) == 8
    # recompute: the weight of fc1 is deterministic under seed_all()
    proc = run_py(PREAMBLE + "\nm = Net()\nimport zlib\nprint('%08x' % zlib.crc32(m.fc1.weight.detach().numpy()"
                  ".tobytes()))\n", str(tmp_path))
    assert proc.stdout.strip() == leaf["md5"]


def test_xor_summary_mode(tmp_path):
    dump = run_config(tmp_path, level="L1", summary_mode="xor")
    leaf = load_dump(dump)["data"]["Functional.linear.0.forward"]["input_args"][1]
    assert list(leaf) == ["type", "dtype", "shape", "md5", "requires_grad"]
    assert leaf["md5"].startswith("0x") and len(leaf["md5"]) == 18


def test_tensor_task_writes_pt_files(tmp_path):
    dump = run_config(tmp_path, level="mix", task="tensor")
    d = load_dump(dump)
    rd = rank_dir(dump)
    assert d["dump_data_dir"] == os.path.join(dump, "step0", os.path.basename(rd), "dump_tensor_data")
    files = set(os.listdir(os.path.join(rd, "dump_tensor_data")))
    for name in ("Functional.linear.0.forward.input.0.pt", "Functional.linear.0.forward.output.0.pt",
                 "Module.fc1.Linear.forward.0.parameters.weight.pt", "Functional.linear.0.backward.output.2.pt",
                 "Module.fc1.Linear.parameters_grad.0.weight.pt", "Module.fc1.Linear.backward.0.input.0.pt"):
        assert name in files, sorted(files)[:20]
    entry = d["data"]["Functional.linear.0.forward"]["input_args"][1]
    t = torch.load(os.path.join(rd, "dump_tensor_data", entry["data_name"]), weights_only=True)
    assert list(t.shape) == entry["shape"] and t.max().item() == pytest.approx(entry["Max"])
    assert not t.requires_grad
    try:  # mindstudio-probe's own loader reads every file
        from msprobe.pytorch.common.utils import load_pt
    except ImportError:
        load_pt = None
    if load_pt is not None:
        for f in files:
            assert isinstance(load_pt(os.path.join(rd, "dump_tensor_data", f), to_cpu=True), torch.Tensor)
    for f in files:
        assert oct(os.stat(os.path.join(rd, "dump_tensor_data", f)).st_mode & 0o777) == "0o640"


def test_structure_task_writes_shapes_not_values(tmp_path):
    dump = run_config(tmp_path, level="L1", task="structure")
    d = load_dump(dump)
    assert d["level"] == "mix"  # msprobe promotes L1 to mix for structure
    assert d["data"], "structure writes the structure (msprobe writes an empty data object)"
    leaf = d["data"]["Functional.linear.0.forward"]["input_args"][0]
    assert leaf == {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [5, 4], "requires_grad": False}
    assert json.load(open(os.path.join(rank_dir(dump), "construct.json")))


def test_a_torch_func_transforms_tensors_get_their_statistics(tmp_path):
    """Inside torch.func.grad every tensor is a wrapper without storage of its own. The gradient of a sum is such a
    wrapper with all strides 0, whose statistics the kernel's constant path read through its data pointer: it was
    skipped with an error. Its statistics, and every other record of the transformed call, are those of the same call
    run eagerly (the Norm to float32's precision: torch's reduction over the wrapper, the kernel's over the plain
    tensor), and nothing is logged."""
    code = PREAMBLE + """
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
x = torch.randn(3, 4)
params = dict(m.named_parameters())

def loss(p, x):
    return torch.func.functional_call(m, p, (x,)).sum()

debugger = PrecisionDebugger(dump_path="d", level="L0")
debugger.start(model=m)
grads = torch.func.grad(loss)(params, x)  # the calls .0
m(x).sum().backward()  # the calls .1: the same values, eagerly
debugger.stop(); debugger.step()
print("SAME", all(torch.equal(grads[k], p.grad) for k, p in m.named_parameters()))
"""
    proc = run_py(code, str(tmp_path))
    assert "SAME True" in proc.stdout
    d = load_dump(str(tmp_path / "d"))["data"]
    assert not os.path.exists(os.path.join(rank_dir(str(tmp_path / "d")), "dump_error_info.log"))
    assert d["Module.2.Linear.backward.0"]["input"][0]["Max"] == 1.0  # the sum's gradient: ones, broadcast
    compared = 0
    for key in d:
        if not key.endswith(".0") or ".parameters_grad." in key:
            continue
        eager = list(leaves(d[key[:-2] + ".1"]))
        transformed = list(leaves(d[key]))
        assert len(transformed) == len(eager) > 0, key
        for got, want in zip(transformed, eager):
            exact = ("shape", "Max", "Min", "Mean")
            assert [got[k] for k in exact] == [want[k] for k in exact], key
            assert got["Norm"] == pytest.approx(want["Norm"], rel=1e-6), key
            compared += 1
    assert compared >= 12  # 15: inputs, outputs and parameters of three modules, forward and backward


def test_a_vmapped_call_keeps_its_results_and_says_why_it_has_no_statistics(tmp_path):
    """Inside torch.func.vmap a call sees one sample of a batched tensor: its statistics are not computed, each entry
    says why and the error log names the records; the per-sample gradients are those of the run without the tool."""
    code = PREAMBLE + """
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
params = {k: v.detach() for k, v in m.named_parameters()}
x = torch.randn(5, 4)

def loss(p, xi):
    return torch.func.functional_call(m, p, (xi.unsqueeze(0),)).sum()

per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))
ref = per_sample(params, x)
debugger = PrecisionDebugger(dump_path="d", level="mix")
debugger.start(model=m)
got = per_sample(params, x)
debugger.stop(); debugger.step()
print("SAME", all(torch.equal(ref[k], got[k]) for k in ref))
"""
    proc = run_py(code, str(tmp_path))
    assert "SAME True" in proc.stdout
    d = load_dump(str(tmp_path / "d"))["data"]
    fwd = d["Module.0.Linear.forward.0"]["input_args"][0]
    assert fwd["shape"] == [1, 4] and fwd["Max"] is None and "vmap" in fwd["error"]
    log = open(os.path.join(rank_dir(str(tmp_path / "d")), "dump_error_info.log")).read()
    assert "Module.0.Linear.forward.0: statistics not computed" in log
