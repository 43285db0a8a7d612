"""msprobe-dump summary on a real 2-rank job (acceptance 1): rank 1 gets a NaN input at step 1."""

from __future__ import annotations

import json
import os

import pytest
from launch_util import runtime_available
from reader_util import SCRIPTS, dump_cli, first_nonfinite, launch_script, line_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not runtime_available(), reason="the in-rank runtime (msprobe_inject.zero_code) is missing"),
]


def test_summary_names_rank_step_record_and_source_line(tmp_path):
    dump, launched = launch_script(tmp_path, "nan_rank1.py")
    # what the dump holds, read independently with plain json
    assert first_nonfinite(os.path.join(dump, "step0", "rank1", "dump.json")) is None
    position, record = first_nonfinite(os.path.join(dump, "step1", "rank1", "dump.json"))
    assert record.startswith("Functional.linear.0.forward"), record  # fc1's input holds the NaN
    rank0 = first_nonfinite(os.path.join(dump, "step1", "rank0", "dump.json"))
    assert rank0 is not None and rank0[0] > position  # rank 0 sees it later, after the gradient all-reduce
    src = os.path.join(SCRIPTS, "_common.py")
    line = line_of(src, "line marker: fc1")

    proc = dump_cli(["summary", dump], tmp_path)
    assert proc.returncode == 1, proc.stderr  # findings
    out = proc.stdout
    lines = out.splitlines()
    head = next(i for i, text in enumerate(lines) if text.startswith("FIRST NaN/Inf OF THE JOB"))
    assert lines[head] == f"FIRST NaN/Inf OF THE JOB: rank 1, step 1, record #{position} {record}"
    source = next(text for text in lines[head:] if text.strip().startswith("source:"))
    assert f"{src}:{line} in forward" in source and "self.fc1(x)" in source
    assert any("nan_rank1.py" in text and "model(x)" in text for text in lines[head:]), out  # the caller's line
    # per rank: rank 1 first NaN at step 1 in the table; per-step rows with the record
    assert f"rank 1: step 1, record #{position} {record}" in out
    assert f"rank 0: step 1, record #{rank0[0]} {rank0[1]}" in out
    assert any(r.split()[:2] == ["1", "1"] and f"#{position} {record}" in r for r in lines), out

    data = json.loads(dump_cli(["summary", "--json", dump], tmp_path).stdout)
    first = data["first_nan"]
    assert (first["rank"], first["step"], first["position"], first["record"]) == (1, 1, position, record)
    assert first["source"]["file"] == src and first["source"]["line"] == line
    assert {r["label"]: r["first_nan"] for r in data["ranks"]} == {"0": [1, rank0[1]], "1": [1, record]}

    # the launcher's end-of-job output says the same
    assert f"first NaN/Inf of the job: rank 1, step 1, record #{position} {record}" in launched.stdout
    assert f"{src}:{line}" in launched.stdout
