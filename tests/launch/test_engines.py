"""The runners: torchrun's agent and msrun in-process, a command as a child; exit codes; the end of a job.

Jobs run through the real launcher and the real torchrun agent (gloo/CPU); the workers are tiny scripts
without torch so that these tests stay fast. msrun runs as a stand-in with the same contract.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from launch_util import BOOT, base_env, launch

from msprobe_launch import engines
from msprobe_launch.plan import DumpPlan, LaunchPlan

ENV_PROBE = """\
import json, os, sys
keys = [k for k in os.environ if k.startswith("MSPROBE_")] + ["PYTHONPATH", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "env.%s.json" % os.environ.get("RANK", "x")), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
sys.exit(int(os.environ.get("EXIT_CODE_RANK%s" % os.environ.get("RANK", "x"), "0")))
"""


def test_torchrun_job_gets_the_env_and_exit_code_propagates(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(ENV_PROBE)
    env = base_env(MSPROBE_CLAIMED_PID="1", MSPROBE_CLAIMED_RANK="RANK=0")  # stale values from an outer job
    proc = launch(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.1",
                   "--level", "mix", str(probe)], str(tmp_path), env=env, check=0)
    for rank in ("0", "1"):
        got = json.loads((tmp_path / f"env.{rank}.json").read_text())
        assert got["MSPROBE_LEVEL"] == "mix"
        assert got["MSPROBE_DUMP_PATH"] == str(tmp_path / "msprobe_dump")
        assert got["PYTHONPATH"].split(os.pathsep)[0] == BOOT
        assert got["MSPROBE_AGENT_PID"] and got["MSPROBE_RUN_ID"]
        # the launcher drops an outer claim; the rank's own bootstrap then claims itself
        assert got["MSPROBE_CLAIMED_PID"] != "1"
    assert "Traceback" not in proc.stderr
    env = base_env(EXIT_CODE_RANK1="5")
    proc = launch(["--standalone", "--nproc-per-node", "2", str(probe)], str(tmp_path), env=env)
    assert proc.returncode == 5, proc.stderr
    assert "FAILED" in proc.stderr


def test_wrap_form_runs_any_command_with_the_env_and_its_exit_code(tmp_path):
    code = textwrap.dedent("""\
        import os, sys
        print("DUMP", os.environ["MSPROBE_DUMP_PATH"], "BOOT", os.environ["PYTHONPATH"].split(os.pathsep)[0])
        sys.exit(7)
    """)
    proc = launch(["--dump-path", "d", "--", sys.executable, "-c", code], str(tmp_path))
    assert proc.returncode == 7, proc.stderr
    assert f"DUMP {tmp_path / 'd'} BOOT {BOOT}" in proc.stdout
    proc = launch(["--", str(tmp_path / "no-such-binary")], str(tmp_path))
    assert proc.returncode == 127


def test_a_command_killed_by_a_signal_exits_128_plus_the_signal(tmp_path):
    # the disposition this test relies on, not an inherited one
    code = "import os, signal; signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGTERM)"
    proc = launch(["--dump-path", "d", "--", sys.executable, "-c", code], str(tmp_path))
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr


def test_overwrite_clears_the_earlier_job_before_the_command_runs(tmp_path):
    old = tmp_path / "d" / "step0" / "rank0"
    old.mkdir(parents=True)
    (old / "dump.json").write_text("{}")
    code = "import os, sys; print('SEES-OLD', os.path.exists(sys.argv[1]))"
    proc = launch(["--dump-path", "d", "--overwrite", "--", sys.executable, "-c", code, str(old)], str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "SEES-OLD False" in proc.stdout and "--overwrite: removing earlier dump data" in proc.stderr


@pytest.mark.parametrize("raw, code", [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_exit_status_of_a_child(raw, code):
    assert engines.exit_status(raw) == code


@pytest.mark.parametrize("raw, code", [(5, 5), (-9, 137), (0, 1), (None, 1), (300, 1), ("x", 1)])
def test_a_failed_worker_never_exits_0(raw, code):
    assert engines.worker_failure_code(raw) == code


RANK_MID_STEP = """\
import os, sys, time
from msprobe_inject import coord
from msprobe_inject.dumpformat import journal
dump, rank, stay = sys.argv[1], int(sys.argv[2]), sys.argv[3]
root = coord.resolve_process_root(dump, rank)
coord.manifest_register(dump, rank=rank, root=root, config={"level": "L1"})
d = os.path.join(root, "step0", "rank%d" % rank)
os.makedirs(d)
jf = journal.JournalFile(os.path.join(d, "dump.journal"), {"task": "statistics", "level": "L1",
                         "framework": "pytorch", "dump_data_dir": None}, "dump")  # a step opened, never closed
jf.append(journal.record_frame("set", "Functional.relu.0.forward", {"input_args": [], "output": []}))
print("ready", flush=True)
while stay != "-" and not os.path.exists(stay):  # a rank still writing its last step
    time.sleep(0.05)
