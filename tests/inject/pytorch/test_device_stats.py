"""Statistics and checksums of device tensors (encode.py, checksums.py) on a stand-in accelerator: the training
thread never waits for the device, and the figures are those of the same tensors on the CPU."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from util import HERE, PREAMBLE, run_py

# after util's PREAMBLE (imports, seed_all, the two-layer Net)
SCRIPT = """
sys.path.insert(0, {here!r})
dev = sys.argv[1]
if dev == "npy":
    import device_standin as stand
    to_dev = stand.to_device
else:
    stand = None
    to_dev = lambda t: t
json.dump({{"task": "statistics", "dump_path": "d", "level": {level!r}, "stat_cache": False,
           "statistics": {{"summary_mode": {summary!r}}}, **{extra!r}}}, open("c.json", "w"))
dbg = PrecisionDebugger(config_path="c.json")
model = Net()
if dev == "npy":
    model = model.to("npy")
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
counts = []
for step in range(3):
    x = to_dev(torch.randn(5, 4))
    if stand:
        stand.arm()
        before = len(stand.kernels)
    if step != 1:  # step 1 runs without the tool: the job's own kernels
        dbg.start(model=model)
    {body}
    if step != 1:
        dbg.stop()
        dbg.step()
    if stand:
        stand.disarm()
        counts.append(len(stand.kernels) - before)
