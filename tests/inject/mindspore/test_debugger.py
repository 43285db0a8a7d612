"""MindSpore's explicit API (mindspore/debugger.py, PyNative, CPU) against mindstudio-probe 26.2.0 and NumPy.

1. The seed network dumped by msprobe.mindspore and by msprobe_inject.mindspore at L0, L1 and mix: every
   record name msprobe writes is in ours, our statistics equal msprobe's, and our statistics equal NumPy's
   on our own .npy tensor dumps.
2. save/save_grad write step{N}/rank{R}/{name}_{dtype}_{count}.npy, and gradients are unchanged.
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from util import HERE, run_py
from util import ms_env as _env

pytest.importorskip("mindspore")

NET = os.path.join(HERE, "scripts", "ms_net.py")
STATS = ("Max", "Min", "Mean", "Norm")




def _run_net(module: str, level: str, out: str, tmp, task: str = "statistics", steps: int = 2) -> None:
    cfg = tmp / f"{module}_{level}_{task}.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": out, "level": level}))
    proc = subprocess.run([sys.executable, NET, module, str(cfg), str(steps)], cwd=tmp, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _load(out: str, step: int) -> tuple:
    files = glob.glob(os.path.join(out, f"step{step}", "*", "dump.json"))
    assert len(files) == 1, files
    with open(files[0]) as fh:
        return json.load(fh), os.path.dirname(files[0])


def _close(a, b, rel: float = 1e-5) -> bool:
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b), 1e-6)


def _tensor_leaves(value):
    if isinstance(value, dict):
        if value.get("type") == "mindspore.Tensor":
            yield value
        else:
            for v in value.values():
                yield from _tensor_leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensor_leaves(v)


def _numpy_stats(arr: np.ndarray):
    if arr.dtype == np.bool_:
        return bool(arr.any()), bool(arr.all()), None, None
    if arr.ndim == 0:
        v = arr.item()
        return v, v, v, v
    a = arr.astype(np.float64)
    return a.max(), a.min(), a.mean(), float(np.sqrt((a * a).sum()))


def _compare_bodies(ref, ours, path, problems):
    if isinstance(ref, dict):
        if not isinstance(ours, dict):
            problems.append(f"{path}: {ours!r} is not an object")
            return
        for k, v in ref.items():
            if k in STATS:
                if not _close(v, ours.get(k)):
                    problems.append(f"{path}.{k}: msprobe {v!r} ours {ours.get(k)!r}")
            elif k in ("data_name", "md5"):
                continue
            elif k not in ours:
                problems.append(f"{path}.{k}: missing")
            else:
                _compare_bodies(v, ours[k], f"{path}.{k}", problems)
    elif isinstance(ref, list):
        if not isinstance(ours, list) or len(ours) != len(ref):
            problems.append(f"{path}: length {len(ref)} vs {ours!r}"[:300])
            return
        for i, (u, v) in enumerate(zip(ref, ours)):
            _compare_bodies(u, v, f"{path}[{i}]", problems)
    elif ref != ours:
        problems.append(f"{path}: msprobe {ref!r} ours {ours!r}")


def _msprobe_compare_passes(tmp_path, ref_out: str) -> None:
    """`msprobe compare` reads our statistics dump against mindstudio-probe's and finds every row equal."""
    import csv

    ours = str(tmp_path / "ours_stats")
    _run_net("msprobe_inject.mindspore", "mix", ours, tmp_path)
    out = tmp_path / "cmp"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "compare",
                           "-tp", glob.glob(os.path.join(ours, "step0", "*", "dump.json"))[0],
                           "-gp", glob.glob(os.path.join(ref_out, "step0", "*", "dump.json"))[0], "-o", str(out)],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    csvs = glob.glob(str(out / "compare_result_*.csv"))
    assert csvs, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(csvs[0], newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) > 50
    assert all(r["Result"] == "pass" for r in rows), [r["NPU Name"] for r in rows if r["Result"] != "pass"][:10]


