"""msprobe_inject.coord: duplicate ranks kept apart, restart attempts kept apart, per-process manifest entries
and their combined view, node-local finishing.

Other processes are real interpreters (no torch), so the claims really come from different pids.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest
from launch_util import base_env, run

from msprobe_inject import coord
from msprobe_inject.dumpformat import manifest as combined

CLAIM = """\
import json, os, sys, warnings
from msprobe_inject import coord
warnings.simplefilter("always")
dump, rank = sys.argv[1], (None if sys.argv[2] == "none" else int(sys.argv[2]))
root = coord.resolve_process_root(dump, rank)
coord.manifest_register(dump, rank=rank, root=root, config={"level": "L1"})
os.makedirs(os.path.join(root, "step0", "rank%s" % rank), exist_ok=True)
with open(os.path.join(root, "step0", "rank%s" % rank, "dump.json"), "w") as fh:
    fh.write(json.dumps({"pid": os.getpid()}))
if len(sys.argv) > 3:
    coord.manifest_finish(dump, rank=rank, root=root, steps=[int(s) for s in sys.argv[3].split(",")], status="finished")
print(json.dumps({"root": root, "pid": os.getpid()}))
"""


@pytest.fixture()
def claim_script(tmp_path):
    path = tmp_path / "claim.py"
    path.write_text(CLAIM)
    return str(path)


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    for var in ("MSPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    coord._roots.clear()
    coord._held.clear()


def _other(claim_script, dump, rank, steps=None, **env):
    args = [sys.executable, claim_script, str(dump), str(rank)] + ([steps] if steps else [])
    proc = run(args, os.path.dirname(claim_script), env=base_env(**env), check=0)
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_first_claim_writes_directly_under_the_dump_path(tmp_path):
    dump = str(tmp_path / "d")
    root = coord.resolve_process_root(dump, 0)
    assert root == dump and os.path.isdir(dump)
    assert coord.resolve_process_root(dump, 0) == root  # idempotent
    claim = json.loads((tmp_path / "d" / ".msprobe" / "claims" / "attempt0_rank0.json").read_text())
    assert claim["pid"] == os.getpid() and claim["host"] == coord.hostname() and claim["attempt"] == 0
    assert claim["start_time"] is not None


def test_a_live_duplicate_rank_is_kept_apart_and_warned_about(tmp_path, claim_script):
    dump = tmp_path / "d"
    mine = coord.resolve_process_root(str(dump), 0)  # this (live) test process holds rank 0
    other, stderr = _other(claim_script, dump, 0)
    assert other["root"] != mine
    assert os.path.basename(other["root"]) == f"duplicate_rank0_{coord._safe_host()}_{other['pid']}"
    assert os.path.dirname(other["root"]) == str(dump)
    assert f"already claimed by pid {os.getpid()}" in stderr
    # both keep their data
    assert (dump / os.path.basename(other["root"]) / "step0" / "rank0" / "dump.json").exists()
    manifest = combined.combine(str(dump))
    dup = [p for p in manifest["processes"] if p["duplicate"]]
    assert len(dup) == 1 and dup[0]["pid"] == other["pid"] and dup[0]["root"] == os.path.basename(other["root"])


def test_a_dead_claim_is_stale_and_released_claims_are_gone(tmp_path, claim_script):
    dump = tmp_path / "d"
    first, _ = _other(claim_script, dump, 1)  # exits without manifest_finish: a crashed process
    assert first["root"] == str(dump)
    assert (dump / ".msprobe" / "claims" / "attempt0_rank1.json").exists()
    second, stderr = _other(claim_script, dump, 1, steps="0,1")  # pid of the first is dead: reuse the root
    assert second["root"] == str(dump) and "already claimed" not in stderr
    assert not (dump / ".msprobe" / "claims" / "attempt0_rank1.json").exists()  # released by manifest_finish


def test_claims_from_other_hosts(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    claims = dump / ".msprobe" / "claims"
    claims.mkdir(parents=True)

    def other_host(run_id):
        coord.write_json_atomic(str(claims / "attempt0_rank2.json"),
                                {"pid": 1, "host": "some-other-host", "attempt": 0, "run_id": run_id})
        coord._roots.clear()
        coord._held.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return coord.resolve_process_root(str(dump), 2)

    monkeypatch.setenv("MSPROBE_RUN_ID", "job-B")
    assert other_host("job-A") == str(dump)  # a different job wrote it earlier: stale
    assert os.path.basename(other_host("job-B")).startswith("duplicate_rank2_")  # same job: a duplicate
    monkeypatch.delenv("MSPROBE_RUN_ID")
    assert os.path.basename(other_host("")).startswith("duplicate_rank2_")  # unknown: be safe


def test_restart_attempts_never_overwrite_earlier_ones(tmp_path, claim_script):
    dump = tmp_path / "d"
    a0, _ = _other(claim_script, dump, 0, steps="0,1", TORCHELASTIC_RESTART_COUNT="0", MSPROBE_RUN_ID="r")
    a1, _ = _other(claim_script, dump, 0, steps="0,1,2", TORCHELASTIC_RESTART_COUNT="1", MSPROBE_RUN_ID="r")
    assert a0["root"] == str(dump) and a1["root"] == str(dump / "attempt1")
    assert json.loads((dump / "step0" / "rank0" / "dump.json").read_text())["pid"] == a0["pid"]
    assert json.loads((dump / "attempt1" / "step0" / "rank0" / "dump.json").read_text())["pid"] == a1["pid"]
    manifest = combined.combine(str(dump))
    by_attempt = {p["attempt"]: p for p in manifest["processes"]}
    assert by_attempt[0]["steps"] == [0, 1] and by_attempt[0]["root"] == "."
    assert by_attempt[1]["steps"] == [0, 1, 2] and by_attempt[1]["root"] == "attempt1"
    assert manifest["attempts"] == [0, 1]


def test_manifest_content_modes_and_concurrent_updates(tmp_path, claim_script):
    dump = tmp_path / "d"
    procs = [subprocess.Popen([sys.executable, claim_script, str(dump), str(r), "0,1,2"], cwd=str(tmp_path),
                              env=base_env(MSPROBE_RUN_ID="job", GROUP_RANK=str(r // 2), LOCAL_RANK=str(r % 2)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    written = coord.write_combined(str(dump))  # what the launcher does after the job
    manifest = json.loads((dump / coord.MANIFEST_NAME).read_text())
    assert manifest == written == dict(combined.combine(str(dump)), updated=manifest["updated"])
    assert manifest["ranks"] == [0, 1, 2, 3]
    assert manifest["hosts"] == [coord.hostname()]
    assert [n["node_rank"] for n in manifest["nodes"]] == [0, 1]
    assert manifest["run_ids"] == ["job"]
    assert manifest["config"] == {"level": "L1"}
    assert manifest["versions"]["python"] and manifest["versions"]["msprobe_launch"]
    assert len(manifest["processes"]) == 4
    for entry in manifest["processes"]:
        assert entry["status"] == "finished" and entry["steps"] == [0, 1, 2] and entry["end_time"]
        assert {"rank", "host", "pid", "attempt", "root", "start_time"} <= set(entry)
    # 0640 files, 0750 dirs (umask permitting), no temp files left behind
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(dump / coord.MANIFEST_NAME).st_mode) == 0o640 & ~umask
    assert stat.S_IMODE(os.stat(dump / ".msprobe").st_mode) == 0o750 & ~umask
    for entry in (dump / ".msprobe" / "procs").iterdir():
        assert stat.S_IMODE(os.stat(entry).st_mode) == 0o640 & ~umask
    assert not [n for n in os.listdir(dump) if n.endswith(".tmp")]
    assert not [n for n in os.listdir(dump / ".msprobe" / "procs") if n.endswith(".tmp")]


def test_manifest_write_does_not_follow_a_symlink(tmp_path):
    dump = tmp_path / "d"
    dump.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, dump / coord.MANIFEST_NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coord.manifest_register(str(dump), rank=0, root=str(dump), config={})
        coord.write_combined(str(dump))
    assert victim.read_text() == "precious"
    assert not os.path.islink(dump / coord.MANIFEST_NAME)
    assert json.loads((dump / coord.MANIFEST_NAME).read_text())["ranks"] == [0]


def test_a_symlinked_attempt_root_is_not_written_through(tmp_path, monkeypatch):
    dump = tmp_path / "d"
    dump.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, dump / "attempt1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.warns(RuntimeWarning, match="symlink"):
        root = coord.resolve_process_root(str(dump), 0)
    assert not os.path.islink(root) and os.path.realpath(root).startswith(os.path.realpath(dump))


def test_reconcile_marks_dead_processes_with_their_steps_on_disk(tmp_path, claim_script):
    dump = tmp_path / "d"
    other, _ = _other(claim_script, dump, 1)  # registers, writes step0, exits without finishing
    (dump / "step3" / "rank1").mkdir(parents=True)
    assert coord.manifest_reconcile(str(dump)) == 1
    entry = combined.combine(str(dump))["processes"][0]
    assert entry["status"] == "died" and entry["steps"] == [0, 3] and entry["pid"] == other["pid"]


def test_importable_without_torch(tmp_path):
    code = textwrap.dedent("""\
        import sys
        from msprobe_inject import coord
        coord.resolve_process_root(sys.argv[1], None)
        print("torch" in sys.modules)
    """)
    proc = run([sys.executable, "-c", code, str(tmp_path / "d")], str(tmp_path), check=0)
    assert proc.stdout.strip() == "False"
    assert any(n.startswith("attempt0_proc") for n in os.listdir(tmp_path / "d" / ".msprobe" / "claims"))


def _snapshot(root) -> dict:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def test_a_rank_start_and_end_touch_only_files_it_owns(tmp_path, claim_script):
    dump = tmp_path / "d"
    for rank in range(3):  # other ranks of the job, already running or finished
        _other(claim_script, dump, rank, steps="0" if rank else None, MSPROBE_RUN_ID="job")
    before = _snapshot(dump)
    _other(claim_script, dump, 7, steps="0", MSPROBE_RUN_ID="job")
    after = _snapshot(dump)
    changed = sorted(p for p in after if before.get(p) != after[p]) + sorted(set(before) - set(after))
    assert changed, "rank 7 wrote nothing"
    # its claim (and the claim's lock), its entry, its own step directory: nothing shared with another rank
    assert all("rank7" in p for p in changed), changed
    assert not (dump / coord.MANIFEST_NAME).exists()  # the combined view is the launcher's, after the job


FORK_RANKS = """\
import os, sys
from msprobe_inject import coord
dump, n = sys.argv[1], int(sys.argv[2])
kids = []
for rank in range(n):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            root = coord.resolve_process_root(dump, rank)
            coord.manifest_register(dump, rank=rank, root=root, config={"level": "L1"})
            coord.manifest_finish(dump, rank=rank, root=root, steps=[0], status="finished")
            code = 0 if root == dump else 3
        finally:
            os._exit(code)
    kids.append(pid)
