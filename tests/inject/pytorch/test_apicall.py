"""A recorded API call's common case in C (pytorch/_apicall.c): the same records, stacks, tree places, backward
records, error log lines and counts as apis.py's Python path, which runs every call when the C is switched off."""

from __future__ import annotations

import glob
import json
import os

import pytest
from util import PREAMBLE, run_py

# a script's first lines: the C common case on ("c") or off ("py", apis._fast_call None), as argv[1] says
WAY = PREAMBLE + """
from msprobe_inject.pytorch import apis
if apis._fast_call is None:
    print("NO-C"); sys.exit(0)
if sys.argv[1] == "py":
    apis._fast_call = None
"""

# one process per path: the same seeded model and calls, the C common case on or off (apis._fast_call); the
# Python call_api counted, so that each run says how many calls the Python path took
SCRIPT = WAY + """
level, summary = sys.argv[2], sys.argv[3]
def counted(name):  # the Python path's calls of ApiHooks.<name>, counted
    real, seen = getattr(apis.ApiHooks, name), [0]
    def wrapper(self, *a, **k):
        seen[0] += 1
        return real(self, *a, **k)
    setattr(apis.ApiHooks, name, wrapper)
    return seen
python_calls, python_backward = counted("call_api"), counted("_on_backward")

class Tagged(torch.Tensor):
    pass

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        y = self.drop(F.relu(self.fc(x)))
        return y * 2 + 1  # operators: their names kept per calling instruction

with open("config.json", "w") as fh:
    json.dump({"task": "statistics", "dump_path": "d", "level": level, "statistics": {"summary_mode": summary}}, fh)
debugger = PrecisionDebugger(config_path="config.json")
m = nn.Sequential(Block(), nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)  # at mix its calls are placed under "optimizer"
for step in range(2):
    python_calls[0] = python_backward[0] = 0  # the second step's: every callable has been seen (named) in the first
    debugger.start(model=m)
    x = torch.randn(3, 4, requires_grad=True)
    y = m(x)
    z = (y - 0.5).sum() + F.gelu(y, approximate="tanh").mean()  # a Python function with keywords: respelled
    a, b = torch.var_mean(y, dim=1)  # a tuple output
    try:
        torch.matmul(a, torch.ones(5, 5))  # the user's error is the user's, and the next call is recorded
    except RuntimeError:
        pass
    top = torch.topk(y, 1, dim=1)  # a named tuple: one value
    sub = torch.mul(y.as_subclass(Tagged), 3)  # a subclass output: its node hook asked through the Python
    z = z + torch.matmul(a, b.t()).sum() + torch.add(y, y, alpha=2).sum() + top.values.sum() + sub.sum()
    with torch.no_grad():
        torch.add(x, 1)  # no backward hook under no_grad
    for _ in range(11):
        torch.relu(x)  # counts of two digits in the key
    z.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
print("PYTHON-CALLS", python_calls[0], python_backward[0])
"""


def _run(tmp, way: str, level: str, summary: str):
    cwd = tmp / f"{way}-{level}-{summary}"
    cwd.mkdir()
    out = run_py(SCRIPT, str(cwd), args=(way, level, summary)).stdout
    if "NO-C" in out:
        pytest.skip("the C common case is not built here")
    files = {}
    for path in sorted(glob.glob(str(cwd / "d" / "**" / "*"), recursive=True)):
        if os.path.isfile(path):
            rel = os.path.relpath(path, cwd / "d").split(os.sep)
            rel[1] = "rank"  # proc{pid} before the rank is known: the two runs' pids differ
            with open(path, "rb") as fh:  # the stacks name the script by its path: the runs' directories differ
                files["/".join(rel)] = fh.read().replace(str(cwd).encode(), b"CWD")
    counts = out.split("PYTHON-CALLS")[1].split()
    return files, int(counts[0]), int(counts[1])


def _both_ways(tmp, code: str) -> dict:
    """code (beginning with WAY) run on the C path and on the Python path, each in its own directory: way -> it.
    Each run must reach its end ("RETURNED")."""
    cwds = {}
    for way in ("c", "py"):
        cwd = cwds[way] = tmp / way
        cwd.mkdir()
        out = run_py(code, str(cwd), args=(way,)).stdout
        if "NO-C" in out:
            pytest.skip("the C common case is not built here")
        assert "RETURNED" in out
    return cwds


