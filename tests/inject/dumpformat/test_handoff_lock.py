"""_jput.HandOffLock, the writer's hand-off lock (DumpWriter._blk): threading.RLock's semantics for what the writer
does with it, taken inline by the journal's C."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import threading

import pytest
from util import run_py

_jput = pytest.importorskip("msprobe_inject.dumpformat._jput")
HandOffLock = getattr(_jput, "HandOffLock", None)
pytestmark = pytest.mark.skipif(HandOffLock is None, reason="a _jput built without the hand-off lock")


def _in_child(body: str, cwd: str, *argv: str) -> str:
    """body run by a fresh interpreter (util.run_py; HandOffLock in scope, argv its sys.argv[1:]): its output. A test
    whose bug is a deadlock of the whole process (a signal handler's, a wait holding the GIL) fails on the timeout
    instead of hanging the suite."""
    code = "import os, signal, sys, threading\nfrom msprobe_inject.dumpformat._jput import HandOffLock\n" + body
    try:
        return run_py(code, cwd, args=argv, timeout=60).stdout
    except subprocess.TimeoutExpired:
        pytest.fail("deadlocked: the child did not end in 60 s")


def _in_thread(fn):
    """fn() on another thread: its result, or its exception raised here."""
    out = []

    def run():
        try:
            out.append((True, fn()))
        except BaseException as exc:
            out.append((False, exc))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive()
    ok, got = out[0]
    if not ok:
        raise got
    return got


def test_reentrant_owned_and_released_by_its_owner_only():
    lock = HandOffLock()
    assert repr(lock).startswith("<unlocked")
    with lock:
        # a timed acquisition first: a lock that is not reentrant fails here instead of hanging the suite
        assert lock.acquire(timeout=5) is True
        lock.release()
        with lock:
            assert lock.acquire() is True and lock.acquire(False) is True
            lock.release()
            lock.release()
        assert repr(lock).startswith("<locked")
        assert _in_thread(lambda: lock.acquire(False)) is False  # held by this thread
        assert _in_thread(lambda: lock.acquire(timeout=0.05)) is False
        with pytest.raises(RuntimeError):
            _in_thread(lock.release)  # not its owner
    assert repr(lock).startswith("<unlocked")
    with pytest.raises(RuntimeError):
        lock.release()
    assert _in_thread(lambda: (lock.acquire(False), lock.release())[0]) is True
    assert _in_thread(lambda: (lock.acquire(True, 5.0), lock.release())[0]) is True
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)  # as RLock's: no timeout for a call that does not wait
    with pytest.raises(TypeError):
        lock.acquire(wait=True)


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, 1e20, -1e20, -2.0, -1, 0, 1e-9, 0.5, "1", None])
@pytest.mark.parametrize("blocking", [True, False])
def test_acquire_takes_and_refuses_the_arguments_rlock_does(blocking, timeout):
    """Each (blocking, timeout) gives what threading.RLock's acquire gives on a free lock: the same result or an error
    of the same type (NaN, an infinite or too long wait, a negative one, a timeout without a wait, not a number). None,
    which some Pythons' RLock take for "no timeout", is left out where this one refuses it."""

    def outcome(lock):
        try:
            got = lock.acquire(blocking, timeout)
        except Exception as exc:
            return type(exc)
        if got:
            lock.release()
        return got

    want = outcome(threading.RLock())
    if timeout is None and want is True:
        pytest.skip("this Python's RLock takes timeout=None")
    assert outcome(HandOffLock()) == want


def test_a_timed_wait_ends_when_the_holder_releases():
    """A timed wait returns True as soon as the holder releases, well before its timeout; a wait shorter than a
    microsecond on a held lock returns False (that it is rounded up to one, as RLock's, no test here can tell)."""
    import time

    lock = HandOffLock()
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    assert lock.acquire(timeout=1e-9) is False
    assert lock.acquire(timeout=0.01) is False
    threading.Timer(0.05, release.set).start()
    t0 = time.monotonic()
    assert lock.acquire(timeout=30) is True
    assert time.monotonic() - t0 < 20
    lock.release()
    t.join(10)
    assert repr(lock).startswith("<unlocked")


def test_a_lock_deleted_while_held():
    """A lock dropped while held, by this thread or by one that ended holding it, is freed without error or crash
    (whether its OS lock was released first, the C library does not show)."""
    lock = HandOffLock()
    assert lock.acquire() is True and lock.acquire(timeout=5) is True  # held twice
    del lock
    other = HandOffLock()
    t = threading.Thread(target=other.acquire)
    t.start()
    t.join(10)
    assert repr(other).startswith("<locked")
    del other
    gc.collect()
    fresh = HandOffLock()
    assert fresh.acquire(False) is True
    fresh.release()


_HELD_WRITER = """
def mine():
    # this thread holds the lock: its release() does not raise (then taken back). Not repr: the writer thread's
    # drain may hold the lock at that instant
    try:
        w._blk.release()
    except RuntimeError:
        return False
    w._blk.acquire()
    return True

from msprobe_inject.writer import DumpWriter, Record, post

root = sys.argv[1]
w = DumpWriter(lambda pending: None, lambda t, p: None, keep_journal=True)
w.open_step(os.path.join(root, "step0", "rank0"),
            {"task": "statistics", "level": "mix", "dump_data_dir": None, "_root": root})
w._held = True  # a flight-recorder step held in its spill journal: the send asks its trigger rule, under the lock
"""


def test_a_callback_under_the_c_send_takes_the_lock_again(tmp_path):
    """Python code the C send runs with the lock held (a held step's trigger rule) takes the lock again on the same
    thread: reentrant from C too, and released to the level it was."""
    out = _in_child(_HELD_WRITER + """
levels = []

def see(ev, t):
    with w._blk:
        levels.append(repr(w._blk).split("count=")[1].split()[0])
    return True

w._triggers_see = see
post(w, Record, "k", {"output": [1.5]}, None)
print(levels, not mine())
w.close()
""", str(tmp_path), str(tmp_path / "d"))
    assert out.split() == ["['2']", "True"]


def test_a_callback_that_releases_the_lock_under_the_c_send(tmp_path):
    """A callback that releases the lock the C send holds: the send's own release then fails as RLock's would, with
    RuntimeError reaching the caller (not a lock released twice, nor a count below zero)."""
    out = _in_child(_HELD_WRITER + """
def see(ev, t):
    w._blk.release()
    return True

w._triggers_see = see
try:
    post(w, Record, "k", {"output": [1.5]}, None)
    print("no error")
except RuntimeError as exc:
    print("un-acquired" in str(exc))
print(not mine(), w._blk.acquire(timeout=5))
w._blk.release()
w.close()
""", str(tmp_path), str(tmp_path / "d"))
    assert out.split() == ["True", "True", "True"]


def test_threads_take_turns():
    """Four threads, each adding to a counter in steps the interpreter may switch between (a switch interval of a
    microsecond): with the lock held around each addition none is lost. Run many times."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            lock = HandOffLock()
            box = [0]

            def work(lock=lock, box=box):
                for _ in range(500):
                    with lock:
                        v = box[0]
                        for _ in range(3):  # bytecodes in between: a switch can land here
                            pass
                        box[0] = v + 1

            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert box[0] == 2000
            assert repr(lock).startswith("<unlocked")
    finally:
        sys.setswitchinterval(old)


def test_a_signal_handler_on_the_owning_thread_takes_it_again(tmp_path):
    """SIGTERM's flush runs on the training thread, possibly inside a send that holds the lock: the handler's
    acquisition is reentrant, not a deadlock. The handler is set here, not inherited."""
    out = _in_child("""
lock = HandOffLock()
seen = []

def handler(signum, frame):
    with lock:
        seen.append(signum)

signal.signal(signal.SIGUSR1, handler)
with lock:
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    for _ in range(1000):  # the handler runs between bytecodes
        if seen:
            break
print(seen == [signal.SIGUSR1], repr(lock).startswith("<unlocked"))
""", str(tmp_path))
    assert out.split() == ["True", "True"]


def test_a_waiting_thread_gives_the_gil_back(tmp_path):
    """A thread that waits for the lock lets the holder run Python to its release (a wait holding the GIL would hang
    the process)."""
    out = _in_child("""
lock = HandOffLock()
go = threading.Event()
done = []

def waiter():
    go.set()
    with lock:
        done.append(1)

with lock:
    t = threading.Thread(target=waiter)
    t.start()
    assert go.wait(10)
    x = 0
    for i in range(100000):  # the holder keeps running Python while the other waits
        x += i
t.join(10)
print(not t.is_alive(), done == [1])
""", str(tmp_path))
    assert out.split() == ["True", "True"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_child_takes_the_lock_its_parent_held_on_the_forking_thread():
    lock = HandOffLock()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: its one thread is the one that held the lock
            code = 0
            try:
                lock.release()
                code = 0 if lock.acquire(False) else 3
            except BaseException:
                code = 4
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_the_writer_hands_off_under_it():
    from msprobe_inject.writer import DumpWriter

    w = DumpWriter(lambda pending: None, lambda t, p: None)
    try:
        assert type(w._blk) is HandOffLock
    finally:
        w.close()
