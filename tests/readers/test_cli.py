"""msprobe_readers.cli: msprobe-dump's usage errors, exit codes and entry point, and the launcher's end-of-job
summary (print_summary, ``python -m msprobe_readers.summary``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from launch_util import ROOT, base_env

from msprobe_readers import cli

from .reader_util import LIB, NAN, dump_cli, frame, fwd, leaf, write_dump


@pytest.fixture()
def dump(tmp_path):
    """Rank 1 has a NaN at step 1 with a stack; rank 0 is clean."""
    d = tmp_path / "dump"
    user = str(tmp_path / "train.py")
    for step in range(2):
        write_dump(d / f"step{step}" / "rank0", {"Functional.linear.0.forward": fwd(leaf())})
        write_dump(d / f"step{step}" / "rank1", {
            "Functional.linear.0.forward": fwd(leaf()),
            "Functional.relu.0.forward": fwd(leaf(mean=NAN if step == 1 else 0.0))},
            stack={"0": [["Functional.relu.0.forward"],
                         [frame(LIB, 1, "_call_impl", "return f()"), frame(user, 9, "forward", "y = relu(x)")]]})
    return str(d)


def test_cli_usage_errors_and_entry_point(tmp_path):
    proc = dump_cli(["summary", str(tmp_path / "missing")], tmp_path)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    os.makedirs(tmp_path / "empty")
    proc = dump_cli(["ranks", str(tmp_path / "empty")], tmp_path)
    assert proc.returncode == 2 and "no step*/rank*/dump.json" in proc.stderr
    proc = dump_cli(["ranks", "--step", "3-1", str(tmp_path / "empty")], tmp_path)
    assert proc.returncode == 2 and "bad range" in proc.stderr
    assert dump_cli([], tmp_path).returncode == 2
    help_text = dump_cli(["--help"], tmp_path).stdout
    assert all(c in help_text for c in ("summary", "ranks", "diff", "report"))
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        project = fh.read()
    assert 'msprobe-dump = "msprobe_readers.cli:main"' in project and '"msprobe_readers*"' in project


def test_cli_summary_exit_codes_and_json(dump, tmp_path):
    proc = dump_cli(["summary", dump], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "FIRST NaN/Inf OF THE JOB: rank 1, step 1, record #1 Functional.relu.0.forward" in proc.stdout
    data = json.loads(dump_cli(["summary", "--json", dump], tmp_path).stdout)
    assert data["first_nan"]["leaves"] == [["input_args.0", "Mean", "nan"]]  # strict JSON: NaN as a string
    assert data["first_nan"]["source"]["line"] == 9
    assert [r["label"] for r in data["ranks"]] == ["0", "1"] and data["ranks"][1]["incomplete_steps"] == []
    proc = dump_cli(["summary", os.path.join(dump, "step0")], tmp_path)
    assert proc.returncode == 0 and "no NaN/Inf in any record" in proc.stdout


def test_print_summary_is_the_launchers_end_of_job_output(dump, tmp_path):
    out = io.StringIO()
    rows = cli.print_summary(dump, file=out)
    lines = out.getvalue().splitlines()
    assert len(rows) == 2 and lines[0] == f"msprobe dump summary: {dump}"
    assert lines[1].split() == ["rank", "attempt", "steps", "records", "bytes", "errors", "first", "NaN/Inf"]
    assert lines[3].split()[:4] == ["0", "0", "0-1", "2"] and lines[3].endswith("-")
    assert lines[4].split()[:4] == ["1", "0", "0-1", "4"] and lines[4].endswith("step 1  Functional.relu.0.forward")
    assert lines[5] == "first NaN/Inf of the job: rank 1, step 1, record #1 Functional.relu.0.forward"
    assert lines[6] == "  non-finite: input_args.0 Mean=nan"
    assert lines[7] == f"  source: {tmp_path / 'train.py'}:9 in forward: y = relu(x)"
    out = io.StringIO()
    assert cli.print_summary(str(tmp_path), file=out) == []
    assert out.getvalue() == f"msprobe dump summary: no step*/rank*/dump.json under {tmp_path}\n"


def test_module_entry_point_and_json(dump, tmp_path):
    env = base_env()
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.summary", dump], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == ""
    expected = io.StringIO()
    cli.print_summary(dump, file=expected)
    assert proc.stdout == expected.getvalue()
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.summary", "--json", dump], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path))
    data = json.loads(proc.stdout)
    assert data[1]["label"] == "1" and data[1]["first_nan"] == [1, "Functional.relu.0.forward"]
    assert data[1]["nan"]["leaves"] == [["input_args.0", "Mean", "nan"]]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.summary", str(empty)], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1 and "no step" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "msprobe_readers.summary", str(tmp_path / "missing")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