@pytest.mark.parametrize("level,summary", [("L1", "statistics"), ("mix", "statistics"), ("L1", "md5"), ("L1", "xor")])
def test_the_c_common_case_writes_what_the_python_path_writes(tmp_path, level, summary):
    fast, c_python_calls, c_python_backward = _run(tmp_path, "c", level, summary)
    slow, py_python_calls, py_python_backward = _run(tmp_path, "py", level, summary)
    assert sorted(fast) == sorted(slow)
    assert any(k.endswith("stack.json") for k in fast)
    differ = [k for k in fast if fast[k] != slow[k]]
    assert not differ, (differ, fast[differ[0]][:2000], slow[differ[0]][:2000])
    data = json.loads(fast["step1/rank/dump.json"])["data"]
    forward = [k for k in data if k.endswith(".forward")]
    # every listed call a record: the operators, the respelled gelu, the tuple output, the call after the error
    names = {k.rsplit(".", 2)[0] for k in forward}
    for name in ("Tensor.__mul__", "Tensor.__add__", "Tensor.__sub__", "Functional.gelu", "Torch.var_mean",
                 "Torch.topk", "Torch.matmul", "Torch.add", "Torch.mul"):
        assert name in names, (name, sorted(names))
    # the failing matmul was not counted: the next one is .0
    assert "Torch.matmul.0.forward" in data and "Torch.matmul.1.forward" not in data
    assert len(data["Torch.var_mean.0.forward"]["output"]) == 2
    assert "Torch.relu.10.forward" in data and "Torch.relu.10.backward" not in data  # no gradient reached it
    assert "Torch.mul.0.backward" in data  # the subclass output's gradient
    if level == "mix":  # the optimizer's calls' tree place
        assert '"optimizer"' in fast["step1/rank/construct.json"].decode()
    # in the second step the Python path took every recorded call in one run, none in the other (the respelled
    # relu and dropout, the operators, the tuple outputs, the call after the user's error: all the C's)
    assert py_python_calls == len(forward) + 1  # the failing matmul: called, not recorded
    assert c_python_calls == 0
    # the backward records: every one through the Python in one run; in the other only those of outputs that are
    # not one plain tensor (the tuples, the subclass's), the rest in C
    backward = [k for k in data if k.endswith(".backward")]
    assert py_python_backward == len(backward) == 24
    assert c_python_backward == 5  # var_mean's and topk's tuples; the subclass's mul, sum and the add of its sum


def test_a_failing_capture_is_logged_as_the_python_path_logs_it_and_the_call_returns(tmp_path):
    code = WAY + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.start()
w = torch.ones(2, 2, requires_grad=True)
torch.matmul(w, w)  # the first call names matmul (in Python), the next ones are the C's
v = torch.matmul(w, w)  # recorded; its backward record then fails as the calls below do
ctx = debugger.runtime.encoder._ctx
debugger.runtime.encoder._ctx = None  # the C entries call raises TypeError for each value
x = torch.ones(2, 2)
y = torch.matmul(x, x)
assert y.sum().item() == 8.0
v.sum().backward()  # the gradients arrive, and reach the user's tensor
assert w.grad.sum().item() == 16.0
debugger.runtime.encoder._ctx = ctx
debugger.stop()
print("RETURNED")
"""
    logs = {}
    for way, cwd in _both_ways(tmp_path, code).items():
        found = glob.glob(str(cwd / "d" / "**" / "dump_error_info.log"), recursive=True)
        assert found, os.listdir(cwd / "d")
        with open(found[0]) as fh:
            # each line's time and pid differ between the runs: what follows them is the record's key and the error
            logs[way] = [ln.split(" Torch.matmul.", 1)[1] for ln in fh if "Torch.matmul." in ln]
    assert any(ln.startswith("1.backward: backward capture failed: TypeError") for ln in logs["c"]), logs["c"]
    assert any("input capture failed: TypeError" in ln for ln in logs["c"]), logs["c"]
    assert any("output capture failed: TypeError" in ln for ln in logs["c"]), logs["c"]
    assert logs["c"] == logs["py"]


def test_a_backward_after_stop_is_recorded_as_the_python_path_records_it(tmp_path):
    # the gradients arrive after stop() and step(): the record goes where the Python path puts it, the next step's
    code = WAY + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
w = torch.ones(2, 2, requires_grad=True)
debugger.start()
torch.matmul(w, w)  # the first call names matmul (in Python), the next one is the C's
v = torch.matmul(w, w) * 3
debugger.stop()
debugger.step()
v.sum().backward()
assert w.grad.sum().item() == 48.0
debugger.stop()
print("RETURNED")
"""
    data = {}
    for way, cwd in _both_ways(tmp_path, code).items():
        data[way] = {}
        for path in glob.glob(str(cwd / "d" / "step*" / "*" / "dump.json")):
            with open(path) as fh:
                data[way][os.path.relpath(path, cwd / "d").split(os.sep)[0]] = json.load(fh)["data"]
    assert "Torch.matmul.1.forward" in data["c"]["step0"], data["c"]
    assert "Torch.matmul.1.backward" in data["c"]["step1"], data["c"]
    assert data["c"] == data["py"]


