"""End to end through the real launcher and the real torchrun agent (gloo, CPU), with the in-rank runtime.

These are issue 3's acceptance runs: every optimizer step of every rank dumped at L0/L1/mix, the env-only form,
two nodes with c10d, an elastic restart, duplicate ranks, DataLoader workers. They need
``msprobe_inject.zero_code`` (the runtime) and are skipped while it does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launch_util import BOOT, EXAMPLE, LAUNCH, base_env, free_port, launch, pth_installed, run, runtime_available

from msprobe_inject.dumpformat import manifest as combined

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]

STEPS = (0, 1, 2)  # examples/ddp_train.py makes 3 optimizer steps


def _records(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["data"]


def _manifest(dump) -> dict:
    with open(os.path.join(dump, "msprobe_manifest.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _assert_ranks_dumped(dump, ranks, steps=STEPS, level=None):
    for step in steps:
        for rank in ranks:
            path = os.path.join(dump, f"step{step}", f"rank{rank}", "dump.json")
            assert os.path.isfile(path), f"missing {path}; have {sorted(os.listdir(dump))}"
            data = _records(path)
            assert data, path
            names = list(data)
            if level == "L0":
                assert all(n.startswith("Module.") for n in names), names[:5]
            elif level == "L1":
                assert not any(n.startswith("Module.") for n in names), names[:5]
                assert any(n.startswith("Functional.linear.") for n in names), names[:5]
            elif level == "mix":
                assert any(n.startswith("Module.") for n in names) and any(n.startswith("Functional.") for n in names)
    procs = {p.name for p in _glob_dirs(dump, "step*/*")}
    assert procs == {f"rank{r}" for r in ranks}, procs  # no proc*/ dirs from helpers


def _glob_dirs(dump, pattern):
    import pathlib

    return [p for p in pathlib.Path(dump).glob(pattern) if p.is_dir()]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_every_step_of_every_rank_is_dumped(tmp_path, level):
    # L1 is the default: that run is the README's first command, verbatim (no --level, no --dump-path)
    args = ["--nproc-per-node", "2", EXAMPLE] if level == "L1" else \
        ["--standalone", "--nproc-per-node", "2", "--level", level, "--dump-path", "msprobe_dump", EXAMPLE]
    proc = launch(args, str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    dump = str(tmp_path / "msprobe_dump")
    _assert_ranks_dumped(dump, (0, 1), level=level)
    assert "msprobe dump summary" in proc.stdout and "first NaN/Inf" in proc.stdout
    manifest = _manifest(dump)
    assert manifest["ranks"] == [0, 1] and manifest["config"]["level"] == level
    assert sorted(p["status"] for p in manifest["processes"]) == ["finished", "finished"]
    assert all(p["steps"] == list(STEPS) for p in manifest["processes"]), manifest["processes"]
    assert manifest["versions"]["torch"]


@pytest.mark.skipif(not pth_installed(), reason="package not installed: the env-only form needs the .pth hook")
def test_env_only_form_under_plain_torchrun(tmp_path):
    env = base_env(MSPROBE_DUMP_PATH=str(tmp_path / "d"))
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE],
               str(tmp_path), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_ranks_dumped(str(tmp_path / "d"), (0, 1), level="L1")


def test_two_nodes_with_c10d_share_one_dump_path(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "e2e2n", "--dump-path", "d", EXAMPLE]
    nodes = [subprocess.Popen(LAUNCH + ["--node-rank", str(n)] + common, cwd=str(tmp_path), env=base_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [n.communicate(timeout=400) for n in nodes]
    for node, (_, err) in zip(nodes, outs):
        assert node.returncode == 0, err[-4000:]
    dump = str(tmp_path / "d")
    _assert_ranks_dumped(dump, (0, 1, 2, 3))
    manifest = _manifest(dump)
    assert manifest["ranks"] == [0, 1, 2, 3]
    assert sorted(n["node_rank"] for n in manifest["nodes"]) == [0, 1]
    assert manifest["run_ids"] == ["e2e2n"]


def test_elastic_restart_keeps_the_first_attempt(tmp_path):
    proc = launch(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.5",
                   "--dump-path", "d", EXAMPLE, "--fail-rank", "1", "--fail-step", "1"], str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    dump = tmp_path / "d"
    for rank in (0, 1):  # attempt 0 wrote steps 0 and 1 before rank 1 failed; nothing overwrote them
        for step in (0, 1):
            assert (dump / f"step{step}" / f"rank{rank}" / "dump.json").is_file()
    _assert_ranks_dumped(str(dump / "attempt1"), (0, 1))
    manifest = _manifest(str(dump))
    assert manifest["attempts"] == [0, 1]
    by = {(p["attempt"], p["rank"]): p for p in manifest["processes"]}
    assert set(by) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert by[(0, 1)]["root"] == "." and {0, 1} <= set(by[(0, 1)]["steps"])
    assert by[(1, 0)]["root"] == "attempt1" and by[(1, 0)]["steps"] == list(STEPS)
    assert "attempt1" in proc.stdout  # the summary shows both attempts


DUPLICATE = """\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()
open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]):  # stay alive until the other process has dumped too
    time.sleep(0.05)
dist.destroy_process_group()
"""


def test_two_processes_with_the_same_rank_both_keep_their_data(tmp_path):
    script = tmp_path / "dup.py"
    script.write_text(DUPLICATE)
    procs = []
    for i in (0, 1):
        env = base_env(MSPROBE_DUMP_PATH=str(tmp_path / "d"), RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
        env["PYTHONPATH"] = os.pathsep.join([BOOT, env["PYTHONPATH"]])  # what msprobe-launch does
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / f"done{i}"),
                                       str(tmp_path / f"done{1 - i}")], cwd=str(tmp_path), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    dump = tmp_path / "d"
    dups = [p for p in dump.iterdir() if p.name.startswith("duplicate_rank0_")]
    assert len(dups) == 1
    for root in (dump, dups[0]):
        for step in (0, 1):
            assert (root / f"step{step}" / "rank0" / "dump.json").is_file(), root
    assert any("already claimed" in err for _, err in outs)
    # no launcher here: nobody wrote msprobe_manifest.json; the readers combine the processes' own entries
    assert not (dump / "msprobe_manifest.json").exists()
    entries = [p for p in combined.combine(str(dump))["processes"] if p["rank"] == 0]
    assert sorted(p["duplicate"] for p in entries) == [False, True]


def test_dataloader_workers_and_subprocesses_write_nothing(tmp_path):
    proc = launch(["--standalone", "--nproc-per-node", "2", "--dump-path", "d", EXAMPLE, "--num-workers", "2",
                   "--mp-context", "fork", "--subprocess"], str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_ranks_dumped(str(tmp_path / "d"), (0, 1))
    assert len(_manifest(str(tmp_path / "d"))["processes"]) == 2



def test_example_script_is_msprobe_free():
    with open(EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    assert "msprobe" not in text.replace("msprobe-launch", "").replace("msprobe code", "")
