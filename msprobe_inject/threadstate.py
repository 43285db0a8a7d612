"""Per-thread state with fixed attributes: each framework adapter's (busy, in_api, the module stack, ...).

The hooks read and set it about twenty times per recorded call. threading.local costs ~440 instructions per read and
~570 per set; the C Local (_tstate.c) gives the same per-thread values for a few dozen. PyLocal is the same state on
threading.local where the C is not built."""

from __future__ import annotations

import threading
from typing import Any, Tuple

Fields = Tuple[Tuple[str, Any], ...]  # (attribute, a thread's first value; a callable is called for each thread)


class PyLocal(threading.local):
    """The fields per thread on threading.local (which calls __init__ in each thread with the same fields)."""

    def __init__(self, fields: Fields) -> None:
        for name, first in fields:
            setattr(self, name, first() if callable(first) else first)


def thread_state(fields: Fields) -> Any:
    """An object whose attributes are the fields, each thread seeing its own values: the C Local where built."""
    try:
        from ._tstate import Local
    except ImportError:
        return PyLocal(fields)
    return Local(tuple(n for n, _ in fields), tuple(d for _, d in fields))
