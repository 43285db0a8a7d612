"""Issue 20's jobs through the real launcher and torchrun (2 ranks, 4 for the 2-D mesh, gloo, CPU, tiny
models): tensor parallel, FSDP2, FSDP2 over tensor parallel, DDP + activation checkpointing, DDP + no_sync +
bf16 autocast, torch.compile. Each: the
loss of the run without the tool, no hang (every run under a timeout), statistics for every tensor with
elements, no false NaN/Inf."""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from launch_util import LAUNCH, ROOT, base_env, runtime_available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]

SCRIPT = os.path.join(ROOT, "tests", "scripts", "parallel_jobs.py")
TIMEOUT = 150
_BASELINE: dict = {}


def _losses(out: str) -> list:
    return [line.split()[1:] for line in out.splitlines() if line.startswith("LOSS ")]


def _torchrun(kind: str, cwd: str, nproc: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), SCRIPT,
           kind]
    return subprocess.run(cmd, cwd=cwd, env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)


def baseline(kind: str, tmp_path, nproc: int = 2) -> list:
    if kind not in _BASELINE:
        proc = _torchrun(kind, str(tmp_path), nproc)
        if proc.returncode != 0:
            # the reference run has no tool in it; gloo's tensor-parallel teardown was seen to abort once
            # ("terminate called without an active exception") on a loaded machine: one more try
            proc = _torchrun(kind, str(tmp_path), nproc)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _BASELINE[kind] = _losses(proc.stdout)
    return _BASELINE[kind]


def dump_job(kind: str, tmp_path, *args: str, level: str = "mix", name: str = "dump", nproc: int = 2):
    dump = str(tmp_path / name)
    cmd = LAUNCH + ["--standalone", "--nproc-per-node", str(nproc), "--dump-path", dump, "--level", level, SCRIPT,
                    kind, *args]
    for attempt in range(2):
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=base_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
        # gloo's teardown at the script's end aborts now and then, with or without the tool (the baseline above;
        # seen here once with FSDP2 over tensor parallelism, after the dump and its summary were complete): that
        # one abort, and only it, gets one more try from scratch
        if attempt or "terminate called without an active exception" not in proc.stderr \
                or "Signal 6 (SIGABRT)" not in proc.stderr:
            break
        shutil.rmtree(dump, ignore_errors=True)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc, dump


def tensor_entries(value, path=""):
    """(path, entry) of every tensor entry of a record body."""
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value and "Max" in value:
            yield path, value
            return
        for k, v in value.items():
            yield from tensor_entries(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from tensor_entries(v, f"{path}.{i}")


def rank_dumps(dump: str, nproc: int = 2) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(dump, "step*", "rank*", "dump.json"))):
        with open(path, encoding="utf-8") as fh:
            out[os.path.relpath(os.path.dirname(path), dump)] = json.load(fh)["data"]
    assert {d.split(os.sep)[1] for d in out} == {f"rank{r}" for r in range(nproc)}, sorted(out)
    return out


def ranks_consistent(dump: str, cwd, nproc: int = 2) -> str:
    """`msprobe-dump ranks`: consistent, and nothing counted from a missing statistic."""
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.cli", "ranks", dump, "--no-progress"],
                          cwd=str(cwd), env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert all(f"rank {r}: consistent" in proc.stdout for r in range(1, nproc)), proc.stdout
    assert "missing on one rank" not in proc.stdout, proc.stdout
    return proc.stdout


def check_dump(dump: str, nproc: int = 2) -> dict:
    """Every tensor with elements has finite statistics (no NaN is planted), no tool error; returns the counts."""
    counts = {"tensors": 0, "dtensors": 0}
    nulls, nonfinite = [], []
    for where, data in rank_dumps(dump, nproc).items():
        for key, body in data.items():
            for path, e in tensor_entries(body):
                counts["tensors"] += 1
                if e.get("type") == "torch.distributed.tensor.DTensor":
                    counts["dtensors"] += 1
                    assert "device_mesh" in e and "placements" in e, (where, key, path, e)
                if math.prod(e["shape"]) == 0:
                    continue
                if e["Max"] is None or e["Min"] is None:
                    nulls.append(f"{where} {key}{path}: {e}")
                elif isinstance(e["Max"], float) and not (math.isfinite(e["Max"]) and math.isfinite(e["Min"])):
                    nonfinite.append(f"{where} {key}{path}")
    assert not nulls, f"{len(nulls)} null statistics, e.g. {nulls[:3]}"
    assert not nonfinite, nonfinite[:5]
    errors = glob.glob(os.path.join(dump, "**", "dump_error_info.log"), recursive=True)
    assert not errors, open(errors[0]).read()[:2000]
    return counts


