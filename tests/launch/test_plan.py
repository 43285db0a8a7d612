"""The plan: everything validated and decided before anything starts (argv, the workers' env, the dump config,
the dump path), printed by --dry-run; a configuration error exits 2 naming the key or value."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
from launch_util import BOOT, base_env, launch, run
from typer.testing import CliRunner

from msprobe_launch import cli, plan, surface
from msprobe_launch.plan import LaunchError, Request, build_plan

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
    return CliRunner().invoke(surface.app, args, obj={"wrap": wrap, "run": cli.run}, prog_name="msprobe-launch")


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
    (["--async-dump", "--summary-mode", "md5"], ["async_dump", "md5"]),
    (["--max-restarts", "x"], ["--max-restarts", "'x'"]),
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


def test_msrun_engine_without_mindspore_is_a_clear_error(tmp_path, script, clean_environ, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mindspore" else
                        find_spec(name, *a))
    result = _invoke(["--engine", "msrun", "--worker_num", "2", "--local_worker_num", "2", script])
    assert result.exit_code == 2 and "MindSpore" in result.output and "nothing was started" in result.output


def _plan(tmp_path, args, env=None) -> dict:
    proc = launch(["--dry-run"] + args, str(tmp_path), env=env, check=0)
    return json.loads(proc.stdout)


def test_dry_run_shows_torchrun_argv_and_worker_env(tmp_path, script):
    plan = _plan(tmp_path, ["--nproc", "2", "--max_restarts", "1", "--level", "L0", "--step", "0,2-3",
                            "--no-async-dump", script, "--lr", "3e-4", "--", "x"])
    assert sorted(plan) == ["argv", "config", "dump_path", "dumping", "engine", "env_set", "env_unset", "node_hooks",
                            "notes"]
    assert plan["engine"] == "torchrun" and plan["node_hooks"] is True
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
    assert plan["dumping"] is True and plan["dump_path"] == env["MSPROBE_DUMP_PATH"]
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
    assert plan.prepend_pythonpath(None, BOOT) == BOOT
    assert plan.prepend_pythonpath("", BOOT) == BOOT
    assert plan.prepend_pythonpath(sep.join(["a", BOOT, "b", BOOT + "/"]), BOOT) == sep.join([BOOT, "a", "b"])


def test_msprobe_enable_0_runs_without_dumping(tmp_path, script):
    proc = launch(["--dry-run", script], str(tmp_path), env=base_env(MSPROBE_ENABLE="0"), check=0)
    plan = json.loads(proc.stdout)
    assert plan["dumping"] is False and plan["env_set"] == {}


# ---------------------------------------------------------------- build_plan itself

def _env(tmp_path, **extra):
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "/elsewhere", **extra}


def test_build_plan_changes_nothing(tmp_path, script, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    request = Request(engine="torchrun", program=[script], engine_options=[("--standalone", True)],
                      overrides={"level": "mix"})
    launch_plan = build_plan(request, environ=_env(tmp_path, MSPROBE_CLAIMED_PID="1"), pid=4242)
    assert dict(os.environ) == before and os.listdir(tmp_path) == ["train.py"]
    assert launch_plan.env_unset == ["MSPROBE_CLAIMED_PID"]
    assert launch_plan.env_set["MSPROBE_AGENT_PID"] == "4242" and launch_plan.env_set["MSPROBE_LEVEL"] == "mix"
    assert launch_plan.env_set["PYTHONPATH"] == os.pathsep.join([BOOT, "/elsewhere"])
    assert launch_plan.torchrun_args.standalone is True and launch_plan.dump.config["level"] == "mix"


def test_the_plan_compiles_the_node_hooks_for_torch_ranks_unless_switched_off(tmp_path, script):
    torchrun = Request(engine="torchrun", program=[script], engine_options=[("--standalone", True)])
    assert build_plan(torchrun, environ=_env(tmp_path)).node_hooks is True
    assert build_plan(torchrun, environ=_env(tmp_path, MSPROBE_NODE_HOOK="0")).node_hooks is False
    assert build_plan(torchrun, environ=_env(tmp_path, MSPROBE_ENABLE="0")).node_hooks is False  # no dumping
    command = Request(engine="command", program=[sys.executable], script_is_file=False)
    assert build_plan(command, environ=_env(tmp_path)).node_hooks is True
    msrun = Request(engine="msrun", program=[script])
    assert build_plan(msrun, environ=_env(tmp_path)).node_hooks is False


def test_msrun_argv_forces_join_and_notes_another_value(tmp_path, script):
    request = Request(engine="msrun", program=[script, "--x"],
                      engine_options=[("--node_rank", "0"), ("--worker_num", "2"), ("--join", "False")])
    notes = []
    assert plan.msrun_argv(request, notes) == ["--node_rank=0", "--worker_num=2", "--join=True", script, "--x"]
    assert notes == ["--join False ignored: msprobe-launch waits for msrun's workers to print the summary"]
    request = Request(engine="msrun", program=[script], engine_options=[("--join", "true")])
    notes = []
    assert plan.msrun_argv(request, notes) == ["--join=True", script] and notes == []


def _earlier_job(dump, run_id="old-job"):
    (dump / "step0" / "rank0").mkdir(parents=True)
    (dump / "step0" / "rank0" / "dump.json").write_text("{}")
    (dump / "msprobe_manifest.json").write_text(json.dumps({"run_ids": [run_id]}))


def test_an_earlier_jobs_dump_is_refused_without_overwrite(tmp_path, script):
    dump = tmp_path / "d"
    _earlier_job(dump)
    request = Request(engine="command", program=["true"], script_is_file=False, overrides={"dump_path": str(dump)})
    earlier = r"already holds dump data of an earlier job \(msprobe_manifest.json, step0\).*--overwrite"
    with pytest.raises(LaunchError, match=earlier):
        build_plan(request, environ=_env(tmp_path))
    overwrite = dataclasses.replace(request, overwrite=True)
    assert build_plan(overwrite, environ=_env(tmp_path)).dump.clear_first == [
        str(dump / "msprobe_manifest.json"), str(dump / "step0")]
    same_job = dataclasses.replace(request, run_id="old-job")  # another node of the same job
    assert build_plan(same_job, environ=_env(tmp_path)).dump.clear_first == []
    assert (dump / "step0" / "rank0" / "dump.json").exists()  # planning removed nothing


def test_another_node_of_the_same_job_is_recognised_while_it_runs(tmp_path, script):
    # node 0's ranks are writing: no msprobe_manifest.json yet, only their own entries and the run's marker
    dump = tmp_path / "d"
    code = ("import sys; from msprobe_inject import coord; d = sys.argv[1]; "
            "coord.manifest_register(d, rank=0, root=coord.resolve_process_root(d, 0), config={})")
    run([sys.executable, "-c", code, str(dump)], str(tmp_path), env=base_env(MSPROBE_RUN_ID="job-7"))
    (dump / "step0" / "rank0").mkdir(parents=True)
    assert not (dump / "msprobe_manifest.json").exists()
    request = Request(engine="command", program=["true"], script_is_file=False, overrides={"dump_path": str(dump)})
    same_job = dataclasses.replace(request, run_id="job-7")
    assert build_plan(same_job, environ=_env(tmp_path)).dump.clear_first == []
    with pytest.raises(LaunchError, match="earlier job"):
        build_plan(dataclasses.replace(request, run_id="job-8"), environ=_env(tmp_path))


def test_overwrite_is_refused_through_the_launcher_and_nothing_starts(tmp_path, script):
    _earlier_job(tmp_path / "d")
    proc = launch(["--dump-path", "d", script], str(tmp_path), check=2)
    assert "--overwrite" in proc.stderr and "earlier job" in proc.stderr
    assert _started(tmp_path) == []
