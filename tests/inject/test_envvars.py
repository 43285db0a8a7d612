"""The one table of dump options (msprobe_inject.envvars.OPTIONS): it drives the launcher's flags, the
MSPROBE_* variables, the config's allowed values and the README's two tables."""

from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

from msprobe_inject import config, envvars
from msprobe_launch import surface
from msprobe_launch.plan import build_plan

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


def _table_after(heading: str) -> list:
    """The body rows of the first markdown table after ``heading``."""
    with open(README, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    assert rows and set(rows[1]) <= set("|- "), rows[:2]
    return rows[2:]


def test_readme_dump_options_table_is_the_table():
    options, _ = envvars.markdown_tables()
    assert _table_after("#### Dump options") == options, \
        "regenerate the README tables with: python -m msprobe_inject.envvars"


def test_readme_variables_table_lists_the_rows_then_the_other_variables():
    _, variables = envvars.markdown_tables()
    rows = _table_after("### Environment variables")
    assert rows[:len(variables)] == variables, "regenerate the README tables with: python -m msprobe_inject.envvars"
    documented = [re.match(r"\| `(MSPROBE_\w+)` \|", row).group(1) for row in rows]
    declared = {v for k, v in vars(envvars).items()
                if k.isupper() and not k.startswith("_") and isinstance(v, str) and v.startswith("MSPROBE_")}
    assert sorted(documented) == sorted(declared)  # every variable once, none that does not exist


def test_rows_are_consistent():
    names = [o.name for o in envvars.OPTIONS]
    flags = [f for o in envvars.OPTIONS for f in o.flags + o.off_flags]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags)
    fields = set(config.DumpConfig.__dataclass_fields__)
    for opt in envvars.OPTIONS:
        assert opt.var.startswith("MSPROBE_") and opt.kind in ("str", "path", "list", "bool", "int", "float"), opt
        assert opt.key is None or (opt.key in fields and opt.key == opt.name), opt
        assert all(f.startswith("--") for f in opt.flags) and opt.help.endswith("."), opt
        for choice in opt.choices:
            assert f"`{choice}`" in opt.help, (opt.name, choice)  # the help names every allowed value
        assert envvars.option(opt.name) is envvars.option(opt.var) is opt
    assert config.TASKS is envvars.option("task").choices and config.LEVELS is envvars.option("level").choices
    assert config.STEP_ON is envvars.option("step_on").choices


def test_async_dump_is_documented_as_ignored():
    opt = envvars.option("async_dump")
    assert "ignored" in opt.help and "compatibility" in opt.help
    with open(README, encoding="utf-8") as fh:
        readme = fh.read()
    assert "Write a step's data at the end of the step" not in readme


# flag value(s) -> what the config (or, for a row without a config key, the variable) holds
SAMPLES = {
    "config": (["--config", "cfg.json"], {"task": "tensor", "level": "L0"}),
    "dump_path": (["--dump-path", "out"], "{cwd}/out"),
    "task": (["--task", "tensor"], "tensor"),
    "level": (["--level", " mix "], "mix"),
    "step": (["--step", "0,2-3"], [0, 2, 3]),
    "rank": (["--rank", "[1, \"3-4\"]"], [1, 3, 4]),
    "scope": (["--scope", "Functional.linear.0.forward,Functional.relu.0.forward"],
              ["Functional.linear.0.forward", "Functional.relu.0.forward"]),
    "list": (["--list", "relu,linear"], ["relu", "linear"]),
    "data_mode": (["--data-mode", "forward,input"], ["forward", "input"]),
    "summary_mode": (["--summary-mode", "xor"], "xor"),
    "async_dump": (["--async-dump"], True),
    "fsync": (["--fsync"], True),
    "keep_journal": (["--keep-journal"], True),
    "step_on": (["--step-on", "manual"], "manual"),
    "flight_recorder": (["--flight-recorder", "4"], 4),
    "flight_after": (["--flight-after", "0"], 0),
    "flight_bytes": (["--flight-bytes", "64M"], 64 << 20),
    "spike_factor": (["--spike-factor", "2.5"], 2.5),
    "spike_records": (["--spike-records", "loss$"], "loss$"),
    "preset": (["--preset", "monitor"], "monitor"),
    "run_id": (["--run-id", "job-9"], "job-9"),
}


def _plan_env(args, cwd) -> dict:
    """The workers' environment the launcher plans for ``args`` (nothing is run)."""
    plans = []

    def run(request):
        plans.append((request, build_plan(request, environ={"PATH": os.environ.get("PATH", "")})))
        return 0

    result = CliRunner().invoke(surface.app, args + ["--", "true"], obj={"wrap": True, "run": run})
    assert result.exit_code == 0, result.output
    request, plan = plans[0]
    from_env = envvars.overrides_from_env(plan.env_set)
    for key, value in request.overrides.items():  # the env reads back what the flags said (the path made absolute)
        assert from_env[key] == (os.path.abspath(value) if key == "dump_path" else value), key
    return plan.env_set


def test_every_row_has_a_round_trip_sample():
    assert set(SAMPLES) == {o.name for o in envvars.OPTIONS}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_every_row_round_trips_flag_env_config(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({"task": "tensor", "level": "L0", "tensor": {}}))
    opt = envvars.option(name)
    args, expected = SAMPLES[name]
    env = _plan_env(args, tmp_path)
    assert opt.var in env
    cfg = config.resolve(None, None, use_env=True, environ=env)  # what a rank resolves from its environment
    if opt.key is not None:
        expected = expected.format(cwd=tmp_path) if isinstance(expected, str) else expected
        assert getattr(cfg, opt.key) == expected
        assert opt.parse(env[opt.var]) is not None
    elif opt.var == envvars.CONFIG:
        assert env[opt.var] == str(tmp_path / "cfg.json")  # absolute: ranks may run elsewhere
        assert {k: getattr(cfg, k) for k in expected} == expected
    else:
        assert env[opt.var] == expected and opt.name not in cfg.to_dict()


def test_a_boolean_row_has_an_off_flag_that_reaches_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = _plan_env(["--no-async-dump"], tmp_path)
    assert env[envvars.ASYNC_DUMP] == "0"
    assert config.resolve(None, None, use_env=True, environ=env).async_dump is False


def test_to_env_and_overrides_from_env_are_inverse():
    values = {"dump_path": "d", "task": "tensor", "level": "mix", "step": [0, "2-3"], "rank": [1],
              "scope": ["a", "b"], "list": ["relu"], "data_mode": ["forward"], "summary_mode": "md5",
              "async_dump": False, "step_on": "forward", "fsync": True, "keep_journal": False,
              "flight_recorder": 3, "flight_after": 2, "flight_bytes": "1G", "spike_factor": 0.5,
              "spike_records": "a|b", "preset": "monitor"}
    assert set(values) == {o.key for o in envvars.OPTIONS if o.key}
    env = envvars.to_env(values)
    assert set(env) == {o.var for o in envvars.OPTIONS if o.key}
    assert envvars.overrides_from_env(env) == values


def test_an_unparsable_variable_is_named():
    with pytest.raises(ValueError, match=r"MSPROBE_STEP='\[1' cannot be parsed"):
        envvars.overrides_from_env({"MSPROBE_STEP": "[1"})
    assert envvars.overrides_from_env({"MSPROBE_RANK": "", "MSPROBE_LEVEL": "L0"}) == {"level": "L0"}
