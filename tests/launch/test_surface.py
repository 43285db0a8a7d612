"""The command line: options as data, parsed into a Request; usage errors exit 2 naming the option before anything.

Jobs are not started here: ``run`` is a stand-in that records the request (the plan and the engines have
their own tests).
"""

from __future__ import annotations

import pytest
from launch_util import base_env, launch
from typer.testing import CliRunner

from msprobe_inject import envvars
from msprobe_launch import surface
from msprobe_launch.plan import LaunchError, Request


def _started(tmp_path) -> list:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("started."))


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("open('started.x', 'w').close()\n")
    return str(path)


def _request(args, wrap=False):
    """The Request the command line becomes (and the CliRunner result)."""
    seen = []

    def run(request):
        seen.append(request)
        return 0

    result = CliRunner().invoke(surface.app, args, obj={"wrap": wrap, "run": run}, prog_name="msprobe-launch")
    return (seen[0] if seen else None), result


def test_help_groups_launch_and_dump_options_and_shows_examples(tmp_path):
    proc = launch(["--help"], str(tmp_path), env=base_env(COLUMNS="160"), check=0)
    out = proc.stdout
    for text in ("Launch options", "Dump options", "msrun options", "Examples", "--nproc-per-node", "--nproc",
                 "--rdzv-endpoint", "--standalone", "--max-restarts", "--local-ranks-filter", "--no-python",
                 "--run-path", "--dump-path", "--step-on", "--async-dump", "--worker_num", "--engine",
                 "msprobe-launch --nproc-per-node 2 train.py"):
        assert text in out, text
    for opt in envvars.OPTIONS:  # every row of the table is an option, its metavar shown
        for flag in opt.flags + opt.off_flags:
            assert flag in out, flag
        if opt.kind != "bool":
            assert opt.metavar in out, opt.metavar


def test_dump_options_are_exactly_the_envvars_rows():
    import typer

    command = typer.main.get_command(surface.app)
    dump = {(p.name, tuple(p.opts), tuple(p.secondary_opts)) for p in command.params
            if getattr(p, "rich_help_panel", None) == surface.DUMP}
    assert dump == {(o.name, o.flags, o.off_flags) for o in envvars.OPTIONS}
    declared = [f for o in surface.LAUNCH_OPTIONS + surface.MSRUN_OPTIONS + surface.GENERAL_OPTIONS
                + (surface.ENGINE_OPTION,) for f in o.flags]
    assert len(declared) == len(set(declared))
    assert not set(declared) & {f for o in envvars.OPTIONS for f in o.flags + o.off_flags}


def test_unknown_flag_fails_before_any_worker_and_names_it(tmp_path, script):
    proc = launch(["--nproc-per-node", "2", "--bogus-flag", "1", script], str(tmp_path), check=2)
    assert "--bogus-flag" in proc.stderr
    assert _started(tmp_path) == []


@pytest.mark.parametrize("args, words", [
    (["--step", "[1"], ["--step", "[1"]),
    (["--engine", "mpirun"], ["--engine", "mpirun", "msrun"]),
    (["--worker_num", "2"], ["--worker_num", "--engine msrun"]),
    (["--engine", "msrun", "--nproc-per-node", "2"], ["--nproc-per-node", "msrun"]),
])
def test_usage_errors_exit_2_and_name_the_option(tmp_path, script, args, words):
    request, result = _request(args + [script])
    assert result.exit_code == 2, result.output
    assert request is None
    for word in words:
        assert word in result.output, (word, result.output)
    assert "msprobe-launch: error: " in result.output