@pytest.mark.parametrize("level", ["mix", "L1", "mix"])
def test_tensor_parallel_never_hangs(tmp_path, level):
    """ColwiseParallel/RowwiseParallel used to hang (statistics of DTensors started collectives from two threads)."""
    proc, dump = dump_job("tp", tmp_path, level=level)
    assert _losses(proc.stdout) == baseline("tp", tmp_path)
    counts = check_dump(dump)
    assert counts["dtensors"] > 10, counts
    assert "only replicas of the same shard are compared" in ranks_consistent(dump, tmp_path)


def test_sigterm_stops_a_job_hung_in_a_collective(tmp_path):
    """The job's own hang (both ranks blocked in C in a collective): SIGTERM stops it as without the tool,
    not 30 s later by torchrun's SIGKILL, and the dump of the finished step is written."""
    dump = str(tmp_path / "dump")
    cmd = LAUNCH + ["--standalone", "--nproc-per-node", "2", "--dump-path", dump, "--level", "L1", SCRIPT, "tp",
                    "--hang"]
    log = open(tmp_path / "out.log", "w+")
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=base_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            log.seek(0)
            if "HANGING" in log.read():
                break
            assert proc.poll() is None, "the job ended before it hung"
            time.sleep(0.3)
        time.sleep(2.0)  # both ranks are now blocked in the collective
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log.seek(0)
    out = log.read()
    assert took < 15, f"{took:.1f} s to stop (torchrun's SIGKILL comes after 30 s)\n{out[-3000:]}"
    assert "Unable to shutdown process" not in out, out[-3000:]
    assert os.path.isfile(os.path.join(dump, "step0", "rank0", "dump.json")), out[-3000:]


def test_fsdp2_every_tensor_has_statistics(tmp_path):
    """FSDP2 (fully_shard on each block and the root, AdamW): the optimizer's records on DTensors and the 0-d
    step counters have statistics on both ranks; parameters are recorded as their local shards."""
    proc, dump = dump_job("fsdp2", tmp_path)
    assert _losses(proc.stdout) == baseline("fsdp2", tmp_path)
    counts = check_dump(dump)
    assert counts["dtensors"] > 100, counts
    out = ranks_consistent(dump, tmp_path)  # the unsharded parameters of the forward agree across ranks
    assert "param 10" in out, out
    assert "first NaN/Inf of the job" not in proc.stdout + proc.stderr
    shards = [e for data in rank_dumps(dump).values() for body in data.values() for _, e in tensor_entries(body)
              if e.get("placements") == [{"Shard": {"dim": 0}}] and e["type"].endswith("DTensor")]
    assert shards and all(e["Max"] is not None for e in shards)


def test_fsdp2_nan_in_one_rank_is_reported_at_that_rank_and_step(tmp_path):
    proc, dump = dump_job("fsdp2", tmp_path, "--nan-rank", "1", level="L1")
    out = proc.stdout + proc.stderr
    assert "first NaN/Inf of the job: rank 1, step 1" in out, out[-3000:]


def test_ddp_with_activation_checkpointing(tmp_path):
    proc, dump = dump_job("ckpt", tmp_path)
    assert _losses(proc.stdout) == baseline("ckpt", tmp_path)
    assert "raised an exception" not in proc.stderr, proc.stderr[-3000:]
    check_dump(dump)
    ranks_consistent(dump, tmp_path)
    for where, data in rank_dumps(dump).items():
        if where.startswith("step2"):
            continue  # after the last optimizer step: nothing but the final records
        # each block is called once per step: the recomputation in backward is left out
        assert "Module.module.blocks.0.Block.forward.0" in data, (where, sorted(data)[:20])
        assert not [k for k in data if k.startswith("Module.") and ".forward.1" in k], where
        assert "Module.module.blocks.0.Block.backward.0" in data, where


def test_compiled_model_has_no_false_nan(tmp_path):
    proc, dump = dump_job("compile", tmp_path)
    assert _losses(proc.stdout) == baseline("compile", tmp_path)
    assert "first NaN/Inf of the job" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    check_dump(dump)
    ranks_consistent(dump, tmp_path)  # DDP under compile: the ranks are replicas
    data = rank_dumps(dump)[os.path.join("step0", "rank0")]
    outs = [k for k, v in data.items() if "out" in (v.get("input_kwargs") or {})]
    assert not outs, outs
    # the compiled region's parameter gradients, named as the uncompiled model's
    assert "Module.module.blocks.0.up.Linear.parameters_grad.0" in data, sorted(data)