SAVE_SCRIPT = """
import os, json
import numpy as np, mindspore as ms
from mindspore import nn, ops
from msprobe_inject.mindspore import save, save_grad, step
ms.set_device("CPU")
ms.set_seed(3)

class Net(nn.Cell):
    def __init__(self, use_tool):
        super().__init__()
        self.fc = nn.Dense(4, 3)
        self.use_tool = use_tool

    def construct(self, x):
        h = self.fc(x)
        if self.use_tool:
            save("./out", "h", h)
            save("./out", "nest", {"a": h, "b": [x, None]})
            h = save_grad("./out", "hg", h)
        return ops.tanh(h).sum()

grads = {}
for use_tool in (False, True):
    ms.set_seed(3)
    net = Net(use_tool)
    gf = ms.value_and_grad(net, None, net.trainable_params())
    out = []
    for i in range(2):
        x = ms.Tensor(np.full((2, 4), 0.1 * (i + 1), np.float32))
        loss, g = gf(x)
        out.append([t.asnumpy().tolist() for t in g])
        if use_tool:
            step()
    grads[use_tool] = out
json.dump({"same": grads[False] == grads[True]}, open("result.json", "w"))
"""


DEBUG_SCRIPT = """
import numpy as np, mindspore as ms
from mindspore import nn, ops
from msprobe_inject.mindspore import PrecisionDebugger
debugger = PrecisionDebugger(dump_path="./dbg", task="tensor", level="debug")
ms.set_device("CPU")

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        h = self.fc(x)
        debugger.save(h, "h")
        debugger.save({"a": h, "n": 2}, "nested", save_backward=False)
        return ops.tanh(h).sum()

net = Net()
gf = ms.value_and_grad(net, None, net.trainable_params())
for i in range(2):
    gf(ms.Tensor(np.ones((2, 4), np.float32)))
    debugger.step()
"""


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_records_match_msprobe_and_statistics_match_numpy(tmp_path, level):
    pytest.importorskip("msprobe.mindspore", reason="mindstudio-probe not installed")
    ref_out, our_out = str(tmp_path / "ref"), str(tmp_path / "ours")
    _run_net("msprobe.mindspore", level, ref_out, tmp_path)
    _run_net("msprobe_inject.mindspore", level, our_out, tmp_path, task="tensor")
    for step in (0, 1):
        ref, _ = _load(ref_out, step)
        ours, rank_dir = _load(our_out, step)
        assert ref["data"], "msprobe wrote no records"
        assert (ours["framework"], ours["level"], ours["task"]) == ("mindspore", level, "tensor")
        missing = [k for k in ref["data"] if k not in ours["data"]]
        assert not missing, f"step{step}: records msprobe writes that we do not: {missing[:20]}"
        problems: list = []
        for key, body in ref["data"].items():
            _compare_bodies(body, ours["data"][key], key, problems)
        assert not problems, "\n".join(problems[:30])
        # every statistic we wrote equals NumPy's on the tensor file we wrote
        checked = 0
        for key, body in ours["data"].items():
            for leaf in _tensor_leaves(body):
                assert "data_name" in leaf, f"{key}: tensor without a file: {leaf}"
                arr = np.load(os.path.join(rank_dir, "dump_tensor_data", leaf["data_name"]))
                assert list(arr.shape) == leaf["shape"], (key, leaf)
                for name, want in zip(STATS, _numpy_stats(arr)):
                    assert _close(leaf[name], want, 1e-5), f"{key} {leaf['data_name']} {name}: {leaf[name]} vs {want}"
                checked += 1
        assert checked > 20
        for name in ("stack.json", "construct.json"):
            assert os.path.isfile(os.path.join(rank_dir, name))
    ref_construct = json.load(open(glob.glob(os.path.join(ref_out, "step0", "*", "construct.json"))[0]))
    our_construct = json.load(open(glob.glob(os.path.join(our_out, "step0", "*", "construct.json"))[0]))
    assert {k: our_construct.get(k) for k in ref_construct} == ref_construct
    if level == "mix":
        _msprobe_compare_passes(tmp_path, ref_out)


