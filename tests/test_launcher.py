"""The msprobe-launch CLI: parsing, validation before any worker starts, the env handed to workers, exit codes.

Everything here runs real processes through the real torchrun agent (gloo/CPU) where a job is started;
the workers are tiny scripts without torch so that these tests stay fast.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from launch_util import BOOT, EXAMPLE, base_env, launch
from typer.testing import CliRunner

from msprobe_launch import cli

MARKER_SCRIPT = """\
import os, sys
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "started." + os.environ.get("RANK", "x")), "w").close()
"""


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MARKER_SCRIPT)
    return str(path)


def _started(tmp_path) -> list:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("started."))


@pytest.fixture()
def clean_environ(monkeypatch):
    for var in list(os.environ):
        if var.startswith("MSPROBE_"):
            monkeypatch.delenv(var)


def _invoke(args, wrap=False):
    return CliRunner().invoke(cli.app, args, obj={"wrap": wrap}, prog_name="msprobe-launch")


def test_help_groups_launch_and_dump_options_and_shows_examples(tmp_path):
    proc = launch(["--help"], str(tmp_path), env=base_env(COLUMNS="160"), check=0)
    out = proc.stdout
    for text in ("Launch options", "Dump options", "msrun options", "Examples", "--nproc-per-node", "--nproc",
                 "--rdzv-endpoint", "--standalone", "--max-restarts", "--local-ranks-filter", "--no-python",
                 "--run-path", "--dump-path", "--step-on", "--async-dump", "--worker_num", "--engine",
                 "msprobe-launch --nproc-per-node 2 train.py"):
        assert text in out, text


def test_unknown_flag_fails_before_any_worker_and_names_it(tmp_path, script):
    proc = launch(["--nproc-per-node", "2", "--bogus-flag", "1", script], str(tmp_path), check=2)
    assert "--bogus-flag" in proc.stderr
    assert _started(tmp_path) == []


def test_bad_level_fails_before_any_worker_and_names_the_value(tmp_path, script):
    proc = launch(["--standalone", "--nproc-per-node", "2", "--level", "L9", script], str(tmp_path), check=2)
    assert "'level'" in proc.stderr and "'L9'" in proc.stderr and "'L0'" in proc.stderr
    assert _started(tmp_path) == []
    assert not (tmp_path / "msprobe_dump").exists()


@pytest.mark.parametrize("args, words", [
    (["--task", "nan_check"], ["task", "nan_check", "statistics"]),
    (["--task", "bogus"], ["task", "bogus"]),
    (["--step", "5-3"], ["step", "5-3"]),
    (["--step", "[1.5]"], ["step", "1.5"]),
    (["--rank", "x-y"], ["rank", "x-y"]),
    (["--data-mode", "sideways"], ["data_mode", "sideways", "forward"]),
    (["--summary-mode", "sha1"], ["summary_mode", "sha1", "md5"]),
    (["--step-on", "epoch"], ["step_on", "epoch", "optimizer"]),
    (["--scope", "a"], ["scope"]),
    (["--step", "[1"], ["--step", "[1"]),
    (["--async-dump", "--summary-mode", "md5"], ["async_dump", "md5"]),
    (["--max-restarts", "x"], ["--max-restarts", "'x'"]),
    (["--engine", "mpirun"], ["--engine", "mpirun", "msrun"]),
    (["--worker_num", "2"], ["--worker_num", "--engine msrun"]),
    (["--engine", "msrun", "--nproc-per-node", "2"], ["--nproc-per-node", "msrun"]),
    (["--config", "no_such_config.json"], ["no_such_config.json"]),
])
def test_bad_values_exit_2_and_name_the_value(tmp_path, script, clean_environ, args, words):
    result = _invoke(args + [script])
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, (word, result.output)
    assert _started(tmp_path) == []


def test_bad_config_file_value_is_named(tmp_path, script, clean_environ):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L5", "statistics": {}}))
    result = _invoke(["--config", str(cfg), script])
    assert result.exit_code == 2 and "'level'" in result.output and "L5" in result.output


def test_inherited_msprobe_env_is_validated_too(tmp_path, script, monkeypatch):
    monkeypatch.setenv("MSPROBE_LEVEL", "L7")
    result = _invoke([script])
    assert result.exit_code == 2 and "L7" in result.output and "environment" in result.output


def test_missing_script_is_reported(tmp_path, clean_environ):
    result = _invoke([str(tmp_path / "nope.py")])
    assert result.exit_code == 2 and "nope.py" in result.output


def test_msrun_engine_without_mindspore_is_a_clear_error(tmp_path, script, clean_environ):
    import importlib.util

    if importlib.util.find_spec("mindspore") is not None:
        pytest.skip("mindspore is installed")
    result = _invoke(["--engine", "msrun", "--worker_num", "2", "--local_worker_num", "2", script])
    assert result.exit_code == 2 and "MindSpore" in result.output


def _plan(tmp_path, args) -> dict:
    proc = launch(["--dry-run"] + args, str(tmp_path), check=0)
    return json.loads(proc.stdout)


def test_dry_run_shows_torchrun_argv_and_worker_env(tmp_path, script):
    plan = _plan(tmp_path, ["--nproc", "2", "--max_restarts", "1", "--level", "L0", "--step", "0,2-3",
                            "--no-async-dump", script, "--lr", "3e-4", "--", "x"])
    assert plan["engine"] == "torchrun"
    assert plan["argv"][:4] == ["--nproc-per-node", "2", "--max-restarts", "1"]
    assert plan["argv"][-5:] == [script, "--lr", "3e-4", "--", "x"]  # script args untouched
    env = plan["env_set"]
    assert env["MSPROBE_LEVEL"] == "L0"
    assert json.loads(env["MSPROBE_STEP"]) == [0, "2-3"]
    assert env["MSPROBE_ASYNC_DUMP"] == "0"
    assert env["MSPROBE_DUMP_PATH"] == str(tmp_path / "msprobe_dump")  # default, made absolute
    assert env["PYTHONPATH"].split(os.pathsep)[0] == BOOT
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # because --max-restarts > 0
    assert env["MSPROBE_RUN_ID"] and env["MSPROBE_AGENT_PID"].isdigit()
    assert plan["config"]["level"] == "L0" and plan["config"]["step"] == [0, 2, 3]
    assert plan["config"]["task"] == "statistics"
    assert not _started(tmp_path)


def test_defaults_and_config_file(tmp_path, script):
    plan = _plan(tmp_path, [script])
    assert plan["config"]["task"] == "statistics" and plan["config"]["level"] == "L1"
    assert plan["config"]["step"] == [] and plan["config"]["rank"] == []
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan["env_set"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "tensor", "dump_path": "from_cfg", "level": "mix",
                               "tensor": {"scope": [], "list": []}}))
    plan = _plan(tmp_path, ["--config", str(cfg), "--level", "L0", script])
    assert plan["env_set"]["MSPROBE_CONFIG"] == str(cfg)
    assert plan["env_set"]["MSPROBE_DUMP_PATH"] == str(tmp_path / "from_cfg")
    assert plan["config"]["task"] == "tensor" and plan["config"]["level"] == "L0"  # the flag wins


def test_rdzv_id_becomes_the_run_id(tmp_path, script):
    plan = _plan(tmp_path, ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29999",
                            "--rdzv-id", "job7", script])
    assert plan["env_set"]["MSPROBE_RUN_ID"] == "job7"
    assert ["--rdzv-id", "job7"] == plan["argv"][plan["argv"].index("--rdzv-id"):][:2]


def test_wrap_form_plan_and_conflicts(tmp_path):
    plan = _plan(tmp_path, ["--task", "tensor", "--", sys.executable, "-c", "pass"])
    assert plan["engine"] == "command" and plan["argv"] == [sys.executable, "-c", "pass"]
    assert plan["env_set"]["MSPROBE_TASK"] == "tensor"
    proc = launch(["--nproc-per-node", "2", "--", sys.executable, "x.py"], str(tmp_path), check=2)
    assert "--nproc-per-node" in proc.stderr


def test_pythonpath_is_deduplicated():
    sep = os.pathsep
    assert cli.prepend_pythonpath(None, BOOT) == BOOT
    assert cli.prepend_pythonpath("", BOOT) == BOOT
    assert cli.prepend_pythonpath(sep.join(["a", BOOT, "b", BOOT + "/"]), BOOT) == sep.join([BOOT, "a", "b"])


def test_msprobe_enable_0_runs_without_dumping(tmp_path, script):
    proc = launch(["--dry-run", script], str(tmp_path), env=base_env(MSPROBE_ENABLE="0"), check=0)
    plan = json.loads(proc.stdout)
    assert plan["dumping"] is False and plan["env_set"] == {}


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


def test_example_script_is_msprobe_free():
    with open(EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    assert "msprobe" not in text.replace("msprobe-launch", "").replace("msprobe code", "")


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
