"""What a launch will do, decided before anything starts: typed plans built from the parsed command line.

``build_plan`` checks what the command line alone cannot (torchrun's own parser, MindSpore being there, the
dump configuration with the config file and the inherited ``MSPROBE_*`` variables, the script, the dump path)
and decides the engine's argv and the workers' environment. It reads the environment and the file system
and changes neither; ``--dry-run`` prints ``LaunchPlan.to_json()``.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from msprobe_inject import config as dump_config
from msprobe_inject import envvars, nodehook
from msprobe_inject.dumpformat import manifest, paths

ENGINES = ("torchrun", "msrun")
# The chars msprobe (and msprobe compare) accept in a path.
_MSPROBE_PATH = re.compile(r"^[A-Za-z0-9_.:/-]+$")
_TRUE = ("True", "true", "1")


class LaunchError(Exception):
    """A usage or configuration error found before any worker starts (exit code 2)."""


@dataclass(frozen=True)
class Request:
    """One command line, parsed (``msprobe_launch.surface.parse``): what the user asked for."""

    engine: str  # "torchrun", "msrun", or "command" (the ``-- COMMAND`` form)
    program: List[str]  # SCRIPT [ARGS...], or COMMAND [ARGS...]
    engine_options: List[Tuple[str, Union[str, bool]]] = field(default_factory=list)  # engine's spelling, value
    script_is_file: bool = True  # SCRIPT must be a file (not a module with -m, not a binary with --no-python)
    overrides: Dict[str, Any] = field(default_factory=dict)  # dump config values from the flags, by config key
    config_path: Optional[str] = None
    run_id: Optional[str] = None
    overwrite: bool = False
    index: bool = False
    dry_run: bool = False


@dataclass
class DumpPlan:
    """The dump the job will write: the validated config, where, and what --overwrite clears first."""

    dumping: bool = True
    dump_path: str = ""
    config: Optional[Dict[str, Any]] = None
    clear_first: List[str] = field(default_factory=list)  # an earlier job's entries, removed before the job
    index: bool = False  # after the job, index this node's ranks (msprobe_readers.index)


@dataclass
class LaunchPlan:
    """What will run: the engine, its argv (or the command), the workers' environment and the dump."""

    engine: str  # "torchrun" | "msrun" | "command"
    argv: List[str]  # torchrun argv, msrun argv, or the wrapped command
    torchrun_args: Any = None  # argparse.Namespace from torch.distributed.run's parser
    env_set: Dict[str, str] = field(default_factory=dict)
    env_unset: List[str] = field(default_factory=list)
    dump: DumpPlan = field(default_factory=DumpPlan)
    notes: List[str] = field(default_factory=list)  # printed to stderr before the job
    node_hooks: bool = False  # compile the ranks' C++ node hooks first where not cached (msprobe_inject.nodehook)

    def to_json(self) -> Dict[str, Any]:
        return {"engine": self.engine, "argv": self.argv, "env_set": self.env_set, "env_unset": self.env_unset,
                "dumping": self.dump.dumping, "dump_path": self.dump.dump_path, "config": self.dump.config,
                "notes": self.notes, "node_hooks": self.node_hooks}


def boot_dir() -> str:
    """The directory holding the bootstrap sitecustomize.py."""
    return os.path.join(os.path.dirname(os.path.abspath(envvars.__file__)), "_boot")


def prepend_pythonpath(current: Optional[str], entry: str) -> str:
    """``entry`` first, then ``current`` without other copies of ``entry`` (nesting stays flat)."""
    if not current:
        return entry
    target = os.path.normcase(os.path.abspath(entry))
    kept = [p for p in current.split(os.pathsep) if not (p and os.path.normcase(os.path.abspath(p)) == target)]
    return os.pathsep.join([entry] + kept)


def earlier_dump_data(dump_path: str, run_id: str) -> List[str]:
    """Entries of dump_path written by another job. Data of this job (another node already running: the run
    id's marker under ``.msprobe/runs/``, or the run id in an older dump's manifest) does not count."""
    try:
        entries = sorted(e for e in os.listdir(dump_path) if paths.DUMP_ENTRY.match(e))
    except OSError:
        return []
    if entries == [paths.META_DIR] and not manifest.entry_files(dump_path):
        return []  # only run markers: a launcher ran here, but no process of it dumped anything
    if not entries:
        return []
    try:
        if manifest.run_seen(dump_path, run_id):
            return []
    except OSError:
        pass
    return entries


def torchrun_argv(request: Request) -> List[str]:
    argv: List[str] = []
    for spelling, value in request.engine_options:
        argv += [spelling] if isinstance(value, bool) else [spelling, str(value)]
    return argv + request.program


