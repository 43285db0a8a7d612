"""The flight recorder: every step is recorded, the last K are kept, and nothing is written
until a trigger fires.

This module is the writer thread's policy for that mode. The training thread asks it two questions only, at no
cost: whether a step is in the window (``in_window``) and whether the spike rule follows a record (``follows``).

* The ring holds finished steps, at most ``steps + SLACK`` of them and at most ``max_bytes``: the oldest step
  leaves first. A held step is its spill journal (the writer replays it if a window takes the step), or, where
  nothing can be spilled, its encoded records in the writer's memory; its bytes are the one or the other's.
* Triggers: a non-finite statistic (in the figures the writer receives: the tensors are not read again), a
  spike (a record matching ``spike_records`` whose norm exceeds ``spike_factor`` times its median
  over the ring), and the reasons the recorder passes in (an exception, SIGTERM, ``debugger.trigger()``).
* The first trigger of the job creates one marker file (``dumpformat.paths.flight_marker``), atomically and
  only if none exists. Every rank looks for it once per finished step (one ``stat``), so all ranks write the
  same window: steps ``T-K .. T+M`` around the trigger step ``T``. No collective, no lock.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .dumpformat import files, paths
from .dumpformat.entry import MAPPINGS, Entry

SLACK = 2  # steps beyond K a rank keeps: it may be this far ahead of the rank that triggered
_MIN_HISTORY = 3  # a spike needs this many earlier values of its record
NONFINITE = "nonfinite"
SPIKE = "spike"
EXCEPTION = "exception"
SIGTERM = "sigterm"
EXPLICIT = "explicit"
_NESTED = (*MAPPINGS, list)  # what can hold a statistic below it


def spill_dir(run_id: str) -> str:
    """This process's node-local directory for the ring's step journals: in memory (/dev/shm) where there is one,
    so that nothing reaches a shared file system, and private to the user."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id or "run")[:80]
    return os.path.join(base, f"msprobe-flight-{os.getuid()}", f"{safe}-{os.getpid()}")


def _norm_of(value: Any) -> Optional[float]:
    """The largest finite-or-not Norm below value (a record's output, or a whole parameter-gradient body). Asked of
    every record the spike rule follows, on the writer thread: a plain loop, where a generator and a tuple of types
    per mapping were most of the walk's cost."""
    best: Optional[float] = None
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        v = pop()
        if isinstance(v, MAPPINGS):
            n = v.get("Norm")
            if isinstance(n, (int, float)) and not isinstance(n, bool) and (best is None or not n <= best):
                best = float(n)
            if type(v) is not Entry:  # a tensor's entry of C values holds figures and a shape, no mapping
                for x in v.values():
                    if isinstance(x, _NESTED):
                        push(x)
        elif isinstance(v, list):
            for x in v:  # a shape's ints are no statistic: only what can hold one is walked
                if isinstance(x, _NESTED):
                    push(x)
    return best


