"""Faults and hostile input: the user's job never breaks, nothing is lost, nothing escapes the dump path."""

from __future__ import annotations

import glob
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from util import PREAMBLE, clean_env, load_dump, run_py

from msprobe_inject.config import ConfigError, build_config


def _all_files(root):
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield os.path.join(dirpath, f)


def test_unwritable_dump_path_training_finishes(tmp_path):
    (tmp_path / "afile").write_text("x")
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="afile/d", level="L1")
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
losses = []
for _ in range(3):
    debugger.start()
    loss = m(torch.randn(4, 4)).sum(); loss.backward(); opt.step(); opt.zero_grad()
    losses.append(float(loss))
    debugger.stop(); debugger.step()
print("LOSSES", json.dumps(losses))
"""
    proc = run_py(code, str(tmp_path))
    ref = run_py(code.replace('PrecisionDebugger(dump_path="afile/d", level="L1")',
                              'PrecisionDebugger(dump_path="ok", level="L1")'), str(tmp_path))
    assert proc.stdout.split("LOSSES")[1] == ref.stdout.split("LOSSES")[1], "results changed"
    assert proc.stderr.count("[msprobe-launch]") == 1 and "not writable" in proc.stderr, proc.stderr[-2000:]


def _run_limited(tmp_path, code, limit):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))

    def limit_fsize():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk gives an error, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=300, preexec_fn=limit_fsize)


def test_disk_full_stops_dumping_not_training(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1", task="tensor")
m = Net()
x = torch.randn(64, 4)
for _ in range(3):
    debugger.start()
    m(x).sum().backward()
    debugger.stop(); debugger.step()
print("TRAINING-DONE")
"""
    proc = _run_limited(tmp_path, code, 6000)
    assert proc.returncode == 0 and "TRAINING-DONE" in proc.stdout, proc.stderr[-3000:]
    assert "File too large" in proc.stderr or "cannot write" in proc.stderr
    # the launcher's summary reports the errors
    from msprobe_readers.summary import summarize

    rows = summarize(str(tmp_path / "d"))
    assert rows and sum(r.errors for r in rows) >= 1


def test_rank_dir_removed_mid_run(tmp_path):
    code = PREAMBLE + """
import shutil, glob
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
for i in range(3):
    debugger.start()
    m(torch.randn(2, 4)).sum().backward()
    if i == 1:
        debugger.stop()
        for d in glob.glob("d/step1/*"):
            shutil.rmtree(d)
    debugger.stop(); debugger.step()
print("TRAINING-DONE")
"""
    proc = run_py(code, str(tmp_path))
    assert "TRAINING-DONE" in proc.stdout
    assert load_dump(str(tmp_path / "d"), step=2)["data"], "later steps are still dumped"
    assert "Functional.linear.0.forward" in load_dump(str(tmp_path / "d"), step=0)["data"]


def test_symlink_inside_dump_path_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "d").mkdir()
    os.symlink(outside, tmp_path / "d" / "step0")
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
m(torch.randn(2, 4)).sum().backward()
debugger.stop(); debugger.step()
print("TRAINING-DONE")
"""
    proc = run_py(code, str(tmp_path))
    assert "TRAINING-DONE" in proc.stdout
    assert list(outside.iterdir()) == [], "wrote through the planted symlink"


def test_earlier_dump_is_moved_aside_not_overwritten(tmp_path):
    code = PREAMBLE + """
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start(rank_id=0)
m(torch.randn(2, 4)).sum().backward()
debugger.stop(); debugger.step()
"""
    run_py(code, str(tmp_path))
    first = (tmp_path / "d" / "step0" / "rank0" / "dump.json").read_bytes()
    proc = run_py(code, str(tmp_path))
    assert "moved to" in proc.stderr
    aside = glob.glob(str(tmp_path / "d" / "step0" / "rank0.replaced-*"))
    assert len(aside) == 1 and open(os.path.join(aside[0], "dump.json"), "rb").read() == first


HOSTILE_NAMES = ["a/b", "../../escape", "x\x00y", "n" * 4096, "中文名", "..", "/abs", "a b;c"]


def test_hostile_names_stay_inside_dump_path(tmp_path):
    code = PREAMBLE + f"""
names = {HOSTILE_NAMES!r}
debugger = PrecisionDebugger(dump_path="d", level="debug", task="tensor")
for n in names:
    save(torch.ones(2, requires_grad=True) * 2, n)
class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        for n in ["a/b", "x\\x00y", "中文"]:
            self.add_module(n, nn.Linear(2, 2))
    def forward(self, x):
        for m in self.children():
            x = m(x)
        return x
