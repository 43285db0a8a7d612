"""The contract between the launcher and the ranks: every ``MSPROBE_*`` variable, in one place.

The launcher only ever talks to the ranks through these variables; the same variables work
without the launcher (``MSPROBE_DUMP_PATH=./d torchrun ... train.py``).
This module must stay importable without torch: the sitecustomize bootstrap reads it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

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
ENABLE = "MSPROBE_ENABLE"  # 0 switches everything off; 1 activates with defaults

# Internal variables set by the launcher (documented, not meant to be set by hand).
RUN_ID = "MSPROBE_RUN_ID"  # one id per launcher invocation, shared by all nodes when given
AGENT_PID = "MSPROBE_AGENT_PID"  # pid of the launcher process that runs the elastic agent / msrun
CLAIMED_PID = "MSPROBE_CLAIMED_PID"  # set by an active rank so that its exec'd children stay inert
BOOT_DIR = "MSPROBE_BOOT_DIR"  # the sitecustomize directory put first on PYTHONPATH
CLAIMED_RANK = "MSPROBE_CLAIMED_RANK"  # e.g. "RANK=0" of the claiming rank; a child with another rank var is a rank
BOOT_LOG = "MSPROBE_BOOT_LOG"  # debug: file to which the bootstrap appends one JSON line per decision

# env name -> (config key, kind)
_USER_VARS: Dict[str, tuple] = {
    DUMP_PATH: ("dump_path", "str"),
    TASK: ("task", "str"),
    LEVEL: ("level", "str"),
    STEP: ("step", "list"),
    RANK: ("rank", "list"),
    SCOPE: ("scope", "list"),
    LIST: ("list", "list"),
    DATA_MODE: ("data_mode", "list"),
    SUMMARY_MODE: ("summary_mode", "str"),
    ASYNC_DUMP: ("async_dump", "bool"),
    STEP_ON: ("step_on", "str"),
}

ALL_USER_VARS = (CONFIG, *_USER_VARS.keys(), ENABLE)


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
    for var, (key, kind) in _USER_VARS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            if kind == "list":
                out[key] = _parse_list(raw)
            elif kind == "bool":
                out[key] = _parse_bool(raw)
            else:
                out[key] = raw.strip()
        except (ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"{var}={raw!r} cannot be parsed: {exc}") from None
    return out


def to_env(overrides: Mapping[str, Any]) -> Dict[str, str]:
    """Inverse of overrides_from_env, used by the launcher."""
    out: Dict[str, str] = {}
    for var, (key, kind) in _USER_VARS.items():
        if key not in overrides or overrides[key] is None:
            continue
        value = overrides[key]
        if kind == "list":
            out[var] = json.dumps(list(value))
        elif kind == "bool":
            out[var] = "1" if value else "0"
        else:
            out[var] = str(value)
    return out