print(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in kids))
"""


def test_256_concurrent_ranks_register_without_a_lost_entry(tmp_path):
    script = tmp_path / "fork_ranks.py"
    script.write_text(FORK_RANKS)
    dump = tmp_path / "d"
    proc = run([sys.executable, str(script), str(dump), "256"], str(tmp_path), env=base_env(MSPROBE_RUN_ID="big"),
               check=0, timeout=300)
    assert proc.stdout.strip() == "0", proc.stderr[-3000:]
    manifest = combined.combine(str(dump))
    assert manifest["ranks"] == list(range(256))
    assert len(manifest["processes"]) == 256
    assert all(p["status"] == "finished" and p["steps"] == [0] and not p["duplicate"] for p in manifest["processes"])
    assert manifest["run_ids"] == ["big"] and combined.run_seen(str(dump), "big")
    assert not os.listdir(dump / ".msprobe" / "claims") or \
        all(n.endswith(".lock") for n in os.listdir(dump / ".msprobe" / "claims"))  # every claim released


def test_finish_node_closes_only_its_own_dead_processes(tmp_path, claim_script, monkeypatch):
    dump = tmp_path / "d"
    _other(claim_script, dump, 0, MSPROBE_AGENT_PID=str(os.getpid()))  # died: this launcher's
    _other(claim_script, dump, 1, MSPROBE_AGENT_PID="1")  # died: another launcher's on this host
    _other(claim_script, dump, 2, steps="0", MSPROBE_AGENT_PID=str(os.getpid()))  # finished
    procs = dump / ".msprobe" / "procs"
    name = next(n for n in os.listdir(procs) if "_rank1_" in n)
    remote = json.loads((procs / name).read_text())
    remote.update(host="another-node", rank=3, pid=12345, launcher_pid=None)
    (procs / name.replace("_rank1_", "_rank3_").replace(coord._safe_host(), "another-node")).write_text(
        json.dumps(remote))
    mine = coord.finish_node(str(dump), os.getpid())
    assert sorted(e["rank"] for e in mine) == [0, 2]
    by_rank = {p["rank"]: p for p in combined.combine(str(dump))["processes"]}
    assert by_rank[0]["status"] == "died" and by_rank[0]["steps"] == [0]
    assert by_rank[1]["status"] == "running"  # its own launcher finishes it
    assert by_rank[2]["status"] == "finished"
    assert by_rank[3]["status"] == "running" and by_rank[3]["host"] == "another-node"
