"""The sitecustomize bootstrap and the .pth startup hook: inert by default, chaining, classification, helpers.

A fake ``mindspore`` package (a few bytes, in tmp) stands in for a framework where only the post-import hook
is under test, so that most of these tests never import torch. Decisions are read from MSPROBE_BOOT_LOG.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from launch_util import BOOT, EXAMPLE, base_env, launch, pth_installed, read_log, run

from msprobe_inject._boot import bootstrap


def boot_env(tmp_path, *front: str, **extra: str):
    env = base_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(list(front) + [env["PYTHONPATH"]])
    return env


@pytest.fixture()
def fake_framework(tmp_path):
    pkg = tmp_path / "fakefw" / "mindspore"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("IMPORTED = True\n")
    return str(tmp_path / "fakefw")


def test_inert_without_msprobe_env(tmp_path):
    code = ("import sys; print(sorted(m for m in sys.modules if 'msprobe' in m or m in ('torch', 'json'))); "
            "print(type(sys.meta_path[0]).__name__)")
    proc = run([sys.executable, "-c", code], str(tmp_path), env=boot_env(tmp_path, BOOT), check=0)
    modules, first_finder = proc.stdout.splitlines()
    assert "msprobe_inject" not in modules and "torch" not in modules and "'json'" not in modules
    assert first_finder != "_PostImportFinder"
    assert proc.stderr == ""


def test_msprobe_enable_0_keeps_everything_inert(tmp_path):
    code = "import sys; print('msprobe_inject' in sys.modules)"
    seen = {}
    for enable in ("", "0"):  # the same environment with and without the switch: the log proves it was read
        log = tmp_path / f"boot{enable}.log"
        env = boot_env(tmp_path, BOOT, MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(log))
        if enable:
            env["MSPROBE_ENABLE"] = enable
        proc = run([sys.executable, "-c", code], str(tmp_path), env=env, check=0)
        seen[enable] = (proc.stdout.strip(), [e.get("event") for e in read_log(str(log))])
    assert seen[""][0] == "True" and "classify" in seen[""][1], seen
    assert seen["0"] == ("False", []), seen


USER_SITECUSTOMIZE = """\
import os, sys
with open(os.environ["USER_SC_LOG"], "a") as fh:
    fh.write("user-sitecustomize %d\\n" % os.getpid())
