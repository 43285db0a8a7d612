"""API interception (pytorch/apis.py, apinames.py): msprobe's names, _VF, originals untouched, torch.compile."""

from __future__ import annotations

import json

import pytest
from util import PREAMBLE, load_dump, run_py


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


def test_a_constant_right_operand_names_the_operator_without_a_look_at_the_left(tmp_path):
    code = PREAMBLE + """
from msprobe_inject.pytorch import apinames
looked = []
real = apinames._left_is_scalar
apinames._left_is_scalar = lambda *a: looked.append(1) or real(*a)
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.start()
a = torch.randn(3); b = torch.randn(3)
h = 0.5
for _ in range(3):
    r = torch.relu(a) * 0.5; s = 0.5 * torch.relu(b); t = torch.relu(a) + 1; g = h * torch.relu(b)
debugger.stop(); debugger.step()
print("LOOKED", len(looked))
looked.clear()
debugger.start()
k = 0.5
for c in (True, False):  # a constant on one branch of the right operand: this site is not known at once
    u = k * (torch.relu(a) if c else 0.5)
debugger.stop(); debugger.step()
print("LOOKED", len(looked))
"""
    out = run_py(code, str(tmp_path)).stdout
    keys = [k for k in load_dump(str(tmp_path / "d"))["data"] if k.startswith("Tensor.")]
    assert keys == [f"Tensor.{op}.forward" for i in range(3)
                    for op in (f"__mul__.{i}", f"__rmul__.{2 * i}", f"__add__.{i}", f"__rmul__.{2 * i + 1}")], keys
    # the constant right operands' sites never look left; the constant left operand (0.5 * x) is looked at once, its
    # answer kept for the site; the name's (h * x), at every call
    assert "LOOKED 4\n" in out, out
    # k * relu(a) reached the method (k * 0.5 is no tensor's): its left operand was looked at, not taken as known
    assert out.endswith("LOOKED 1\n"), out


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_torch_compile_runs_without_recompiles(tmp_path, level):
    """At L1 too, where the module hooks leave after the first forward."""
    code = PREAMBLE + f"""
import torch._dynamo as dyn
debugger = PrecisionDebugger(dump_path="d", level="{level}")
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
    ref = run_py(code.replace(f'debugger = PrecisionDebugger(dump_path="d", level="{level}")',
                              "debugger = type('D', (), {'start': lambda *a, **k: None, 'stop': lambda *a: None, "
                              "'step': lambda *a: None})()"), str(tmp_path))
    assert proc.stdout.split("LOSSES")[1] == ref.stdout.split("LOSSES")[1]
    d = load_dump(str(tmp_path / "d"), step=1)["data"]
    assert "Tensor.sum.0.forward" in d and "Tensor.sum.0.backward" in d


def test_calls_that_are_no_api_are_called_through_and_the_apis_still_recorded(tmp_path):
    """The dump mode remembers the callables that are no API (a tensor attribute's getter, torch.is_complex) and calls
    them through at once: their results are the call's, and the listed APIs around them, including one called as an
    operator and as a method, are recorded in every step as before."""
    code = PREAMBLE + """
from msprobe_inject.pytorch import apis
debugger = PrecisionDebugger(dump_path="d", level="L1")
x = torch.randn(4, 4, requires_grad=True)
for step in range(2):
    debugger.start()
    for i in range(3):
        assert torch.is_complex(x) is False and (x.grad is None) == (step == 0 and i == 0)
        y = torch.relu(x) * 2 + x.add(1)
        y.sum().backward()
    debugger.stop(); debugger.step()
mode = PrecisionDebugger._rt().fw.apis.mode
never = [f for f, info in mode.known.items() if info is None]
names = sorted(getattr(f, "__qualname__", None) or repr(f) for f in never)
print("NEVER", json.dumps(names))
print("LISTED", any(mode.hooks.table.lookup(f) is not None for f in never))
print("KNOWN", json.dumps(sorted(info[0] for info in mode.known.values() if info is not None)))
"""
    out = run_py(code, str(tmp_path)).stdout
    never = json.loads(next(line for line in out.splitlines() if line.startswith("NEVER "))[6:])
    assert "_VariableFunctionsClass.is_complex" in never, never
    assert "LISTED False" in out
    # an API's name is kept, but not an operator's: the calling line says which it is (x.add or +)
    known = json.loads(next(line for line in out.splitlines() if line.startswith("KNOWN "))[6:])
    assert "Torch.relu." in known and not any(k.startswith(("Tensor.add", "Tensor.__")) for k in known), known
    for step in (0, 1):
        d = load_dump(str(tmp_path / "d"), step=step)["data"]
        for key in ("Torch.relu.2.forward", "Tensor.__mul__.2.forward", "Tensor.add.2.forward",
                    "Tensor.__add__.2.forward", "Torch.relu.2.backward"):
            assert key in d, (step, key, sorted(d))
        assert not any("is_complex" in k for k in d)


def test_an_operators_name_kept_for_its_calling_instruction_is_the_one_each_call_would_get(tmp_path):
    """An operator's record name is kept per calling instruction and per second argument (a tensor or not): the
    same instruction reached with the operands swapped (``p * q`` with p a number: the method gets them in the
    other order) is named again, a constant left operand once, and ``**`` and its reflection each by its own
    instruction."""
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.start()
t = torch.randn(3)
def f(p, q): return p * q
def c(q): return 2.0 * q
def p(q): return q ** 2
def r(q): return 2 ** q
for _ in range(2):
    f(t, t); f(2.0, t); f(t, 2.0); c(t); p(t); r(t)
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    keys = [k.rsplit(".", 2)[0] for k in load_dump(str(tmp_path / "d"))["data"] if k.endswith(".forward")]
    assert keys == ["Tensor.__mul__", "Tensor.__rmul__", "Tensor.__mul__", "Tensor.__rmul__", "Tensor.__pow__",
                    "Tensor.__rpow__"] * 2, keys


def test_a_call_inside_a_backward_pass_is_a_recomputation_when_a_module_forward_began_inside_the_pass(tmp_path):
    """apis._recomputing, which the API calls ask inside a backward pass while the module hooks are out: true inside
    activation checkpointing's recomputed module forward (reentrant or not), false in a custom function's backward,
    also when the pass itself was begun inside a module forward."""
    code = PREAMBLE + """
from torch.utils.checkpoint import checkpoint
from msprobe_inject.pytorch.apis import _recomputing
seen = []

def look(where):
    if torch._C._current_graph_task_id() != -1:
        seen.append((where, _recomputing(sys._getframe())))

class Block(nn.Module):
    def forward(self, x):
        look("recomputed forward")
        return torch.relu(x * 2)

class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        look("custom backward")
        return g * 2

class Runs(nn.Module):
    def forward(self, x):  # a backward pass begun inside a module forward
        leaf = x.detach().requires_grad_()
        torch.autograd.grad(Twice.apply(leaf).sum(), [leaf])
        return x

block = Block()
for reentrant in (False, True):
    x = torch.randn(3, requires_grad=True)
    checkpoint(block, x, use_reentrant=reentrant).sum().backward()
Twice.apply(torch.randn(3, requires_grad=True)).sum().backward()
Runs()(torch.randn(3))
print("SEEN", json.dumps(seen))
"""
    proc = run_py(code, str(tmp_path))
    seen = json.loads(proc.stdout.split("SEEN ")[1])
    assert seen == [["recomputed forward", True], ["recomputed forward", True], ["custom backward", False],
                    ["custom backward", False]], seen
