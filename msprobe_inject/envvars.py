"""The contract between the launcher and the ranks: every ``MSPROBE_*`` variable, in one place.

The launcher only ever talks to the ranks through these variables; the same variables work
without the launcher (``MSPROBE_DUMP_PATH=./d torchrun ... train.py``).

``OPTIONS`` is the one declaration of each dump option: its variable, config key, command-line
spelling, parser, allowed values, metavar and help. The launcher's dump flags are generated from it
(``msprobe_launch.surface``), ``overrides_from_env`` / ``to_env`` and the config's allowed values come
from it, and the README's two tables are its rendering (``python -m msprobe_inject.envvars``; a test
checks them).

This module must stay importable without torch and cheap to import: the sitecustomize bootstrap reads it
in every process that asks for dumping, helpers included.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

# User-facing variables (documented in the README). Each maps to a config key.
CONFIG = "MSPROBE_CONFIG"  # path to an msprobe config.json
DUMP_PATH = "MSPROBE_DUMP_PATH"
TASK = "MSPROBE_TASK"
LEVEL = "MSPROBE_LEVEL"
STEP = "MSPROBE_STEP"  # "0,2,4-6" or a JSON list
RANK = "MSPROBE_RANK"  # "0,1" or a JSON list
SCOPE = "MSPROBE_SCOPE"  # "start,end" or a JSON list
LIST = "MSPROBE_LIST"  # "relu,linear" or a JSON list
DATA_MODE = "MSPROBE_DATA_MODE"  # "forward,input" or a JSON list
SUMMARY_MODE = "MSPROBE_SUMMARY_MODE"
ASYNC_DUMP = "MSPROBE_ASYNC_DUMP"  # 1/0, true/false
STEP_ON = "MSPROBE_STEP_ON"  # optimizer | forward | manual
FSYNC = "MSPROBE_FSYNC"  # 1/0: a finished step's files are on stable storage before step() returns
KEEP_JOURNAL = "MSPROBE_KEEP_JOURNAL"  # 1/0: a finished step keeps its dump.journal
FLIGHT_RECORDER = "MSPROBE_FLIGHT_RECORDER"  # K: keep the last K steps in memory, write them on a trigger
FLIGHT_AFTER = "MSPROBE_FLIGHT_AFTER"  # M: steps written after the trigger step
FLIGHT_BYTES = "MSPROBE_FLIGHT_BYTES"  # the ring's memory bound per rank: bytes, or 512M / 2G
SPIKE_FACTOR = "MSPROBE_SPIKE_FACTOR"  # F: a norm above F x its median over the ring triggers (0: off)
PRESET = "MSPROBE_PRESET"  # monitor: module outputs and parameter gradients only
SPIKE_RECORDS = "MSPROBE_SPIKE_RECORDS"  # regular expression of the record names the spike rule watches
ENABLE = "MSPROBE_ENABLE"  # 0 switches everything off; 1 activates with defaults
NODE_HOOK = "MSPROBE_NODE_HOOK"  # 0: backward hooks through torch's Python API only (no C++ build, no load)
CACHE_DIR = "MSPROBE_CACHE_DIR"  # where the C++ node hooks are built (default ~/.cache/msprobe-launch)

# Internal variables set by the launcher (documented, not meant to be set by hand).
RUN_ID = "MSPROBE_RUN_ID"  # one id per launcher invocation, shared by all nodes when given
AGENT_PID = "MSPROBE_AGENT_PID"  # pid of the launcher process that runs the elastic agent / msrun
CLAIMED_PID = "MSPROBE_CLAIMED_PID"  # set by an active rank so that its exec'd children stay inert
BOOT_DIR = "MSPROBE_BOOT_DIR"  # the sitecustomize directory put first on PYTHONPATH
CLAIMED_RANK = "MSPROBE_CLAIMED_RANK"  # e.g. "RANK=0" of the claiming rank; a child with another rank var is a rank
BOOT_LOG = "MSPROBE_BOOT_LOG"  # debug: file to which the bootstrap appends one JSON line per decision

_PREFIX = "MSPROBE_"


def _parse_list(raw: str) -> list:
    raw = raw.strip()
    if not raw:
        return []
    if raw.startswith("["):
        value = json.loads(raw)
        if not isinstance(value, list):
            raise ValueError("expected a JSON list")
        return value
    items: list = []
    for part in raw.split(","):
        part = part.strip()
        if part:
            items.append(int(part) if part.isdigit() else part)
    return items


def _parse_bool(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    return raw  # left for validation to reject with the field name


# kind -> (variable text -> value, value -> variable text)
_KINDS = {
    "str": (str.strip, str),
    "path": (str.strip, os.path.abspath),  # relative to the launcher's cwd, which the ranks may not share
    "list": (_parse_list, lambda value: json.dumps(list(value))),
    "bool": (_parse_bool, lambda value: "1" if value else "0"),
    "int": (lambda raw: int(raw.strip()), str),
    "float": (lambda raw: float(raw.strip()), repr),
}


class Option(NamedTuple):
    """One dump option, declared once."""

    var: str
    key: Optional[str]  # config key; None when the value is not a config value (--config, --run-id)
    flags: Tuple[str, ...]  # command-line spellings; a "bool" option also gets each "--no-" form
    kind: str  # "str", "path", "list", "bool", "int" or "float": how the variable's text is parsed (see _KINDS)
    metavar: str
    help: str  # --help and the README (markdown); names every allowed value
    choices: Tuple[str, ...] = ()  # allowed values, checked by msprobe_inject.config
    var_help: str = ""  # the README variable table's text where it differs from ``help``

    @property
    def name(self) -> str:
        """The option's identifier (command-line parameter name): the variable without its prefix."""
        return self.var[len(_PREFIX):].lower()

    @property
    def off_flags(self) -> Tuple[str, ...]:
        return tuple("--no-" + f[2:] for f in self.flags) if self.kind == "bool" else ()

    def parse(self, raw: str) -> Any:
        """The value of the variable's text. Raises ValueError (or json.JSONDecodeError) with the reason."""
        return _KINDS[self.kind][0](raw)

    def format(self, value: Any) -> str:
        """The variable's text for a value; ``parse`` reads it back."""
        return _KINDS[self.kind][1](value)


