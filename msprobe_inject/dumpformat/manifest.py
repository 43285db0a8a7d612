"""The run manifest: one entry file per process, and the combined view made from them.

Each process writes only its own entry, ``.msprobe/procs/attempt{k}_{key}_{host}_{pid}.json`` (claim, status,
steps, config, versions), at its start and at its end, so its cost does not grow with the number of ranks
and no process waits for another (coverage.py's parallel data files, combined later). The combined view has
the layout ``msprobe_manifest.json`` always had (``FORMAT`` 1); the launcher writes it after the job and the
readers build it on demand with ``combine``. Torch-free: the launcher and the readers import it.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import paths

FORMAT = 1
TOOL = "msprobe-launch"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def procs_dir(dump_path: str) -> str:
    return os.path.join(dump_path, paths.META_DIR, paths.PROCS_DIR)


def read_json(path: str) -> Optional[Any]:
    """Parsed JSON, or None when the file is missing, is a symlink, or is not (yet) valid."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None
        raise
    with os.fdopen(fd, "r", encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except ValueError:
            return None


def entry_files(dump_path: str) -> List[str]:
    """The entry files of every process that wrote into ``dump_path`` (any attempt, any host)."""
    try:
        with os.scandir(procs_dir(dump_path)) as it:
            return sorted(e.path for e in it if e.name.endswith(paths.ENTRY_SUFFIX) and not e.name.startswith(".")
                          and e.is_file(follow_symlinks=False))
    except OSError:
        return []


def iter_entries(dump_path: str, host: Optional[str] = None) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(file, entry) of every readable process entry; with ``host`` (as in entry names), only that host's, whose
    other entries are not even opened (a node's launcher reads its own ranks' entries, not the job's)."""
    for path in entry_files(dump_path):
        if host is not None and not paths.entry_on_host(os.path.basename(path), host):
            continue
        try:
            entry = read_json(path)
        except OSError:
            continue
        if isinstance(entry, dict):
            yield path, entry


def _most_common(values: List[Any]) -> Any:
    if not values:
        return {}
    counts = Counter(json.dumps(v, sort_keys=True) for v in values)
    return json.loads(counts.most_common(1)[0][0])


def _order(entry: Dict[str, Any]) -> Tuple:
    rank = entry.get("rank")
    return (entry.get("attempt") or 0, bool(entry.get("duplicate")), rank if isinstance(rank, int) else 1 << 30,
            str(entry.get("host")), entry.get("pid") or 0)


def build(entries: List[Dict[str, Any]], created: Optional[str] = None,
          updated: Optional[str] = None) -> Dict[str, Any]:
    """The combined manifest of process entries: the job-wide config, versions and compiled parts ("native") are
    the most common ones, and an entry keeps its own only when it differs (as the single-file manifest did)."""
    common = {name: _most_common([e[name] for e in entries if isinstance(e.get(name), dict)])
              for name in ("config", "versions", "native")}
    procs = []
    for entry in sorted(entries, key=_order):
        entry = dict(entry)
        for name, value in common.items():
            if entry.get(name) == value:
                entry.pop(name, None)
        procs.append(entry)
    starts = sorted(str(e["start_time"]) for e in entries if e.get("start_time"))
    nodes = {(p.get("host") or "", p.get("node_rank")) for p in procs}
    flights = [e["flight_recorder"] for e in entries if isinstance(e.get("flight_recorder"), dict)]
    extra: Dict[str, Any] = {}
    if flights:  # the job's view; each process entry keeps its own (ring peak, its own trigger)
        triggers = [f["trigger"] for f in flights if isinstance(f.get("trigger"), dict)]
        extra["flight_recorder"] = {"steps": flights[0].get("steps"), "after": flights[0].get("after"),
                                    "triggered": bool(triggers), "trigger": triggers[0] if triggers else None}
    return {
        "format": FORMAT, "tool": TOOL,
        "created": created or (starts[0] if starts else None), "updated": updated,
        "config": common["config"], "versions": common["versions"],
        **({"native": common["native"]} if common["native"] else {}),
        "ranks": sorted({p["rank"] for p in procs if isinstance(p.get("rank"), int)}),
        "hosts": sorted({p["host"] for p in procs if p.get("host")}),
        "attempts": sorted({p["attempt"] for p in procs if isinstance(p.get("attempt"), int)}),
        "run_ids": sorted({p["run_id"] for p in procs if p.get("run_id")}),
        "nodes": [{"host": h, "node_rank": n}
                  for h, n in sorted(nodes, key=lambda hn: (hn[1] is None, hn[1] or 0, hn[0]))],
        **extra,
        "processes": procs,
    }


def combine(dump_path: str) -> Optional[Dict[str, Any]]:
    """The current combined manifest of ``dump_path``: built from the process entries, or the
    ``msprobe_manifest.json`` of a dump written before entries existed; None when there is neither."""
    entries = [e for _, e in iter_entries(dump_path)]
    if entries:
        return build(entries)
    try:
        legacy = read_json(os.path.join(dump_path, paths.MANIFEST))
    except OSError:
        return None
    return legacy if isinstance(legacy, dict) else None


def run_seen(dump_path: str, run_id: str) -> bool:
    """Whether the run id wrote into ``dump_path``: its marker, or the manifest of an older dump, names it."""
    if not run_id:
        return False
    if os.path.lexists(os.path.join(dump_path, paths.META_DIR, paths.RUNS_DIR, paths.run_marker_name(run_id))):
        return True
    try:
        legacy = read_json(os.path.join(dump_path, paths.MANIFEST))
    except OSError:
        return False
    return isinstance(legacy, dict) and run_id in (legacy.get("run_ids") or [])
