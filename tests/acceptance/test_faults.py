"""Faults and hostile input: the user's job never breaks, nothing is lost, nothing escapes the dump path."""

from __future__ import annotations

import glob
import os
import resource
import signal
import subprocess
import sys
import textwrap

from util import PREAMBLE, clean_env, load_dump, run_py


def _all_files(root):
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            yield os.path.join(dirpath, f)


def _run_limited(tmp_path, code, limit):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))

    def limit_fsize():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk gives an error, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=300, preexec_fn=limit_fsize)


HOSTILE_NAMES = ["a/b", "../../escape", "x\x00y", "n" * 4096, "中文名", "..", "/abs", "a b;c"]


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


def test_sigint_flushes_json_files(tmp_path):
    code = PREAMBLE + """
import signal, time
# the disposition this test relies on: a suite started in the background inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
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
