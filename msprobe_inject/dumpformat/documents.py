"""One step's records of one rank, in msprobe's order, and the documents written from them.

Record bodies are held encoded (strings are not tracked by the garbage collector, so a step's records do
not pile up in its older generations). A body arrives whole (``set``) or as members merged into the
record (``merge``: a parameter gradient per parameter; ``move``: a module call's output and parameters,
which also moves the record to where the call completed, msprobe's position for module records).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple, Union

from . import paths
from .encoding import data_section, dumps_document, encode_key, join_members

SET = "set"
MERGE = "merge"
MOVE = "move"

Body = Union[str, Dict[str, str]]  # a whole encoded body, or encoded members


class StepRecords:
    """The records, stacks and module tree of one step of one rank."""

    def __init__(self, header: Dict[str, Any], kind: str = "dump"):
        self.header = header  # keys starting with "_" are ours and never written to dump.json
        self.kind = kind  # "dump" or "debug"
        self.bodies: Dict[str, Body] = {}
        # each stack text in order of first use, its keys at the same position: a text (a tuple of lines, whose
        # hash is not cached) is looked up once per stack, in stack_pos
        self.stack_order: List[Tuple] = []  # the journal names a repeated stack by its position here
        self.stack_keys: List[List[str]] = []
        self.stack_pos: Dict[Tuple, int] = {}
        self.construct: Dict[str, Any] = {}
        self.dirty = True

    # ---- records ----
    def set(self, key: str, encoded: str) -> None:
        self.bodies[key] = encoded
        self.dirty = True

    def merge(self, key: str, members: Dict[str, str], move: bool = False) -> None:
        cur = self.bodies.pop(key, None) if move else self.bodies.get(key)
        if isinstance(cur, str):  # a whole body: its members become mergeable (rare: a re-sent record)
            try:
                cur = {k: json.dumps(v) for k, v in json.loads(cur).items()}
            except (ValueError, AttributeError):
                cur = None
        merged = dict(cur) if isinstance(cur, dict) else {}
        merged.update(members)
        self.bodies[key] = merged
        self.dirty = True

    def apply(self, op: str, key: str, value: Any) -> None:
        """A journal operation with a decoded value (replay); the writer calls set/merge directly."""
        if op == SET:
            self.set(key, json.dumps(value))
        elif op in (MERGE, MOVE, "update"):  # "update": journals written before version 2
            if isinstance(value, dict):
                self.merge(key, {k: json.dumps(v) for k, v in value.items()}, move=op == MOVE)
            else:
                self.set(key, json.dumps(value))
        elif op == "construct":
            self.construct[key] = value
        elif op == "stack":
            self.add_stack(key, tuple(value))
        elif op == "stackref":
            self.stack_keys[value].append(key)
        self.dirty = True

    def __contains__(self, key: str) -> bool:
        return key in self.bodies

    def __len__(self) -> int:
        return len(self.bodies)

    def add_stack(self, key: str, text: Tuple) -> Optional[int]:
        """Record key's stack; its position when this step has seen that stack before, else None."""
        pos = self.stack_pos.get(text)
        if pos is None:
            self.stack_pos[text] = len(self.stack_order)
            self.stack_order.append(text)
            self.stack_keys.append([key])
            self.dirty = True
            return None
        self.stack_keys[pos].append(key)
        self.dirty = True
        return pos

    def add_construct(self, key: str, parent: Any) -> None:
        self.construct[key] = parent
        self.dirty = True

    # ---- documents ----
    def encoded(self, key: str) -> Optional[str]:
        body = self.bodies.get(key)
        return join_members(body) if isinstance(body, dict) else body

    def items(self):
        """(key, decoded body) in order: for readers of a replayed journal."""
        for key in self.bodies:
            yield key, json.loads(self.encoded(key))

    def main_bytes(self) -> bytes:
        """dump.json / debug.json: the header, then one record per line (each body encoded once)."""
        head = {k: v for k, v in self.header.items() if not k.startswith("_")}
        parts = ["{\n"]
        for k, v in head.items():
            parts.append(f" {json.dumps(k)}: {json.dumps(v)},\n")
        data = data_section(self.bodies) if data_section is not None else None
        if data is not None:
            return "".join(parts).encode("ascii", "backslashreplace") + data
        recs = [f"\n  {encode_key(k)}: {v if isinstance(v, str) else join_members(v)}"
                for k, v in self.bodies.items()]
        parts.append(' "data": {' + ",".join(recs) + ("\n }\n}\n" if recs else "}\n}\n"))
        return "".join(parts).encode("ascii", "backslashreplace")

    def is_empty(self, name: str) -> bool:
        if name == paths.STACK_JSON:
            return not self.stack_order
        return name == paths.CONSTRUCT_JSON and not self.construct

    def documents(self) -> Dict[str, bytes]:
        """File name -> contents."""
        if self.kind == "debug":
            return {paths.DEBUG_JSON: self.main_bytes()}
        docs = {paths.DUMP_JSON: self.main_bytes()}
        if self.header.get("_extra_info", True):
            docs[paths.STACK_JSON] = dumps_document(
                {str(i): [keys, list(fr)] for i, (fr, keys) in enumerate(zip(self.stack_order, self.stack_keys))})
            docs[paths.CONSTRUCT_JSON] = dumps_document(self.construct)
        return docs