print("RESULT", json.dumps({{"hits": stand.hits if stand else [], "kernels": counts}}))
"""

TRAIN = """loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()"""

# values whose bits the stand-in computes exactly as the CPU does: every dtype and shape the encoder treats apart
VALUES = """h = x * 2 + 1
    F.relu(h)
    b = to_dev(torch.randn(7, 3).to(torch.bfloat16))
    b + 1
    i = to_dev(torch.arange(-5, 6, dtype=torch.int64))
    i * 3
    (x > 0) & (x < 1)
    s = to_dev(torch.tensor(2.5))
    s * 2
    to_dev(torch.randn(3, 5))[:, 1:4] * 1
    to_dev(torch.randn(6, 4)).t() - 1"""


def _run(tmp_path, dev: str, level: str, summary: str, body: str = TRAIN, **extra):
    d = tmp_path / dev
    d.mkdir()
    proc = run_py(PREAMBLE + SCRIPT.format(here=HERE, level=level, summary=summary, body=body, extra=extra), str(d),
                  args=(dev,))
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    records = {}
    for f in sorted(glob.glob(str(d / "d" / "step*" / "*" / "dump.json"))):
        step = f.split(os.sep)[-3]
        for k, v in json.load(open(f))["data"].items():
            records[(step, k)] = v
    errors = glob.glob(str(d / "d" / "**" / "dump_error_info.log"), recursive=True)
    return result, records, errors


def _tensors(value, path=()):
    if isinstance(value, dict):
        if value.get("type") == "torch.Tensor":
            yield path, value
            return
        for k, v in value.items():
            yield from _tensors(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _tensors(v, path + (i,))


@pytest.mark.parametrize("level,summary", [("L1", "statistics"), ("mix", "md5"), ("L1", "xor")])
def test_a_training_step_on_a_device_never_waits_for_it(tmp_path, level, summary):
    result, records, errors = _run(tmp_path, "npy", level, summary)
    assert result["hits"] == [], result["hits"]
    assert not errors, open(errors[0]).read()
    entries = [e for r in records.values() for _, e in _tensors(r)]
    assert len(entries) > 40, len(entries)
    figure = "Max" if summary == "statistics" else "md5"
    missing = [e for e in entries if e.get(figure) is None]
    assert not missing, missing[:3]


def test_device_statistics_are_the_cpu_ones(tmp_path):
    _, dev, errors = _run(tmp_path, "npy", "mix", "statistics")
    _, cpu, _ = _run(tmp_path, "cpu", "mix", "statistics")
    assert not errors
    assert dev.keys() == cpu.keys() and len(dev) > 30
    compared = 0
    for key in cpu:
        a, b = dict(_tensors(dev[key])), dict(_tensors(cpu[key]))
        assert a.keys() == b.keys(), key
        for path in b:
            # a matmul's last bit differs (the stand-in multiplies a contiguous copy of a transposed weight), and
            # the CPU kernel carries the mean and norm in double where the device keeps float32
            for f in ("Max", "Min", "Mean", "Norm"):
                assert a[path][f] == pytest.approx(b[path][f], rel=1e-6, abs=1e-7), (key, path, f)
            compared += 1
    assert compared >= 100, compared


@pytest.mark.parametrize("summary", ["md5", "xor", "statistics"])
def test_device_checksums_and_figures_of_every_kind_are_the_cpu_ones(tmp_path, summary):
    (res, dev, errors), (_, cpu, _) = (_run(tmp_path, "npy", "L1", summary, VALUES),
                                       _run(tmp_path, "cpu", "L1", summary, VALUES))
    assert res["hits"] == [] and not errors
    assert dev.keys() == cpu.keys() and len(dev) >= 18, sorted(dev)
    kinds = set()
    for key in cpu:
        a, b = dict(_tensors(dev[key])), dict(_tensors(cpu[key]))
        for path in b:
            kinds.add((b[path]["dtype"], len(b[path]["shape"])))
            if summary == "statistics":
                assert (a[path]["Max"], a[path]["Min"]) == (b[path]["Max"], b[path]["Min"]), (key, path)
                for f in ("Mean", "Norm"):
                    assert a[path][f] == pytest.approx(b[path][f], rel=1e-6, abs=1e-7), (key, path, f)
            else:
                assert a[path]["md5"] == b[path]["md5"] and b[path]["md5"] is not None, (key, path)
    assert {("torch.bfloat16", 2), ("torch.int64", 1), ("torch.bool", 2), ("torch.float32", 0)} <= kinds, kinds


def test_kernels_per_recorded_device_tensor(tmp_path):
    result, records, _ = _run(tmp_path, "npy", "L1", "statistics")
    with_tool, without, _ = result["kernels"]
    tensors = sum(1 for k, r in records.items() if k[0] == "step0" for _ in _tensors(r))
    per_tensor = (with_tool - without) / tensors
    print(f"{with_tool - without} kernels for {tensors} recorded tensors: {per_tensor:.2f} each")
    assert per_tensor <= 2, (with_tool, without, tensors)


def test_the_monitor_presets_norms_on_a_device_are_one_batched_kernel_per_value_and_the_cpu_ones(tmp_path):
    (res, dev, errors), (_, cpu, _) = (_run(tmp_path, "npy", "L0", "statistics", preset="monitor"),
                                       _run(tmp_path, "cpu", "L0", "statistics", preset="monitor"))
    assert res["hits"] == [] and not errors
    assert dev.keys() == cpu.keys() and len(dev) >= 6, sorted(dev)
    compared = 0
    for key in cpu:
        a, b = dict(_tensors(dev[key])), dict(_tensors(cpu[key]))
        assert a.keys() == b.keys(), key
        for path in b:
            assert {f: a[path][f] for f in ("Max", "Min", "Mean")} == {"Max": None, "Min": None, "Mean": None}
            assert a[path]["Norm"] == pytest.approx(b[path]["Norm"], rel=1e-6), (key, path)
            assert b[path]["Max"] is None, (key, path)
            compared += 1
    assert compared >= 6, compared
    # no aminmax, no mean: a record's value (a module's outputs, a parameter's gradient) costs one norm kernel
    with_tool, without, _ = res["kernels"]
    values = sum(1 for k, r in dev.items() if k[0] == "step0" for _ in _tensors(r))
    assert with_tool - without <= values, (with_tool, without, values)


def test_a_flight_recorder_window_of_device_steps_holds_the_figures_every_step_written_holds(tmp_path):
    """The held steps' device statistics are read by the writer thread after the training thread journaled their
    records: the journal gets them too, and the window replayed from it holds what writing every step writes."""
    body = TRAIN + """
    if step == 2:
        dbg.trigger("the script saw something")"""
    for name in ("flight", "every"):
        (tmp_path / name).mkdir()
    res, flight, errors = _run(tmp_path / "flight", "npy", "mix", "statistics", body, flight_recorder=1,
                               flight_after=0)
    _, every, _ = _run(tmp_path / "every", "npy", "mix", "statistics", body)
    assert res["hits"] == [] and not errors
    assert {k[0] for k in flight} == {"step0", "step1"} and flight == every
    entries = [e for r in flight.values() for _, e in _tensors(r)]
    assert len(entries) > 40 and all(e["Max"] is not None for e in entries), len(entries)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("summary", ["statistics", "md5", "xor"])
def test_cuda_dumping_raises_no_sync_error(tmp_path, summary):
    code = """
import json, threading, warnings, torch, torch.nn as nn
from msprobe_inject.pytorch import PrecisionDebugger
json.dump({"task": "statistics", "dump_path": "d", "level": "mix", "statistics": {"summary_mode": "SUMMARY"}},
          open("c.json", "w"))
syncs = []
# the mode is process-wide: the writer thread's reads warn too, so each warning is kept with its thread
warnings.simplefilter("always")
warnings.showwarning = lambda msg, *a, **k: syncs.append((threading.current_thread().name, str(msg)))
dbg = PrecisionDebugger(config_path="c.json")
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x = torch.randn(16, 64, device="cuda")
    torch.cuda.set_sync_debug_mode("warn")
    dbg.start(model=model)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    dbg.stop()
    torch.cuda.set_sync_debug_mode(0)
    dbg.step()
mine = [m for t, m in syncs if t == threading.main_thread().name and "synchroniz" in m]
print("NO-SYNC-OK" if not mine else mine)
""".replace("SUMMARY", summary)
    assert "NO-SYNC-OK" in run_py(code, str(tmp_path)).stdout
    assert not glob.glob(str(tmp_path / "d" / "**" / "dump_error_info.log"), recursive=True)
