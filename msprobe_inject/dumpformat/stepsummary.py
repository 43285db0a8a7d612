"""The step summary: a small file each rank writes beside a finished step's documents, so that the end-of-job
summary of thousands of ranks reads one small file per rank and step instead of every record.

``step{N}/{rank{R}|proc{pid}}/.step_summary.json`` holds the number of records, the first record (in
``data`` order) with a non-finite statistic, with its non-finite leaves, and the size and modification time
of the record file it describes. A reader trusts it only while that file is unchanged (a recovered or
rewritten ``dump.json`` makes it stale); otherwise it reads the records.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from . import paths
from .documents import StepRecords
from .nonfinite import has_nonfinite, nonfinite_leaves

FORMAT = 1


def build(records: StepRecords, suspect: set, record_file: str) -> Optional[bytes]:
    """The summary of a step whose record file was just written; None when that file cannot be found."""
    try:
        st = os.stat(record_file)
    except OSError:
        return None
    first = None
    if suspect:
        for position, key in enumerate(records.bodies):
            if key in suspect:
                value = json.loads(records.encoded(key))
                if has_nonfinite(value):
                    first = {"position": position, "record": key, "leaves": nonfinite_leaves(value)}
                    break
    doc = {"format": FORMAT, "file": os.path.basename(record_file), "size": st.st_size,
           "mtime_ns": st.st_mtime_ns, "records": len(records), "first_nan": first}
    return (json.dumps(doc) + "\n").encode()


def read(rank_dir: str) -> Optional[Dict[str, Any]]:
    """The step summary of a rank directory, when there is one and its record file is unchanged."""
    try:
        with open(os.path.join(rank_dir, paths.STEP_SUMMARY), encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("file") not in paths.RECORD_FILES:
            return None
        st = os.stat(os.path.join(rank_dir, doc["file"]))
    except (OSError, ValueError):
        return None
    if st.st_size != doc.get("size") or st.st_mtime_ns != doc.get("mtime_ns"):
        return None
    return doc