def test_compiled_dump_diffs_against_the_same_script_run_eagerly(tmp_path):
    """README: TORCHDYNAMO_DISABLE=1 dumps the same script uncompiled; diff aligns the records both have."""
    _, compiled = dump_job("compile", tmp_path, name="compiled")
    eager = str(tmp_path / "eager")
    cmd = LAUNCH + ["--standalone", "--nproc-per-node", "2", "--dump-path", eager, "--level", "mix", SCRIPT,
                    "compile"]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=base_env(TORCHDYNAMO_DISABLE="1"), capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Module.module.blocks.0.up.Linear.forward.0" in rank_dumps(eager)[os.path.join("step0", "rank0")]
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.cli", "diff", compiled, eager, "--no-progress",
                           "--json", "--rtol", "1e-4", "--atol", "1e-6"],
                          cwd=str(tmp_path), env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)
    out = json.loads(proc.stdout)
    pairs = out["pairs"]
    assert pairs and all(p["beyond"] == 0 for p in pairs), proc.stdout[-3000:]
    assert sum(p["compared"] for p in pairs) >= 4 * 10  # the loss, the parameter gradients, the updates


def test_tensor_parallel_nan_in_one_rank_is_reported_at_that_rank_and_step(tmp_path):
    proc, dump = dump_job("tp", tmp_path, "--nan-rank", "1", level="L1")
    out = proc.stdout + proc.stderr
    assert "first NaN/Inf of the job: rank 1, step 1" in out, out[-3000:]


def test_ddp_no_sync_bf16_autocast(tmp_path):
    proc, dump = dump_job("ddp_amp", tmp_path)
    assert _losses(proc.stdout) == baseline("ddp_amp", tmp_path)
    check_dump(dump)
    ranks_consistent(dump, tmp_path)
    data = rank_dumps(dump)[os.path.join("step0", "rank1")]
    assert any(e["dtype"] == "torch.bfloat16" for body in data.values() for _, e in tensor_entries(body))


def test_fsdp2_over_tensor_parallel_on_a_2d_mesh(tmp_path):
    """4 ranks, a (dp=2, tp=2) mesh: tensor-parallel blocks sharded by FSDP2 over the data-parallel dimension.
    FSDP2 shards the tensor-parallel dimension-0 shards again with _StridedShard: one placement per mesh
    dimension is recorded (msprobe drops that one, which puts the other on the wrong dimension), so `ranks`
    compares only ranks holding the same piece. The pre-reduction parameter gradients agree within a
    tensor-parallel pair (one batch) and differ across data-parallel ranks: rank-local, not departures."""
    proc, dump = dump_job("fsdp_tp", tmp_path, nproc=4)
    assert _losses(proc.stdout) == baseline("fsdp_tp", tmp_path, nproc=4)
    counts = check_dump(dump, nproc=4)
    assert counts["dtensors"] > 100, counts
    entries = [e for data in rank_dumps(dump, 4).values() for body in data.values() for _, e in tensor_entries(body)
               if e["type"].endswith("DTensor")]
    def mesh_dims(mesh):
        return 1 + mesh_dims(mesh[0]) if isinstance(mesh, list) else 0

    # one placement per mesh dimension, on the 2-D mesh (parameters) and the tensor-parallel one (activations)
    bad = [(e["device_mesh"], e["placements"]) for e in entries if len(e["placements"]) != mesh_dims(e["device_mesh"])]
    assert not bad and any(mesh_dims(e["device_mesh"]) == 2 for e in entries), bad[:5]
    assert any(e["placements"][0] == {"Shard": {"dim": 0, "split_factor": 2}} for e in entries)
    out = ranks_consistent(dump, tmp_path, nproc=4)
    assert "only replicas of the same shard are compared" in out, out


def test_fsdp2_over_tensor_parallel_nan_in_one_rank_is_reported_at_that_rank_and_step(tmp_path):
    proc, dump = dump_job("fsdp_tp", tmp_path, "--nan-rank", "2", level="L1", nproc=4)
    out = proc.stdout + proc.stderr
    assert "first NaN/Inf of the job: rank 2, step 1" in out, out[-3000:]


@pytest.mark.parametrize("kind", ["ckpt", "ddp_amp", "compile"])
def test_nan_in_one_rank_is_reported_at_that_rank_and_step(tmp_path, kind):
    proc, dump = dump_job(kind, tmp_path, "--nan-rank", "1", level="L1")
    out = proc.stdout + proc.stderr
    assert "first NaN/Inf of the job: rank 1, step 1" in out, out[-3000:]
