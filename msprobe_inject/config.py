"""One validated configuration object, resolved from config.json, keyword arguments and the environment.

Precedence (lowest first): defaults, config.json, environment (MSPROBE_*), explicit keyword arguments.
The schema is msprobe's config.json; a bad value raises ConfigError naming the key and the allowed values.
Importable without torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from . import envvars
from .dumpformat import names

# The options the launcher and the environment also carry declare their allowed values in envvars.OPTIONS.
TASKS = envvars.option("task").choices
LEVELS = envvars.option("level").choices
SUMMARY_MODES = envvars.option("summary_mode").choices
DATA_MODES = envvars.option("data_mode").choices
STEP_ON = envvars.option("step_on").choices
RISK_LEVELS = ("CORE", "FOCUS", "ALL")
PRECISIONS = ("low", "high")
_NPU_ONLY_TASKS = ("diff_check", "nan_check", "acc_check", "exception_dump")
_MAX_STEP = 1_000_000
DEFAULT_SPIKE_RECORDS = "loss|parameters_grad|clip_grad_norm"
FLIGHT_TASKS = ("statistics",)
FLIGHT_LEVELS = ("L0", "L1", "mix")
_SIZE = re.compile(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", re.IGNORECASE)
# Keys of a task section of config.json that this runtime understands.
_SECTION_KEYS = ("scope", "list", "data_mode", "summary_mode", "tensor_list", "overflow_nums")


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the key and the allowed values."""

    def __init__(self, key: str, message: str):
        super().__init__(f"[msprobe-launch] invalid config '{key}': {message}")
        self.key = key


def _new_list() -> list:
    return []