OPTIONS: Tuple[Option, ...] = (
    Option(CONFIG, None, ("--config",), "path", "FILE",
           "An msprobe `config.json` (made absolute); the other dump options override it.",
           var_help="Path to an msprobe `config.json`."),
    Option(DUMP_PATH, "dump_path", ("--dump-path",), "str", "DIR",
           "Output directory (made absolute; default `./msprobe_dump`).",
           var_help="Output directory. Setting it (or `MSPROBE_CONFIG`) turns dumping on."),
    Option(TASK, "task", ("--task",), "str", "TASK",
           "`statistics`, `tensor`, `structure`, `overflow_check`.",
           choices=("statistics", "tensor", "structure", "overflow_check")),
    Option(LEVEL, "level", ("--level",), "str", "LEVEL",
           "`L0` (modules), `L1` (APIs), `mix`, `debug`.",
           choices=("L0", "L1", "mix", "debug")),
    Option(STEP, "step", ("--step",), "list", "LIST",
           "Steps to dump, `0,2,4-6` or a JSON list (default all)."),
    Option(RANK, "rank", ("--rank",), "list", "LIST",
           "Global ranks that dump, `0,1` or `0-3` (default all)."),
    Option(SCOPE, "scope", ("--scope",), "list", "START,END",
           "Dump only between two record names."),
    Option(LIST, "list", ("--list",), "list", "NAMES",
           "Dump only these APIs or modules, `relu,linear` or a JSON list."),
    Option(DATA_MODE, "data_mode", ("--data-mode",), "list", "MODES",
           "`all`, or a list of `input`, `output`, `forward`, `backward`.",
           choices=("all", "input", "output", "forward", "backward")),
    Option(SUMMARY_MODE, "summary_mode", ("--summary-mode",), "str", "MODE",
           "`statistics`, `md5`, `xor`.",
           choices=("statistics", "md5", "xor")),
    Option(ASYNC_DUMP, "async_dump", ("--async-dump",), "bool", "BOOL",
           "Accepted for msprobe compatibility and ignored: a rank always writes off the training thread, "
           "and `step()`/`stop()` return once the step's files are on disk. As in msprobe, it cannot be "
           "combined with `--summary-mode md5`."),
    Option(STEP_ON, "step_on", ("--step-on",), "str", "WHEN",
           "Step boundary: `optimizer` (each `optimizer.step()`, default), `forward` (each top-level model "
           "forward, for inference), `manual` (the script calls `step()`).",
           choices=("optimizer", "forward", "manual")),
    Option(FSYNC, "fsync", ("--fsync",), "bool", "BOOL",
           "At each step end, wait until the step's files are on stable storage (each file and directory "
           "fsync'ed), so that a machine crash or power loss keeps every finished step. Without it a killed "
           "process loses nothing written (the page cache outlives it), but a machine crash can lose the "
           "steps of its last seconds. Cost: one fsync per file per step (1-2% of the step at L1 on a local disk, "
           "`benchmarks/README.md`)."),
    Option(KEEP_JOURNAL, "keep_journal", ("--keep-journal",), "bool", "BOOL",
           "Keep each finished step's `dump.journal` beside its `dump.json`. By default a step's journal is "
           "removed once its `dump.json` is written, so the dump holds no duplicate."),
    Option(FLIGHT_RECORDER, "flight_recorder", ("--flight-recorder",), "int", "K",
           "Flight recorder: record every step but keep only the last K in memory, and write nothing until a "
           "trigger fires (a NaN/Inf statistic, a spike, an exception leaving the script, SIGTERM, or "
           "`debugger.trigger()`); then every rank writes steps T-K .. T+M around the trigger step T as ordinary "
           "step directories. `0` (default): off. Tasks `statistics` only; levels `L0`, `L1`, `mix`."),
    Option(FLIGHT_AFTER, "flight_after", ("--flight-after",), "int", "M",
           "Flight recorder: steps written after the trigger step (default 1)."),
    Option(FLIGHT_BYTES, "flight_bytes", ("--flight-bytes",), "str", "SIZE",
           "Flight recorder: the most memory one rank's ring holds, in bytes or with a `K`/`M`/`G` suffix "
           "(default `256M`); the oldest steps leave first."),
    Option(SPIKE_FACTOR, "spike_factor", ("--spike-factor",), "float", "F",
           "Flight recorder: a watched record whose norm exceeds F times its median over the ring triggers "
           "(default 10; `0` turns the spike rule off)."),
    Option(SPIKE_RECORDS, "spike_records", ("--spike-records",), "str", "REGEX",
           "Flight recorder: the records the spike rule watches, a regular expression searched in record names "
           "(default `loss|parameters_grad|clip_grad_norm`: the loss and the gradient norms)."),
    Option(PRESET, "preset", ("--preset",), "str", "NAME",
           "`monitor`: level L0 recording only the norms of module forward outputs and parameter gradients (Max, "
           "Min and Mean null), without stacks or the module tree: the signals of msprobe's monitor, at the "
           "lowest cost. Pairs with `--flight-recorder`.",
           choices=("monitor",)),
    Option(RUN_ID, None, ("--run-id",), "str", "ID",
           "Id shared by all nodes of one job (default `--rdzv-id` under c10d, else a fresh uuid).",
           var_help="One id per job, shared by all nodes; the launcher always sets it (`--run-id`, `--rdzv-id` "
                    "under c10d, or a uuid). Used to tell an earlier job's leftovers from a duplicate rank."),
)

