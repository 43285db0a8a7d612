"""Which compiled parts the processes of a dump recorded with (each manifest entry's "native"). A process that
recorded through the Python fallbacks was slower, and nothing in its records says so."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from msprobe_inject.dumpformat import manifest

# what a missing part is, and how to get it
_PARTS = {
    "node_hooks": "the C++ node hooks (`python -m msprobe_inject.nodehook` builds them for this torch; "
                  "msprobe-launch builds them before the ranks start)",
    "api_call": "the recorded API call's C extension (reinstall msprobe-launch where a C compiler is found)",
    "entries": "the statistics' C extension (reinstall msprobe-launch where a C compiler is found)",
}


def read(dump_path: str) -> Optional[Dict[str, Any]]:
    """{"processes": entries that say, "without": {part: processes without it}}; None when no entry says."""
    said = [e["native"] for _, e in manifest.iter_entries(dump_path) if isinstance(e.get("native"), dict)]
    if not said:
        return None
    without: Dict[str, int] = {}
    for parts in said:
        for part, loaded in parts.items():
            if loaded is False:
                without[part] = without.get(part, 0) + 1
    return {"processes": len(said), "without": dict(sorted(without.items()))}


def describe(info: Optional[Dict[str, Any]]) -> List[str]:
    """The summary's lines about compiled parts missing (none when every process had them all)."""
    if not info:
        return []
    return [f"recorded without {_PARTS.get(part, part)} in {n} of {info['processes']} processes: slower recording"
            for part, n in info["without"].items()]