# ---- a module call that records its outputs alone (module_pre, module_post): the monitor preset's ----

# the module hooks' C common case on ("c") or off ("py", modules._fast_pre, _fast_post and _fast_param_grad None), as
# argv[1] says
MODULE_WAY = PREAMBLE + """
from msprobe_inject import recorder
from msprobe_inject.pytorch import modules
if modules._fast_pre is None:
    print("NO-C"); sys.exit(0)
if sys.argv[1] == "py":
    modules._fast_pre = modules._fast_post = modules._fast_param_grad = None
python_bodies = {"module_enter": 0, "module_exit": 0, "param_grad": 0}
def counted(name):  # the Python path's calls of Recorder.<name>, counted
    real = getattr(recorder.Recorder, name)
    def wrapper(self, *a, **k):
        python_bodies[name] += 1
        return real(self, *a, **k)
    setattr(recorder.Recorder, name, wrapper)
counted("module_enter")
counted("module_exit")
counted("param_grad")

class Fails(nn.Module):
    def forward(self, x):
        raise ValueError("the user's own error")
"""

MODULE_SCRIPT = MODULE_WAY + """
import collections
from torch.utils.checkpoint import checkpoint
Pair = collections.namedtuple("Pair", "a b")

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        y = self.drop(self.act(self.fc(x)))
        return y * 0.5 + x, (x, [y * 2])  # a tuple output, nested values

class Named(nn.Module):
    def forward(self, x):
        return Pair(x + 1, x.sum())  # a named tuple: one value

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.shared = nn.Linear(4, 4)  # called twice per step: forward.0 and forward.1
        self.named = Named()
        self.fails = Fails()
        self.ckpt = Block()  # checkpointed: run again in the backward pass, which records nothing
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for b in self.blocks:
            x, _ = b(x)
        x = self.shared(self.shared(x))
        try:
            self.fails(x)
        except ValueError:
            pass
        x = self.named(x).a
        x, _ = checkpoint(self.ckpt, x, use_reentrant=False)
        with torch.no_grad():
            self.head(x)  # no gradient: recorded all the same
        return self.head(x)

settings = {"monitor": {"level": "L0", "preset": "monitor"}, "L0": {"level": "L0"}}[sys.argv[2]]
with open("config.json", "w") as fh:
    json.dump({"task": "statistics", "dump_path": "d", **settings}, fh)
debugger = PrecisionDebugger(config_path="config.json")
m = Net()
m.shared.bias.main_grad = torch.full((4,), 0.25)  # Megatron's fp32 gradient: recorded in its place
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(3):
    if step == 2:  # a parameter replaced by another object (as FSDP2 swaps them): its gradient still recorded
        m.head.weight = nn.Parameter(m.head.weight.detach().clone())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
    python_bodies.update(module_enter=0, module_exit=0, param_grad=0)
    debugger.start(model=m)
    x = torch.randn(3, 4, requires_grad=True)
    m(x).sum().backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
print("PYTHON-BODIES", python_bodies["module_enter"], python_bodies["module_exit"], python_bodies["param_grad"])
"""


