"""The journal: each rank directory's append-only record log, from which its documents can be rebuilt.

One JSON object per line: ``{"op": "open", "v": header}`` first, then record operations
(``set``/``merge``/``move`` with ``"k"`` the record name and ``"v"`` the body or its members;
``construct``, ``stack``, ``stackref``), and ``{"op": "end"}`` once the step's documents are final.
A journal without its end line belongs to a process that died during the step (or still runs).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, Optional, Tuple

from . import files, paths
from .documents import StepRecords
from .encoding import encode, encode_key

VERSION = 2  # 2: merge/move carry only the members they add; 1 had "update" and a whole-body "move"
END_LINE = b'{"op": "end"}\n'
_TAIL = 4096  # the end line is looked for in the last bytes of a journal


def open_line(header: Dict[str, Any], kind: str) -> bytes:
    return encode({"op": "open", "v": dict(header, _kind=kind, _journal=VERSION)}).encode() + b"\n"


def record_line(op: str, key: str, encoded: str) -> bytes:
    """A record operation whose value is already encoded (the writer encodes each body once)."""
    return f'{{"op": "{op}", "k": {encode_key(key)}, "v": {encoded}}}\n'.encode("ascii", "backslashreplace")


def construct_line(key: str, parent: Any) -> bytes:
    return record_line("construct", key, encode(parent))


def stack_line(key: str, encoded_text: str) -> bytes:
    return record_line("stack", key, encoded_text)


def stackref_line(key: str, position: int) -> bytes:
    return record_line("stackref", key, str(position))


def is_complete(path: str) -> Optional[bool]:
    """None without a journal at path; else whether its last line is the end line."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _TAIL))
            tail = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if line.strip():
            return line.strip() + b"\n" == END_LINE
    return False


def replay(path: str, directory: Optional[str] = None) -> Tuple[Optional[StepRecords], int, bool]:
    """(records of the journal's last opened step, operations replayed, complete). A torn last line (the
    process died while writing it) ends the replay; everything before it counts."""
    st: Optional[StepRecords] = None
    complete = False
    n = 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                ev = json.loads(raw)
            except ValueError:
                break
            op = ev.get("op")
            if op == "open":
                head = dict(ev["v"])
                kind = head.pop("_kind", "dump")
                head.pop("_journal", None)
                st = StepRecords(head, kind)
                complete = False
            elif op == "end":
                complete = True
            elif st is not None:
                st.apply(op, ev.get("k"), ev.get("v"))
                n += 1
    return st, n, complete


def iter_records(path: str) -> Iterator[Tuple[str, Any]]:
    """The records a journal holds, decoded, in execution order (for readers when dump.json is missing)."""
    st, _, _ = replay(path)
    if st is not None:
        yield from st.items()


def needs_recovery(rank_dir: str) -> bool:
    """A journal without its end line: the process never closed the step."""
    return is_complete(os.path.join(rank_dir, paths.JOURNAL)) is False


def recover(rank_dir: str) -> Dict[str, Any]:
    """Rebuild the documents of a rank directory from its journal (after a crash).

    Returns {"records": n, "complete": bool}. A step whose journal lacks the end line is marked
    ``"incomplete": true`` in dump.json, so readers can tell.
    """
    st, n, complete = replay(os.path.join(rank_dir, paths.JOURNAL))
    if st is None:
        return {"records": 0, "complete": False}
    if not complete:
        st.header["incomplete"] = True
    for name, data in st.documents().items():
        files.write_atomic(os.path.join(rank_dir, name), data)
    return {"records": n, "complete": complete}


def recover_tree(dump_path: str):
    """recover() every rank directory below dump_path whose journal has no end line: [(dir, result)]."""
    out = []
    for dirpath, dirnames, filenames in os.walk(dump_path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != paths.TENSOR_DIR and not d.startswith(".")]
        if paths.JOURNAL in filenames and needs_recovery(dirpath):
            try:
                out.append((dirpath, recover(dirpath)))
            except OSError as exc:
                out.append((dirpath, {"error": str(exc)}))
    return out
