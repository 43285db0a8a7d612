"""Tasks, levels, summary modes and statistics, each asserted on the files written by a real run."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import torch
from util import PREAMBLE, leaves, load_dump, rank_dir, run_py, train_script, write_config


def _run(tmp_path, steps=1, extra_pre="", extra_post="", **cfg):
    dump = str(tmp_path / "dump")
    conf = write_config(str(tmp_path / "config.json"), dump_path=dump, **cfg)
    run_py(train_script(conf, steps, extra_pre, extra_post), str(tmp_path))
    return dump


def test_l1_statistics_layout_and_values(tmp_path):
    dump = _run(tmp_path, level="L1")
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
    dump = _run(tmp_path, level="L1", summary_mode="md5")
    d = load_dump(dump)["data"]
    leaf = d["Functional.linear.0.forward"]["input_args"][1]
    assert list(leaf)[-1] == "md5" and len(leaf["md5"]) == 8
    # recompute: the weight of fc1 is deterministic under seed_all()
    proc = run_py(PREAMBLE + "\nm = Net()\nimport zlib\nprint('%08x' % zlib.crc32(m.fc1.weight.detach().numpy()"
                  ".tobytes()))\n", str(tmp_path))
    assert proc.stdout.strip() == leaf["md5"]


def test_xor_summary_mode(tmp_path):
    dump = _run(tmp_path, level="L1", summary_mode="xor")
    leaf = load_dump(dump)["data"]["Functional.linear.0.forward"]["input_args"][1]
    assert list(leaf) == ["type", "dtype", "shape", "md5", "requires_grad"]
    assert leaf["md5"].startswith("0x") and len(leaf["md5"]) == 18


def test_tensor_task_writes_pt_files(tmp_path):
    dump = _run(tmp_path, level="mix", task="tensor")
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
    dump = _run(tmp_path, level="L1", task="structure")
    d = load_dump(dump)
    assert d["level"] == "mix"  # msprobe promotes L1 to mix for structure
    assert d["data"], "structure writes the structure (msprobe writes an empty data object)"
    leaf = d["data"]["Functional.linear.0.forward"]["input_args"][0]
    assert leaf == {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [5, 4], "requires_grad": False}
    assert json.load(open(os.path.join(rank_dir(dump), "construct.json")))


def test_overflow_check_keeps_only_nonfinite_records(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(config_path=sys.argv[1])
debugger.start()
a = torch.tensor([1.0, 2.0])
torch.exp(a)
torch.exp(torch.tensor([1.0, 3e38]))  # overflows
torch.log(torch.tensor([-1.0]))      # NaN
torch.sqrt(torch.tensor([-1.0]))     # NaN, beyond overflow_nums=2
debugger.stop(); debugger.step()
"""
    conf = write_config(str(tmp_path / "c.json"), dump_path="d", task="overflow_check", level="L1", overflow_nums=2)
    run_py(code, str(tmp_path), args=(conf,))
    d = load_dump(str(tmp_path / "d"))
    assert d["task"] == "overflow_check"
    assert list(d["data"]) == ["Torch.exp.1.forward", "Torch.log.0.forward"]


def test_levels_l0_mix_and_construct(tmp_path):
    dump = _run(tmp_path, level="L0")
    d = load_dump(dump)["data"]
    assert all(k.startswith("Module.") for k in d)
    assert list(d) == ["Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0",
                       "Module.fc2.Linear.parameters_grad.0", "Module.fc2.Linear.backward.0",
                       "Module.fc1.Linear.parameters_grad.0", "Module.fc1.Linear.backward.0"] or \
        set(d) == {"Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0", "Module.fc2.Linear.backward.0",
                   "Module.fc1.Linear.backward.0", "Module.fc2.Linear.parameters_grad.0",
                   "Module.fc1.Linear.parameters_grad.0"}
    body = d["Module.fc1.Linear.forward.0"]
    assert list(body) == ["input_args", "input_kwargs", "output", "parameters"]
    assert set(body["parameters"]) == {"weight", "bias"}
    assert set(d["Module.fc1.Linear.parameters_grad.0"]) == {"weight", "bias"}
    construct = json.load(open(os.path.join(rank_dir(dump), "construct.json")))
    assert construct["Module.fc1.Linear.forward.0"] is None


def test_mix_construct_hierarchy_and_optimizer(tmp_path):
    dump = _run(tmp_path, level="mix")
    construct = json.load(open(os.path.join(rank_dir(dump), "construct.json")))
    assert construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert construct["Functional.relu.0.forward"] is None
    assert construct.get("optimizer", "absent") is None
    assert any(v == "optimizer" for v in construct.values())


