"""Zero-loss crash record: a rank killed with SIGKILL at random instants keeps every record it produced.

Each killed run is compared with a run that was not killed: the recovered records are exactly the
complete run's records up to the last one the tool had sent (equal statistics), every step before the
kill is complete, and the step of the kill is marked incomplete. Instants: a random torch call of a
random step (the tool's own calls included), a random gradient hook inside backward, and the first call
after every optimizer.step(). Recovery by the launcher, and by ``python -m msprobe_inject.recover``.

The instants are the runtime's and the same in both forms; the explicit form tries 36 of them. The launcher
form adds the launcher's own recovery after the rank died, which does not depend on the instant, and each of
its runs imports torch twice (launcher and rank): it tries 12. Each run draws its instants from a new seed
(printed, and taken from KILL_SEED when set), so the runs of CI together try many more.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from launch_util import LAUNCH, ROOT, base_env

pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(ROOT, "tests", "scripts", "kill_points.py")
POINTS = {"launcher": 12, "explicit": 36}
if os.environ.get("KILL_POINTS"):  # fewer (or more) to try a change
    POINTS = dict.fromkeys(POINTS, int(os.environ["KILL_POINTS"]))
STEPS = 3


def _run(form: str, work: str, at: str) -> dict:
    os.makedirs(work)
    dump = os.path.join(work, "d")
    info = os.path.join(work, "info.json")
    env = base_env(KILL_AT=at, KILL_INFO=info, KILL_FORM=form, KILL_DUMP=dump)
    if form == "launcher":
        cmd = LAUNCH + ["--nproc-per-node", "1", "--level", "L1", "--dump-path", dump, SCRIPT]
    else:
        cmd = [sys.executable, SCRIPT]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    out = {"rc": proc.returncode, "stderr": proc.stderr, "dump": dump}
    if form == "explicit" and at != "none":
        rec = subprocess.run([sys.executable, "-m", "msprobe_inject.recover", dump], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
        out["recover"] = rec.returncode, rec.stdout + rec.stderr
    with open(info) as fh:
        out["info"] = json.load(fh)
    return out


def _rank_dir(dump: str, step: int) -> str:
    """The step's one rank directory (rank0 under the launcher, the process's own name without a rank)."""
    top = os.path.join(dump, f"step{step}")
    names = [n for n in os.listdir(top) if not n.startswith(".")] if os.path.isdir(top) else []
    assert len(names) <= 1, names
    return os.path.join(top, names[0]) if names else os.path.join(top, "none")


def _spares(dump: str) -> list:
    """Emptied journals kept for a next step: the process removes its own at the end, recovery a killed one's."""
    return [os.path.join(d, n) for d, _, names in os.walk(dump) for n in names if n.startswith(".dump.journal.spare")]


def _steps(dump: str) -> dict:
    out = {}
    for step in range(STEPS):
        path = os.path.join(_rank_dir(dump, step), "dump.json")
        if os.path.exists(path):
            with open(path) as fh:
                out[step] = json.load(fh)
    return out


def _stacks(dump: str, step: int) -> dict:
    path = os.path.join(_rank_dir(dump, step), "stack.json")
    with open(path) as fh:
        return {key: lines for keys, lines in json.load(fh).values() for key in keys}


def _check(ref: dict, ref_dump: str, run: dict, at: str) -> None:
    got = _steps(run["dump"])
    sent, kill_step = run["info"]["sent"], run["info"]["step"]
    total = 0
    for step in range(STEPS):
        want = ref[step]["data"]
        doc = got.get(step)
        if step < kill_step:  # the boundary was passed: complete, whatever the instant
            assert doc is not None and "incomplete" not in doc, (at, step)
            assert doc["data"] == want, (at, step)
        elif doc is None:
            assert step > kill_step or sent == total, (at, step, sent, total)
            continue
        keys = list(doc["data"])
        assert keys == list(want)[:len(keys)], (at, step)  # a prefix, in execution order
        for key in keys:
            assert doc["data"][key] == want[key], (at, key)  # equal statistics
        if step == kill_step:
            assert doc.get("incomplete") is True, (at, step)
            wanted_stacks = _stacks(ref_dump, step)
            have = _stacks(run["dump"], step)
            for key in keys:
                if key in wanted_stacks:
                    assert have.get(key) == wanted_stacks[key], (at, key)
        total += len(keys)
    assert total == sent, (at, total, sent)  # nothing the tool had sent is missing


def _points(counts: dict, rng: random.Random, n: int) -> list:
    # the first call after each optimizer.step(), then random calls and random gradient hooks
    points = [f"api:{s}:1" for s in range(1, STEPS)]
    while len(points) < n:
        kind = "bwd" if rng.random() < 0.3 else "api"
        step = rng.randrange(STEPS)
        points.append(f"{kind}:{step}:{rng.randint(1, counts[kind][step])}")
    return points


@pytest.mark.parametrize("form", ["launcher", "explicit"])
def test_a_rank_killed_at_random_instants_keeps_every_record_it_sent(tmp_path, form):
    seed = int(os.environ.get("KILL_SEED", random.randrange(1 << 30)))
    print(f"KILL_SEED={seed}")
    ref = _run(form, str(tmp_path / "ref"), "none")
    assert ref["rc"] == 0, ref["stderr"][-3000:]
    assert _spares(ref["dump"]) == []
    counts = ref["info"]
    ref_docs = _steps(ref["dump"])
    assert sorted(ref_docs) == list(range(STEPS)) and all(len(d["data"]) > 10 for d in ref_docs.values())
    points = _points(counts, random.Random(seed), POINTS[form])
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda ip: _run(form, str(tmp_path / f"k{ip[0]}"), ip[1]), enumerate(points)))
    for at, run in zip(points, runs):
        assert run["rc"] != 0, (at, run["stderr"][-2000:])
        if form == "explicit":
            assert run["recover"][0] == 0, (at, run["recover"][1])
        assert _spares(run["dump"]) == [], at
        _check(ref_docs, ref["dump"], run, at)