_BY_NAME = {**{o.name: o for o in OPTIONS}, **{o.var: o for o in OPTIONS}}
_CONFIG_OPTIONS = tuple(o for o in OPTIONS if o.key)

ALL_USER_VARS = (CONFIG, *(o.var for o in _CONFIG_OPTIONS), ENABLE)


def option(name: str) -> Option:
    """The row named ``name`` (``"task"``, ``"run_id"``) or of the variable ``name`` (``"MSPROBE_TASK"``)."""
    return _BY_NAME[name]


def is_disabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENABLE, "").strip().lower() in ("0", "false", "no", "off")


def wants_dump(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when the environment asks for dumping (cheap: no imports, no parsing)."""
    env = os.environ if environ is None else environ
    if is_disabled(env):
        return False
    if env.get(ENABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool(env.get(DUMP_PATH) or env.get(CONFIG))


def overrides_from_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Config overrides carried by the environment, keyed by config key.

    Raises ValueError naming the variable when a value cannot be parsed.
    """
    env = os.environ if environ is None else environ
    out: Dict[str, Any] = {}
    for opt in _CONFIG_OPTIONS:
        raw = env.get(opt.var)
        if raw is None or raw == "":
            continue
        try:
            out[opt.key] = opt.parse(raw)
        except ValueError as exc:  # json.JSONDecodeError is one
            raise ValueError(f"{opt.var}={raw!r} cannot be parsed: {exc}") from None
    return out


def to_env(overrides: Mapping[str, Any]) -> Dict[str, str]:
    """Inverse of overrides_from_env, used by the launcher."""
    return {opt.var: opt.format(overrides[opt.key]) for opt in _CONFIG_OPTIONS
            if overrides.get(opt.key) is not None}


def markdown_tables() -> Tuple[List[str], List[str]]:
    """The README's rows: the launcher's dump-options table and the variables table's option rows."""
    options, variables = [], []
    for opt in OPTIONS:
        spelled = [f"`{f} {opt.metavar}`" if opt.kind != "bool" else f"`{f}`" for f in opt.flags]
        spelled += [f"`{f}`" for f in opt.off_flags]
        options.append(f"| {' / '.join(spelled)} | `{opt.var}` | {opt.help} |")
        variables.append(f"| `{opt.var}` | user / `{opt.flags[0]}` | {opt.var_help or opt.help} |")
    return options, variables


if __name__ == "__main__":
    for table in markdown_tables():
        print("\n".join(table) + "\n")
