"""What both frameworks' value encoders share: the settings they read, the skip entry of a tensor that
cannot be encoded, and msprobe's entries of plain Python values."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

try:  # what waits for the writer thread (entries, record bodies, events) left untracked by the collector (_fastats.c)
    from ._fastats import untrack
except ImportError:  # pragma: no cover - without the C extension (or one built before it): the collector follows them

    def untrack(entry: Any) -> Any:
        return entry


class Pending(list):
    """(entry, statistics, kind) triples of one record, resolved in the writer thread."""


class EncoderBase:
    """One instance per session; per-record state is passed in."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("some_files", "__dict__", "__weakref__")

    tensor_type_name = ""

    def __init__(self, cfg: Any, tensor_dir_fn: Callable[[], str], writer: Any):
        self.cfg = cfg
        self.high = cfg.precision == "high"
        self.summary = cfg.summary_mode
        self.norm_only = cfg.norm_only  # tensor entries carry their Norm alone (monitor preset)
        self.structure = cfg.task == "structure"
        self.save_all = cfg.task == "tensor"
        self.tensor_list = list(cfg.tensor_list)
        # whether any record's tensors go to files: the hot paths ask this before wants_files (a call per value)
        self.some_files = self.save_all or bool(self.tensor_list)
        self._tensor_dir = tensor_dir_fn
        self._writer = writer

    def wants_files(self, key: str) -> bool:
        return self.save_all or (bool(self.tensor_list) and any(s in key for s in self.tensor_list))

    def skipped(self, exc: Exception, file_name: Optional[str], **known: Any) -> Dict[str, Any]:
        """The entry of a tensor that could not be encoded: a clear skip, never an exception in user code."""
        msg = f"{type(exc).__name__}: {exc}"[:200]
        self._writer.log_error(f"tensor {file_name or ''} skipped: {msg}")
        return {"type": self.tensor_type_name, **known, "error": msg}


def builtin(v: Any, bound: Callable[[Any], Any]) -> Dict[str, Any]:
    """msprobe's entry of a bool, int, float, str, slice or Ellipsis; bound turns a slice bound into an
    int/float or None (a framework's 0-d tensors are bounds too)."""
    if isinstance(v, bool):
        return {"type": "bool", "value": v}
    if isinstance(v, int):
        return {"type": "int", "value": v}
    if isinstance(v, float):
        return {"type": "float", "value": v}
    if isinstance(v, str):
        return {"type": "str", "value": v}
    if isinstance(v, slice):
        vals: List[Any] = [None if x is None else bound(x) for x in (v.start, v.stop, v.step)]
        return {"type": "slice", "value": vals}
    return {"type": "ellipsis", "value": "..."}
