"""The writer (writer.py): overflow_check, async_dump, file modes, the journal after a kill, SIGTERM."""

from __future__ import annotations

import glob
import json
import os

from util import PREAMBLE, load_dump, rank_dir, run_config, run_py, write_config


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


def test_async_dump_is_accepted_and_changes_nothing(tmp_path):
    """msprobe's async_dump is accepted for compatibility and ignored: the same run writes the same records."""
    (tmp_path / "sync").mkdir()
    (tmp_path / "async").mkdir()
    sync = load_dump(run_config(tmp_path / "sync", level="L1", async_dump=False))
    asynchronous = load_dump(run_config(tmp_path / "async", level="L1", async_dump=True))
    assert sync["data"] and asynchronous == sync


def test_files_and_dirs_permissions(tmp_path):
    dump = run_config(tmp_path, level="L1")
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
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the disposition this test relies on, not an inherited one
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
