"""Per-thread state with fixed attributes: each framework adapter's (busy, in_api, the module stack, ...).

The hooks read and set it about twenty times per recorded call. threading.local costs ~440 instructions per read and
~570 per set; the C Local (_tstate.c) gives the same per-thread values for a few dozen. PyLocal is the same state on
threading.local where the C is not built.

quiet_sections(local, guard, c_guard) makes the tool's quiet sections over that state: the busy flag set (the hooks
pass straight through) and the framework's dispatch guard entered, both put back on leaving. In C (_tstate.Quiet) a
section costs no interpreter frame, and with the guard as C functions (torch's, from the C++ node hooks' module) no
object either; PyQuiet is the same in Python. One owner of what a quiet section is: the recorder's bodies, the API
hooks and both adapters enter these (the C bodies through _tstate's quiet_api, the same functions)."""

from __future__ import annotations

import threading
from typing import Any, Callable, ContextManager, Optional, Protocol, Tuple

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


class QuietSections(Protocol):
    """What quiet_sections makes: ``with quiet():`` runs one section; the per-record bodies use ``sec =
    quiet.enter()`` and ``quiet.leave(sec)`` in a try/finally, the same section without the with statement's
    lookups (about a tenth of a microsecond each)."""

    def __call__(self) -> ContextManager[None]: ...

    def enter(self) -> Any: ...

    def leave(self, section: Any) -> None: ...


class PySection:
    """One quiet section in Python (where _tstate is not built): the busy flag set and a fresh guard() entered; on
    leaving, the guard exited and the flag put back to what it was, whatever the guard's exit does. A guard whose
    entry fails leaves the flag as it was."""

    __slots__ = ("_local", "_guard", "_prev", "_entered")

    def __init__(self, local: Any, guard: Optional[Callable[[], Any]]) -> None:
        self._local = local
        self._guard = guard

    def __enter__(self) -> None:
        local = self._local
        prev = self._prev = local.busy
        local.busy = True
        self._entered = None
        if self._guard is not None:
            try:
                g = self._guard()
                g.__enter__()
            except BaseException:
                local.busy = prev
                raise
            self._entered = g

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._entered is not None:
                self._entered.__exit__(None, None, None)
        finally:
            self._entered = None
            self._local.busy = self._prev


class PyQuiet:
    """_tstate.Quiet in Python: its sections are PySection's."""

    __slots__ = ("_local", "_guard")

    def __init__(self, local: Any, guard: Optional[Callable[[], Any]]) -> None:
        self._local = local
        self._guard = guard

    def __call__(self) -> PySection:
        return PySection(self._local, self._guard)

    def enter(self) -> PySection:
        sec = PySection(self._local, self._guard)
        sec.__enter__()
        return sec

    def leave(self, section: PySection) -> None:
        section.__exit__(None, None, None)


def quiet_sections(local: Any, guard: Optional[Callable[[], Any]], c_guard: Any = None) -> QuietSections:
    """Quiet sections over local's ``busy`` flag with the framework's dispatch guard (a callable making a context
    manager, or None): in C where local is the C Local, else in Python. ``c_guard``, where the framework's C
    extension gives one, is the same guard as C functions (_tstate.h's tf_guard capsule): the C sections enter it in
    place of ``guard``, with no object made per section."""
    try:
        from ._tstate import Local, Quiet
    except ImportError:
        return PyQuiet(local, guard)
    if type(local) is Local:
        return Quiet(local, "busy", guard if c_guard is None else c_guard)
    return PyQuiet(local, guard)
