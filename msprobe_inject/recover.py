"""Rebuild the json files of rank directories whose process died (kill -9, OOM) from their journals.

    python -m msprobe_inject.recover DUMP_PATH

A step whose journal lacks its end marker gets ``"incomplete": true`` in dump.json. The launcher
runs this over the dump path after every job.
"""

from __future__ import annotations

import json
import os
import sys
from typing import List, Tuple

from .writer import JOURNAL, recover


def needs_recovery(rank_dir: str) -> bool:
    """True when the journal does not end with the end marker (the process never closed the step)."""
    path = os.path.join(rank_dir, JOURNAL)
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64))
            tail = fh.read()
    except OSError:
        return False
    return not tail.rstrip().endswith(b'{"op": "end"}')


def recover_tree(dump_path: str) -> List[Tuple[str, dict]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(dump_path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "dump_tensor_data" and not d.startswith(".")]
        if JOURNAL in filenames and needs_recovery(dirpath):
            try:
                out.append((dirpath, recover(dirpath)))
            except OSError as exc:
                out.append((dirpath, {"error": str(exc)}))
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for d, res in recover_tree(args[0]):
        print(f"{d}: {json.dumps(res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
