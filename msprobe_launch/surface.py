"""The command line of ``msprobe-launch``, as data: every option declared once, parsed into a ``Request``.

Launch options (torchrun's), msrun options and general options are declared here (``LAUNCH_OPTIONS``,
``MSRUN_OPTIONS``, ``GENERAL_OPTIONS``), each with the spelling handed to the engine that takes it; the dump
options are the rows of ``msprobe_inject.envvars.OPTIONS``. The typer command is generated from these rows.
``parse`` turns the values click parsed into a ``plan.Request``: which engine, its options in the engine's
spelling, the dump config overrides. A usage error exits 2 naming the option or value before anything starts.
"""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import typer

from msprobe_inject import envvars
from msprobe_launch.plan import ENGINES, LaunchError, Request

LAUNCH = "Launch options (torchrun; torchrun's spellings and defaults)"
MSRUN = "msrun options (with --engine msrun)"
DUMP = "Dump options (override --config; defaults: task statistics, level L1, all ranks and steps)"
GENERAL = "General"

PROG = "msprobe-launch"

EXAMPLES = """\
**Examples**

```
msprobe-launch --nproc-per-node 2 train.py --lr 3e-4
msprobe-launch --level L0 --step 0-2 --dump-path ./dump --nproc-per-node 8 train.py
msprobe-launch --config config.json --nnodes 2 --node-rank 0 --rdzv-backend c10d \\
    --rdzv-endpoint node0:29400 --rdzv-id job42 --nproc-per-node 8 train.py
msprobe-launch --max-restarts 1 --standalone --nproc-per-node 4 train.py
msprobe-launch --engine msrun --worker_num 8 --local_worker_num 8 train_ms.py
msprobe-launch --level mix -- deepspeed --num_gpus 8 train.py
msprobe-launch --dump-path ./d -- python infer.py       # any command: plain python, srun, accelerate
python -m msprobe_readers.summary ./msprobe_dump        # the summary table again
```

Without the launcher the same MSPROBE_* variables work:
`MSPROBE_DUMP_PATH=./d torchrun --nproc-per-node 2 train.py`. `MSPROBE_ENABLE=0` switches dumping off.
"""


class LaunchOption(NamedTuple):
    """A launch, msrun or general option: its spellings, its help, and what each engine calls it."""

    name: str  # parameter name
    flags: Tuple[str, ...]  # accepted spellings; the first one names the option in messages
    help: str
    panel: str = LAUNCH
    torchrun: Optional[str] = None  # spelling handed to torch.distributed.run's parser; None: not torchrun's
    msrun: Optional[str] = None  # spelling handed to msrun as SPELLING=VALUE; None: not msrun's
    switch: bool = False  # takes no value
    metavar: str = "VALUE"


def _torchrun(name: str, flags: Tuple[str, ...], help: str, **kw: Any) -> LaunchOption:
    return LaunchOption(name, flags, help, torchrun=flags[0], **kw)


def _msrun(name: str, flags: Tuple[str, ...], help: str, **kw: Any) -> LaunchOption:
    return LaunchOption(name, flags, help, panel=MSRUN, msrun=flags[0], **kw)


