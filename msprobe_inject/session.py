"""Step and rank bookkeeping, counters, filters and directories: everything that is not framework code."""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable, Dict, List, Optional

from .config import DumpConfig
from .dumpformat import files, paths
from .writer import DumpWriter

_RANK_VARS = ("RANK", "RANK_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def rank_from_env() -> Optional[int]:
    for var in _RANK_VARS:
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


class Filters:
    """scope / list decisions; counters are never affected by filtering."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("active", "__dict__", "__weakref__")

    def __init__(self, cfg: DumpConfig):
        self.plain = [s for s in cfg.list if not (s.startswith("name-regex(") and s.endswith(")"))]
        self.regex = [re.compile(s[len("name-regex("):-1]) for s in cfg.list
                      if s.startswith("name-regex(") and s.endswith(")")]
        self.has_list = bool(cfg.list)
        self.scope = list(cfg.scope)
        self.level = cfg.level
        self._scope_state = 0  # 0 before, 1 inside, 2 after
        self._closing: Optional[str] = None
        self.active = self.has_list or bool(self.scope)  # read for every record; the settings are fixed

    def reset(self) -> None:
        self._scope_state = 0
        self._closing = None

    def list_match(self, key: str) -> bool:
        return any(s in key for s in self.plain) or any(r.search(key) for r in self.regex)

    def keep(self, key: str, enclosing: List[str]) -> bool:
        """enclosing: keys of the module forwards running around this record (mix-level list semantics)."""
        ok = True
        if self.scope:
            if self._scope_state == 0 and key == self.scope[0]:
                self._scope_state = 1
            ok = self._scope_state == 1
            if ok and key == self.scope[1]:
                self._closing = key
        if ok and self.has_list:
            ok = self.list_match(key) or (self.level == "mix" and any(self.list_match(m) for m in enclosing))
        return ok

    def finished(self, key: str) -> None:
        """Called when a record completes; closes the scope after its end record (output kept)."""
        if self._closing is not None and key == self._closing:
            self._scope_state = 2
            self._closing = None


class Session:
    """One per process. Holds what msprobe's service holds, minus the framework."""

    # the attributes a recorded call reads from C (_apicall.c), at their slots' offsets (_attrs.h); the rest in __dict__
    __slots__ = ("running", "ended", "filters", "api_counts", "ready_kind", "module_counts", "pgrad_counts", "__dict__",
                 "__weakref__")

    def __init__(self, cfg: DumpConfig, framework: str, rank_fn: Callable[[], Optional[int]],
                 resolver: Callable[[list], Optional[Dict[int, str]]], save_tensor: Callable[[Any, str], None],
                 resolve_host: Optional[Callable[[list], list]] = None, native: Optional[Dict[str, bool]] = None):
        self.cfg = cfg
        self.framework = framework
        self.native = dict(native or {})  # the framework's compiled parts, loaded or not: for the manifest entry
        self._rank_fn = rank_fn
        overflow = None
        if cfg.task == "overflow_check":
            overflow = cfg.overflow_nums if cfg.overflow_nums > 0 else 10**12
        flight = None
        if cfg.flight_recorder:
            from .dumpformat.nonfinite import has_nonfinite
            from .flight import Flight

            flight = Flight(cfg.flight_recorder, cfg.flight_after, cfg.flight_bytes, cfg.spike_factor,
                            cfg.spike_records, has_nonfinite)
        self.writer = DumpWriter(resolver, save_tensor, cfg.pending_bytes, overflow, cfg.fsync, cfg.keep_journal,
                                 flight, resolve_host)
        self.filters = Filters(cfg)
        self.lock = threading.RLock()
        self.running = False
        self.ended = False
        self.init_step = 0
        self.loop = 0
        self.rank: Optional[int] = None
        self.rank_fixed = False
        self.pid = os.getpid()
        self.api_counts: Dict[str, int] = {}
        # counted in the recorder's module and gradient hooks themselves (a frame per record less): a module call's
        # last index per prefix; per module, [index, the parameter whose gradient opens a new index]
        self.module_counts: Dict[str, int] = {}
        self.pgrad_counts: Dict[str, list] = {}
        self.debug_counts: Dict[str, int] = {}
        self._open_dir: Optional[str] = None
        self._open_kind: Optional[str] = None
        self._open_step: Optional[int] = None
        # the kind whose directory is open for this step, rank looked up: ensure_open's check for every record,
        # and the record ceremony's own (``ready_kind != "dump" or writer.stopped``: ensure_open asked only then)
        self.ready_kind: Optional[str] = None
        self._opened: set = set()  # rank directories this process created
        self.root: Optional[str] = None
        self._root_failed = False

    # ---- steps ----
    @property
    def step(self) -> int:
        return self.init_step + self.loop

    def step_selected(self, step: Optional[int] = None) -> bool:
        s = self.step if step is None else step
        return not self.cfg.step or s in self.cfg.step

    def rank_selected(self) -> bool:
        rank = self.refresh_rank()
        return not self.cfg.rank or rank is None or rank in self.cfg.rank

    def next_step(self) -> None:
        self.refresh_rank()  # the step's directory is named for the rank before its files are finished
        # the step is complete on disk once step() returns (flight recorder: in its node-local spill)
        self.writer.flush(finish=True)
        self.api_counts.clear()
        self.module_counts.clear()
        self.pgrad_counts.clear()
        self.debug_counts.clear()
        self.filters.reset()
        self._open_dir = None
        self._open_step = None
        self.ready_kind = None
        self.loop += 1
        if (self.cfg.step and self.step > max(self.cfg.step)) or self.writer.flight_over:
            self.ended = True
            self.running = False
            self.writer.close()

    def set_init_step(self, step: int) -> None:
        self.init_step = step
        self.loop = 0
        self.ready_kind = None

    # ---- ranks and directories ----
    def refresh_rank(self) -> Optional[int]:
        """Look the rank up until it is known. Once it is, a step directory opened as proc{pid} moves to
        rank{R} (dist was initialised after start(): msprobe renames it the same way)."""
        if not self.rank_fixed:
            r = self._rank_fn()
            if r is not None:
                self.rank = r
                self.rank_fixed = True
                if self._open_dir is not None and paths.parse_process(os.path.basename(self._open_dir)).rank is None:
                    new = self.rank_dir()
                    self.writer.rename(self._open_dir, new)
                    self._open_dir = new
        return self.rank

    def fix_rank(self, rank: int) -> None:
        if not self.rank_fixed:
            self.rank = rank
            self.rank_fixed = True

    def _root(self) -> str:
        if self.root is None:
            root = self.cfg.dump_path
            try:
                files.makedirs(root)
            except OSError as exc:
                # one message for one cause; the job runs on without dumping
                self.writer.log_error(f"dump path {root} is not writable ({exc}); dumping is off")
                self.stop_for_good()
                self._root_failed = True
                self.root = root
                return root
            try:
                from . import coord  # optional: shared-file-system coordination

                root = coord.resolve_process_root(self.cfg.dump_path, self.rank)
                extra: Dict[str, Any] = {"native": self.native} if self.native else {}
                fl = self.writer.flight
                if fl is not None:
                    from .flight import spill_dir

                    fl.marker = paths.flight_marker(self.cfg.dump_path, coord.current_attempt())
                    fl.spill = extra["flight_spill"] = spill_dir(coord.run_id())
                coord.manifest_register(self.cfg.dump_path, rank=self.rank, root=root,
                                        config=self.cfg.to_dict(), extra=extra)
            except ImportError:
                pass
            except Exception as exc:
                self.writer.log_error(f"coordination: {exc}")
            self.root = root
        return self.root

    def rank_dir(self) -> str:
        return paths.rank_dir(self._root(), self.step, self.rank, os.getpid())

    def header(self, level: Optional[str] = None) -> Dict[str, Any]:
        cfg = self.cfg
        tensor_dir = None
        if cfg.task == "tensor" or (cfg.task == "statistics" and cfg.tensor_list):
            tensor_dir = paths.tensor_dir(self.rank_dir())
        return {"task": cfg.task, "level": level or cfg.level, "framework": self.framework,
                "dump_data_dir": tensor_dir, "_extra_info": cfg.extra_info, "_step": self.step,
                "_root": cfg.dump_path}

    def stop_for_good(self) -> None:
        self.running = False
        self.ended = True
        self.ready_kind = None

    def ensure_open(self, kind: str = "dump") -> str:
        """Open the rank directory of the current step (once per step) and return it. The record ceremony asks it
        only while ``ready_kind`` is not the record's kind or the writer has stopped; others may ask at any time. A
        rank not known yet is looked up when the step's directory opens and at stop() and step(), which rename it to
        rank{R} if torch.distributed came up since."""
        if self.ready_kind == kind and not self.writer.stopped:
            return self._open_dir  # type: ignore[return-value]
        if self.writer.stopped and not self.ended:
            self.stop_for_good()
        if self._open_step == self.step and self._open_kind == kind and self._open_dir is not None:
            self.refresh_rank()
            self.ready_kind = kind if not self.ended else None
            return self._open_dir
        self._open_step = self.step
        self.refresh_rank()
        d = self.rank_dir()
        if self.ended:
            return d
        if d not in self._opened and os.path.lexists(d):
            self._move_aside(d)
        self._opened.add(d)
        if d != self._open_dir or kind != self._open_kind:
            self._open_dir = d
            self._open_kind = kind
            header = self.header("debug" if kind == "debug" else None)
            if header["dump_data_dir"] is not None:
                try:
                    files.makedirs(paths.tensor_dir(d), self.cfg.dump_path)
                except OSError as exc:
                    self.writer.log_error(f"cannot create {paths.tensor_dir(d)}: {exc}", d)
            self.writer.open_step(d, header, kind)
        self.ready_kind = kind if not self.ended else None
        return d

    def _move_aside(self, d: str) -> None:
        """Existing dump data is never silently overwritten: an earlier run's rank directory is kept
        under a new name (msprobe compare only reads rank{R}/proc{pid}) and a warning says where."""
        import time
        import warnings

        aside = f"{d}.replaced-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
        try:
            os.rename(d, aside)
            warnings.warn(f"[msprobe-launch] {d} held data from an earlier run; it was moved to {aside}",
                          RuntimeWarning, stacklevel=3)
        except OSError as exc:
            self.writer.log_error(f"{d} holds earlier data and cannot be moved aside ({exc}); writing over it", d)

    def tensor_dir(self) -> str:
        return paths.tensor_dir(self._open_dir or self.rank_dir())

    # ---- counters ----
    def next_api_index(self, base: str) -> int:
        return self.api_counts.get(base, 0)

    def finish_api(self, base: str) -> None:
        self.api_counts[base] = self.api_counts.get(base, 0) + 1

    def debug_index(self, name: str) -> int:
        n = self.debug_counts.get(name, 0)
        self.debug_counts[name] = n + 1
        return n

    # ---- lifecycle ----
    def flush(self) -> None:
        self.refresh_rank()
        if self.writer.flight is not None:
            return  # the flight recorder writes nothing at stop(): the training thread does not wait
        # blocking, as msprobe: the step's files are complete when stop()/step() return. Letting them
        # overlap the next step measured no faster (statistics or tensors: the writer is the bottleneck
        # or the cores are) and would lose up to pending_bytes of files in a crash
        self.writer.flush()

    def close(self, timeout: Optional[float] = None) -> None:
        try:
            self.writer.close(timeout)
        finally:
            try:
                from . import coord

                if self.root is not None and not self.writer.stopped and not self._root_failed:
                    fl = self.writer.flight
                    coord.manifest_finish(self.cfg.dump_path, rank=self.rank, root=self.root,
                                          steps=sorted(self.writer.steps_written), status="finished",
                                          flight=fl.summary() if fl is not None else None)
            except ImportError:
                pass
            except Exception:
                pass
