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


def _switching(work, rounds: int) -> None:
    """work(k) in 8 threads and this one (k 99), rounds times, the interpreter switching threads constantly."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(rounds):
            threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            work(99)
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(before)


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
    bad: list = []

    def work(k: int) -> None:
        mine = loc.stack
        for i in range(3000):
            loc.depth = k * 100_000 + i
            loc.busy = bool(i & 1)
            if loc.depth != k * 100_000 + i or loc.busy is not bool(i & 1) or loc.stack is not mine:
                bad.append((k, i))
                return

    _switching(work, 5)
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


# ---- quiet sections (threadstate.quiet_sections: _tstate.Quiet in C, PyQuiet in Python) ----

class _Guard:
    """A dispatch guard that logs its entries and exits, and fails where told."""

    log: list = []
    fail_enter = False
    fail_exit = False

    def __enter__(self):
        _Guard.log.append(("enter", state_busy()))
        if _Guard.fail_enter:
            raise RuntimeError("enter refused")

    def __exit__(self, *exc):
        _Guard.log.append(("exit", state_busy()))
        if _Guard.fail_exit:
            raise KeyError("exit refused")


_LOC: list = []


def state_busy():
    return _LOC[0].busy


def _sections(kind: str, guard=_Guard):
    loc = _local() if kind == "c" else threadstate.PyLocal(FIELDS)
    _LOC[:] = [loc]
    _Guard.log, _Guard.fail_enter, _Guard.fail_exit = [], False, False
    return loc, threadstate.quiet_sections(loc, guard)


@pytest.mark.parametrize("kind", ["c", "python"])
def test_a_quiet_section_sets_the_flag_inside_the_guard_and_puts_back_what_was_there(kind):
    loc, quiet = _sections(kind)
    assert (type(quiet) is tstate.Quiet) == (kind == "c")
    loc.busy = "before"  # not a bool: what was there comes back, not False
    with quiet():
        assert loc.busy is True
        with quiet():  # nested: the inner one puts back True
            pass
        assert loc.busy is True
    assert loc.busy == "before"
    assert _Guard.log == [("enter", True), ("enter", True), ("exit", True), ("exit", True)]
    with pytest.raises(ValueError):
        with quiet():
            raise ValueError("the section's own error goes on")
    assert loc.busy == "before" and _Guard.log[-1] == ("exit", True)
    sec = quiet.enter()  # the per-record bodies' form: the same section
    assert loc.busy is True and _Guard.log[-1] == ("enter", True)
    quiet.leave(sec)
    assert loc.busy == "before" and _Guard.log[-1] == ("exit", True)
    loc.busy = False
    _Guard.log.clear()
    _, bare = _sections(kind, None)
    _LOC[:] = [loc]
    with bare():
        pass
    assert _Guard.log == []


@pytest.mark.parametrize("kind", ["c", "python"])
def test_a_guard_that_fails_leaves_the_flag_as_it_was(kind):
    loc, quiet = _sections(kind)
    _Guard.fail_enter = True
    with pytest.raises(RuntimeError, match="enter refused"):
        with quiet():
            raise AssertionError("a section whose guard failed is not entered")
    assert loc.busy is False and _Guard.log == [("enter", True)]
    _Guard.fail_enter, _Guard.fail_exit = False, True
    with pytest.raises(KeyError, match="exit refused"):
        with quiet():
            pass
    assert loc.busy is False


@pytest.mark.parametrize("kind", ["c", "python"])
def test_each_thread_enters_its_own_sections_while_the_interpreter_switches_threads_constantly(kind):
    class Slow:  # a guard running Python code, so that threads switch inside the sections' enter and exit too
        def __enter__(self):
            sum(range(3))

        def __exit__(self, *exc):
            sum(range(3))

    loc, quiet = _sections(kind, Slow)
    bad: list = []

    def work(k: int) -> None:
        for i in range(2000):
            if loc.busy is not False:
                bad.append((k, i, "before"))
                return
            with quiet():
                if loc.busy is not True:
                    bad.append((k, i, "inside"))
                    return
            sec = quiet.enter()
            quiet.leave(sec)
        loc.depth = k

    _switching(work, 3)
    assert bad == [] and loc.busy is False


def test_the_adapters_quiet_is_the_c_section_with_torchs_dispatch_guard():
    import torch

    assert type(state.Quiet) is tstate.Quiet
    state.tls.busy = False
    with state.Quiet():
        assert state.tls.busy is True and not torch._C._is_torch_function_enabled()
    assert state.tls.busy is False and torch._C._is_torch_function_enabled()
    with pytest.raises(ValueError, match="no attribute 'other'"):
        tstate.Quiet(_local(), "other", None)
    with pytest.raises(TypeError):
        tstate.Quiet(threadstate.PyLocal(FIELDS), "busy", None)  # the C section sets a C Local's flag


def _tf_state():
    import torch

    return (torch._C._is_torch_function_enabled(), torch._C._is_torch_function_all_disabled(),
            str(torch._C._get_torch_function_state()))


@pytest.mark.parametrize("start", ["enabled", "subclasses disabled", "all disabled"])
def test_the_c_guard_sets_and_puts_back_torchs_state_as_torchs_own_guard_does(start):
    import contextlib

    import torch

    if state._NO_TF_C is None:
        pytest.skip("the C++ node hooks are not built")
    outer = {"enabled": contextlib.nullcontext, "subclasses disabled": torch._C.DisableTorchFunctionSubclass,
             "all disabled": torch._C.DisableTorchFunction}[start]
    seen = {}
    for name, guard in (("c", state._NO_TF_C), ("torch", torch._C.DisableTorchFunction)):
        quiet = tstate.Quiet(_local(), "busy", guard)
        assert quiet.guard is guard
        with outer():
            log = [_tf_state()]
            with quiet():
                log.append(_tf_state())
                sec = quiet.enter()  # nested, in the bodies' form
                log.append(_tf_state())
                quiet.leave(sec)
                log.append(_tf_state())
            log.append(_tf_state())
        log.append(_tf_state())
        seen[name] = log
    assert seen["c"] == seen["torch"]
    assert seen["c"][1][:2] == (False, True) and seen["c"][-1][:2] == (True, False)
    assert seen["c"][0][:2] == seen["c"][-2][:2] == {"enabled": (True, False), "subclasses disabled": (False, False),
                                                     "all disabled": (False, True)}[start]


def test_the_adapters_sections_enter_the_c_guard_and_the_recorded_calls_take_them_without_a_section_object():
    if state._NO_TF_C is None:
        pytest.skip("the C++ node hooks are not built")
    from msprobe_inject.pytorch import apis

    assert state.Quiet.guard is state._NO_TF_C
    assert apis._apicall is None or apis._apicall.quiet_in_c()
    with pytest.raises(TypeError, match="capsule"):
        tstate.Quiet(_local(), "busy", 3)