LAUNCH_OPTIONS: Tuple[LaunchOption, ...] = (
    _torchrun("nproc_per_node", ("--nproc-per-node", "--nproc_per_node", "--nproc"),
              "Workers per node: an int, or auto/cpu/gpu/xpu (default 1)."),
    _torchrun("nnodes", ("--nnodes",), "Nodes, or MIN:MAX for elastic jobs (default 1:1)."),
    _torchrun("node_rank", ("--node-rank", "--node_rank"),
              "Rank of this node for static rendezvous (msrun: --node_rank).", msrun="--node_rank"),
    _torchrun("master_addr", ("--master-addr", "--master_addr"),
              "Address of rank 0's node (static rendezvous / msrun).", msrun="--master_addr"),
    _torchrun("master_port", ("--master-port", "--master_port"),
              "Port on the master node (static rendezvous / msrun).", msrun="--master_port"),
    _torchrun("rdzv_backend", ("--rdzv-backend", "--rdzv_backend"), "Rendezvous backend, e.g. c10d (default static)."),
    _torchrun("rdzv_endpoint", ("--rdzv-endpoint", "--rdzv_endpoint"), "Rendezvous endpoint HOST[:PORT]."),
    _torchrun("rdzv_id", ("--rdzv-id", "--rdzv_id"), "Job id shared by all nodes; also the dump run id."),
    _torchrun("rdzv_conf", ("--rdzv-conf", "--rdzv_conf"), "Extra rendezvous settings key1=v1,key2=v2."),
    _torchrun("standalone", ("--standalone",), "Single node with a private c10d rendezvous on a free port.",
              switch=True),
    _torchrun("max_restarts", ("--max-restarts", "--max_restarts"),
              "Restarts of the worker group before failing (default 0). Each attempt dumps apart."),
    _torchrun("monitor_interval", ("--monitor-interval", "--monitor_interval"),
              "Seconds between worker checks (default 0.1)."),
    _torchrun("log_dir", ("--log-dir", "--log_dir"), "Directory for worker logs (msrun: --log_dir).",
              msrun="--log_dir"),
    _torchrun("redirects", ("--redirects", "-r"), "Redirect std streams into log files: 0-3 or local_rank:code,..."),
    _torchrun("tee", ("--tee", "-t"), "Tee std streams into log files and the console: 0-3 or local_rank:code,..."),
    _torchrun("local_ranks_filter", ("--local-ranks-filter", "--local_ranks_filter"),
              "Only show logs of these local ranks: 0,1."),
    _torchrun("module", ("-m", "--module"), "SCRIPT is a Python module (python -m).", switch=True),
    _torchrun("no_python", ("--no-python", "--no_python"), "Run SCRIPT as an executable, not with python.",
              switch=True),
    _torchrun("run_path", ("--run-path", "--run_path"), "Run SCRIPT with runpy.run_path in the agent's children.",
              switch=True),
    _torchrun("start_method", ("--start-method", "--start_method"),
              "spawn|fork|forkserver, for --run-path (default spawn)."),
    _torchrun("role", ("--role",), "User-defined role of the workers."),
    _torchrun("local_addr", ("--local-addr", "--local_addr"), "Address of this node (default: its FQDN)."),
    _torchrun("logs_specs", ("--logs-specs", "--logs_specs"), "torchrun logs_specs entry point."),
    _torchrun("signals_to_handle", ("--signals-to-handle", "--signals_to_handle"),
              "Signals the agent forwards to workers."),
    _torchrun("virtual_local_rank", ("--virtual-local-rank", "--virtual_local_rank"),
              "Every worker sees LOCAL_RANK 0.", switch=True),
)

MSRUN_OPTIONS: Tuple[LaunchOption, ...] = (
    _msrun("worker_num", ("--worker_num", "--worker-num"), "Total workers of the job (msrun default 8)."),
    _msrun("local_worker_num", ("--local_worker_num", "--local-worker-num"),
           "Workers on this node (msrun default 8)."),
    _msrun("join", ("--join",), "Always True here: the launcher waits for the workers.", metavar="True"),
    _msrun("cluster_time_out", ("--cluster_time_out", "--cluster-time-out"),
           "Seconds to wait for the cluster (default 600)."),
    _msrun("bind_core", ("--bind_core",), "Passed to msrun."),
    _msrun("sim_level", ("--sim_level",), "Passed to msrun."),
    _msrun("rank_table_file", ("--rank_table_file",), "Passed to msrun."),
    _msrun("worker_log_name", ("--worker_log_name",), "Passed to msrun."),
    _msrun("tail_worker_log", ("--tail_worker_log",), "Passed to msrun."),
)

ENGINE_OPTION = LaunchOption("engine", ("--engine",), "Launcher to run the job with (default torchrun).",
                             panel=GENERAL, metavar="|".join(ENGINES))