def test_vf_lstm_is_captured(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
lstm = nn.LSTM(4, 3)
debugger.start()
out, _ = lstm(torch.randn(2, 1, 4))
out.sum().backward()
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "VF.lstm.0.forward" in d, list(d)


def test_originals_are_untouched(tmp_path):
    code = PREAMBLE + """
orig = (F.gelu, torch.matmul, torch.Tensor.add, torch.Tensor.__add__, F.linear)
debugger = PrecisionDebugger(dump_path="d", level="mix")
m = Net()
debugger.start(model=m)
m(torch.randn(2, 4)).sum().backward()
now = (F.gelu, torch.matmul, torch.Tensor.add, torch.Tensor.__add__, F.linear)
assert all(a is b for a, b in zip(orig, now)), now
assert isinstance(F.gelu, type(orig[0]))
debugger.stop(); debugger.step()
print("IDENTITY-OK")
"""
    assert "IDENTITY-OK" in run_py(code, str(tmp_path)).stdout


def test_operators_get_msprobe_dunder_names(tmp_path):
    code = PREAMBLE + """
import math
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.start()
a = torch.randn(3, requires_grad=True); b = torch.randn(3)
scale = 0.5
x = a + b; y = 2 * a; z = a * 2; w = 1.0 - a; v = scale * a; u = math.sqrt(2.0) * (a + b); q = a @ b
c = b.clone(); c += 1
a.add(b)
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    keys = [k for k in load_dump(str(tmp_path / "d"))["data"] if k.endswith(".forward")]
    assert keys == ["Tensor.__add__.0.forward", "Tensor.__rmul__.0.forward", "Tensor.__mul__.0.forward",
                    "Tensor.__rsub__.0.forward", "Tensor.__rmul__.1.forward", "Tensor.__add__.1.forward",
                    "Tensor.__rmul__.2.forward", "Tensor.__matmul__.0.forward", "Tensor.__iadd__.0.forward",
                    "Tensor.add.0.forward"], keys


def test_async_dump_is_accepted_and_changes_nothing(tmp_path):
    """msprobe's async_dump is accepted for compatibility and ignored: the same run writes the same records."""
    (tmp_path / "sync").mkdir()
    (tmp_path / "async").mkdir()
    sync = load_dump(_run(tmp_path / "sync", level="L1", async_dump=False))
    asynchronous = load_dump(_run(tmp_path / "async", level="L1", async_dump=True))
    assert sync["data"] and asynchronous == sync


def test_files_and_dirs_permissions(tmp_path):
    dump = _run(tmp_path, level="L1")
    rd = rank_dir(dump)
    assert oct(os.stat(rd).st_mode & 0o777) == "0o750"
    for f in glob.glob(os.path.join(rd, "*.json")):
        assert oct(os.stat(f).st_mode & 0o777) == "0o640"


def test_journal_recovers_after_kill(tmp_path):
    code = PREAMBLE + """
import signal
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
for _ in range(3):
    m(torch.randn(2, 4)).sum().backward()
import time; time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == -9
    rd = rank_dir(str(tmp_path / "d"))
    from msprobe_inject.dumpformat.journal import recover

    res = recover(rd)
    assert res["records"] > 0 and res["complete"] is False
    d = json.load(open(os.path.join(rd, "dump.json")))
    assert d["incomplete"] is True
    assert "Functional.linear.5.forward" in d["data"]


def test_sigterm_flushes_json_files(tmp_path):
    code = PREAMBLE + """
import signal, time
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
for _ in range(3):
    m(torch.randn(2, 4)).sum().backward()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("NOT-REACHED")
"""
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == -15 and "NOT-REACHED" not in proc.stdout
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "Functional.linear.5.forward" in d and "Functional.linear.5.backward" in d


def test_torch_compile_runs_without_recompiles(tmp_path):
    code = PREAMBLE + """
import torch._dynamo as dyn
debugger = PrecisionDebugger(dump_path="d", level="mix")
torch.manual_seed(0)
m = Net()
cm = torch.compile(m)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(3, 4)
losses = []
for i in range(3):
    debugger.start(model=cm)
    loss = cm(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
    losses.append(float(loss))
    debugger.stop(); debugger.step()
print("RECOMPILES", sum(dyn.utils.counters["recompiles"].values()))
print("LOSSES", json.dumps(losses))
"""
    proc = run_py(code, str(tmp_path))
    assert int(proc.stdout.split("RECOMPILES")[1].split()[0]) == 0
    ref = run_py(code.replace('debugger = PrecisionDebugger(dump_path="d", level="mix")',
                              "debugger = type('D', (), {'start': lambda *a, **k: None, 'stop': lambda *a: None, "
                              "'step': lambda *a: None})()"), str(tmp_path))
    assert proc.stdout.split("LOSSES")[1] == ref.stdout.split("LOSSES")[1]
    d = load_dump(str(tmp_path / "d"), step=1)["data"]
    assert "Tensor.sum.0.forward" in d and "Tensor.sum.0.backward" in d


def test_tensor_step_files_complete_at_stop(tmp_path):
    # stop() returns when the step's records and tensor files are on disk, as with msprobe
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1", task="tensor")
m = Net()
seen = []
for step in range(2):
    debugger.start()
    m(torch.full((64, 4), float(step))).sum().backward()
    debugger.stop()
    rd = [os.path.join(f"d/step{step}", r) for r in os.listdir(f"d/step{step}")][0]
    data = json.load(open(os.path.join(rd, "dump.json")))["data"]
    names = [e["data_name"] for r in data.values() for v in r.values() if isinstance(v, list)
             for e in v if isinstance(e, dict) and "data_name" in e]
    x = torch.load(os.path.join(rd, "dump_tensor_data", "Functional.linear.0.forward.input.0.pt"))
    seen.append((step, len(names), all(os.path.exists(os.path.join(rd, "dump_tensor_data", n)) for n in names),
                 float(x[0, 0])))
    debugger.step()
print(json.dumps(seen))
"""
    proc = run_py(code, str(tmp_path))
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(s, complete, value) for s, _n, complete, value in seen] == [(0, True, 0.0), (1, True, 1.0)]
    assert all(n > 5 for _s, n, _c, _v in seen)