def _module_run(tmp, way: str, config: str, script: str = MODULE_SCRIPT, marker: str = "PYTHON-BODIES"):
    """script run one way in its own directory: its step directories' files, and what it printed after marker"""
    cwd = tmp / way
    cwd.mkdir()
    out = run_py(script, str(cwd), args=(way, config)).stdout
    if "NO-C" in out:
        pytest.skip("the C common case is not built here")
    files = {}
    for path in sorted(glob.glob(str(cwd / "d" / "**" / "*"), recursive=True)):
        rel = os.path.relpath(path, cwd / "d").split(os.sep)
        if os.path.isfile(path) and rel[0].startswith("step"):
            rel[1] = "rank"  # proc{pid}: the two runs' pids differ
            with open(path, "rb") as fh:  # the stacks name the script by its path: the runs' directories differ
                files["/".join(rel)] = fh.read().replace(str(cwd).encode(), b"CWD")
    return files, out.split(marker)[1]


@pytest.mark.parametrize("config", ["monitor", "L0"])
def test_a_module_call_and_a_parameter_gradient_are_written_as_the_python_path_writes_them(tmp_path, config):
    fast, c_said = _module_run(tmp_path, "c", config)
    slow, py_said = _module_run(tmp_path, "py", config)
    (c_enter, c_exit, c_pgrad), (py_enter, py_exit, py_pgrad) = ([int(n) for n in said.split()]
                                                                 for said in (c_said, py_said))
    assert sorted(fast) == sorted(slow)
    differ = [k for k in fast if fast[k] != slow[k]]
    assert not differ, (differ, fast[differ[0]][:2000], slow[differ[0]][:2000])
    data = json.loads(fast["step2/rank/dump.json"])["data"]
    for key in ("Module.blocks.1.act.GELU.forward.0", "Module.shared.Linear.forward.1", "Module.named.Named.forward.0",
                "Module.ckpt.Block.forward.0", "Module.head.Linear.forward.1", "Module.head.Linear.parameters_grad.0"):
        assert key in data, (key, sorted(data))
    assert "Module.ckpt.Block.forward.1" not in data  # the recomputation is the same call
    assert "output" not in data.get("Module.fails.Fails.forward.0", {})  # it raised: no outputs to record
    assert len(data["Module.blocks.0.Block.forward.0"]["output"]) == 2
    assert len(data["Module.head.Linear.parameters_grad.0"]) == 2  # the replaced weight's and the bias's
    assert data["Module.shared.Linear.parameters_grad.0"]["bias"][0]["Norm"] == 0.5  # the main_grad: 4 x 0.25
    # the last step's module calls: every one through the recorder's Python in one run; in the other none at the
    # monitor preset (the failing module's pre-hook is the C's, its exit Python's abandon; the recomputation's hooks
    # return at once), all at L0 (inputs, stacks, backward capture: the Python's)
    module_calls = sum(1 for k, v in data.items() if ".forward." in k and "output" in v) + 1  # the failing one's
    assert (py_enter, py_exit) == (module_calls, module_calls - 1)
    assert (c_enter, c_exit) == ((0, 0) if config == "monitor" else (module_calls, module_calls - 1))
    # the gradients: 5 Linear modules with 2 parameters each (the shared one's accumulated once, whatever its calls);
    # every one the C's but the main_grad's
    assert py_pgrad == 10
    assert c_pgrad == 1


