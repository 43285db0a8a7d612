"""The step summary each rank writes beside a finished step (msprobe_inject.dumpformat.stepsummary); the reader's
use of it is tested with the summary (tests/readers/test_summary.py)."""

from __future__ import annotations

from msprobe_inject.dumpformat import paths, stepsummary
from msprobe_inject.dumpformat.documents import StepRecords


def test_a_step_summary_is_ignored_once_its_record_file_changes(tmp_path):
    records = StepRecords({"task": "statistics", "level": "L1"})
    records.set("Functional.relu.0.forward", '{"output": [{"Max": NaN, "Min": 0, "Mean": 0, "Norm": 1}]}')
    (tmp_path / paths.DUMP_JSON).write_bytes(records.main_bytes())
    data = stepsummary.build(records, {"Functional.relu.0.forward"}, str(tmp_path / paths.DUMP_JSON))
    (tmp_path / paths.STEP_SUMMARY).write_bytes(data)
    doc = stepsummary.read(str(tmp_path))
    assert doc["records"] == 1 and doc["first_nan"]["record"] == "Functional.relu.0.forward"
    (tmp_path / paths.DUMP_JSON).write_bytes(records.main_bytes() + b" ")  # rewritten (e.g. recovered)
    assert stepsummary.read(str(tmp_path)) is None


def test_the_first_nan_is_the_first_in_data_order_not_the_first_to_arrive(tmp_path):
    records = StepRecords({"task": "statistics", "level": "mix"})
    nan = '[{"Max": NaN, "Min": 0, "Mean": 0, "Norm": 1}]'
    records.merge("Module.fc.Linear.forward.0", {"input_args": nan})  # arrives first, moves to its completion
    records.set("Functional.linear.0.forward", '{"output": ' + nan + '}')
    records.merge("Module.fc.Linear.forward.0", {"output": nan}, move=True)
    (tmp_path / paths.DUMP_JSON).write_bytes(records.main_bytes())
    data = stepsummary.build(records, {"Module.fc.Linear.forward.0", "Functional.linear.0.forward"},
                             str(tmp_path / paths.DUMP_JSON))
    (tmp_path / paths.STEP_SUMMARY).write_bytes(data)
    first = stepsummary.read(str(tmp_path))["first_nan"]
    assert (first["position"], first["record"]) == (0, "Functional.linear.0.forward")
    assert first["leaves"][0][:2] == ["output.0", "Max"]
