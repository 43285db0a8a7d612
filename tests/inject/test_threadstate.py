"""The hooks' per-thread state (threadstate.thread_state; in C, _tstate.Local): each thread its own values, as
threading.local gives them."""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref

import pytest

from msprobe_inject import threadstate

tstate = pytest.importorskip("msprobe_inject._tstate")

from msprobe_inject.pytorch import state  # noqa: E402

FIELDS = (("busy", False), ("in_api", False), ("stack", list), ("depth", 0))


def _local():
    return threadstate.thread_state(FIELDS)


def test_the_adapter_uses_it_and_a_threads_first_values_are_threading_locals():
    assert type(state.tls) is tstate.Local and type(_local()) is tstate.Local
    done: list = []

    def first():  # a new thread's values: PyLocal's, lists fresh for it
        loc, ts = threadstate.thread_state(state._FIELDS), threadstate.PyLocal(state._FIELDS)
        done.append([(getattr(loc, n), getattr(ts, n)) for n, _ in state._FIELDS])
        done.append(loc.stack is not state.tls.stack)

    t = threading.Thread(target=first)
    t.start()
    t.join()
    assert done[1] is True and len(done[0]) == len(state._FIELDS) and all(a == b for a, b in done[0])


@pytest.mark.parametrize("make", [threadstate.thread_state, threadstate.PyLocal])
def test_each_thread_reads_back_what_it_set_while_the_interpreter_switches_threads_constantly(make):
    loc = make(FIELDS)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    bad: list = []

    def work(k: int) -> None:
        mine = loc.stack
        for i in range(3000):
            loc.depth = k * 100_000 + i
            loc.busy = bool(i & 1)
            if loc.depth != k * 100_000 + i or loc.busy is not bool(i & 1) or loc.stack is not mine:
                bad.append((k, i))
                return

    try:
        for _ in range(5):
            threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            work(99)
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(before)
    assert bad == []
    assert loc.depth == 99 * 100_000 + 2999 and loc.busy is True


def test_a_threads_values_go_with_it_and_other_names_are_refused():
    loc = _local()

    class Held:
        pass

    refs: list = []

    def keep() -> None:
        h = Held()
        refs.append(weakref.ref(h))
        loc.stack = [h]

    t = threading.Thread(target=keep)
    t.start()
    t.join()
    loc.busy = True  # this thread's access: the cache lets the dead thread's values go
    gc.collect()
    assert refs[0]() is None
    assert loc.stack == [] and loc.busy is True
    with pytest.raises(AttributeError):
        loc.other = 1
    with pytest.raises(AttributeError):
        loc.other  # noqa: B018
    with pytest.raises(AttributeError):
        del loc.busy
    assert "Local" in repr(type(loc))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_has_its_parent_threads_values():
    loc = _local()
    loc.depth = 7
    loc.stack.append("Module.fc")
    other = threading.Thread(target=lambda: loc.depth)  # the cache holds another thread's values: the child looks
    other.start()  # its own up in its thread's dict
    other.join()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            code = 0 if (loc.depth, loc.stack) == (7, ["Module.fc"]) else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
