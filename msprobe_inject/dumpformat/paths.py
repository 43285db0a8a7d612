"""Every name of a dump on disk, built and parsed here and nowhere else.

``DUMP_PATH/[attempt{k}/][duplicate_{rank}_{host}_{pid}/]step{N}/{rank{R}|proc{pid}}/`` holds
``dump.json`` (``debug.json`` at level debug), ``stack.json``, ``construct.json``, ``dump.journal``,
``dump_error_info.log`` and ``dump_tensor_data/``. The dump path also holds the job's coordination
files: ``.msprobe/procs/`` (one entry per process, written only by that process), ``.msprobe/claims/``
(one claim and one lock file per rank and attempt), ``.msprobe/runs/`` (one empty marker per run id),
``.msprobe/flight/`` (the flight recorder's trigger, one file per attempt) and
``msprobe_manifest.json`` (the combined view the launcher writes after the job).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Optional

DUMP_JSON = "dump.json"
DEBUG_JSON = "debug.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
JOURNAL = "dump.journal"
SPARE_JOURNAL = ".dump.journal.spare-"  # + pid: a finished step's journal, emptied, for the process's next step
JOURNAL_SUFFIX = ".journal"  # the flight recorder's spilled step journals: step{N}.journal
ERROR_LOG = "dump_error_info.log"
STEP_SUMMARY = ".step_summary.json"  # written beside a finished step's documents (dumpformat.stepsummary)
TENSOR_DIR = "dump_tensor_data"
MANIFEST = "msprobe_manifest.json"
META_DIR = ".msprobe"
PROCS_DIR = "procs"  # under META_DIR
CLAIMS_DIR = "claims"  # under META_DIR
RUNS_DIR = "runs"  # under META_DIR
INDEX_DIR = "index"  # under META_DIR: the readers' Parquet dataset (msprobe_readers.index)
FLIGHT_DIR = "flight"  # under META_DIR: the flight recorder's trigger marker, one per attempt
ENTRY_SUFFIX = ".json"
RECORD_FILES = (DUMP_JSON, DEBUG_JSON)  # the files that hold records
JSON_FILES = (DUMP_JSON, STACK_JSON, CONSTRUCT_JSON)

_STEP = re.compile(r"^step(\d+)$")
_PROCESS = re.compile(r"^(?:rank(\d*)|proc(\d+))$")  # msprobe writes a bare "rank" without a rank too
_ATTEMPT = re.compile(r"^attempt(\d+)(?:_[A-Za-z0-9_.-]+)?$")  # attempt{k}[_{host}_{pid}]
DUPLICATE_PREFIX = "duplicate_"
# what a dump path may hold from an earlier job: a launcher refuses to write over it without --overwrite
DUMP_ENTRY = re.compile(rf"^(step\d+|attempt\d+|duplicate_rank.*|{re.escape(MANIFEST)}|{re.escape(META_DIR)})$")


def step_dir_name(step: int) -> str:
    return f"step{step}"


def rank_dir_name(rank: Optional[int], pid: int) -> str:
    """``rank{R}``, or ``proc{pid}`` for a process whose rank is not known (msprobe's names)."""
    return f"rank{rank}" if rank is not None else f"proc{pid}"


def attempt_dir_name(attempt: int) -> str:
    return f"attempt{attempt}"


def claim_key(rank: Optional[int], pid: int) -> str:
    return rank_dir_name(rank, pid)


def process_entry_name(attempt: int, key: str, host: str, pid: int) -> str:
    """The file of one process's manifest entry: unique per process, so only that process writes it."""
    return f"attempt{attempt}_{key}_{host}_{pid}{ENTRY_SUFFIX}"


def entry_on_host(name: str, host: str) -> bool:
    """Whether a process entry's file name says it was written on ``host``."""
    stem = name[:-len(ENTRY_SUFFIX)] if name.endswith(ENTRY_SUFFIX) else name
    head, _, pid = stem.rpartition("_")
    return pid.isdigit() and head.endswith("_" + host)


def index_file(dump_path: str, version: int, attempt: int, step: int, rank: Optional[int], process: str,
               tag: str) -> str:
    """One Parquet file of the readers' index: hive partitions attempt/step/rank (-1 for proc{pid})."""
    return os.path.join(dump_path, META_DIR, INDEX_DIR, f"v{version}", f"attempt={attempt}", f"step={step}",
                        f"rank={rank if rank is not None else -1}", f"{process}-{tag}.parquet")


def flight_marker(dump_path: str, attempt: int) -> str:
    """The job's flight-recorder trigger: created once, by the first rank that triggers; every rank looks for it."""
    return os.path.join(dump_path, META_DIR, FLIGHT_DIR, f"attempt{attempt}_trigger.json")


def claim_name(attempt: int, key: str) -> str:
    return f"attempt{attempt}_{key}.json"


def claim_lock_name(attempt: int, key: str) -> str:
    """One lock per rank and attempt: only processes claiming the same rank ever wait on each other."""
    return f"attempt{attempt}_{key}.lock"


def run_marker_name(run_id: str) -> str:
    """An empty file whose presence says that the run id wrote into this dump path (found in O(1))."""
    import zlib

    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:100]
    return f"{safe}~{zlib.crc32(run_id.encode()):08x}"


def duplicate_dir_name(key: str, host: str, pid: int) -> str:
    return f"{DUPLICATE_PREFIX}{key}_{host}_{pid}"


def rank_dir(root: str, step: int, rank: Optional[int], pid: int) -> str:
    return os.path.join(root, step_dir_name(step), rank_dir_name(rank, pid))


def tensor_dir(rank_directory: str) -> str:
    return os.path.join(rank_directory, TENSOR_DIR)


def parse_step(name: str) -> Optional[int]:
    """N of a ``step{N}`` directory name, else None."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


class Process(NamedTuple):
    rank: Optional[int]  # None for proc{pid} and msprobe's bare "rank"
    pid: Optional[int]


def parse_process(name: str) -> Optional[Process]:
    """The rank (or pid) of a ``rank{R}`` / ``proc{pid}`` / ``rank`` directory name, else None."""
    m = _PROCESS.match(name)
    if not m:
        return None
    return Process(int(m.group(1)) if m.group(1) else None, int(m.group(2)) if m.group(2) else None)


def parse_attempt(name: str) -> Optional[int]:
    """k of an ``attempt{k}`` (or ``attempt{k}_{host}_{pid}``) directory name, else None."""
    m = _ATTEMPT.match(name)
    return int(m.group(1)) if m else None


def is_duplicate(name: str) -> bool:
    return name.startswith(DUPLICATE_PREFIX)