def test_launch_options_reach_the_request_in_the_engines_spelling(script):
    request, result = _request(["--nproc", "2", "--node_rank", "1", "--standalone", "-r", "3", "--level", "L0",
                                "--step", "0,2-3", "--no-async-dump", script, "--lr", "1", "--", "x"])
    assert result.exit_code == 0, result.output
    assert request.engine == "torchrun" and request.script_is_file
    assert request.engine_options == [("--nproc-per-node", "2"), ("--node-rank", "1"), ("--standalone", True),
                                      ("--redirects", "3")]
    assert request.program == [script, "--lr", "1", "--", "x"]
    assert request.overrides == {"level": "L0", "step": [0, "2-3"], "async_dump": False}
    request, _ = _request(["--engine", "msrun", "--node-rank", "1", "--worker-num", "4", script])
    assert request.engine == "msrun" and request.engine_options == [("--node_rank", "1"), ("--worker_num", "4")]
    request, _ = _request(["-m", "--config", "c.json", "--run-id", "j1", "--overwrite", "pkg.train"])
    assert not request.script_is_file and request.engine_options == [("-m", True)]
    assert (request.config_path, request.run_id, request.overwrite, request.dry_run) == ("c.json", "j1", True, False)


def test_dump_flags_parse_exactly_as_their_variables():
    raw = {"--step": " 0, 2-3 ", "--rank": '[1, "2-3"]', "--list": "relu,linear", "--level": " mix "}
    params = {envvars.option("MSPROBE_" + flag[2:].upper()).name: value for flag, value in raw.items()}
    from_env = envvars.overrides_from_env({"MSPROBE_" + flag[2:].upper(): v for flag, v in raw.items()})
    assert surface.dump_overrides(params) == from_env == {
        "step": [0, "2-3"], "rank": [1, "2-3"], "list": ["relu", "linear"], "level": "mix"}
    assert surface.dump_overrides({"level": ""}) == {}  # as an empty variable: not given
    with pytest.raises(LaunchError, match=r"--rank: '\[1'"):
        surface.dump_overrides({"rank": "[1"})


def test_wrap_form_request_and_conflicts(tmp_path):
    request, result = _request(["--task", "tensor", "python", "-c", "pass"], wrap=True)
    assert result.exit_code == 0, result.output
    assert request == Request(engine="command", program=["python", "-c", "pass"], script_is_file=False,
                              overrides={"task": "tensor"})
    for args, word in ((["--nproc-per-node", "2", "python"], "--nproc-per-node"),
                       (["--engine", "msrun", "python"], "--engine"),
                       (["--worker_num", "2", "python"], "--worker_num"),
                       (["--level", "L0"], "missing COMMAND")):
        request, result = _request(args, wrap=True)
        assert result.exit_code == 2 and word in result.output and request is None, (args, result.output)


def test_missing_script_is_a_usage_error():
    with pytest.raises(LaunchError, match=r"missing SCRIPT: msprobe-launch \[options\] SCRIPT"):
        surface.parse({"standalone": True})
    with pytest.raises(LaunchError, match="missing SCRIPT: msprobe-launch --engine msrun"):
        surface.parse({"engine": "msrun"})


@pytest.mark.parametrize("argv, wrap", [
    (["--level", "L0", "--", "python", "x.py"], True),
    (["--standalone", "--level=L0", "--", "python"], True),
    (["--", "deepspeed"], True),
    (["train.py", "--", "x"], False),  # '--' after SCRIPT belongs to the script
    (["--nproc", "2", "train.py"], False),
    (["--level", "--", "train.py"], False),  # '--' is --level's value here
    (["--bogus", "--", "x"], False),  # unknown option: left to click's error
])
def test_wrap_form_is_a_bare_double_dash_before_the_first_positional(argv, wrap):
    import typer

    assert surface.is_wrap(typer.main.get_command(surface.app), argv) is wrap


def test_main_runs_nothing_on_a_usage_error_and_exits_with_runs_code(script, capsys):
    calls = []

    def run(request):
        calls.append(request)
        return 7

    with pytest.raises(SystemExit) as exit_:
        surface.main(["--level", "L0", "--", "python", "-c", "pass"], run)
    assert exit_.value.code == 7 and calls[0].engine == "command" and calls[0].overrides == {"level": "L0"}
    with pytest.raises(SystemExit) as exit_:
        surface.main(["--engine", "nope", script], run)
    assert exit_.value.code == 2 and len(calls) == 1

    def plan_error(request):
        raise LaunchError("[msprobe-launch] invalid config 'level': bad")

    with pytest.raises(SystemExit) as exit_:
        surface.main([script], plan_error)
    assert exit_.value.code == 2
    assert "msprobe-launch: error: invalid config 'level': bad\n" in capsys.readouterr().err
