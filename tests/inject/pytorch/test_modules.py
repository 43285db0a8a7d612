"""Module backward capture gives what torch's BackwardHook gives, and leaves the training's gradients alone."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.hooks import BackwardHook
from util import PREAMBLE, load_dump, rank_dir, run_py

from msprobe_inject.pytorch.modules import _collect, _fix_view, _ModuleBackward, _put_back


def _reference(module, hook, pre):
    """The capture as it was built on torch's BackwardHook (the tensors requiring grad, nested too)."""
    bw = BackwardHook(module, [hook], [pre])

    def through(setup, value):
        tensors: list = []
        _collect(value, tensors)
        hooked = tuple([_fix_view(h) for h in setup(tuple(tensors))])
        return _put_back(value, tensors, hooked) if tensors else value

    return bw, lambda a: through(bw.setup_input_hook, a), lambda o: through(bw.setup_output_hook, o)


def _ours(module, hook, pre):
    bw = _ModuleBackward(module, hook, pre)
    return bw, bw.inputs, bw.outputs


def _install(model, make, log):
    handles = []

    def pre_fwd(module, args):
        name = names[module]
        hook = lambda m, gi, go: log.append((name, "hook", gi, go))  # noqa: E731
        pre = lambda m, go: log.append((name, "pre", go))  # noqa: E731
        bw, inp, out = make(module, hook, pre)
        stack.append(out)
        new = inp(args)
        return new if new is not args else None

    def post_fwd(module, args, output):
        new = stack.pop()(output)
        return new if new is not output else None

    stack: list = []
    names = {m: n or "root" for n, m in model.named_modules()}
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre_fwd))
        handles.append(m.register_forward_hook(post_fwd))
    return handles


class TwoIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(4, 4, 3)

    def forward(self, a, b):
        return self.bil(a, b)


class TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y, None, y * 2  # two tensors: the second is unused by the loss below


