"""Filters (data_mode, scope, list, tensor_list, rank, step) and every API function, asserted on files."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from util import PREAMBLE, load_dump, rank_dir, run_py, train_script, write_config

from msprobe_inject.config import ConfigError, build_config, resolve


def _keys(tmp_path, steps=1, step=0, **cfg):
    dump = str(tmp_path / "dump")
    conf = write_config(str(tmp_path / "config.json"), dump_path=dump, **cfg)
    run_py(train_script(conf, steps), str(tmp_path))
    return load_dump(dump, step=step)["data"], dump


@pytest.mark.parametrize("modes,fwd_keys,bwd_keys,params,pgrad", [
    (["forward"], {"input_args", "input_kwargs", "output"}, None, True, False),
    (["backward"], None, {"input", "output"}, False, True),
    (["input"], {"input_args", "input_kwargs"}, {"input"}, False, True),
    (["output"], {"output"}, {"output"}, True, True),
    (["forward", "output"], {"output"}, None, True, False),
])
def test_data_mode(tmp_path, modes, fwd_keys, bwd_keys, params, pgrad):
    d, _ = _keys(tmp_path, level="mix", data_mode=modes)
    fwd = d.get("Functional.linear.0.forward")
    bwd = d.get("Functional.linear.0.backward")
    assert (set(fwd) if fwd else None) == fwd_keys
    assert (set(bwd) if bwd else None) == bwd_keys
    mod = d.get("Module.fc1.Linear.forward.0", {})
    assert ("parameters" in mod) == params
    assert ("Module.fc1.Linear.parameters_grad.0" in d) == pgrad


def test_list_substring_and_regex(tmp_path):
    d, _ = _keys(tmp_path, level="L1", list=["relu", "name-regex(linear\\.1\\.forward$)"])
    assert set(d) == {"Functional.relu.0.forward", "Functional.relu.0.backward", "Functional.linear.1.forward"}


def test_list_at_mix_keeps_apis_inside_a_matching_module(tmp_path):
    d, _ = _keys(tmp_path, level="mix", list=["fc1"])
    assert "Functional.linear.0.forward" in d and "Module.fc1.Linear.forward.0" in d
    assert "Functional.linear.1.forward" not in d and "Functional.linear.0.backward" not in d


def test_scope_range_keeps_end_output(tmp_path):
    d, _ = _keys(tmp_path, level="L1", scope=["Functional.relu.0.forward", "Functional.linear.1.forward"])
    assert list(d) == ["Functional.relu.0.forward", "Functional.linear.1.forward"]
    assert "output" in d["Functional.linear.1.forward"], "the scope's last API keeps its output"


def test_tensor_list_saves_only_matching(tmp_path):
    d, dump = _keys(tmp_path, level="L1", tensor_list=["relu"])
    assert "data_name" in d["Functional.relu.0.forward"]["input_args"][0]
    assert "data_name" not in d["Functional.linear.0.forward"]["input_args"][0]
    files = os.listdir(os.path.join(rank_dir(dump), "dump_tensor_data"))
    assert files and all("relu" in f for f in files)


def test_step_ranges_and_set_init_step(tmp_path):
    dump = str(tmp_path / "dump")
    conf = write_config(str(tmp_path / "c.json"), dump_path=dump, level="L1", step=["1-2", 4])
    run_py(train_script(conf, steps=6), str(tmp_path))
    assert sorted(x for x in os.listdir(dump) if x.startswith("step")) == ["step1", "step2", "step4"]
    code = PREAMBLE + f"\ndebugger = PrecisionDebugger(dump_path={dump + '2'!r}, level='L1')\n" \
        "debugger.set_init_step(10)\n" + "\n".join(train_script("x", 2).split("\n")[-12:])
    run_py(code, str(tmp_path))
    assert sorted(x for x in os.listdir(dump + "2") if x.startswith("step")) == ["step10", "step11"]


def test_rank_filter_and_rank_id(tmp_path):
    dump = str(tmp_path / "d")
    code = PREAMBLE + f"""
