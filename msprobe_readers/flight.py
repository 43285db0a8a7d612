"""What the flight recorder says about a dump: whether it was on, whether and why it triggered.

The job's trigger is the marker the first triggering rank created (``dumpformat.paths.flight_marker``); each
process's manifest entry adds its ring's size and its own trigger, if it fired one.
"""

from __future__ import annotations

import glob
import json
from typing import Any, Dict, List, Optional

from msprobe_inject.dumpformat import manifest, paths


def read(dump_path: str) -> Optional[Dict[str, Any]]:
    """{"steps", "after", "triggers": [marker, ...], "triggered_ranks": [...], "peak_bytes", "window"}; None when
    the dump was not written by the flight recorder."""
    triggers: List[Dict[str, Any]] = []
    pattern = paths.flight_marker(glob.escape(dump_path), 0).replace("attempt0_", "attempt*_")
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as fh:
                value = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(value, dict):
            triggers.append(value)
    entries = [e.get("flight_recorder") for _, e in manifest.iter_entries(dump_path)]
    entries = [e for e in entries if isinstance(e, dict)]
    if not entries and not triggers:
        return None
    first = entries[0] if entries else {}
    own = sorted({e["own_trigger"]["rank"] for e in entries if isinstance(e.get("own_trigger"), dict)
                  and isinstance(e["own_trigger"].get("rank"), int)})
    windows = {tuple(e["window"]) for e in entries if e.get("window")}
    return {"steps": first.get("steps"), "after": first.get("after"), "max_bytes": first.get("max_bytes"),
            "peak_bytes": max((e.get("peak_bytes") or 0 for e in entries), default=None),
            "triggers": triggers, "triggered_ranks": own,
            "window": list(sorted(windows)[0]) if len(windows) == 1 else None}


def trigger_steps(info: Optional[Dict[str, Any]]) -> List[int]:
    return sorted({t["step"] for t in (info or {}).get("triggers", []) if isinstance(t.get("step"), int)})


def describe(info: Optional[Dict[str, Any]]) -> List[str]:
    """The summary's lines about the flight recorder (none when it was off)."""
    if info is None:
        return []
    from msprobe_readers.text import human_bytes

    k = info.get("steps")
    peak = info.get("peak_bytes")
    mem = f"; ring peak {human_bytes(peak)} per rank" if peak else ""
    if not info["triggers"]:
        return [f"flight recorder (last {k} steps kept): never triggered, nothing written{mem}"]
    lines = []
    for t in info["triggers"]:
        what = t.get("record") or ""
        if t.get("kind") == "spike" and t.get("value") is not None:
            what += f" (norm {t['value']:.6g} > {t.get('median', 0):.6g} median x factor)"
        lines.append(f"flight recorder triggered: {t.get('kind')} on rank {t.get('rank')} at step {t.get('step')}"
                     + (f": {what}" if what else ""))
    window = info.get("window")
    if window:
        lines.append(f"  every rank wrote steps {window[0]}-{window[1]} (last {k} steps kept{mem})")
    if len(info["triggered_ranks"]) > 1:
        lines.append(f"  ranks that triggered on their own: {', '.join(map(str, info['triggered_ranks']))}")
    return lines