# a module call the tool does not record: an API level's, and every call of a step outside the range
PASS_SCRIPT = MODULE_WAY + """
from torch.utils.checkpoint import checkpoint
from msprobe_inject.pytorch.state import tls
python_pre = [0]
real_task = modules._graph_task  # the C holds its own reference: this counts the Python body of _pre alone
def counted_task():
    python_pre[0] += 1
    return real_task()
modules._graph_task = counted_task

loose = nn.Linear(4, 4)  # called inside the model's forward, not one of its modules: not named

class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(Inner(), Inner())
        self.ckpt = Inner()
        self.fails = Fails()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = loose(self.inner(x))
        try:
            self.fails(x)
        except ValueError:
            pass
        x = checkpoint(self.ckpt, x, use_reentrant=False)
        return self.head(x)

settings = {"L1": {"level": "L1", "step": [1]}, "monitor": {"level": "L0", "preset": "monitor", "step": [1]},
            "mix": {"level": "mix", "step": [1]}}[sys.argv[2]]
with open("config.json", "w") as fh:
    json.dump({"task": "statistics", "dump_path": "d", **settings}, fh)
debugger = PrecisionDebugger(config_path="config.json")
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
seen = []
for step in range(3):
    python_pre[0] = 0
    debugger.start(model=m)
    m(torch.randn(3, 4, requires_grad=True)).sum().backward()
    opt.step()
    opt.zero_grad()
    seen.append((python_pre[0], tls.depth, len(tls.mframes)))
    debugger.stop()
    debugger.step()
print("PASSED", json.dumps(seen))
"""


@pytest.mark.parametrize("config", ["L1", "monitor", "mix"])
def test_a_module_call_not_recorded_is_counted_as_the_python_path_counts_it(tmp_path, config):
    (fast, c_said), (slow, py_said) = (_module_run(tmp_path, way, config, PASS_SCRIPT, "PASSED") for way in ("c", "py"))
    c_seen, py_seen = json.loads(c_said), json.loads(py_said)
    assert sorted(fast) == sorted(slow) and sorted({k.split("/")[0] for k in fast}) == ["step1"]
    differ = [k for k in fast if fast[k] != slow[k]]
    assert not differ, (differ, fast[differ[0]][:2000], slow[differ[0]][:2000])
    data = json.loads(fast["step1/rank/dump.json"])["data"]
    assert any(k.startswith("Torch.relu.") for k in data) == (config != "monitor")
    assert any(k.startswith("Module.") for k in data) == (config != "L1")
    # every step ends its forward and backward with the module frames balanced, both ways
    assert [s[1:] for s in c_seen] == [s[1:] for s in py_seen] == [[0, 0]] * 3
    # the Python body of _pre: every module call in one run (the checkpointed module's twice: its recomputation);
    # in the other the model's top-level call and the recomputation's; and at the step recorded at mix, whose module
    # records are the Python's, every call again
    calls = 1 + 1 + 2 * 2 + 1 + 1 + 2 + 1  # net, inner, its two and their fc's, loose, fails, ckpt and its fc, head
    if config == "L1":
        # the hooks are taken out when the first forward ends (nothing at L1 needs module calls once started): its
        # calls alone, before the recomputation
        assert [s[0] for s in py_seen] == [calls, 0, 0]
        assert [s[0] for s in c_seen] == [1, 0, 0]
        return
    assert [s[0] for s in py_seen] == [calls + 2] * 3
    passed = 1 + 2
    assert [s[0] for s in c_seen] == [passed, calls + 2 if config == "mix" else passed, passed]