class InplaceInside(nn.Module):
    def forward(self, x):
        return x.mul_(2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.same = nn.Identity()
        self.two = TwoIn()
        self.tup = TupleOut()
        self.inp = InplaceInside()

    def forward(self, ids):
        h = self.emb(ids)
        h = self.act(self.fc(h))
        h = self.same(h)
        h = self.fc(h)  # the same module twice
        y, _, _unused = self.tup(h)
        h = self.inp(y + 0)
        return self.two(h, y).sum()


def _run(make, retain=False):
    torch.manual_seed(0)
    model = Net()
    ids = torch.randint(0, 10, (3, 5))
    log: list = []
    handles = _install(model, make, log) if make else []
    loss = model(ids)
    loss.backward(retain_graph=retain)
    if retain:
        loss.backward()
    for h in handles:
        h.remove()
    return log, {n: p.grad.clone() for n, p in model.named_parameters()}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("retain", [False, True])
def test_hooks_get_what_backward_hook_gives(retain):
    with pytest.warns(UserWarning):  # BackwardHook warns for modules whose inputs need no grad
        ref, ref_grads = _run(_reference, retain)
    got, grads = _run(_ours, retain)
    _, plain = _run(None, retain)
    assert [e[:2] for e in got] == [e[:2] for e in ref]
    # in-place updates of a hooked tensor ("act", "inp") detach its hook node, as with BackwardHook
    assert len(got) == (36 if retain else 18) and ("two.bil", "hook") in [e[:2] for e in got]
    for r, g in zip(ref, got):
        assert _same(r, g), (r, g)
    for n in plain:  # the training's gradients are untouched
        assert torch.equal(grads[n], plain[n]) and torch.equal(ref_grads[n], plain[n])


def test_put_back_hands_back_exactly_the_tensors_collect_gathered_in_their_places():
    """Which values a module's backward capture hooks is decided in _collect alone: _put_back puts each hooked twin
    where its tensor was, through lists, named tuples, dicts and mappings, and leaves the rest (a tensor without
    grad, a tensor past the depth limit, other values) as it was."""
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", "a b")
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    plain = torch.zeros(2)
    deep = b
    for _ in range(32):  # b one level past the depth _collect looks to
        deep = [deep]
    value = (a, [plain, Pair(b, 7)], {"x": a, "y": "s"}, deep, OrderedDict(z=b))
    tensors: list = []
    _collect(value, tensors)
    assert [t is a for t in tensors] == [True, False, True, False]
    hooked = [t * 1 for t in tensors]
    got = _put_back(value, tensors, hooked)
    assert got[0] is hooked[0] and got[1][0] is plain and got[1][1].a is hooked[1] and got[1][1].b == 7
    assert type(got[1][1]) is Pair and got[2] == {"x": hooked[2], "y": "s"} and got[4]["z"] is hooked[3]
    inner = got[3]
    for _ in range(32):
        inner = inner[0]
    assert inner is b  # past _collect's depth: not gathered, not replaced
    with torch.no_grad():
        tensors = []
        _collect(value, tensors)
    assert tensors == []  # outside grad mode no backward hook can see a value


def test_single_tensors_take_the_view_and_others_the_function():
    seen = []
    lin = nn.Linear(2, 2)
    bw = _ModuleBackward(lin, lambda *a: seen.append(a), lambda *a: None)
    x = torch.randn(1, 2, requires_grad=True)
    (xv,) = bw.inputs((x,))
    assert xv.grad_fn.name() == "AliasBackward0" and xv.data_ptr() == x.data_ptr()
    y = bw.outputs(lin(xv))
    assert y.grad_fn.name() == "AliasBackward0"
    a, b = bw.inputs((x, x * 1))
    assert a.grad_fn.name() == b.grad_fn.name() == "BackwardHookFunctionBackward"
    y.sum().backward()
    (_, grad_in, grad_out), = seen
    assert torch.equal(grad_out[0], torch.ones(1, 2)) and torch.equal(grad_in[0], lin.weight.sum(0, keepdim=True))


def test_a_single_output_or_input_handed_back_can_be_modified_in_place_as_the_modules_own():
    """A chunk of torch.split is a view that autograd forbids modifying in place; the view the backward capture hands
    back in its place is an ordinary view (as msprobe's BackwardHookFunction path makes it), whether it stands for a
    module's single output or for its one positional input."""
    seen = []
    lin = nn.Linear(4, 4)
    bw = _ModuleBackward(lin, lambda *a: seen.append(a), lambda *a: None)
    x = torch.randn(2, 8, requires_grad=True)
    h = x * 1
    with pytest.raises(RuntimeError, match="modified inplace"):
        h.split(4, dim=1)[0].add_(1)
    (xv,) = bw.inputs((h.split(4, dim=1)[0],))
    xv.mul_(2)
    y = bw.outputs(h.split(4, dim=1)[1])
    y.add_(1)
    (xv.sum() + y.sum()).backward()
    assert torch.equal(x.grad, torch.cat([torch.full((2, 4), 2.0), torch.ones(2, 4)], dim=1))


def test_a_failing_hook_never_reaches_backward():
    def boom(*_):
        raise RuntimeError("tool bug")

    lin = nn.Linear(2, 2)
    bw = _ModuleBackward(lin, boom, boom)
    x = torch.randn(1, 2, requires_grad=True)
    (xv,) = bw.inputs((x,))
    bw.outputs(lin(xv)).sum().backward()
    assert x.grad is not None



def test_a_module_whose_input_cannot_be_hooked_keeps_training_and_its_records(tmp_path):
    """Sparse tensors pass through neither a view nor BackwardHookFunction: the module's backward capture
    is skipped and logged, its forward record and every other module's records stay."""
    code = PREAMBLE + """
class SparseMM(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 2))

    def forward(self, x):
        return torch.sparse.mm(x, self.w)

class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.sp = SparseMM()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(self.sp(x))

m = Top()
x = torch.randn(4, 3).to_sparse().requires_grad_()
debugger = PrecisionDebugger(dump_path="d", level="L0")
debugger.start(model=m)
m(x).sum().backward()
debugger.stop(); debugger.step()
print("GRAD", m.sp.w.grad.tolist())
"""
    proc = run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    assert {"Module.sp.SparseMM.forward.0", "Module.fc.Linear.forward.0", "Module.fc.Linear.backward.0",
            "Module.sp.SparseMM.parameters_grad.0"} <= set(d)
    assert "Module.sp.SparseMM.backward.0" not in d
    assert "GRAD [[" in proc.stdout
    log = open(os.path.join(rank_dir(str(tmp_path / "d")), "dump_error_info.log")).read()
    assert "Module.sp.SparseMM.backward.0: backward capture not set up" in log


def test_parameter_gradients_are_those_of_the_modules_own_parameters_at_each_forward(tmp_path):
    """A module's records name each of its own parameters once, as named_parameters(recurse=False) yields them:
    no None, a parameter registered under two names once (and the gradient record no frozen one); a parameter
    replaced between forwards (as FSDP2 swaps them) is hooked again, its gradient recorded, the old one's no more,
    whether or not the module holds the old one under another name (``lin``: its other parameter unchanged)."""
    code = PREAMBLE + """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))
        self.register_parameter("none", None)
        self.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
        self.alias = self.w

    def forward(self, x):
        return x @ self.w + self.frozen

top = nn.Sequential()
top.m = M()
top.lin = nn.Linear(3, 3)
m, lin = top.m, top.lin
x = torch.randn(2, 3)
debugger = PrecisionDebugger(dump_path="d", level="L0")
for step in range(2):
    debugger.start(model=top)
    top(x).sum().backward()
    print("NORM", step, float(m.w.grad.norm()), float(lin.weight.grad.norm()))
    debugger.stop(); debugger.step()
    with torch.no_grad():
        m.w = nn.Parameter(m.w * 3.0)  # a new object under the same name (and alias keeps the old one)
        lin.weight = nn.Parameter(lin.weight * 3.0)
"""
    proc = run_py(code, str(tmp_path))
    norms = {line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines() if line.startswith("NORM")}
    for step in (0, 1):
        d = load_dump(str(tmp_path / "d"), step=step)["data"]
        grads = {k: v for k, v in d.items() if ".parameters_grad." in k}
        assert set(grads) == {"Module.m.M.parameters_grad.0", "Module.lin.Linear.parameters_grad.0"}, (step, grads)
        # step 1: w is the new parameter, alias the old one, unused in forward: no gradient
        assert set(grads["Module.m.M.parameters_grad.0"]) == {"w"}, (step, grads)
        assert abs(grads["Module.m.M.parameters_grad.0"]["w"][0]["Norm"] - float(norms[str(step)][0])) < 1e-4
        assert set(grads["Module.lin.Linear.parameters_grad.0"]) == {"weight", "bias"}, (step, grads)
        got = grads["Module.lin.Linear.parameters_grad.0"]["weight"][0]["Norm"]
        assert abs(got - float(norms[str(step)][1])) < 1e-4, step
        own = {"w", "frozen"} | ({"alias"} if step else set())  # frozen too; alias, once another object
        assert set(d["Module.m.M.forward.0"]["parameters"]) == own, step
        log = os.path.join(rank_dir(str(tmp_path / "d"), step), "dump_error_info.log")
        assert not os.path.exists(log), open(log).read()


def test_a_parameter_with_a_main_grad_is_recorded_by_it(tmp_path):
    """Megatron keeps a parameter's gradient in its ``main_grad`` (fp32) buffer: the record is that one's, also
    when it is None; a parameter without one is recorded by ``.grad``."""
    code = PREAMBLE + """
top = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
top[0].weight.main_grad = torch.full((3, 3), 2.0)
top[0].bias.main_grad = None
debugger = PrecisionDebugger(dump_path="d", level="L0")
debugger.start(model=top)
top(torch.randn(2, 3)).sum().backward()
debugger.stop(); debugger.step()
print("NORM", float(top[1].weight.grad.norm()))
"""
    proc = run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    first = d["Module.0.Linear.parameters_grad.0"]
    assert first["weight"][0]["Norm"] == 6.0  # sqrt(9 * 2.0 ** 2)
    assert first["bias"] == [None]
    norm = float(proc.stdout.split("NORM")[1])
    assert abs(d["Module.1.Linear.parameters_grad.0"]["weight"][0]["Norm"] - norm) < 1e-5



@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_compiled_model_has_the_records_of_its_eager_run_and_its_hooks_leave_at_l1(tmp_path, level):
    """A compiled model's parameter gradients are module records (levels L0 and mix), as its eager run's; at L1 the
    global module hooks are taken out after the first forward and the API records stay those of the eager run."""
    code = PREAMBLE + """
from torch.nn.modules import module as mm
debugger = PrecisionDebugger(dump_path=sys.argv[1], level=sys.argv[2])
m = Net()
if sys.argv[3] == "compiled":
    m = torch.compile(m, backend="eager")
for _ in range(2):
    debugger.start(model=m)
    m(torch.randn(5, 4)).sum().backward()
    debugger.stop()
    debugger.step()
print("HOOKS", len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks))
"""
    keys = {}
    for how in ("eager", "compiled"):
        proc = run_py(code, str(tmp_path), args=(how, level, how), timeout=240)
        assert f"HOOKS {0 if level == 'L1' else 2}" in proc.stdout, proc.stdout
        keys[how] = sorted(k for k in load_dump(str(tmp_path / how), step=1)["data"] if "parameters_grad" in k)
    expected = [] if level == "L1" else ["Module.fc1.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0"]
    assert keys == {"eager": expected, "compiled": expected}, keys


@pytest.mark.parametrize("step_on", ["optimizer", "forward"])
def test_zero_code_at_l1_steps_with_the_module_hooks_out_unless_it_steps_on_forwards(tmp_path, step_on):
    """Zero-code at L1: the first top-level call starts the dump and, stepping on the optimizer, the module hooks
    leave when it ends; every step still has its records. Stepping on forwards needs each forward's end: they stay."""
    from launch_util import BOOT
    from util import clean_env

    code = PREAMBLE + """
from torch.nn.modules import module as mm
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    loss = m(torch.randn(5, 4)).sum()
    if sys.argv[1] == "optimizer":
        loss.backward()
        opt.step()
        opt.zero_grad()
print("HOOKS", len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks))
"""
    env = clean_env(MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_LEVEL="L1", MSPROBE_STEP_ON=step_on)
    env["PYTHONPATH"] = BOOT + os.pathsep + env["PYTHONPATH"]
    proc = run_py(code, str(tmp_path), env=env, args=(step_on,))
    assert f"HOOKS {2 if step_on == 'forward' else 0}" in proc.stdout, proc.stdout
    for step in range(3):
        data = load_dump(str(tmp_path / "d"), step=step)["data"]
        assert "Functional.linear.0.forward" in data and "Functional.linear.1.forward" in data, (step, sorted(data))
        assert ("Functional.linear.0.backward" in data) == (step_on == "optimizer"), (step, sorted(data))