USER_MARK = True
"""


@pytest.mark.parametrize("dumping", [False, True])
@pytest.mark.parametrize("copies", [1, 2])
def test_chains_the_shadowed_sitecustomize_exactly_once(tmp_path, dumping, copies):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    sc_log = tmp_path / "sc.log"
    extra = {"USER_SC_LOG": str(sc_log)}
    if dumping:
        extra.update(MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(tmp_path / "boot.log"))
    env = boot_env(tmp_path, *([BOOT] * copies), str(user), **extra)
    code = ("import sys, sitecustomize; print(sitecustomize.USER_MARK); "
            f"print(sum(1 for p in sys.path if p.rstrip('/') == {BOOT!r}))")
    proc = run([sys.executable, "-c", code], str(tmp_path), env=env, check=0)
    assert proc.stdout.split() == ["True", "1"], proc.stderr
    assert sc_log.read_text().count("user-sitecustomize") == 1
    if dumping:
        events = read_log(str(tmp_path / "boot.log"))
        assert [e["event"] for e in events] == ["classify"] and events[0]["role"] == "worker"


def test_failing_user_sitecustomize_is_reported_like_site_does(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('boom in user sitecustomize')\n")
    proc = run([sys.executable, "-c", "print('still running')"], str(tmp_path),
               env=boot_env(tmp_path, BOOT, str(user)), check=0)
    assert "still running" in proc.stdout
    assert "Error in sitecustomize" in proc.stderr and "boom in user sitecustomize" in proc.stderr


def test_activation_after_import_and_when_a_chained_sitecustomize_imported_it(tmp_path, fake_framework):
    log = tmp_path / "boot.log"
    env = boot_env(tmp_path, BOOT, fake_framework, MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(log))
    code = "import mindspore; print(mindspore.IMPORTED, type(mindspore.__loader__).__name__)"
    proc = run([sys.executable, "-c", code], str(tmp_path), env=env, check=0)
    assert proc.stdout.split() == ["True", "SourceFileLoader"]  # the loader object is the original one
    events = read_log(str(log))
    assert [e["event"] for e in events] == ["classify", "activate"] and events[1]["module"] == "mindspore"

    # a user sitecustomize (chained after ours) imports the framework itself
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import mindspore\n")
    log.unlink()
    env = boot_env(tmp_path, BOOT, str(user), fake_framework, MSPROBE_DUMP_PATH=str(tmp_path / "d"),
                   MSPROBE_BOOT_LOG=str(log))
    run([sys.executable, "-c", "pass"], str(tmp_path), env=env, check=0)
    assert [e["event"] for e in read_log(str(log))] == ["classify", "activate"]


FORK_AND_CHILDREN = """\
import json, os, subprocess, sys
from msprobe_inject._boot import bootstrap
out = {"parent_active": bootstrap.is_active_worker()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    import mindspore  # a fork child must not activate
    os.write(w, json.dumps(bootstrap.is_active_worker()).encode())
    os._exit(0)
os.waitpid(pid, 0)
out["fork_child_active"] = json.loads(os.read(r, 100))
subprocess.run([sys.executable, "-c", "import mindspore"], check=True)
import multiprocessing as mp
ctx = mp.get_context("spawn")
p = ctx.Process(target=print, args=("spawned",))
p.start(); p.join()
import mindspore
print(json.dumps(out))
"""


def test_fork_spawn_and_subprocess_children_stay_inert(tmp_path, fake_framework):
    log = tmp_path / "boot.log"
    script = tmp_path / "parent.py"
    script.write_text(FORK_AND_CHILDREN)
    env = boot_env(tmp_path, BOOT, fake_framework, MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(log))
    proc = run([sys.executable, str(script)], str(tmp_path), env=env, check=0)
    assert '{"parent_active": true, "fork_child_active": false}' in proc.stdout
    events = read_log(str(log))
    parent = next(e["pid"] for e in events if e["event"] == "classify" and e["role"] == "worker")
    workers = [e for e in events if e["event"] == "classify" and e["role"] == "worker"]
    assert len(workers) == 1, events
    helpers = [e for e in events if e["event"] == "classify" and e["role"] == "helper"]
    # the subprocess, the spawn child and the spawn resource tracker (if any) are helpers
    assert len(helpers) >= 2 and all("descendant of rank process" in e["reason"] for e in helpers)
    assert [e["pid"] for e in events if e["event"] == "activate"] == [parent]
    assert any(e["event"] == "fork-child-inert" for e in events)


@pytest.mark.parametrize("argv, env, role", [
    (["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"], {}, "helper"),
    (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
      "--multiprocessing-fork"], {}, "helper"),
    (["python", "-c", "from multiprocessing.forkserver import main; main(1)"], {}, "helper"),
    (["python", "/x/torch/_inductor/compile_worker/__main__.py", "--kind=fork"], {}, "helper"),
    (["python", "train.py"], {"TORCH_WARM_POOL": "0"}, "helper"),
    (["python", "train.py"], {"MS_ROLE": "MS_SCHED", "RANK_ID": "0"}, "helper"),
    (["python", "train.py"], {"MS_ROLE": "MS_WORKER", "RANK_ID": "1"}, "worker"),
    (["python", "train.py"], {"MSPROBE_CLAIMED_PID": "1", "MSPROBE_CLAIMED_RANK": "RANK=0", "RANK": "0"}, "helper"),
    (["python", "train.py"], {"MSPROBE_CLAIMED_PID": "1", "MSPROBE_CLAIMED_RANK": ""}, "helper"),
    # a launcher between the claiming process and us assigned a new rank: we are a rank
    (["python", "train.py"], {"MSPROBE_CLAIMED_PID": "1", "MSPROBE_CLAIMED_RANK": "", "RANK": "3"}, "worker"),
    (["python", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], {}, "launcher"),
    (["python", "-m", "torch.distributed.run", "train.py"], {"SLURM_PROCID": "0"}, "launcher"),
    (["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"], {}, "launcher"),
    (["python", "/venv/bin/msrun", "--worker_num=2"], {}, "launcher"),
    (["python", "/venv/bin/msprobe-launch", "train.py"], {}, "launcher"),
    (["python", "-X", "dev", "-W", "ignore", "train.py"], {"RANK": "1"}, "worker"),
    (["python", "train.py"], {}, "worker"),  # the env-only form of `python train.py`
])
def test_classification_rules(argv, env, role):
    assert bootstrap.classify(env=env, argv=argv)[0] == role


def test_child_of_the_launcher_is_a_worker_even_when_spawned():
    # --run-path: the agent starts workers with multiprocessing spawn; RANK arrives later
    env = {"MSPROBE_AGENT_PID": str(os.getppid())}
    argv = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
            "--multiprocessing-fork"]
    assert bootstrap.classify(env=env, argv=argv) == ("worker", "child of the launcher")


@pytest.mark.skipif(not pth_installed(), reason="package not installed (pip install -e .): no .pth hook")
def test_pth_hook_for_the_env_only_form(tmp_path, fake_framework):
    log = tmp_path / "boot.log"
    env = base_env(MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join([fake_framework, env["PYTHONPATH"]])
    run([sys.executable, "-c", "import mindspore"], str(tmp_path), env=env, check=0)
    events = read_log(str(log))
    assert [(e["event"], e.get("origin")) for e in events] == [("classify", "pth"), ("activate", None)]
    # with the boot dir on PYTHONPATH too, the .pth defers to sitecustomize: one activation only
    log.unlink()
    env["PYTHONPATH"] = os.pathsep.join([BOOT, env["PYTHONPATH"]])
    run([sys.executable, "-c", "import mindspore"], str(tmp_path), env=env, check=0)
    events = read_log(str(log))
    assert [(e["event"], e.get("origin")) for e in events] == [("classify", "sitecustomize"), ("activate", None)]
    # and nothing at all without the variables
    log.unlink()
    env.pop("MSPROBE_DUMP_PATH")
    run([sys.executable, "-c", "import mindspore"], str(tmp_path), env=env, check=0)
    assert read_log(str(log)) == []


def _roles(events):
    classified = [e for e in events if e["event"] == "classify"]
    workers = {e["pid"] for e in classified if e["role"] == "worker"}
    return classified, workers


@pytest.mark.parametrize("mp_context", ["spawn", "fork"])
def test_dataloader_workers_and_subprocesses_are_inert_under_the_launcher(tmp_path, mp_context):
    """Real job: 2 ranks x (2 DataLoader workers + resource tracker + a subprocess); only the 2 ranks activate."""
    log = tmp_path / "boot.log"
    env = base_env(MSPROBE_BOOT_LOG=str(log))
    proc = launch(["--standalone", "--nproc-per-node", "2", "--dump-path", "d", EXAMPLE, "--steps", "2",
                   "--num-workers", "2", "--mp-context", mp_context, "--subprocess"],
                  str(tmp_path), env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_log(str(log))
    classified, workers = _roles(events)
    assert len(workers) == 2, classified
    assert {e["pid"] for e in events if e["event"] == "activate"} == workers
    helpers = [e for e in classified if e["role"] != "worker"]
    assert all(e["role"] == "helper" and "descendant" in e["reason"] for e in helpers), helpers
    assert sum("import torch; print('child process'" in " ".join(e["argv"]) for e in helpers) == 2
    if mp_context == "spawn":
        assert sum("spawn_main" in " ".join(e["argv"]) for e in helpers) == 4
    else:
        assert len([e for e in events if e["event"] == "fork-child-inert"]) >= 4
    if os.path.isdir(tmp_path / "d"):  # with the runtime present: only rank directories
        names = {p.name for p in (tmp_path / "d").glob("step*/*")}
        assert names <= {"rank0", "rank1"}, names


@pytest.mark.skipif(not pth_installed(), reason="package not installed (pip install -e .): no .pth hook")
def test_env_only_form_under_plain_torchrun_classifies_the_same(tmp_path):
    log = tmp_path / "boot.log"
    env = base_env(MSPROBE_DUMP_PATH=str(tmp_path / "d"), MSPROBE_BOOT_LOG=str(log))
    code = textwrap.dedent("""\
        import os, subprocess, sys
        import torch
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    """)
    script = tmp_path / "job.py"
    script.write_text(code)
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(script)], str(tmp_path), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    classified, workers = _roles(read_log(str(log)))
    roles = sorted(e["role"] for e in classified)
    assert roles == ["helper", "helper", "launcher", "worker", "worker"], classified
    assert all(e["origin"] == "pth" for e in classified)