debugger = PrecisionDebugger(config_path={write_config(str(tmp_path / 'c.json'), dump_path=dump, level='L1',
                                                              rank=[1])!r})
m = Net()
debugger.start(rank_id=RANK)
m(torch.randn(2, 4)).sum().backward()
debugger.stop(); debugger.step()
"""
    run_py(code.replace("RANK", "0"), str(tmp_path))
    assert not os.path.exists(os.path.join(dump, "step0")) or not os.listdir(os.path.join(dump, "step0"))
    run_py(code.replace("RANK", "1"), str(tmp_path))
    assert os.listdir(os.path.join(dump, "step0")) == ["rank1"]


def test_save_debug_level(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="debug", task=TASK)
h = torch.randn(2, 3, requires_grad=True)
for _ in range(2):
    y = h * 2
    debugger.save(y, "h")
    PrecisionDebugger.save({"a": y, "b": [y.sum(), 3, "s"], "c": 1.5}, "nested")
    save(torch.ones(2), "nograd")
    save(7, "an_int")
    save(None, "bad")  # unsupported: skipped with a warning
    (y.sum() * 3).backward()
debugger.step()
save(torch.ones(1), "next")
debugger.step()
"""
    for task in ("statistics", "tensor"):
        out = tmp_path / task
        out.mkdir()
        run_py(code.replace("TASK", repr(task)), str(out))
        d = load_dump(str(out / "d"), name="debug.json")
        assert d["level"] == "debug" and d["task"] == task
        data = d["data"]
        for k in ("h.0.debug", "h_grad.0.debug", "h.1.debug", "h_grad.1.debug", "nested.0.debug",
                  "nested_grad.0.debug", "nograd.0.debug", "nograd_grad.0.debug", "an_int.0.debug"):
            assert k in data, (k, list(data))
        assert "bad.0.debug" not in data
        assert data["an_int.0.debug"] == {"type": "int", "value": 7}
        assert data["nograd_grad.0.debug"] is None
        assert data["h_grad.0.debug"]["Max"] == pytest.approx(3.0)  # d(3*sum(y))/dy
        assert data["nested.0.debug"]["b"][1:] == [{"type": "int", "value": 3}, {"type": "str", "value": "s"}]
        assert data["nested_grad.0.debug"]["b"] == [None, None, None]
        assert data["nested_grad.0.debug"]["a"]["Max"] == pytest.approx(3.0)
        assert not os.path.exists(os.path.join(rank_dir(str(out / "d")), "dump.json"))
        assert "next.0.debug" in load_dump(str(out / "d"), step=1, name="debug.json")["data"]
        if task == "tensor":
            files = set(os.listdir(os.path.join(rank_dir(str(out / "d")), "dump_tensor_data")))
            for f in ("h.0.debug.pt", "h_grad.0.debug.pt", "nested.0.debug.a.pt", "nested.0.debug.b.0.pt",
                      "nested_grad.0.debug.a.pt"):
                assert f in files, sorted(files)
            t = torch.load(os.path.join(rank_dir(str(out / "d")), "dump_tensor_data", "h_grad.0.debug.pt"),
                           weights_only=True)
            assert torch.allclose(t, torch.full((2, 3), 3.0))


