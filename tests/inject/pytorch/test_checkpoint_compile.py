"""Activation checkpointing: the recomputed forward is left out (not a new call, not its APIs), the
original call keeps its forward, backward and parameter-gradient records, and no hook of ours raises.
torch.compile's generated code: an out= buffer is an output, recorded after the call."""

from __future__ import annotations

import json
import os

import pytest
from util import PREAMBLE, load_dump, run_py, write_config

SCRIPT = PREAMBLE + """
import warnings
from torch.utils.checkpoint import checkpoint
warnings.simplefilter("always")
reentrant = sys.argv[1] == "reentrant"
ckpt = sys.argv[1] != "plain"

class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Net()
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        h = checkpoint(self.block, x, use_reentrant=reentrant) if ckpt else self.block(x)
        return self.head(h)

debugger = PrecisionDebugger(config_path=sys.argv[2])
model = Outer()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with warnings.catch_warnings(record=True) as caught:
    for _ in range(2):
        debugger.start(model=model)
        x = torch.randn(5, 4, requires_grad=True)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
print("WARNINGS", json.dumps([str(w.message) for w in caught if "msprobe" in str(w.message)
                               or "hook" in str(w.message)]))
print("LOSS", loss.item())
from torch.nn.modules import module as mm
print("HOOKS", len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks))
"""


def _run(tmp_path, mode, level="mix"):
    d = tmp_path / f"{mode}_{level}"
    d.mkdir()
    cfg = write_config(str(d / "config.json"), dump_path=str(d / "dump"), level=level)
    proc = run_py(SCRIPT, str(d), args=(mode, cfg), timeout=240)
    warns = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("WARNINGS"))[9:])
    loss = next(line for line in proc.stdout.splitlines() if line.startswith("LOSS"))
    hooks = int(proc.stdout.split("HOOKS ")[1].split()[0])
    assert hooks == (2 if level == "mix" else 0), hooks  # at L1 they are out after the first forward
    return load_dump(str(d / "dump"), step=1)["data"], warns, loss, str(d / "dump")


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_recomputation_is_left_out(tmp_path, mode):
    plain, _, plain_loss, _ = _run(tmp_path, "plain")
    data, warns, loss, dump = _run(tmp_path, mode)
    assert loss == plain_loss
    assert warns == [], warns
    # the same calls as without checkpointing: the recomputed Net forward and its linears are not new calls
    fwd_only = sorted(k for k in data if "backward" not in k)
    assert fwd_only == sorted(k for k in plain if "backward" not in k)
    if mode == "nonreentrant":
        assert sorted(data) == sorted(plain), (sorted(set(plain) - set(data)), sorted(set(data) - set(plain)))
        assert "Module.block.Net.backward.0" in data
    fwd = data["Module.block.Net.forward.0"]
    assert fwd["input_args"] and fwd["output"], fwd
    assert "Module.block.fc1.Linear.parameters_grad.0" in data
    assert data["Module.block.fc1.Linear.forward.0"]["output"][0]["Max"] == \
        plain["Module.block.fc1.Linear.forward.0"]["output"][0]["Max"]
    assert not any(os.path.basename(p) == "dump_error_info.log" for _, _, fs in os.walk(dump) for p in fs)


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_recomputation_is_left_out_at_l1_with_the_module_hooks_out(tmp_path, mode):
    """At L1 the module hooks are out once the first forward ended: the records are still those of the run without
    checkpointing (torch's function mode is off inside a backward pass begun under it, so the recomputed calls
    reach no hook; where one would, apis._recomputing finds it, test_apis.py)."""
    plain, _, plain_loss, _ = _run(tmp_path, "plain", "L1")
    data, warns, loss, dump = _run(tmp_path, mode, "L1")
    assert loss == plain_loss
    assert warns == [], warns
    fwd_only = sorted(k for k in data if "backward" not in k)
    assert fwd_only == sorted(k for k in plain if "backward" not in k) and len(fwd_only) >= 5, fwd_only
    if mode == "nonreentrant":
        assert sorted(data) == sorted(plain), (sorted(set(plain) - set(data)), sorted(set(data) - set(plain)))
    key = "Functional.linear.0.forward"
    assert data[key]["output"][0]["Max"] == plain[key]["output"][0]["Max"]
    assert not any(os.path.basename(p) == "dump_error_info.log" for _, _, fs in os.walk(dump) for p in fs)


OUT_SCRIPT = PREAMBLE + """
debugger = PrecisionDebugger(config_path=sys.argv[1])
debugger.start()
x, w, b = torch.randn(3, 4), torch.randn(4, 2), torch.randn(2)
buf = torch.full((3, 2), float("nan"))  # what an uninitialised out= buffer may hold
torch.addmm(b, x, w, out=buf)
debugger.stop(); debugger.step()
print("REF", json.dumps(torch.addmm(b, x, w).max().item()))
"""


def test_out_argument_is_an_output_recorded_after_the_call(tmp_path):
    cfg = write_config(str(tmp_path / "config.json"), dump_path=str(tmp_path / "dump"), level="L1")
    proc = run_py(OUT_SCRIPT, str(tmp_path), args=(cfg,))
    ref = json.loads(proc.stdout.split("REF ")[1])
    rec = load_dump(str(tmp_path / "dump"))["data"]["Torch.addmm.0.forward"]
    assert "out" not in rec["input_kwargs"], rec["input_kwargs"]
    assert rec["output"][0]["Max"] == pytest.approx(ref)
    assert "first NaN" not in proc.stderr


def test_non_strict_export_is_traced_without_the_tools_hooks(tmp_path):
    """torch.export's non-strict tracing runs the model's Python with the module and API hooks on: they step aside
    (torch marks the tracing as compiling, not as dynamo's), so the exported graph holds the model's ops alone and the
    step records the eager calls only."""
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="mix")
m = Net()
x = torch.randn(3, 4, requires_grad=True)
debugger.start(model=m)
ep = torch.export.export(m, (x,), strict=False)
m(x).sum().backward()
debugger.stop(); debugger.step()
print("TARGETS", json.dumps(sorted({str(n.target) for n in ep.graph.nodes if n.op == "call_function"})))
print("SAME", bool(torch.equal(ep.module()(x), m(x))))
"""
    proc = run_py(code, str(tmp_path), timeout=240)
    targets = json.loads(proc.stdout.split("TARGETS")[1].splitlines()[0])
    assert targets == ["aten.linear.default", "aten.relu.default"], targets
    assert "SAME True" in proc.stdout
    d = load_dump(str(tmp_path / "d"), step=0)["data"]
    assert [k for k in d if k.endswith("forward") or k.endswith("forward.0")] == [
        "Functional.linear.0.forward", "Module.fc1.Linear.forward.0", "Functional.relu.0.forward",
        "Functional.linear.1.forward", "Module.fc2.Linear.forward.0", "Tensor.sum.0.forward"], list(d)
    assert not [f for _, _, fs in os.walk(str(tmp_path / "d")) for f in fs if f == "dump_error_info.log"]
