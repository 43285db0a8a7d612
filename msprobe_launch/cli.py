"""``msprobe-launch``: run a training script exactly as torchrun (or msrun) would, with every rank dumping.

The launcher validates the dump configuration, puts the bootstrap directory first on PYTHONPATH, sets the
MSPROBE_* variables (the only channel to the ranks, see msprobe_inject.envvars) and then runs the real
elastic agent in-process (``torch.distributed.run.run``), MindSpore's msrun, or any command after ``--``.
At the end it prints a per-rank summary of the dump and exits with the job's exit code.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Optional

import typer

from msprobe_inject import config as dump_config
from msprobe_inject import envvars
from msprobe_inject.dumpformat import paths

LAUNCH = "Launch options (torchrun; torchrun's spellings and defaults)"
MSRUN = "msrun options (with --engine msrun)"
DUMP = "Dump options (override --config; defaults: task statistics, level L1, all ranks and steps)"
GENERAL = "General"

ENGINES = ("torchrun", "msrun")

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

# Parameter name -> spelling handed to torch.distributed.run's parser (value options).
_TORCHRUN_VALUES = {
    "nproc_per_node": "--nproc-per-node",
    "nnodes": "--nnodes",
    "rdzv_backend": "--rdzv-backend",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_id": "--rdzv-id",
    "rdzv_conf": "--rdzv-conf",
    "max_restarts": "--max-restarts",
    "monitor_interval": "--monitor-interval",
    "redirects": "--redirects",
    "tee": "--tee",
    "local_ranks_filter": "--local-ranks-filter",
    "start_method": "--start-method",
    "role": "--role",
    "local_addr": "--local-addr",
    "logs_specs": "--logs-specs",
    "signals_to_handle": "--signals-to-handle",
}
_TORCHRUN_FLAGS = {"standalone": "--standalone", "module": "-m", "no_python": "--no-python",
                   "run_path": "--run-path", "virtual_local_rank": "--virtual-local-rank"}
# Options both engines have: (torchrun spelling, msrun spelling).
_SHARED = {
    "node_rank": ("--node-rank", "--node_rank"),
    "master_addr": ("--master-addr", "--master_addr"),
    "master_port": ("--master-port", "--master_port"),
    "log_dir": ("--log-dir", "--log_dir"),
}
_MSRUN_VALUES = {
    "worker_num": "--worker_num",
    "local_worker_num": "--local_worker_num",
    "join": "--join",
    "cluster_time_out": "--cluster_time_out",
    "bind_core": "--bind_core",
    "sim_level": "--sim_level",
    "rank_table_file": "--rank_table_file",
    "worker_log_name": "--worker_log_name",
    "tail_worker_log": "--tail_worker_log",
}
# Dump flag -> (parameter name, env variable); parsed exactly as the variable would be.
_DUMP_FLAGS = {
    "--dump-path": ("dump_path", envvars.DUMP_PATH),
    "--task": ("task", envvars.TASK),
    "--level": ("level", envvars.LEVEL),
    "--step": ("step", envvars.STEP),
    "--rank": ("rank", envvars.RANK),
    "--scope": ("scope", envvars.SCOPE),
    "--list": ("list_", envvars.LIST),
    "--data-mode": ("data_mode", envvars.DATA_MODE),
    "--summary-mode": ("summary_mode", envvars.SUMMARY_MODE),
    "--step-on": ("step_on", envvars.STEP_ON),
}
# The chars msprobe (and msprobe compare) accept in a path.
_MSPROBE_PATH = re.compile(r"^[A-Za-z0-9_.:/-]+$")


class LaunchError(Exception):
    """A usage or configuration error found before any worker starts (exit code 2)."""


@dataclass
class LaunchPlan:
    engine: str  # "torchrun" | "msrun" | "command"
    argv: List[str]  # torchrun argv, msrun argv, or the wrapped command
    torchrun_args: Any = None  # argparse.Namespace from torch.distributed.run's parser
    env_set: Dict[str, str] = field(default_factory=dict)
    env_unset: List[str] = field(default_factory=list)
    dumping: bool = True
    dump_path: str = ""
    config: Optional[Dict[str, Any]] = None
    notes: List[str] = field(default_factory=list)
    clear_first: List[str] = field(default_factory=list)  # earlier data removed by --overwrite before the job

    def to_json(self) -> Dict[str, Any]:
        return {"engine": self.engine, "argv": self.argv, "env_set": self.env_set, "env_unset": self.env_unset,
                "dumping": self.dumping, "dump_path": self.dump_path, "config": self.config, "notes": self.notes}


def boot_dir() -> str:
    """The directory holding the bootstrap sitecustomize.py."""
    return os.path.join(os.path.dirname(os.path.abspath(envvars.__file__)), "_boot")


def prepend_pythonpath(current: Optional[str], entry: str) -> str:
    """``entry`` first, then ``current`` without other copies of ``entry`` (nesting stays flat)."""
    target = os.path.normcase(os.path.abspath(entry))
    kept = [p for p in (current or "").split(os.pathsep)
            if not (p and os.path.normcase(os.path.abspath(p)) == target)]
    if current is None or current == "":
        kept = []
    return os.pathsep.join([entry] + kept)


def _given(value: Any) -> bool:
    return value is not None and value is not False


def _flag_names(names: Dict[str, str], params: Dict[str, Any]) -> List[str]:
    return [flag for name, flag in names.items() if _given(params.get(name))]


def _torchrun_argv(params: Dict[str, Any], script: str, script_args: List[str]) -> List[str]:
    argv: List[str] = []
    for name, flag in _TORCHRUN_VALUES.items():
        if params.get(name) is not None:
            argv += [flag, str(params[name])]
    for name, (flag, _) in _SHARED.items():
        if params.get(name) is not None:
            argv += [flag, str(params[name])]
    for name, flag in _TORCHRUN_FLAGS.items():
        if params.get(name):
            argv.append(flag)
    return argv + [script] + script_args


def _parse_torchrun(argv: List[str]) -> Any:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "msprobe-launch"

    def error(message: str) -> None:
        raise LaunchError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser.parse_args(argv)


def _msrun_argv(params: Dict[str, Any], script: str, script_args: List[str], notes: List[str]) -> List[str]:
    argv: List[str] = []
    for name, (_, flag) in _SHARED.items():
        if params.get(name) is not None:
            argv.append(f"{flag}={params[name]}")
    for name, flag in _MSRUN_VALUES.items():
        if name == "join":
            continue
        if params.get(name) is not None:
            argv.append(f"{flag}={params[name]}")
    join = params.get("join")
    if join is not None and str(join).strip() not in ("True", "true", "1"):
        notes.append(f"--join {join} ignored: msprobe-launch waits for msrun's workers to print the summary")
    argv.append("--join=True")  # otherwise msrun returns right after spawning and workers are orphaned
    return argv + [script] + script_args


def _dump_overrides(params: Dict[str, Any]) -> Dict[str, Any]:
    """Flag values parsed exactly as their MSPROBE_* variables; errors name the flag."""
    overrides: Dict[str, Any] = {}
    for flag, (name, var) in _DUMP_FLAGS.items():
        raw = params.get(name)
        if raw is None:
            continue
        try:
            overrides.update(envvars.overrides_from_env({var: raw}))
        except ValueError as exc:
            raise LaunchError("invalid value for {}: {!r} ({})".format(flag, raw, str(exc).split(": ", 1)[-1]))
    if params.get("async_dump") is not None:
        overrides["async_dump"] = bool(params["async_dump"])
    return overrides


def _check_script(script: str, params: Dict[str, Any]) -> None:
    if params.get("module") or params.get("no_python"):
        return
    if not os.path.isfile(script):
        raise LaunchError(f"training script not found: {script}")


def build_plan(params: Dict[str, Any], wrap: bool = False) -> LaunchPlan:
    """Validate everything and decide what to run; starts nothing and leaves os.environ alone."""
    engine = params.get("engine") or "torchrun"
    if engine not in ENGINES:
        allowed = ", ".join(repr(e) for e in ENGINES)
        raise LaunchError(f"invalid value for --engine: {engine!r}; allowed values: {allowed}")
    script = params.get("script")
    script_args = list(params.get("script_args") or [])
    torchrun_only = _flag_names(_TORCHRUN_VALUES, params) + _flag_names(_TORCHRUN_FLAGS, params)
    msrun_only = _flag_names(_MSRUN_VALUES, params)
    shared = [flags[0] for name, flags in _SHARED.items() if params.get(name) is not None]
    notes: List[str] = []
    torchrun_args = None

    if wrap:
        used = torchrun_only + msrun_only + shared + (["--engine"] if params.get("engine") else [])
        if used:
            raise LaunchError(f"{', '.join(used)} cannot be combined with '-- COMMAND': "
                              "the wrapped command launches the job")
        if not script:
            raise LaunchError("missing COMMAND after '--'")
        plan = LaunchPlan(engine="command", argv=[script] + script_args)
        if any(a in ("-E", "-I", "-S") for a in plan.argv[1:3]) and "python" in os.path.basename(script):
            notes.append("python -E/-I/-S ignores PYTHONPATH: that interpreter will not dump")
    elif engine == "msrun":
        if torchrun_only:
            raise LaunchError(f"{', '.join(torchrun_only)}: torchrun option(s) cannot be used with --engine msrun "
                              "(use --worker_num, --local_worker_num, --master_addr, ...)")
        if not script:
            raise LaunchError("missing SCRIPT: msprobe-launch --engine msrun [options] SCRIPT [ARGS...]")
        import importlib.util

        if importlib.util.find_spec("mindspore") is None:
            raise LaunchError("--engine msrun needs MindSpore, which is not installed in this Python "
                              "(pip install mindspore); nothing was started")
        plan = LaunchPlan(engine="msrun", argv=_msrun_argv(params, script, script_args, notes))
    else:
        if msrun_only:
            raise LaunchError("{}: msrun option(s) need --engine msrun".format(", ".join(msrun_only)))
        if not script:
            raise LaunchError("missing SCRIPT: msprobe-launch [options] SCRIPT [ARGS...] "
                              "(or msprobe-launch [dump options] -- COMMAND ...)")
        argv = _torchrun_argv(params, script, script_args)
        torchrun_args = _parse_torchrun(argv)
        plan = LaunchPlan(engine="torchrun", argv=argv, torchrun_args=torchrun_args)
    plan.notes = notes

    # 1) the flags and the config file alone, so that an error names the flag's key
    overrides = _dump_overrides(params)
    config_path = params.get("config")
    try:
        dump_config.resolve(config_path, overrides, use_env=False)
    except dump_config.ConfigError as exc:
        raise LaunchError(str(exc))
    if plan.engine != "command":
        _check_script(script, params)

    # 2) exactly what the ranks will see: flags > inherited MSPROBE_* > config file > defaults
    env = dict(os.environ)
    unset = [v for v in (envvars.CLAIMED_PID, envvars.CLAIMED_RANK) if v in env]
    for var in unset:
        env.pop(var)
    env_set: Dict[str, str] = dict(envvars.to_env(overrides))
    if config_path:
        env_set[envvars.CONFIG] = os.path.abspath(config_path)
    env.update(env_set)
    if envvars.is_disabled(env):
        plan.dumping = False
        plan.notes.append(f"{envvars.ENABLE}={env.get(envvars.ENABLE)}: running the job without dumping")
        return plan
    try:
        cfg = dump_config.resolve(None, None, use_env=True, environ=env)
    except dump_config.ConfigError as exc:
        raise LaunchError(f"{exc} (set in the environment before msprobe-launch)")

    dump_path = os.path.abspath(cfg.dump_path)
    if not _MSPROBE_PATH.match(dump_path):
        plan.notes.append(f"dump path {dump_path!r} has characters msprobe compare rejects (allowed: A-Za-z0-9_.:/-)")
    env_set[envvars.DUMP_PATH] = dump_path
    run_id = params.get("run_id") or os.environ.get(envvars.RUN_ID)
    if not run_id and torchrun_args is not None and not torchrun_args.standalone \
            and torchrun_args.rdzv_id not in (None, "", "none"):
        run_id = torchrun_args.rdzv_id  # shared by every node of a c10d job
    env_set[envvars.RUN_ID] = run_id or uuid.uuid4().hex
    env_set[envvars.AGENT_PID] = str(os.getpid())
    env_set[envvars.BOOT_DIR] = boot_dir()
    env_set["PYTHONPATH"] = prepend_pythonpath(os.environ.get("PYTHONPATH"), boot_dir())
    if torchrun_args is not None and int(torchrun_args.max_restarts or 0) > 0 \
            and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        # Restarted gloo/NCCL inits fail or hang on the shared rendezvous store (pytorch/pytorch#135712).
        env_set["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    earlier = earlier_dump_data(dump_path, env_set[envvars.RUN_ID])
    if earlier and not params.get("overwrite"):
        raise LaunchError(f"{dump_path} already holds dump data of an earlier job ({', '.join(earlier[:4])}); "
                          "pass --overwrite to replace it, or choose another --dump-path "
                          "(other nodes of one job share --rdzv-id/--run-id and are not affected)")
    plan.clear_first = [os.path.join(dump_path, e) for e in earlier]
    plan.env_set = env_set
    plan.env_unset = unset
    plan.dump_path = dump_path
    plan.config = cfg.to_dict()
    return plan




def earlier_dump_data(dump_path: str, run_id: str) -> List[str]:
    """Entries of dump_path written by another job. Data of this job (another node already running,
    same run id in the manifest) does not count."""
    try:
        entries = sorted(e for e in os.listdir(dump_path) if paths.DUMP_ENTRY.match(e))
    except OSError:
        return []
    if not entries:
        return []
    try:
        with open(os.path.join(dump_path, "msprobe_manifest.json"), encoding="utf-8") as fh:
            if run_id in (json.load(fh).get("run_ids") or []):
                return []
    except (OSError, ValueError, AttributeError):
        pass
    return entries


def _clear(paths: List[str]) -> None:
    import shutil

    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def _apply_env(plan: LaunchPlan) -> None:
    for var in plan.env_unset:
        os.environ.pop(var, None)
    os.environ.update(plan.env_set)


def _run_torchrun(args: Any) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        sys.stderr.write(exc.format_msg() + "\n")
        _, failure = exc.get_first_failure()
        code = getattr(failure, "exitcode", 1)
        if isinstance(code, int) and code < 0:
            return 128 - code  # killed by a signal
        return code if isinstance(code, int) and 0 < code < 256 else 1
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except KeyboardInterrupt:
        return 130


def _run_msrun(argv: List[str]) -> int:
    from mindspore.parallel.cluster import run as msrun

    saved_argv, saved_path = sys.argv, os.environ.get("PATH", "")
    # msrun starts the literal 'python' through PATH: make it this interpreter (its venv).
    os.environ["PATH"] = os.path.dirname(sys.executable) + (os.pathsep + saved_path if saved_path else "")

    def sigterm_to_sigint(signum: int, frame: Any) -> None:
        signal.raise_signal(signal.SIGINT)  # msrun traps SIGINT only; SIGTERM would orphan the workers

    previous = signal.signal(signal.SIGTERM, sigterm_to_sigint)
    sys.argv = ["msrun"] + argv
    try:
        msrun.run(msrun.get_args())
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        sys.stderr.write(f"msprobe-launch: msrun failed: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        sys.argv = saved_argv
        signal.signal(signal.SIGTERM, previous)


def _run_command(argv: List[str]) -> int:
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        sys.stderr.write(f"msprobe-launch: cannot run {shlex.join(argv)}: {exc.strerror or exc}\n")
        return 127

    def forward(signum: int, frame: Any) -> None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def execute(plan: LaunchPlan) -> int:
    """Run the plan in this process (the agent / msrun manager) and print the summary. Returns the exit code."""
    for note in plan.notes:
        sys.stderr.write(f"[msprobe-launch] {note}\n")
    if plan.clear_first:
        sys.stderr.write(f"[msprobe-launch] --overwrite: removing earlier dump data in {plan.dump_path}\n")
        _clear(plan.clear_first)
    _apply_env(plan)
    if plan.engine == "torchrun":
        code = _run_torchrun(plan.torchrun_args)
    elif plan.engine == "msrun":
        code = _run_msrun(plan.argv)
    else:
        code = _run_command(plan.argv)
    if plan.dumping and plan.dump_path and os.path.isdir(plan.dump_path):
        try:
            from msprobe_inject.dumpformat.journal import recover_tree

            for d, res in recover_tree(plan.dump_path):
                sys.stderr.write(f"[msprobe-launch] recovered {res.get('records', 0)} records of a rank that "
                                 f"did not finish from its journal: {d} (step marked incomplete)\n")
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not recover journals: {exc}\n")
        try:
            from msprobe_inject.coord import manifest_reconcile

            manifest_reconcile(plan.dump_path)
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not update the manifest: {exc}\n")
        try:
            from msprobe_readers.cli import print_summary

            sys.stdout.flush()
            print_summary(plan.dump_path)
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not summarise {plan.dump_path}: {exc}\n")
    return code


def _opt(panel: str, *names: str, help: str, metavar: Optional[str] = "VALUE", **kw: Any) -> Any:
    return typer.Option(*names, help=help, metavar=metavar, rich_help_panel=panel, show_default=False, **kw)


def _flag(panel: str, *names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False)


app = typer.Typer(add_completion=False, rich_markup_mode="markdown", pretty_exceptions_enable=False)



def _allowed(values: Any) -> str:
    return ", ".join(str(v) for v in values)


@app.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=EXAMPLES,
    no_args_is_help=True,
)
def launch(
    ctx: typer.Context,
    script: Annotated[Optional[str], typer.Argument(
        metavar="SCRIPT", show_default=False,
        help="Training script (or module with -m, binary with --no-python); with `--`, the command to wrap.")] = None,
    script_args: Annotated[Optional[List[str]], typer.Argument(
        metavar="[ARGS]...", show_default=False, help="Passed to the script untouched.")] = None,
    # --- torchrun ---
    nproc_per_node: Annotated[Optional[str], _opt(
        LAUNCH, "--nproc-per-node", "--nproc_per_node", "--nproc",
        help="Workers per node: an int, or auto/cpu/gpu/xpu (default 1).")] = None,
    nnodes: Annotated[Optional[str], _opt(LAUNCH, "--nnodes", help="Nodes, or MIN:MAX for elastic jobs (default 1:1).")
                      ] = None,
    node_rank: Annotated[Optional[str], _opt(
        LAUNCH, "--node-rank", "--node_rank", help="Rank of this node for static rendezvous (msrun: --node_rank).")
    ] = None,
    master_addr: Annotated[Optional[str], _opt(
        LAUNCH, "--master-addr", "--master_addr", help="Address of rank 0's node (static rendezvous / msrun).")] = None,
    master_port: Annotated[Optional[str], _opt(
        LAUNCH, "--master-port", "--master_port", help="Port on the master node (static rendezvous / msrun).")] = None,
    rdzv_backend: Annotated[Optional[str], _opt(
        LAUNCH, "--rdzv-backend", "--rdzv_backend", help="Rendezvous backend, e.g. c10d (default static).")] = None,
    rdzv_endpoint: Annotated[Optional[str], _opt(
        LAUNCH, "--rdzv-endpoint", "--rdzv_endpoint", help="Rendezvous endpoint HOST[:PORT].")] = None,
    rdzv_id: Annotated[Optional[str], _opt(
        LAUNCH, "--rdzv-id", "--rdzv_id", help="Job id shared by all nodes; also the dump run id.")] = None,
    rdzv_conf: Annotated[Optional[str], _opt(
        LAUNCH, "--rdzv-conf", "--rdzv_conf", help="Extra rendezvous settings key1=v1,key2=v2.")] = None,
    standalone: Annotated[bool, _flag(
        LAUNCH, "--standalone", help="Single node with a private c10d rendezvous on a free port.")] = False,
    max_restarts: Annotated[Optional[str], _opt(
        LAUNCH, "--max-restarts", "--max_restarts",
        help="Restarts of the worker group before failing (default 0). Each attempt dumps apart.")] = None,
    monitor_interval: Annotated[Optional[str], _opt(
        LAUNCH, "--monitor-interval", "--monitor_interval", help="Seconds between worker checks (default 0.1).")
    ] = None,
    log_dir: Annotated[Optional[str], _opt(
        LAUNCH, "--log-dir", "--log_dir", help="Directory for worker logs (msrun: --log_dir).")] = None,
    redirects: Annotated[Optional[str], _opt(
        LAUNCH, "--redirects", "-r", help="Redirect std streams into log files: 0-3 or local_rank:code,...")] = None,
    tee: Annotated[Optional[str], _opt(
        LAUNCH, "--tee", "-t", help="Tee std streams into log files and the console: 0-3 or local_rank:code,...")
    ] = None,
    local_ranks_filter: Annotated[Optional[str], _opt(
        LAUNCH, "--local-ranks-filter", "--local_ranks_filter", help="Only show logs of these local ranks: 0,1.")
    ] = None,
    module: Annotated[bool, _flag(LAUNCH, "-m", "--module", help="SCRIPT is a Python module (python -m).")] = False,
    no_python: Annotated[bool, _flag(
        LAUNCH, "--no-python", "--no_python", help="Run SCRIPT as an executable, not with python.")] = False,
    run_path: Annotated[bool, _flag(
        LAUNCH, "--run-path", "--run_path", help="Run SCRIPT with runpy.run_path in the agent's children.")] = False,
    start_method: Annotated[Optional[str], _opt(
        LAUNCH, "--start-method", "--start_method", help="spawn|fork|forkserver, for --run-path (default spawn).")
    ] = None,
    role: Annotated[Optional[str], _opt(LAUNCH, "--role", help="User-defined role of the workers.")] = None,
    local_addr: Annotated[Optional[str], _opt(
        LAUNCH, "--local-addr", "--local_addr", help="Address of this node (default: its FQDN).")] = None,
    logs_specs: Annotated[Optional[str], _opt(
        LAUNCH, "--logs-specs", "--logs_specs", help="torchrun logs_specs entry point.")] = None,
    signals_to_handle: Annotated[Optional[str], _opt(
        LAUNCH, "--signals-to-handle", "--signals_to_handle", help="Signals the agent forwards to workers.")] = None,
    virtual_local_rank: Annotated[bool, _flag(
        LAUNCH, "--virtual-local-rank", "--virtual_local_rank", help="Every worker sees LOCAL_RANK 0.")] = False,
    # --- engine / msrun ---
    engine: Annotated[Optional[str], _opt(
        GENERAL, "--engine", metavar="torchrun|msrun", help="Launcher to run the job with (default torchrun).")] = None,
    worker_num: Annotated[Optional[str], _opt(
        MSRUN, "--worker_num", "--worker-num", help="Total workers of the job (msrun default 8).")] = None,
    local_worker_num: Annotated[Optional[str], _opt(
        MSRUN, "--local_worker_num", "--local-worker-num", help="Workers on this node (msrun default 8).")] = None,
    join: Annotated[Optional[str], _opt(
        MSRUN, "--join", metavar="True", help="Always True here: the launcher waits for the workers.")] = None,
    cluster_time_out: Annotated[Optional[str], _opt(
        MSRUN, "--cluster_time_out", "--cluster-time-out", help="Seconds to wait for the cluster (default 600).")
    ] = None,
    bind_core: Annotated[Optional[str], _opt(MSRUN, "--bind_core", help="Passed to msrun.")] = None,
    sim_level: Annotated[Optional[str], _opt(MSRUN, "--sim_level", help="Passed to msrun.")] = None,
    rank_table_file: Annotated[Optional[str], _opt(MSRUN, "--rank_table_file", help="Passed to msrun.")] = None,
    worker_log_name: Annotated[Optional[str], _opt(MSRUN, "--worker_log_name", help="Passed to msrun.")] = None,
    tail_worker_log: Annotated[Optional[str], _opt(MSRUN, "--tail_worker_log", help="Passed to msrun.")] = None,
    # --- dump ---
    config: Annotated[Optional[str], _opt(
        DUMP, "--config", metavar="FILE", help="msprobe config.json; the flags below override it.")] = None,
    dump_path: Annotated[Optional[str], _opt(
        DUMP, "--dump-path", metavar="DIR", help="Output directory (default ./msprobe_dump).")] = None,
    task: Annotated[Optional[str], _opt(DUMP, "--task", metavar="TASK", help=_allowed(dump_config.TASKS))] = None,
    level: Annotated[Optional[str], _opt(DUMP, "--level", metavar="LEVEL", help=_allowed(dump_config.LEVELS))] = None,
    step: Annotated[Optional[str], _opt(
        DUMP, "--step", metavar="LIST", help="Steps to dump: '0,2,4-6' or a JSON list (default all).")] = None,
    rank: Annotated[Optional[str], _opt(
        DUMP, "--rank", metavar="LIST", help="Global ranks that dump: '0,1' or '0-3' (default all).")] = None,
    scope: Annotated[Optional[str], _opt(
        DUMP, "--scope", metavar="START,END", help="Dump only between two record names.")] = None,
    list_: Annotated[Optional[str], _opt(
        DUMP, "--list", metavar="NAMES", help="Dump only these APIs/modules: 'relu,linear' or a JSON list.")] = None,
    data_mode: Annotated[Optional[str], _opt(
        DUMP, "--data-mode", metavar="MODES", help="all, or a list of " + _allowed(dump_config.DATA_MODES[1:]))] = None,
    summary_mode: Annotated[Optional[str], _opt(
        DUMP, "--summary-mode", metavar="MODE", help=_allowed(dump_config.SUMMARY_MODES))] = None,
    async_dump: Annotated[Optional[bool], typer.Option(
        "--async-dump/--no-async-dump", help="Write the step's data at the step end (no syncs).",
        rich_help_panel=DUMP, show_default=False)] = None,
    step_on: Annotated[Optional[str], _opt(
        DUMP, "--step-on", metavar="WHEN",
        help="Step boundary: optimizer (each optimizer.step, default), forward (each top-level forward), "
             "manual (the script calls step()).")] = None,
    run_id: Annotated[Optional[str], _opt(
        DUMP, "--run-id", metavar="ID", help="Id shared by all nodes of one job (default: --rdzv-id or a uuid).")
    ] = None,
    overwrite: Annotated[bool, _flag(
        DUMP, "--overwrite", help="Replace dump data an earlier job left in the dump path (refused otherwise).")
    ] = False,
    dry_run: Annotated[bool, _flag(
        GENERAL, "--dry-run", help="Validate, print the plan (command, MSPROBE_* env, config) as JSON, run nothing.")
    ] = False,
) -> None:
    """Run SCRIPT on every node exactly as torchrun would; every rank dumps msprobe-compatible precision data.

    Usage: `msprobe-launch [launch options] [dump options] SCRIPT [ARGS]...`
    or `msprobe-launch [dump options] -- COMMAND [ARGS]...` to wrap another launcher.
    """
    wrap = bool((ctx.obj or {}).get("wrap"))
    try:
        plan = build_plan(dict(ctx.params), wrap=wrap)
    except LaunchError as exc:
        message = str(exc)
        if message.startswith("[msprobe-launch] "):
            message = message[len("[msprobe-launch] "):]
        typer.echo(f"msprobe-launch: error: {message}", err=True)
        raise typer.Exit(2)
    if dry_run:
        typer.echo(json.dumps(plan.to_json(), indent=1))
        raise typer.Exit(0)
    raise typer.Exit(execute(plan))


def _is_wrap(command: Any, argv: List[str]) -> bool:
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


def main(argv: Optional[List[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    command.main(args=args, prog_name="msprobe-launch", obj={"wrap": _is_wrap(command, args)})


if __name__ == "__main__":
    main()
