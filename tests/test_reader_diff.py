"""msprobe-dump diff of two real runs that differ in one layer (acceptance 3)."""

from __future__ import annotations

import csv
import os

import pytest
from launch_util import runtime_available
from reader_util import SCRIPTS, dump_cli, launch_script, line_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]


def test_diff_names_the_changed_layer_first(tmp_path):
    a, _ = launch_script(tmp_path / "a", "two_layers.py")
    b, _ = launch_script(tmp_path / "b", "two_layers.py", "--scale", "fc2=1.5")
    out_csv = tmp_path / "diff.csv"
    proc = dump_cli(["diff", a, b, "--csv", str(out_csv)], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    first = next(text for text in lines if text.startswith("FIRST DIFFERENCE:"))
    assert first.startswith("FIRST DIFFERENCE: step 0, rank 0, record #"), first
    assert "(in Module.fc2.Linear.forward.0)" in first and "fc1" not in first and "fc3" not in first
    source = lines[lines.index(first) + 1]
    line = line_of(os.path.join(SCRIPTS, "_common.py"), "x = self.fc2(x)")
    assert source.strip().startswith("source:") and f"_common.py:{line}" in source, source
    # the fc2 weight itself is what differs first: input 1 of the linear call
    assert any(text.split()[:2] == ["input_args.1", "Norm"] for text in lines), proc.stdout

    with open(out_csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    step0 = [r for r in rows if r["step"] == "0" and r["rank_a"] == "0"]
    k = next(i for i, r in enumerate(step0) if r["beyond_tolerance"] == "yes")
    assert step0[k]["record"] in first
    assert k > 0 and all("fc2" not in r["record"] and r["beyond_tolerance"] == "no" for r in step0[:k])
    assert float(step0[k]["Norm_diff"]) != 0.0 and {"cosine", "max_abs_err", "reason"} <= set(step0[k])

    # the same dump: nothing differs
    proc = dump_cli(["diff", a, a], tmp_path)
    assert proc.returncode == 0 and "no record differs beyond tolerance" in proc.stdout
    # two dump.json files named directly
    proc = dump_cli(["diff", os.path.join(a, "step0", "rank1", "dump.json"),
                     os.path.join(b, "step0", "rank1", "dump.json")], tmp_path)
    assert proc.returncode == 1 and "(in Module.fc2.Linear.forward.0)" in proc.stdout
