"""_jput.HandOffLock, the writer's hand-off lock (DumpWriter._blk): threading.RLock's semantics for what the writer
does with it, taken inline by the journal's C."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

_jput = pytest.importorskip("msprobe_inject.dumpformat._jput")
HandOffLock = getattr(_jput, "HandOffLock", None)
pytestmark = pytest.mark.skipif(HandOffLock is None, reason="a _jput built without the hand-off lock")


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


def test_a_signal_handler_on_the_owning_thread_takes_it_again():
    """SIGTERM's flush runs on the training thread, possibly inside a send that holds the lock: the handler's
    acquisition is reentrant, not a deadlock. The handler is set here, not inherited."""
    lock = HandOffLock()
    seen = []

    def handler(signum, frame):
        with lock:
            seen.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with lock:
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            for _ in range(1000):  # the handler runs between bytecodes
                if seen:
                    break
        assert seen == [signal.SIGUSR1]
        assert repr(lock).startswith("<unlocked")
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_waiting_thread_gives_the_gil_back():
    """A thread that waits for the lock lets the holder run Python to its release (a wait holding the GIL would hang
    here)."""
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
    assert not t.is_alive() and done == [1]


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