def msrun_argv(request: Request, notes: List[str]) -> List[str]:
    argv: List[str] = []
    for spelling, value in request.engine_options:
        if spelling == "--join":
            if str(value).strip() not in _TRUE:
                notes.append(f"--join {value} ignored: msprobe-launch waits for msrun's workers to print the summary")
            continue
        argv.append(f"{spelling}={value}")
    argv.append("--join=True")  # otherwise msrun returns right after spawning and workers are orphaned
    return argv + request.program


def parse_torchrun(argv: List[str]) -> Any:
    """torch.distributed.run's own parser over ``argv``; its errors become LaunchError."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "msprobe-launch"

    def error(message: str) -> None:
        raise LaunchError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser.parse_args(argv)


def _engine_plan(request: Request) -> LaunchPlan:
    notes: List[str] = []
    if request.engine == "command":
        argv = list(request.program)
        if any(a in ("-E", "-I", "-S") for a in argv[1:3]) and "python" in os.path.basename(argv[0]):
            notes.append("python -E/-I/-S ignores PYTHONPATH: that interpreter will not dump")
        return LaunchPlan(engine="command", argv=argv, notes=notes)
    if request.engine == "msrun":
        import importlib.util

        if importlib.util.find_spec("mindspore") is None:
            raise LaunchError("--engine msrun needs MindSpore, which is not installed in this Python "
                              "(pip install mindspore); nothing was started")
        return LaunchPlan(engine="msrun", argv=msrun_argv(request, notes), notes=notes)
    argv = torchrun_argv(request)
    return LaunchPlan(engine="torchrun", argv=argv, torchrun_args=parse_torchrun(argv), notes=notes)


def _run_id(request: Request, torchrun_args: Any, environ: Mapping[str, str]) -> str:
    run_id = request.run_id or environ.get(envvars.RUN_ID)
    if not run_id and torchrun_args is not None and not torchrun_args.standalone \
            and torchrun_args.rdzv_id not in (None, "", "none"):
        run_id = torchrun_args.rdzv_id  # shared by every node of a c10d job
    return run_id or uuid.uuid4().hex


def build_plan(request: Request, environ: Optional[Mapping[str, str]] = None,
               pid: Optional[int] = None) -> LaunchPlan:
    """Validate everything and decide what to run. Raises LaunchError; starts nothing, changes nothing.

    ``environ`` (default os.environ) is the launcher's environment, which the workers inherit.
    """
    environ = os.environ if environ is None else environ
    plan = _engine_plan(request)

    # 1) the flags and the config file alone, so that an error names the flag's key
    try:
        dump_config.resolve(request.config_path, request.overrides, use_env=False)
    except dump_config.ConfigError as exc:
        raise LaunchError(str(exc))
    script = request.program[0]
    if request.script_is_file and not os.path.isfile(script):
        raise LaunchError(f"training script not found: {script}")

    # 2) exactly what the ranks will see: flags > inherited MSPROBE_* > config file > defaults
    env = dict(environ)
    unset = [v for v in (envvars.CLAIMED_PID, envvars.CLAIMED_RANK) if v in env]
    for var in unset:
        env.pop(var)
    env_set = envvars.to_env(request.overrides)
    if request.config_path:
        env_set[envvars.CONFIG] = envvars.option(envvars.CONFIG).format(request.config_path)
    env.update(env_set)
    if envvars.is_disabled(env):
        plan.dump.dumping = False
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
    env_set[envvars.RUN_ID] = _run_id(request, plan.torchrun_args, environ)
    env_set[envvars.AGENT_PID] = str(os.getpid() if pid is None else pid)
    env_set[envvars.BOOT_DIR] = boot_dir()
    env_set["PYTHONPATH"] = prepend_pythonpath(environ.get("PYTHONPATH"), boot_dir())
    if plan.torchrun_args is not None and int(plan.torchrun_args.max_restarts or 0) > 0 \
            and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in environ:
        # Restarted gloo/NCCL inits fail or hang on the shared rendezvous store (pytorch/pytorch#135712).
        env_set["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    earlier = earlier_dump_data(dump_path, env_set[envvars.RUN_ID])
    if earlier and not request.overwrite:
        raise LaunchError(f"{dump_path} already holds dump data of an earlier job ({', '.join(earlier[:4])}); "
                          "pass --overwrite to replace it, or choose another --dump-path "
                          "(other nodes of one job share --rdzv-id/--run-id and are not affected)")
    plan.env_set = env_set
    plan.env_unset = unset
    # msrun's ranks run MindSpore; torchrun's and a command's may run torch, whose hooks these are
    plan.node_hooks = plan.engine != "msrun" and nodehook.enabled(env)
    plan.dump = DumpPlan(dumping=True, dump_path=dump_path, config=cfg.to_dict(),
                         clear_first=[os.path.join(dump_path, e) for e in earlier], index=request.index)
    return plan