import msprobe_inject.pytorch.debugger as dd
print("SAVE-DONE")
"""
    proc = run_py(code, str(tmp_path))
    assert "SAVE-DONE" in proc.stdout
    root = os.path.realpath(tmp_path / "d")
    files = list(_all_files(str(tmp_path)))
    for f in files:
        if f.endswith(".pt"):
            assert os.path.realpath(f).startswith(root + os.sep), f
    assert not os.path.exists(tmp_path.parent / "escape")
    d = load_dump(str(tmp_path / "d"), name="debug.json")["data"]
    assert len([k for k in d if not k.endswith("_grad.0.debug")]) == len(HOSTILE_NAMES)
    # module names from user code, at L0 with tensor files
    code2 = PREAMBLE + """
class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        for n in ["a/b", "x\\x00y", "中文", "n" * 3000]:
            self.add_module(n, nn.Linear(2, 2))
    def forward(self, x):
        for m in self.children():
            x = m(x)
        return x
debugger = PrecisionDebugger(dump_path="d2", level="mix", task="tensor")
m = Odd()
debugger.start(model=m)
m(torch.randn(1, 2)).sum().backward()
debugger.stop(); debugger.step()
print("OK")
"""
    assert "OK" in run_py(code2, str(tmp_path)).stdout
    root2 = os.path.realpath(tmp_path / "d2")
    pts = [f for f in _all_files(root2) if f.endswith(".pt")]
    assert pts and all(os.path.realpath(f).startswith(root2 + os.sep) for f in pts)
    assert all(len(os.path.basename(f)) <= 255 for f in pts)
    keys = load_dump(str(tmp_path / "d2"))["data"]
    assert any("中文" in k for k in keys)


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
    json.dumps(out)  # serialisable (NaN tokens allowed)

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


_config_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                           st.lists(st.one_of(st.integers(-3, 1000001), st.text(max_size=6)), max_size=4),
                           st.sampled_from(["L0", "L1", "mix", "debug", "statistics", "tensor", "md5", "0-3"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["task", "level", "step", "rank", "scope", "list", "data_mode",
                                        "summary_mode", "async_dump", "precision", "risk_level", "dump_path",
                                        "overflow_nums", "step_on", "tensor_list", "unknown"]),
                       _config_values, max_size=6))
def test_config_is_valid_or_rejected_by_name(values):
    try:
        cfg = build_config(values)
    except ConfigError as exc:
        assert exc.key in str(exc) and exc.key in (set(values) | {"environment"}), (values, str(exc))
        return
    assert cfg.task in ("statistics", "tensor", "structure", "overflow_check")
    assert all(isinstance(s, int) and 0 <= s <= 1_000_000 for s in cfg.step)


def test_sigint_flushes_json_files(tmp_path):
    code = PREAMBLE + """
import signal, time
debugger = PrecisionDebugger(dump_path="d", level="L1")
m = Net()
debugger.start()
m(torch.randn(2, 4)).sum().backward()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
"""
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    d = load_dump(str(tmp_path / "d"))["data"]
    assert "Functional.linear.1.backward" in d


def test_journal_alone_rebuilds_the_step(tmp_path):
    """What the writer journaled (repeated stacks by reference, merged updates) rebuilds the same files."""
    from msprobe_inject.dumpformat.journal import recover
    from msprobe_inject.writer import Construct, DumpWriter, Merge, Record, Stack, capture_stack

    d = str(tmp_path / "step0" / "rank0")
    w = DumpWriter(lambda pending: None, lambda t, p: None)
    w.open_step(d, {"task": "statistics", "level": "mix", "dump_data_dir": None, "_root": str(tmp_path)})
    sites = {"linear": lambda: capture_stack(0),
             "relu": lambda: capture_stack(0)}  # two call sites, each seen three times
    for i in range(3):
        for api, site in sites.items():
            key = f"Functional.{api}.{i}.forward"
            w.send(Record(key, {"input_args": [{"type": "int", "value": i}], "input_kwargs": {}}, None))
            w.send(Stack(key, site()))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"weight": [{"type": "float", "value": 1.5}]}, None, False))
    w.send(Merge("Module.fc.Linear.parameters_grad.0", {"bias": [{"type": "float", "value": float("nan")}]}, None,
                 False))
    w.send(Construct("Functional.linear.0.forward", None))
    w.close()
    written = {n: open(os.path.join(d, n)).read() for n in ("dump.json", "stack.json", "construct.json")}
    journal = open(os.path.join(d, "dump.journal")).read()
    assert journal.count('"op": "stackref"') == 4 and journal.count('"op": "stack"') == 2
    for n in written:
        os.remove(os.path.join(d, n))
    assert recover(d) == {"records": 15, "complete": True}
    for n, text in written.items():
        assert open(os.path.join(d, n)).read() == text, n
    stacks = json.loads(written["stack.json"])
    assert sorted(len(v[0]) for v in stacks.values()) == [3, 3]
    grads = json.loads(written["dump.json"])["data"]["Module.fc.Linear.parameters_grad.0"]
    assert grads["weight"][0]["value"] == 1.5 and grads["bias"][0]["value"] != grads["bias"][0]["value"]