def test_register_and_restore_custom_api(tmp_path):
    code = PREAMBLE + """
import types
mymod = types.ModuleType("mymod")
def compute(x):
    return torch.relu(x) * 2
mymod.compute = compute
debugger = PrecisionDebugger(dump_path="d", level="L1")
debugger.register_custom_api(mymod, "compute", api_prefix="MyPrefix")
debugger.start()
mymod.compute(torch.randn(3))
debugger.restore_custom_api(mymod, "compute")
assert mymod.compute is compute
mymod.compute(torch.randn(3))
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "MyPrefix.compute.0.forward" in d
    # after restore_custom_api the call is an ordinary function again: only its inner torch.relu is seen
    assert sum(k.startswith("MyPrefix.compute") for k in d) == 1
    assert [k for k in d if k.endswith(".forward")] == ["MyPrefix.compute.0.forward", "Torch.relu.0.forward",
                                                        "Tensor.__mul__.0.forward"]


@pytest.mark.parametrize("before", ["", "m(torch.randn(2, 4))"])
def test_module_dump(tmp_path, before):
    """With a forward before it, the L1 module hooks are out (nothing needed module calls): module_dump puts them
    back."""
    code = PREAMBLE + f"""
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
{before}
debugger.start()
module_dump(m.fc1, "first")
m(torch.randn(2, 4)).sum().backward()
module_dump_end()
torch.relu(torch.randn(2))
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "Module.first.Linear.forward.0" in d and "Module.first.Linear.backward.0" in d
    assert "Functional.linear.0.forward" not in d  # APIs are off between the two calls
    assert "Torch.relu.0.forward" in d


@pytest.mark.parametrize("before", ["", "debugger.start(model=m); m(torch.randn(1, 4)); debugger.stop()"])
def test_token_range_dumps_only_chosen_forwards(tmp_path, before):
    """After a call without a token range the L1 module hooks are out: start(token_range=...) puts them back."""
    code = PREAMBLE + f"""
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
{before}
debugger.step()
with torch.no_grad():
    debugger.start(model=m, token_range=[1, 2])
    for _ in range(4):
        m(torch.randn(1, 4))
    debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    d = load_dump(str(tmp_path / "d"), step=1)["data"]
    assert sorted(k for k in d if k.startswith("Functional.linear")) == [
        "Functional.linear.0.forward", "Functional.linear.1.forward", "Functional.linear.2.forward",
        "Functional.linear.3.forward"]


def test_seed_all_and_random_save(tmp_path):
    code = PREAMBLE + """
from msprobe_inject.pytorch import random_save
random_save(output_path="rnd")
seed_all(42)
a = torch.randn(3)
seed_all(42)
b = torch.randn(3)
assert torch.equal(a, b)
import random; random.random()
"""
    run_py(code, str(tmp_path))
    csvs = glob.glob(str(tmp_path / "rnd" / "random_proc*_*.csv"))
    assert csvs
    text = open(csvs[0], encoding="utf-8-sig").read()
    assert text.startswith("api_name,stack") and "torch_random.randn.0" in text and "python_random.random.0" in text


def test_hook_failure_goes_to_error_log_not_user(tmp_path):
    code = PREAMBLE + """
from msprobe_inject.pytorch import encode
def broken(*a, **k):
    raise RuntimeError("injected")
encode.stat_of = broken
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
out = m(torch.randn(2, 4)).sum()
out.backward()
debugger.stop(); debugger.step()
print("TRAINING-OK", float(out))
"""
    proc = run_py(code, str(tmp_path))
    assert "TRAINING-OK" in proc.stdout
    log = open(os.path.join(rank_dir(str(tmp_path / "d")), "dump_error_info.log")).read()
    assert "injected" in log
    assert "injected" in proc.stderr  # and a warning


def test_proc_dir_renamed_to_rank_after_init(tmp_path):
    code = PREAMBLE + """