"""


def _rank_mid_step(tmp_path, rank, stay, **env):
    script = tmp_path / "rank_mid_step.py"
    script.write_text(RANK_MID_STEP)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "d"), str(rank), stay], cwd=str(tmp_path),
                            env=base_env(MSPROBE_RUN_ID="job", **env), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_end_of_job_finishes_only_this_nodes_dead_ranks(tmp_path, capsys):
    me = str(os.getpid())
    dead = _rank_mid_step(tmp_path, 0, "-", MSPROBE_AGENT_PID=me, GROUP_RANK="0")
    dead.wait(timeout=60)
    live = _rank_mid_step(tmp_path, 1, str(tmp_path / "go"), MSPROBE_AGENT_PID=me, GROUP_RANK="0")
    other = _rank_mid_step(tmp_path, 2, "-", MSPROBE_AGENT_PID="1", GROUP_RANK="1")  # another launcher's
    other.wait(timeout=60)
    try:
        engines.finish_job(DumpPlan(dumping=True, dump_path=str(tmp_path / "d")))
    finally:
        (tmp_path / "go").touch()
        live.wait(timeout=60)
    dump = tmp_path / "d"
    recovered = json.loads((dump / "step0" / "rank0" / "dump.json").read_text())
    assert recovered["incomplete"] is True and list(recovered["data"]) == ["Functional.relu.0.forward"]
    assert not (dump / "step0" / "rank1" / "dump.json").exists()  # alive: never "recovered"
    assert not (dump / "step0" / "rank2" / "dump.json").exists()  # its own launcher recovers it
    err = capsys.readouterr().err
    assert "recovered 1 records" in err and "rank1" not in err and "rank2" not in err
    manifest = json.loads((dump / "msprobe_manifest.json").read_text())  # node 0: the job-wide view
    status = {p["rank"]: p["status"] for p in manifest["processes"]}
    assert status == {0: "died", 1: "running", 2: "running"}


def test_a_node_other_than_0_prints_its_own_ranks_and_writes_no_combined_manifest(tmp_path, capsys):
    me = str(os.getpid())
    for rank, group, agent in ((0, "0", "1"), (2, "1", me), (3, "1", me)):
        _rank_mid_step(tmp_path, rank, "-", MSPROBE_AGENT_PID=agent, GROUP_RANK=group).wait(timeout=60)
    engines.finish_job(DumpPlan(dumping=True, dump_path=str(tmp_path / "d"), index=True))
    dump = tmp_path / "d"
    assert not (dump / "msprobe_manifest.json").exists()
    indexed = sorted(p.parent.name for p in (dump / ".msprobe" / "index").rglob("*.parquet"))
    assert indexed == ["rank=2", "rank=3"]  # --index: this node's ranks only
    assert (dump / "step0" / "rank2" / "dump.json").exists() and (dump / "step0" / "rank3" / "dump.json").exists()
    assert not (dump / "step0" / "rank0" / "dump.json").exists()
    out = capsys.readouterr().out
    assert "this node's ranks" in out
    table = out.split("this node's ranks", 1)[1]
    rows = [line.split()[0] for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert rows == ["2", "3"], table


def test_end_of_job_without_dumping_does_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(engines, "print_summary", lambda path, select=None: calls.append(path))
    engines.finish_job(DumpPlan(dumping=False, dump_path=str(tmp_path)))
    engines.finish_job(DumpPlan(dumping=True, dump_path=str(tmp_path / "never-written")))
    assert calls == []


def test_a_failing_summary_is_reported_and_does_not_change_the_exit_code(tmp_path, monkeypatch, capsys):
    def broken(path):
        raise RuntimeError("unreadable")

    monkeypatch.setattr(engines, "print_summary", broken)
    plan = LaunchPlan(engine="command", argv=[sys.executable, "-c", "raise SystemExit(4)"],
                      dump=DumpPlan(dumping=True, dump_path=str(tmp_path)))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # apply_env writes the workers' env into this process
    assert engines.execute(plan) == 4
    assert f"could not summarise {tmp_path}: unreadable" in capsys.readouterr().err


def test_the_summary_is_the_readers_table(tmp_path, capsys):
    (tmp_path / "step0" / "rank0").mkdir(parents=True)
    (tmp_path / "step0" / "rank0" / "dump.json").write_text(json.dumps(
        {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
         "data": {"Functional.relu.0.forward": {"input_args": [], "input_kwargs": {}, "output": []}}}))
    engines.print_summary(str(tmp_path))
    out = capsys.readouterr().out
    assert "msprobe dump summary" in out and "first NaN/Inf" in out


FAKE_MSRUN = '''\
"""Stand-in for mindspore.parallel.cluster.run: same get_args() contract (parses sys.argv), spawns 'python'."""
import argparse, ast, json, os, subprocess, sys


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--worker_num", type=int, default=8)
    p.add_argument("--local_worker_num", type=int, default=8)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=8118)
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--log_dir", default="")
    p.add_argument("--join", default=False, type=ast.literal_eval, choices=[True, False])
    p.add_argument("--cluster_time_out", type=int, default=600)
    p.add_argument("task_script")
    p.add_argument("task_script_args", nargs=argparse.REMAINDER)
    return p.parse_args()


def run(args):
    with open("msrun_seen.json", "w") as fh:
        json.dump({"argv": sys.argv, "join": args.join, "path0": os.environ["PATH"].split(os.pathsep)[0],
                   "dump": os.environ.get("MSPROBE_DUMP_PATH")}, fh)
    codes = []
    for role, rank in [("MS_SCHED", "0")] + [("MS_WORKER", str(r)) for r in range(args.local_worker_num)]:
        env = dict(os.environ, MS_ROLE=role, RANK_ID=rank)
        codes.append(subprocess.call(["python", args.task_script] + args.task_script_args, env=env))
    if any(codes):
        sys.exit(max(codes))
'''


def test_msrun_engine_runs_msrun_in_process(tmp_path):
    """The msrun path with a stand-in for MindSpore's msrun (MindSpore itself is not needed for this test)."""
    from launch_util import read_log

    pkg = tmp_path / "fakems" / "mindspore" / "parallel" / "cluster"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "run.py").write_text(FAKE_MSRUN)
    script = tmp_path / "ms_train.py"
    script.write_text("import sys, mindspore\nsys.exit(int(sys.argv[1]))\n")
    env = base_env(MSPROBE_BOOT_LOG=str(tmp_path / "boot.log"), PATH="/usr/bin:/bin")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fakems"), env["PYTHONPATH"]])
    args = ["--engine", "msrun", "--worker_num", "2", "--local_worker_num", "2", "--master_port", "8123",
            "--join", "False", "--level", "L0", str(script)]
    proc = launch(args + ["0"], str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((tmp_path / "msrun_seen.json").read_text())
    assert seen["argv"][0] == "msrun" and "--master_port=8123" in seen["argv"] and "--worker_num=2" in seen["argv"]
    assert seen["join"] is True and "--join False ignored" in proc.stderr
    assert seen["path0"] == os.path.dirname(sys.executable)  # msrun's literal 'python' is this interpreter
    assert seen["dump"] == str(tmp_path / "msprobe_dump")
    roles = sorted((e["role"], e["reason"]) for e in read_log(str(tmp_path / "boot.log")) if e["event"] == "classify")
    assert roles == [("helper", "msrun scheduler"), ("worker", "child of the launcher"),
                     ("worker", "child of the launcher")]
    proc = launch(args + ["3"], str(tmp_path), env=env)
    assert proc.returncode == 3


def test_the_node_hooks_are_compiled_before_the_ranks_start_and_a_failed_compile_still_runs_the_job(tmp_path):
    from msprobe_inject import nodehook

    cache = tmp_path / "cache"
    env = base_env(MSPROBE_CACHE_DIR=str(cache), CXX="/nonexistent/c++", CC="/nonexistent/cc")
    cmd = ["--dump-path", "d", "--", sys.executable, "-c", "print('the job ran')"]
    proc = launch(cmd, str(tmp_path), env=env, check=0)
    assert "the job ran" in proc.stdout
    assert "compiling the C++ node hooks" in proc.stderr and "C++ node hooks not built (" in proc.stderr
    failed = list(cache.glob("nodehook/*/failed.txt"))
    assert [f.parent.name for f in failed] == [nodehook.tag()]
    proc = launch(cmd, str(tmp_path), env=env, check=0)  # not tried again at every launch
    assert "the job ran" in proc.stdout and "node hooks" not in proc.stderr
    off = base_env(MSPROBE_CACHE_DIR=str(tmp_path / "off"), MSPROBE_NODE_HOOK="0")
    proc = launch(cmd, str(tmp_path), env=off, check=0)
    assert "node hooks" not in proc.stderr and not (tmp_path / "off").exists()


@pytest.mark.skipif(__import__("msprobe_inject.nodehook").nodehook.load() is None,
                    reason="the C++ node hooks are not built (tests/conftest.py)")
def test_a_rank_registers_its_hooks_through_the_cached_node_hooks(tmp_path):
    code = ("import torch, msprobe_inject.pytorch.state as s; "
            "print('native', s.hook_after is not None and s.hook_single is not None)")
    proc = launch(["--dump-path", "d", "--", sys.executable, "-c", code], str(tmp_path), check=0)
    assert "native True" in proc.stdout and "node hooks" not in proc.stderr
    proc = launch(["--dump-path", "d", "--overwrite", "--", sys.executable, "-c", code], str(tmp_path),
                  env=base_env(MSPROBE_NODE_HOOK="0"), check=0)
    assert "native False" in proc.stdout