def test_a_failing_module_record_is_logged_as_the_python_path_logs_it_and_the_forward_returns(tmp_path):
    code = MODULE_WAY + """
with open("config.json", "w") as fh:
    json.dump({"task": "statistics", "dump_path": "d", "level": "L0", "preset": "monitor"}, fh)
debugger = PrecisionDebugger(config_path="config.json")
m = Net()
debugger.start(model=m)
m(torch.ones(2, 4))
ctx = debugger.runtime.encoder._ctx
debugger.runtime.encoder._ctx = None  # the C entries call raises TypeError for each value
y = m(torch.ones(2, 4))
assert y.shape == (2, 2)
debugger.runtime.encoder._ctx = ctx
from msprobe_inject import writer
def refused(*a):
    raise RuntimeError("the hand-off refused")
real_post = writer.post
recorder.post = writer.post = refused  # every record's hand-off fails: the module calls' and the gradients'
x = torch.ones(2, 4, requires_grad=True)
m(x).sum().backward()
assert x.grad.shape == (2, 4)
recorder.post = writer.post = real_post
m(torch.ones(2, 4))
debugger.stop()
print("RETURNED")
"""
    logs, data = {}, {}
    for way in ("c", "py"):
        cwd = tmp_path / way
        cwd.mkdir()
        out = run_py(code, str(cwd), args=(way,)).stdout
        if "NO-C" in out:
            pytest.skip("the C common case is not built here")
        assert "RETURNED" in out
        found = glob.glob(str(cwd / "d" / "**" / "dump_error_info.log"), recursive=True)
        assert found, os.listdir(cwd / "d")
        with open(found[0]) as fh:
            logs[way] = [ln.split(" Module.", 1)[1] for ln in fh if " Module." in ln]
        with open(glob.glob(str(cwd / "d" / "step0" / "*" / "dump.json"))[0]) as fh:
            data[way] = json.load(fh)["data"]
    assert any(ln.startswith("fc1.Linear.forward.1: module hook failed: TypeError") for ln in logs["c"]), logs["c"]
    assert any(ln.startswith("fc2.Linear.forward.2: module hook failed: RuntimeError: the hand-off refused")
               for ln in logs["c"]), logs["c"]
    assert any(ln.startswith("fc1.Linear.parameters_grad: capture failed: RuntimeError: the hand-off refused")
               for ln in logs["c"]), logs["c"]
    assert logs["c"] == logs["py"]
    assert "Module.fc1.Linear.forward.3" in data["c"]  # the next call recorded again
    assert data["c"] == data["py"]


def test_a_record_body_made_in_c_reaches_the_writer_untracked_where_nothing_in_it_is_tracked(tmp_path):
    """The C call builds a record's body from _fastats' lists and dicts, which the collector does not follow: the body
    is left untracked as it is built (a dict becomes tracked on the insertion of any list), so the writer's untrack
    finds it so without walking it. The Python path's bodies are tracked until that untrack; every body ends
    untracked. (A bfloat16 record, whose figures the Python encoder reads later, goes through the writer's Python
    send and its own untrack.)"""
    code = WAY + """
import gc
from msprobe_inject import writer
from msprobe_inject.dumpformat import journal
seen = {}  # each Record's key: whether its body was tracked when sent, and after the writer's untrack
def spy(ev, _real=writer.untrack):
    before = gc.is_tracked(ev[1]) if type(ev) is writer.Record else None
    out = _real(ev)
    if before is not None:
        seen[ev[0]] = [before, gc.is_tracked(ev[1])]
    return out
journal._send_setup(writer.Record, writer.Merge, writer.Construct, spy, writer._BATCH,
                    *((writer.Stack,) if writer._cstack is not None else ()))
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.start()
x = torch.randn(3, 4, requires_grad=True)
xb = torch.randn(3, 4, dtype=torch.bfloat16, requires_grad=True)
for _ in range(2):  # the first call of each callable is the Python path's (it names the callable): mul.0 and mul.1
    torch.mul(x, 2).sum().backward()  # float32: mul.2 the C's
    torch.mul(xb, 3).sum().backward()  # bfloat16: mul.1 and mul.3, not journaled in C
debugger.stop()
print("RETURNED")
print(json.dumps(seen))
"""
    got = {}
    for way in ("c", "py"):
        (tmp_path / way).mkdir()
        out = run_py(code, str(tmp_path / way), args=(way,)).stdout
        if "NO-C" in out:
            pytest.skip("the C common case is not built here")
        got[way] = json.loads(out.strip().splitlines()[-1])
    c, py = got["c"], got["py"]
    assert sorted(c) == sorted(py) == sorted(f"{name}.{i}.{way}" for name in ("Torch.mul", "Tensor.sum")
                                             for i in (0, 2) for way in ("forward", "backward")), (c, py)
    assert all(after is False for _, after in c.values()) and all(after is False for _, after in py.values())
    for key in ("Torch.mul.2.forward", "Torch.mul.2.backward", "Tensor.sum.2.forward", "Tensor.sum.2.backward"):
        assert c[key] == [False, False] and py[key] == [True, False], (key, c[key], py[key])
    assert c["Torch.mul.0.forward"] == [True, False]  # the first call's record: the Python path's