import torch.distributed as dist
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
m(torch.randn(2, 4))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(2)
dist.all_reduce(t)
debugger.stop(); debugger.step()
dist.destroy_process_group()
"""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    run_py(code, str(tmp_path), args=(str(port),))
    assert os.listdir(tmp_path / "d" / "step0") == ["rank0"]
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "Functional.linear.0.forward" in d and "Distributed.all_reduce.0.forward" in d
    rec = d["Distributed.all_reduce.0.forward"]
    assert rec["output"][0]["Max"] == 1.0


def test_a_fork_child_runs_the_parents_hooks_and_records_nothing(tmp_path):
    """The hooks know a fork child by a flag its at-fork handler sets (no os.getpid() per call): the child runs the
    parent's backward graph and a forward of its own through every hook, and sends nothing; the parent records on."""
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="mix")
rec = debugger.runtime
m = Net()
debugger.start(model=m)
loss = m(torch.randn(5, 4)).sum()
sent = rec.writer.records_sent
pid = os.fork()
if pid == 0:
    status = 1
    try:
        loss.backward(retain_graph=True)  # the parent's graph: API backward hooks, module capture, gradient hooks
        m(torch.randn(5, 4)).sum().backward()  # module hooks and the API mode in the child
        status = (0 if rec.forked else 2) | (0 if rec.writer.records_sent == sent else 4)
    finally:
        os._exit(status)
print("CHILD", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "PARENT", rec.forked)
loss.backward()
debugger.stop()
debugger.step()
"""
    proc = run_py(code, str(tmp_path))
    assert "CHILD 0 PARENT False" in proc.stdout
    d = load_dump(str(tmp_path / "d"))["data"]
    for key in ("Functional.linear.0.backward", "Functional.relu.0.backward", "Module.fc1.Linear.backward.0",
                "Module.fc1.Linear.parameters_grad.0"):
        assert key in d, key
    assert "Functional.linear.2.forward" not in d  # the child's forward was not counted here either


def test_config_validation_names_the_key():
    cases = {"task": "overflow", "level": "L3", "summary_mode": "crc", "step": [-1], "rank": "0",
             "data_mode": ["all", "input"], "async_dump": 1, "precision": "mid", "risk_level": "LOW",
             "scope": ["a"], "list": [1], "step_on": "epoch", "overflow_nums": 0}
    for key, bad in cases.items():
        with pytest.raises(ConfigError) as err:
            build_config({key: bad})
        assert f"'{key}'" in str(err.value), (key, str(err.value))
    with pytest.raises(ConfigError, match="allowed values: 'statistics', 'tensor', 'structure', 'overflow_check'"):
        build_config({"task": "diff_check"})
    assert build_config({"step": ["0-3", 7, "5"]}).step == [0, 1, 2, 3, 5, 7]
    with pytest.raises(ConfigError, match="'async_dump'"):
        build_config({"async_dump": True, "summary_mode": "md5"})


def test_config_file_env_and_kwargs_precedence(tmp_path):
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"task": "tensor", "dump_path": "from_file", "level": "L0",
                                "tensor": {"list": ["relu"], "data_mode": ["forward"]}}))
    env = {"MSPROBE_LEVEL": "mix", "MSPROBE_STEP": "1,3-4"}
    cfg = resolve(str(conf), {"dump_path": "from_kwargs"}, environ=env)
    assert (cfg.task, cfg.dump_path, cfg.level, cfg.step, cfg.list, cfg.data_mode) == \
        ("tensor", "from_kwargs", "mix", [1, 3, 4], ["relu"], ["forward"])
    with pytest.raises(ConfigError, match="environment"):
        resolve(None, None, environ={"MSPROBE_STEP": "[1,"})


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_module_hooks_keep_the_users_tensor_subclass(tmp_path, level):
    """The module backward hooks wrap inputs and outputs: a subclass's __torch_function__ still applies."""
    code = PREAMBLE + f"""
class Sub(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {{}})
seen = []
m = Net()
m.fc1.register_forward_pre_hook(lambda mod, a: seen.append(type(a[0]).__name__))
debugger = PrecisionDebugger(dump_path="d", level="{level}")
debugger.start(model=m)
x = torch.randn(2, 4, requires_grad=True).as_subclass(Sub)
out = m(x)
out.sum().backward()
debugger.stop(); debugger.step()
print("TYPES", seen, type(out).__name__)
"""
    proc = run_py(code, str(tmp_path))
    assert "TYPES ['Sub'] Sub" in proc.stdout, proc.stdout
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "Module.fc1.Linear.backward.0" in d