def test_save_and_save_grad_files_and_unchanged_gradients(tmp_path):
    run_py(SAVE_SCRIPT, str(tmp_path), env=_env())
    assert json.loads((tmp_path / "result.json").read_text()) == {"same": True}
    for n in (0, 1):
        d = tmp_path / "out" / f"step{n}" / "rank0"
        assert sorted(os.listdir(d)) == ["h_float32_0.npy", "hg_grad_float32_3.npy", "nest.a_float32_1.npy",
                                         "nest.b.0_float32_2.npy"]
        h = np.load(d / "h_float32_0.npy")
        assert h.shape == (2, 3) and np.array_equal(h, np.load(d / "nest.a_float32_1.npy"))
        assert np.allclose(np.load(d / "nest.b.0_float32_2.npy"), 0.1 * (n + 1))
        # d/dh sum(tanh(h)) = 1 - tanh(h)^2
        assert np.allclose(np.load(d / "hg_grad_float32_3.npy"), 1 - np.tanh(h) ** 2, atol=1e-6)


def test_debug_level_save(tmp_path):
    run_py(DEBUG_SCRIPT, str(tmp_path), env=_env())
    for step in (0, 1):
        [path] = glob.glob(str(tmp_path / "dbg" / f"step{step}" / "*" / "debug.json"))
        body = json.load(open(path))
        assert (body["framework"], body["level"]) == ("mindspore", "debug")
        assert list(body["data"]) == ["h.0.debug", "h_grad.0.debug", "nested.0.debug"]
        assert body["data"]["nested.0.debug"]["n"] == {"type": "int", "value": 2}
        tdir = os.path.join(os.path.dirname(path), "dump_tensor_data")
        for key, leaf in (("h.0.debug", body["data"]["h.0.debug"]), ("h_grad.0.debug", body["data"]["h_grad.0.debug"]),
                          ("nested.0.debug", body["data"]["nested.0.debug"]["a"])):
            arr = np.load(os.path.join(tdir, leaf["data_name"]))
            assert leaf["data_name"].startswith(key)
            for name, want in zip(STATS, _numpy_stats(arr)):
                assert _close(leaf[name], want), (key, name, leaf[name], want)