class Flight:
    """The ring, the triggers and the window of one process (writer thread only)."""

    # the spike rule's two attributes the journal's C reads for every record of a held step (_jput.c triggers_see):
    # at slots, where its attribute cache reads them at their offset; from 3.11 an instance dict's are asked of the
    # attribute protocol each time
    __slots__ = ("spike_re", "_spike_match", "__dict__")

    def __init__(self, steps: int, after: int, max_bytes: int, spike_factor: float, spike_records: str,
                 has_nonfinite: Callable[[Any], bool]):
        self.steps = steps
        self.after = after
        self.max_bytes = max_bytes
        self.spike_factor = spike_factor
        self.spike_re = re.compile(spike_records) if spike_records and spike_factor > 0 else None
        self._has_nonfinite = has_nonfinite
        self.ring: Deque[Tuple[Any, int]] = collections.deque()  # (open step object, its bytes)
        self.ring_bytes = 0
        self.peak_bytes = 0
        self.dropped_for_bytes = 0
        self.marker: Optional[str] = None  # set once the dump root is known
        self.spill: Optional[str] = None  # node-local directory of the held steps' journals (see spill_dir)
        self.rank: Optional[int] = None
        self.trigger: Optional[Dict[str, Any]] = None  # the job's trigger, once known (ours or another rank's)
        self.own: Optional[Dict[str, Any]] = None  # this rank's first trigger, when it fired one
        self.window: Optional[Tuple[int, int]] = None
        self.over = False  # the window has been written: recording stops
        # the spike rule's answer per record key, kept by follows(); read by name, with spike_re, by the journal's C
        # send for a held step's records (_jput.c triggers_see): a change to either is made there too
        self._spike_match: Dict[str, bool] = {}
        self._history: Dict[str, Deque[float]] = {}
        # a record's median over the ring, once it has enough history: the history changes at step ends only, so it
        # is sorted there, once per record and step, not at each of the record's calls
        self._medians: Dict[str, float] = {}
        self._step_norms: Dict[str, float] = {}

    # ---- per record ----
    def observe(self, step: Optional[int], key: str, body: Any, suspect: bool) -> None:
        """A record (or members of one) of the open step: look for a trigger. suspect: it may hold a non-finite
        statistic (its encoded text has one's spelling, ``encoding.is_suspect``, or, for a held step the writer
        does not encode, ``has_nonfinite`` found one), which has_nonfinite then confirms."""
        if self.own is not None:
            return
        if suspect and self._has_nonfinite(body):
            self.fire(NONFINITE, step, key)
            return
        if not self.follows(key):
            return
        norm = _norm_of(body.get("output", body) if isinstance(body, dict) else body)
        if norm is None:
            return
        prev = self._step_norms.get(key)
        self._step_norms[key] = norm if prev is None else max(prev, norm)
        median = self._medians.get(key)
        if median is not None and median > 0 and norm > self.spike_factor * median:
            self.fire(SPIKE, step, key, value=norm, median=median)

    def follows(self, key: str) -> bool:
        """Whether the spike rule follows the record key (asked from the writer thread and, for the records of a held
        step it need not send, the training thread: one dict operation at a time, under the GIL)."""
        if self.spike_re is None:
            return False
        match = self._spike_match.get(key)
        if match is None:
            if len(self._spike_match) > 100_000:
                self._spike_match.clear()
            match = self._spike_match[key] = self.spike_re.search(key) is not None
        return match

    def step_finished(self) -> None:
        """The norms of the step just finished join the history the next steps are compared with."""
        for key, norm in self._step_norms.items():
            hist = self._history.get(key)
            if hist is None:
                hist = self._history[key] = collections.deque(maxlen=max(self.steps, _MIN_HISTORY))
            hist.append(norm)
            if len(hist) >= min(_MIN_HISTORY, self.steps):
                self._medians[key] = sorted(hist)[len(hist) // 2]
        self._step_norms.clear()

    # ---- triggers and the job's marker ----
    def fire(self, kind: str, step: Optional[int], record: Optional[str] = None, **detail: Any) -> None:
        """This rank triggers (first trigger only); the job's marker names the first rank that did."""
        if self.own is not None or self.over:
            return
        own = {"kind": kind, "rank": self.rank, "step": step, "record": record, "pid": os.getpid(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        own.update({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in detail.items()})
        self.own = own
        if self.trigger is None:
            self.trigger = self._publish(own)
        self._set_window()

    def _publish(self, own: Dict[str, Any]) -> Dict[str, Any]:
        """Create the job's marker unless one exists; the marker that stands is the job's trigger."""
        if self.marker is None:
            return own
        try:
            files.makedirs(os.path.dirname(self.marker))
            tmp = f"{self.marker}.{os.getpid()}.{threading.get_ident()}.tmp"
            files.write_atomic(tmp, (json.dumps(own, indent=1) + "\n").encode())
            try:
                os.link(tmp, self.marker)  # atomic and exclusive: one rank's trigger is the job's
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        except OSError:
            return own
        return self.read_marker() or own

    def read_marker(self) -> Optional[Dict[str, Any]]:
        if self.marker is None:
            return None
        try:
            with open(self.marker, encoding="utf-8") as fh:
                value = json.load(fh)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) and isinstance(value.get("step"), int) else None

    def poll(self) -> None:
        """Once per finished step: has another rank triggered? (One stat while nobody has.)"""
        if self.trigger is not None or self.marker is None or not os.path.exists(self.marker):
            return
        self.trigger = self.read_marker()
        self._set_window()

    def _set_window(self) -> None:
        if self.window is None and self.trigger is not None and isinstance(self.trigger.get("step"), int):
            t = self.trigger["step"]
            self.window = (max(0, t - self.steps), t + self.after)

    # ---- the ring ----
    def in_window(self, step: Optional[int]) -> bool:
        w = self.window
        return w is not None and isinstance(step, int) and w[0] <= step <= w[1]

    def keep(self, st: Any, nbytes: int) -> List[Any]:
        """A finished step outside any window joins the ring; the oldest leave beyond K + SLACK or the bytes
        (returned)."""
        gone = []
        self.ring.append((st, nbytes))
        self.ring_bytes += nbytes
        while len(self.ring) > self.steps + SLACK or (self.ring_bytes > self.max_bytes and len(self.ring) > 1):
            if len(self.ring) <= self.steps + SLACK:
                self.dropped_for_bytes += 1
            old, n = self.ring.popleft()
            gone.append(old)
            self.ring_bytes -= n
        self.peak_bytes = max(self.peak_bytes, self.ring_bytes)
        return gone

    def take_window(self) -> Tuple[List[Any], List[Any]]:
        """The ring's steps inside the window and outside it, oldest first; the ring is emptied."""
        inside = [st for st, _ in self.ring if self.in_window(st.records.header.get("_step"))]
        outside = [st for st, _ in self.ring if not self.in_window(st.records.header.get("_step"))]
        self.ring.clear()
        self.ring_bytes = 0
        return inside, outside

    def summary(self) -> Dict[str, Any]:
        """What the process's manifest entry says about the flight recorder."""
        return {"steps": self.steps, "after": self.after, "max_bytes": self.max_bytes,
                "peak_bytes": self.peak_bytes, "dropped_for_bytes": self.dropped_for_bytes,
                "triggered": self.trigger is not None, "trigger": self.trigger, "own_trigger": self.own,
                "window": list(self.window) if self.window else None}


KILLED = "killed"


def recover_spill(dump_path: str, entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The launcher, after the job, for a process of its node that died without exiting (kill -9, the OOM
    killer): the death is a trigger (unless the job already has one), and the process's spilled steps inside the
    job's window are written as ordinary step directories (the step it died in marked incomplete). The spill
    directory is removed. None when the process left no spill."""
    from .dumpformat import journal

    spill = entry.get("flight_spill")
    if not isinstance(spill, str) or not os.path.isdir(spill):
        return None
    steps: Dict[int, str] = {}
    for name in os.listdir(spill):
        if name.endswith(paths.JOURNAL_SUFFIX):
            step = paths.parse_step(name[:-len(paths.JOURNAL_SUFFIX)])
            if step is not None:
                steps[step] = os.path.join(spill, name)
    cfg = entry.get("config") or {}
    fl = Flight(int(cfg.get("flight_recorder") or 1), int(cfg.get("flight_after") or 0), 1, 0.0, "",
                lambda body: False)
    fl.marker = paths.flight_marker(dump_path, int(entry.get("attempt") or 0))
    fl.rank = entry.get("rank")
    written: List[int] = []
    try:
        if steps:
            fl.poll()
            if fl.trigger is None:
                fl.fire(KILLED, max(steps), "the process died without exiting (SIGKILL, e.g. the OOM killer)")
            else:
                fl.own = {"kind": KILLED, "rank": fl.rank, "step": max(steps), "record": None,
                          "pid": entry.get("pid")}
        root = os.path.join(dump_path, entry.get("root") or ".")
        for step in sorted(steps):
            if not fl.in_window(step):
                continue
            d = paths.rank_dir(root, step, entry.get("rank"), int(entry.get("pid") or 0))
            state = journal.state(steps[step])
            if state is not None and state[1]:  # its documents were written from all of it
                continue
            files.makedirs(d, dump_path)
            target = os.path.join(d, paths.JOURNAL)
            with open(steps[step], "rb") as src:
                files.write_atomic(target, src.read())
            journal.recover(d)
            os.unlink(target)
            written.append(step)
    finally:

        shutil.rmtree(spill, ignore_errors=True)
    out = fl.summary()
    out["recovered_steps"] = written
    return out