GENERAL_OPTIONS: Tuple[LaunchOption, ...] = (
    LaunchOption("overwrite", ("--overwrite",),
                 "Replace dump data an earlier job left in the dump path (refused otherwise).",
                 panel=GENERAL, switch=True),
    LaunchOption("index", ("--index",),
                 "After the job, index this node's ranks for `msprobe-dump sql` (a Parquet dataset).",
                 panel=GENERAL, switch=True),
    LaunchOption("dry_run", ("--dry-run",),
                 "Validate, print the plan (command, MSPROBE_* env, config) as JSON, run nothing.",
                 panel=GENERAL, switch=True),
)

_ENGINE_OPTIONS = LAUNCH_OPTIONS + MSRUN_OPTIONS


def _given(value: Any) -> bool:
    return value is not None and value is not False


def _strip_prefix(message: str) -> str:
    prefix = "[msprobe-launch] "
    return message[len(prefix):] if message.startswith(prefix) else message


def dump_overrides(params: Mapping[str, Any]) -> Dict[str, Any]:
    """Config values of the dump flags given, parsed exactly as their MSPROBE_* variables; errors name the flag."""
    overrides: Dict[str, Any] = {}
    for opt in envvars.OPTIONS:
        value = params.get(opt.name)
        if opt.key is None or value is None or value == "":
            continue
        if opt.kind == "bool":
            overrides[opt.key] = bool(value)  # click already parsed the --x/--no-x pair
            continue
        try:
            overrides[opt.key] = opt.parse(value)
        except ValueError as exc:
            raise LaunchError(f"invalid value for {opt.flags[0]}: {value!r} ({exc})")
    return overrides


def parse(params: Mapping[str, Any], wrap: bool = False) -> Request:
    """The request of one command line (``params``: the values click parsed, by parameter name).

    ``wrap``: the ``-- COMMAND`` form. Raises LaunchError for options that do not belong together or a value
    that cannot be parsed; values only the plan can check (torchrun's, the config's) are left to it.
    """
    engine = params.get("engine")
    if engine is not None and engine not in ENGINES:
        allowed = ", ".join(repr(e) for e in ENGINES)
        raise LaunchError(f"invalid value for --engine: {engine!r}; allowed values: {allowed}")
    script = params.get("script")
    program = [script] + list(params.get("script_args") or []) if script else []
    given = [o for o in _ENGINE_OPTIONS if _given(params.get(o.name))]
    if wrap:
        used = [o.flags[0] for o in given] + (["--engine"] if engine else [])
        if used:
            raise LaunchError(f"{', '.join(used)} cannot be combined with '-- COMMAND': "
                              "the wrapped command launches the job")
        if not script:
            raise LaunchError("missing COMMAND after '--'")
        kind, engine_options = "command", []
    elif engine == "msrun":
        wrong = [o.flags[0] for o in given if o.msrun is None]
        if wrong:
            raise LaunchError(f"{', '.join(wrong)}: torchrun option(s) cannot be used with --engine msrun "
                              "(use --worker_num, --local_worker_num, --master_addr, ...)")
        if not script:
            raise LaunchError("missing SCRIPT: msprobe-launch --engine msrun [options] SCRIPT [ARGS...]")
        kind, engine_options = "msrun", [(o.msrun, params[o.name]) for o in given]
    else:
        wrong = [o.flags[0] for o in given if o.torchrun is None]
        if wrong:
            raise LaunchError("{}: msrun option(s) need --engine msrun".format(", ".join(wrong)))
        if not script:
            raise LaunchError("missing SCRIPT: msprobe-launch [options] SCRIPT [ARGS...] "
                              "(or msprobe-launch [dump options] -- COMMAND ...)")
        kind, engine_options = "torchrun", [(o.torchrun, params[o.name]) for o in given]
    return Request(
        engine=kind,
        program=program,
        engine_options=engine_options,
        script_is_file=kind != "command" and not (params.get("module") or params.get("no_python")),
        overrides=dump_overrides(params),
        config_path=params.get(envvars.option(envvars.CONFIG).name),
        run_id=params.get(envvars.option(envvars.RUN_ID).name),
        overwrite=bool(params.get("overwrite")),
        index=bool(params.get("index")),
        dry_run=bool(params.get("dry_run")),
    )