def test_the_flight_recorder_writes_the_window_around_a_nan(tmp_path):
    # the flight recorder lives in the recorder and the writer: MindSpore gets it with no adapter code
    out = str(tmp_path / "flight")
    cfg = tmp_path / "flight.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": out, "level": "mix", "flight_recorder": 2}))
    proc = subprocess.run([sys.executable, NET, "msprobe_inject.mindspore", str(cfg), "7"], cwd=tmp_path,
                          env=_env(MS_NET_NAN_STEP="4"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = sorted(int(d[4:]) for d in os.listdir(out) if d.startswith("step"))
    assert steps == [2, 3, 4, 5]
    with open(glob.glob(os.path.join(out, ".msprobe", "flight", "*.json"))[0], encoding="utf-8") as fh:
        trig = json.load(fh)
    assert (trig["kind"], trig["step"]) == ("nonfinite", 4) and trig["record"].startswith("Cell."), trig


def test_xor_is_folded_by_the_writer_into_msprobes_xor(tmp_path):
    """xor mode: the training thread queues a copy of each tensor (asnumpy there would wait for the device at
    each call); the writer thread reads it and folds it into msprobe's XOR of the little-endian words."""
    code = """
import json
import mindspore as ms
import numpy as np
from mindspore import mint
from msprobe_inject.mindspore import PrecisionDebugger
ms.set_device("CPU")
json.dump({"task": "statistics", "dump_path": "d", "level": "L1", "statistics": {"summary_mode": "xor"}},
          open("c.json", "w"))
dbg = PrecisionDebugger(config_path="c.json")
x = ms.Tensor(np.arange(-6, 9, dtype=np.float32).reshape(3, 5) / 4)
dbg.start()
y = mint.add(x, 1.5)
dbg.stop()
dbg.step()
"""
    run_py(code, str(tmp_path), env=_env())

    def xor(a: np.ndarray) -> str:
        b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        b = np.concatenate([b, np.zeros((-len(b)) % 8, dtype=np.uint8)])
        return f"0x{int(np.bitwise_xor.reduce(b.view('<u8'))):016x}"

    doc, _ = _load(str(tmp_path / "d"), 0)
    rec = doc["data"]["Mint.add.0.forward"]
    x = np.arange(-6, 9, dtype=np.float32).reshape(3, 5) / 4
    assert rec["input_args"][0]["md5"] == xor(x)
    assert rec["output"][0]["md5"] == xor(x + np.float32(1.5))


def test_complex_statistics_are_numpys_and_read_by_the_writer(tmp_path):
    """A complex tensor's statistics are msprobe's (NumPy over |z| on the host), computed by the writer thread
    from a copy queued on the device: the training thread never calls asnumpy during a recorded call (it would
    wait for the device at each call)."""
    code = """
import json, threading
import mindspore as ms
import numpy as np
from mindspore import mint
from msprobe_inject.mindspore import PrecisionDebugger
ms.set_device("CPU")
json.dump({"task": "statistics", "dump_path": "d", "level": "L1"}, open("c.json", "w"))
dbg = PrecisionDebugger(config_path="c.json")
z = ms.Tensor(np.array([1 + 2j, -3 + 0.5j, 0.25 - 1j, 4j], dtype=np.complex64))
calls = []
plain = ms.Tensor.asnumpy

def asnumpy(self):
    calls.append(threading.current_thread() is threading.main_thread())
    return plain(self)

ms.Tensor.asnumpy = asnumpy
dbg.start()
y = mint.add(z, z)
dbg.stop()
on_main = sum(calls)
ms.Tensor.asnumpy = plain
dbg.step()
json.dump({"on_main": on_main}, open("calls.json", "w"))
"""
    run_py(code, str(tmp_path), env=_env())
    with open(tmp_path / "calls.json") as fh:
        assert json.load(fh)["on_main"] == 0
    doc, _ = _load(str(tmp_path / "d"), 0)
    rec = doc["data"]["Mint.add.0.forward"]
    z = np.array([1 + 2j, -3 + 0.5j, 0.25 - 1j, 4j], dtype=np.complex64)
    for entry, value in ((rec["input_args"][0], z), (rec["output"][0], z + z)):
        a = np.abs(value)
        assert entry["dtype"] == "Complex64"
        assert [entry["Max"], entry["Min"], entry["Mean"], entry["Norm"]] == \
            [a.max().item(), a.min().item(), a.mean().item(), np.linalg.norm(a).item()]


def test_the_monitor_preset_writes_the_norms_alone_as_level_l0_computes_them(tmp_path):
    full, mon = str(tmp_path / "full"), str(tmp_path / "mon")
    _run_net("msprobe_inject.mindspore", "L0", full, tmp_path)
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": mon, "preset": "monitor"}))
    proc = subprocess.run([sys.executable, NET, "msprobe_inject.mindspore", str(cfg), "2"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, ours = _load(full, 0)[0]["data"], _load(mon, 0)[0]["data"]
    compared = 0
    for key, body in ours.items():
        assert ".forward." in key and list(body) == ["output"] or ".parameters_grad" in key, key
        if key not in ref:
            continue
        want = ref[key]["output"] if "output" in body else ref[key]
        for mine, theirs in zip(_tensor_leaves(body.get("output", body)), _tensor_leaves(want)):
            assert (mine["Max"], mine["Min"], mine["Mean"]) == (None, None, None), (key, mine)
            assert _close(theirs["Norm"], mine["Norm"]), (key, mine, theirs)
            compared += 1
    assert compared >= 4, (compared, sorted(ours))


def test_the_garbage_collector_does_not_follow_the_encoders_entries(tmp_path):
    """As the PyTorch encoder's: a record's entries wait for the writer thread untracked by the collector (promoted
    to its older generations, they set off full collections of the whole process)."""
    code = """
import gc
import mindspore as ms
import numpy as np
from msprobe_inject.config import DumpConfig
from msprobe_inject.entries import Pending
from msprobe_inject.mindspore.encode import Encoder
ms.set_device("CPU")

class W:
    def log_error(self, *a, **k):
        pass

enc = Encoder(DumpConfig(dump_path="unused"), lambda: "unused", W())
x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
out = enc.encode([x, {"k": x, "n": 1}, 0.5], Pending(), None)
print(gc.is_tracked(out), gc.is_tracked(out[0]), gc.is_tracked(out[0]["shape"]), gc.is_tracked(out[1]))
out[0]["placements"] = [1]
print(gc.is_tracked(out[0]))
"""
    proc = run_py(code, str(tmp_path), env=_env())
    assert proc.stdout.split() == ["False", "False", "False", "False", "True"], proc.stdout
