"""msprobe-dump ranks on a real 2-rank DDP job (acceptance 2): rank 1 perturbs fc2.weight's gradient after the
all-reduce at step 1."""

from __future__ import annotations

import json
import os

import pytest
from launch_util import runtime_available
from reader_util import dump_cli, launch_script, load_data

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]


def test_ranks_names_the_perturbed_rank_and_parameter(tmp_path):
    dump, _ = launch_script(tmp_path, "perturb_grad.py")
    # the dump itself: identical fc2 weights on both ranks at step 1, different ones at step 2
    fc2 = "Module.module.fc2.Linear.forward.0"
    w = [[load_data(os.path.join(dump, f"step{s}", f"rank{r}", "dump.json"))[fc2]["parameters"]["weight"]
          for r in (0, 1)] for s in (1, 2)]
    assert w[0][0] == w[0][1] and w[1][0]["Norm"] != w[1][1]["Norm"]

    proc = dump_cli(["ranks", dump], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "rank 0: consistent" in lines, proc.stdout
    rank1 = next(text for text in lines if text.startswith("rank 1:"))
    assert rank1.startswith("rank 1: DEPARTS at step 1,") and "module.fc2.weight" in rank1, rank1
    first = next(text for text in lines if text.startswith("first departure:"))
    assert "rank 1, step 1" in first and "module.fc2.weight" in first and "fc1" not in first
    # pre-all-reduce gradients differ legitimately: reported as rank-local, not as a departure
    assert any("rank-local" in text and "parameters_grad" in text for text in lines)

    data = json.loads(dump_cli(["ranks", "--json", dump], tmp_path).stdout)
    assert list(data["first"]) == ["1"]
    dep = data["first"]["1"]
    assert (dep["step"], dep["param"], dep["reference_label"]) == (1, "module.fc2.weight", "0")
    assert dep["kind"] in ("optimizer", "param")

    # a tolerance wider than the perturbation hides it
    proc = dump_cli(["ranks", "--rtol", "10", dump], tmp_path)
    assert proc.returncode == 0 and "no rank departs" in proc.stdout
    # --pattern: each rank's loss input comes from its own data, so rank 1 departs at step 0
    proc = dump_cli(["ranks", "--no-defaults", "--pattern", r"^Functional\.mse_loss\.0\.forward$", dump], tmp_path)
    assert proc.returncode == 1
    assert "rank 1: DEPARTS at step 0" in proc.stdout and "Functional.mse_loss.0.forward" in proc.stdout