@dataclass
class DumpConfig:
    dump_path: str = "./msprobe_dump"
    task: str = "statistics"
    level: str = "L1"
    rank: List[int] = field(default_factory=_new_list)
    step: List[int] = field(default_factory=_new_list)
    scope: List[str] = field(default_factory=_new_list)
    list: List[str] = field(default_factory=_new_list)
    tensor_list: List[str] = field(default_factory=_new_list)
    data_mode: List[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    async_dump: bool = False
    extra_info: bool = True
    precision: str = "low"
    risk_level: str = "FOCUS"
    all_apis: bool = False  # widen L1 beyond msprobe's API list: every torch function call is recorded
    # reduce each distinct tensor once per step (off: every occurrence is reduced); only where records hold
    # inputs, as an input is mostly an earlier call's output (see the encoder's use_cache)
    stat_cache: bool = True
    overflow_nums: int = 1
    step_on: str = "optimizer"  # zero-code step boundary
    pending_bytes: int = 256 << 20  # tensor task: memory budget of queued writes
    fsync: bool = False  # each finished step's files reach stable storage before step() returns
    keep_journal: bool = False  # a finished step keeps its dump.journal beside dump.json
    flight_recorder: int = 0  # K > 0: keep the last K steps in memory, write them around a trigger
    flight_after: int = 1  # M: steps written after the trigger step
    flight_bytes: int = 256 << 20  # the ring's memory bound per rank
    spike_factor: float = 10.0
    spike_records: str = DEFAULT_SPIKE_RECORDS
    preset: str = ""  # "monitor": module outputs and parameter gradients only (level L0, no stacks)

    # derived, not user keys
    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @property
    def forward_enabled(self) -> bool:
        return "all" in self.data_mode or "forward" in self.data_mode or "backward" not in self.data_mode

    @property
    def backward_enabled(self) -> bool:
        return "all" in self.data_mode or "backward" in self.data_mode or "forward" not in self.data_mode

    @property
    def input_enabled(self) -> bool:
        return "all" in self.data_mode or "input" in self.data_mode or "output" not in self.data_mode

    @property
    def output_enabled(self) -> bool:
        return "all" in self.data_mode or "output" in self.data_mode or "input" not in self.data_mode

    @property
    def inputs_recorded(self) -> bool:
        """Records hold inputs: data_mode asks for them and the preset keeps them (monitor: outputs only)."""
        return self.input_enabled and self.preset != "monitor"

    @property
    def norm_only(self) -> bool:
        """Tensor entries carry their Norm alone, Max, Min and Mean null (monitor: the norms are its signals; in the
        statistics mode, where the others cost most of the read)."""
        return self.preset == "monitor" and self.summary_mode == "statistics" and self.task == "statistics" \
            and self.precision != "high"  # precision high: msprobe writes no Norm at all


def _allowed(values) -> str:
    return ", ".join(repr(v) for v in values)


def _expand_ranges(key: str, value: Any) -> List[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, f"must be a list of ints or 'a-b' range strings, got {value!r}")
    out = set()
    for item in value:
        if isinstance(item, bool):
            raise ConfigError(key, f"element {item!r} must be an int or a string like '3' or '3-5'")
        if isinstance(item, int):
            lo = hi = item
        elif isinstance(item, str):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
            if not m:
                raise ConfigError(key, f"element {item!r} must look like '3' or '3-5'")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if lo > hi:
                raise ConfigError(key, f"range {item!r}: left boundary {lo} is greater than right boundary {hi}")
        else:
            raise ConfigError(key, f"element {item!r} must be an int or a string like '3' or '3-5'")
        if lo < 0 or hi > _MAX_STEP:
            raise ConfigError(key, f"element {item!r} must be between 0 and {_MAX_STEP}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _str_list(key: str, value: Any) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, f"must be a list of strings, got {value!r}")
    return list(value)


def _choice(key: str, value: Any, allowed) -> str:
    if value not in allowed:
        extra = ""
        if key == "task" and value in _NPU_ONLY_TASKS:
            extra = " (that task needs an Ascend NPU and is not supported here)"
        raise ConfigError(key, f"{value!r} is not allowed{extra}; allowed values: {_allowed(allowed)}")
    return value


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be a boolean (true/false), got {value!r}")
    return value




def _size(key: str, value: Any) -> int:
    """Bytes: an int, or a string such as '512M', '2G', '64KiB'."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) <= 0:
        raise ConfigError(key, f"must be a positive size in bytes, or with a K/M/G suffix like '512M', got {value!r}")
    unit = (m.group(2) or "B")[0].upper()
    return int(m.group(1)) << {"B": 0, "K": 10, "M": 20, "G": 30}[unit]


def _check_data_mode(modes: List[str]) -> List[str]:
    if not modes:
        return ["all"]
    for m in modes:
        if m not in DATA_MODES:
            raise ConfigError("data_mode", f"element {m!r} is not allowed; allowed values: {_allowed(DATA_MODES)}")
    if "all" in modes and len(modes) > 1:
        raise ConfigError("data_mode", "'all' cannot be combined with other values")
    return list(dict.fromkeys(modes))


def _check_scope(scope: List[str], level: str) -> List[str]:
    if not scope:
        return []
    if len(scope) != 2:
        raise ConfigError("scope", f"must be empty or exactly two full record names [start, end], got {scope!r}")
    for name in scope:
        parsed = names.parse(name)
        is_module = parsed is not None and parsed.kind == "module" and parsed.direction != names.PARAMETERS_GRAD
        is_api = parsed is not None and parsed.kind == "api"
        ok = (level == "L0" and is_module) or (level == "L1" and is_api) or (level == "mix" and (is_module or is_api))
        if not ok:
            want = {"L0": "module names like 'Module.fc1.Linear.forward.0' (MindSpore: 'Cell.fc1.Dense.forward.0')",
                    "L1": "API names like 'Functional.linear.0.forward'"}.get(level, "module or API record names")
            raise ConfigError("scope", f"{name!r} is not valid at level {level}; expected {want}")
    return list(scope)


def _check_list(items: List[str]) -> List[str]:
    for item in items:
        if item.startswith("name-regex(") and item.endswith(")"):
            try:
                re.compile(item[len("name-regex("):-1])
            except re.error as exc:
                raise ConfigError("list", f"{item!r} is not a valid regular expression: {exc}")
    return items


def read_config_file(path: str) -> Dict[str, Any]:
    """Flatten an msprobe config.json into config keys (the task's section merged in)."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise ConfigError("config_path", f"cannot read {path!r}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        raise ConfigError("config_path", f"{path!r} is not valid JSON: {exc}")
    if not isinstance(raw, dict):
        raise ConfigError("config_path", f"{path!r} must hold a JSON object")
    return flatten(raw)


def flatten(raw: Mapping[str, Any]) -> Dict[str, Any]:
    flat = {k: v for k, v in raw.items() if not isinstance(v, dict) or k in ("load",)}
    task = raw.get("task", "statistics")
    section = raw.get(task) if isinstance(task, str) else None
    if isinstance(section, dict):
        for key in _SECTION_KEYS:
            if key in section:
                flat[key] = section[key]
    return flat


_KNOWN = {f for f in DumpConfig.__dataclass_fields__}


def build_config(values: Mapping[str, Any]) -> DumpConfig:
    """Validate flat key/values into a DumpConfig. Unknown keys are ignored, like msprobe."""
    v = {k: val for k, val in values.items() if k in _KNOWN and val is not None}
    cfg = DumpConfig()
    if "dump_path" in v:
        if not isinstance(v["dump_path"], str) or not v["dump_path"].strip():
            raise ConfigError("dump_path", f"must be a non-empty string, got {v['dump_path']!r}")
        cfg.dump_path = v["dump_path"]
    cfg.task = _choice("task", v.get("task", cfg.task), TASKS)
    cfg.level = _choice("level", v.get("level", cfg.level), LEVELS)
    cfg.rank = _expand_ranges("rank", v.get("rank", []))
    cfg.step = _expand_ranges("step", v.get("step", []))
    cfg.list = _check_list(_str_list("list", v.get("list", [])))
    cfg.tensor_list = _str_list("tensor_list", v.get("tensor_list", []))
    dm = v.get("data_mode", ["all"])
    if not isinstance(dm, (list, tuple)):
        raise ConfigError("data_mode", f"must be a list of strings from {_allowed(DATA_MODES)}, got {dm!r}")
    cfg.data_mode = _check_data_mode(_str_list("data_mode", dm))
    cfg.summary_mode = _choice("summary_mode", v.get("summary_mode", cfg.summary_mode), SUMMARY_MODES)
    for key in ("async_dump", "extra_info", "all_apis", "stat_cache", "fsync", "keep_journal"):
        if key in v:
            setattr(cfg, key, _bool(key, v[key]))
    cfg.precision = _choice("precision", v.get("precision", cfg.precision), PRECISIONS)
    cfg.risk_level = _choice("risk_level", v.get("risk_level", cfg.risk_level), RISK_LEVELS)
    cfg.step_on = _choice("step_on", v.get("step_on", cfg.step_on), STEP_ON)
    if "overflow_nums" in v:
        n = v["overflow_nums"]
        if isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1):
            raise ConfigError("overflow_nums", f"must be -1 (no limit) or a positive int, got {n!r}")
        cfg.overflow_nums = n
    if "pending_bytes" in v:
        n = v["pending_bytes"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("pending_bytes", f"must be a positive int (bytes), got {n!r}")
        cfg.pending_bytes = n
    for key, low in (("flight_recorder", 0), ("flight_after", 0)):
        if key in v:
            n = v[key]
            if isinstance(n, bool) or not isinstance(n, int) or n < low:
                raise ConfigError(key, f"must be an int >= {low} (steps), got {n!r}")
            setattr(cfg, key, n)
    if "flight_bytes" in v:
        cfg.flight_bytes = _size("flight_bytes", v["flight_bytes"])
    if "spike_factor" in v:
        f = v["spike_factor"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 0 or f == float("inf"):
            raise ConfigError("spike_factor", f"must be a number >= 0 (0: no spike rule), got {f!r}")
        cfg.spike_factor = float(f)
    if "spike_records" in v:
        pattern = v["spike_records"]
        if not isinstance(pattern, str):
            raise ConfigError("spike_records", f"must be a regular expression (string), got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError("spike_records", f"{pattern!r} is not a valid regular expression: {exc}")
        cfg.spike_records = pattern
    if v.get("preset"):
        cfg.preset = _choice("preset", v["preset"], envvars.option("preset").choices)
        if "level" in v and v["level"] != "L0":
            raise ConfigError("level", f"{v['level']!r} cannot be combined with preset 'monitor'; allowed values: 'L0'")
        cfg.level = "L0"
        cfg.extra_info = False
    if cfg.task == "structure" and cfg.level == "L1":
        cfg.level = "mix"  # msprobe promotes L1 to mix for structure
    cfg.scope = _check_scope(_str_list("scope", v.get("scope", [])), cfg.level)
    if cfg.flight_recorder:
        if cfg.task not in FLIGHT_TASKS:
            raise ConfigError("task", f"{cfg.task!r} cannot be combined with flight_recorder; allowed values: "
                                      f"{_allowed(FLIGHT_TASKS)}")
        if cfg.level not in FLIGHT_LEVELS:
            raise ConfigError("level", f"{cfg.level!r} cannot be combined with flight_recorder; allowed values: "
                                       f"{_allowed(FLIGHT_LEVELS)}")
        if cfg.step:
            raise ConfigError("step", "cannot be combined with flight_recorder, which records every step and "
                                      "writes the steps around a trigger")
    if cfg.async_dump and cfg.summary_mode == "md5":
        raise ConfigError("async_dump", "cannot be true together with summary_mode 'md5'")
    return cfg


def resolve(
    config_path: Optional[str] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    use_env: bool = True,
    environ: Optional[Mapping[str, str]] = None,
) -> DumpConfig:
    """The one place where config.json, the environment and keyword arguments meet."""
    env = os.environ if environ is None else environ
    values: Dict[str, Any] = {}
    path = config_path or (env.get(envvars.CONFIG) if use_env else None)
    if path:
        values.update(read_config_file(path))
    if use_env:
        try:
            values.update(envvars.overrides_from_env(env))
        except ValueError as exc:
            raise ConfigError("environment", str(exc))
    for key, val in (overrides or {}).items():
        if val is not None:
            values[key] = val
    return build_config(values)