# ---------------------------------------------------------------- the typer command, generated from the rows

def _parameter(name: str, annotation: Any, info: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[annotation, info],
                             default=default)


def _launch_parameter(opt: LaunchOption) -> inspect.Parameter:
    if opt.switch:
        info = typer.Option(*opt.flags, help=opt.help, rich_help_panel=opt.panel, show_default=False)
        return _parameter(opt.name, bool, info, False)
    info = typer.Option(*opt.flags, help=opt.help, metavar=opt.metavar, rich_help_panel=opt.panel,
                        show_default=False)
    return _parameter(opt.name, Optional[str], info, None)


def _dump_parameter(opt: envvars.Option) -> inspect.Parameter:
    if opt.kind == "bool":
        decls = ["/".join(pair) for pair in zip(opt.flags, opt.off_flags)]
        info = typer.Option(*decls, help=opt.help, rich_help_panel=DUMP, show_default=False)
        return _parameter(opt.name, Optional[bool], info, None)
    info = typer.Option(*opt.flags, help=opt.help, metavar=opt.metavar, rich_help_panel=DUMP, show_default=False)
    return _parameter(opt.name, Optional[str], info, None)


def _signature() -> inspect.Signature:
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    script = _parameter("script", Optional[str], typer.Argument(
        metavar="SCRIPT", show_default=False,
        help="Training script (or module with -m, binary with --no-python); with `--`, the command to wrap."), None)
    script_args = _parameter("script_args", Optional[List[str]], typer.Argument(
        metavar="[ARGS]...", show_default=False, help="Passed to the script untouched."), None)
    params = [ctx, script, script_args]
    params += [_launch_parameter(o) for o in LAUNCH_OPTIONS + (ENGINE_OPTION,) + MSRUN_OPTIONS]
    params += [_dump_parameter(o) for o in envvars.OPTIONS]
    params += [_launch_parameter(o) for o in GENERAL_OPTIONS]
    return inspect.Signature(params)


def _launch(ctx: typer.Context, **params: Any) -> None:
    """Run SCRIPT on every node exactly as torchrun would; every rank dumps msprobe-compatible precision data.

    Usage: `msprobe-launch [launch options] [dump options] SCRIPT [ARGS]...`
    or `msprobe-launch [dump options] -- COMMAND [ARGS]...` to wrap another launcher.
    """
    obj = ctx.obj or {}
    try:
        code = obj["run"](parse(params, wrap=bool(obj.get("wrap"))))
    except LaunchError as exc:
        typer.echo(f"{PROG}: error: {_strip_prefix(str(exc))}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(code)


_launch.__signature__ = _signature()  # type: ignore[attr-defined]

app = typer.Typer(add_completion=False, rich_markup_mode="markdown", pretty_exceptions_enable=False)
app.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=EXAMPLES,
    no_args_is_help=True,
)(_launch)


def is_wrap(command: Any, argv: Sequence[str]) -> bool:
    """True when a bare '--' comes before the first positional argument (the wrap form)."""
    takes_value: Dict[str, bool] = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            for name in list(param.opts) + list(param.secondary_opts):
                takes_value[name] = not param.is_flag and not param.count
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return True
        if not token.startswith("-") or token == "-":
            return False
        if token.startswith("--") and "=" in token:
            i += 1
        elif token in takes_value:
            i += 2 if takes_value[token] else 1
        else:
            return False  # unknown option: click reports it
    return False


def main(argv: Optional[Sequence[str]], run: Callable[[Request], int]) -> None:
    """Parse ``argv`` (default: sys.argv) and exit with ``run(request)``; usage errors exit 2 and run nothing.

    ``run`` may raise LaunchError: it is reported as a usage error too.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    command.main(args=args, prog_name=PROG, obj={"wrap": is_wrap(command, args), "run": run})
