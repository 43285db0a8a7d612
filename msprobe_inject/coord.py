"""Coordination of the processes that share one dump path (possibly on several hosts).

Layout decisions (documented in the README):

* Attempt 0 of a job writes directly under ``dump_path``; after an elastic restart
  (``TORCHELASTIC_RESTART_COUNT=k``, k > 0) a process writes under ``dump_path/attempt{k}/``, so
  nothing an earlier attempt wrote is ever overwritten.
* A process claims its rank (``rank{R}``, or ``proc{pid}`` without a rank) for the attempt in
  ``dump_path/.msprobe/claims/``, under a lock of that rank and attempt only (processes of different ranks
  never wait on each other). If a live process already holds the claim, the newcomer writes under
  ``<attempt root>/duplicate_rank{R}_{host}_{pid}/`` and a warning names both processes.
  A claim is stale when its pid is dead (same host), or when it comes from another host and a
  different known run id (an older job). Claims are released by ``manifest_finish``.
* Each process writes its own manifest entry (``dumpformat.manifest``), at start and at end only, and an
  empty marker of its run id. A rank's start and end therefore touch a fixed number of files whatever the
  number of ranks, and none of them is written by another live process. After the job each node's launcher
  closes the entries of its own dead processes (``finish_node``); the combined ``msprobe_manifest.json`` is
  written by the launcher that has the job-wide view (``write_combined``) and built by readers on demand.

Files are created 0640 and directories 0750 (before umask), never through a symlink; JSON files are
replaced atomically. Claims and entries are not fsync'd: they matter only while the processes that wrote
them live, and an fsync is a round trip per rank on a networked file system. Importable without torch.
I/O problems degrade to a warning, never an exception.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import re
import socket
import time
import uuid
import warnings
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .dumpformat import manifest as combined
from .dumpformat import paths

MANIFEST_NAME = paths.MANIFEST
META_DIR = paths.META_DIR
CLAIMS_DIR = paths.CLAIMS_DIR
FILE_MODE = 0o640
DIR_MODE = 0o750
LOCK_TIMEOUT = 60.0
MANIFEST_FORMAT = 1

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# (abs dump path, claim key, attempt, pid) -> root; the runtime may ask for the root more than once.
_roots: Dict[Tuple[str, str, int, int], str] = {}
# (abs dump path, pid) -> (claim file, its lock file) held by this process (released by manifest_finish)
_held: Dict[Tuple[str, int], List[Tuple[str, str]]] = {}
# (abs dump path, pid) -> (entry file, entry) of this process
_entries: Dict[Tuple[str, int], Tuple[str, Dict[str, Any]]] = {}


class CoordError(OSError):
    """The dump path cannot be used safely (e.g. a symlink where a directory is expected)."""


def hostname() -> str:
    return socket.gethostname() or "localhost"


def _safe_host() -> str:
    # msprobe only accepts paths made of [A-Za-z0-9_.:/-]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", hostname())


def current_attempt() -> int:
    """The elastic restart count of this process (0 for the first attempt or without torchrun)."""
    try:
        return max(0, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
    except ValueError:
        return 0


def run_id() -> str:
    """MSPROBE_RUN_ID (set by msprobe-launch), else torchrun's run id, else '' (unknown)."""
    rid = os.environ.get("MSPROBE_RUN_ID", "")
    if rid:
        return rid
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return "" if rid in ("", "none") else rid


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError(errno.ENOENT, "no btime in /proc/stat")


def _process_start_time(pid: int) -> Optional[float]:
    """psutil's create_time, computed the way psutil does on Linux without importing it (a rank pays for
    every import at start-up)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def _pid_alive(pid: Any, start_time: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        import psutil
    except ImportError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
    # A different start time means the pid was reused by an unrelated process.
    return not isinstance(start_time, (int, float)) or abs(created - start_time) < 1.0


def _ensure_dir(path: str, allow_link: bool = False) -> None:
    """mkdir -p with mode 0750; refuse a symlink in place of the directory itself (the user's dump path may be one)."""
    try:
        os.makedirs(path, DIR_MODE, exist_ok=True)
    except FileExistsError:
        pass
    if (os.path.islink(path) and not allow_link) or not os.path.isdir(path):
        raise CoordError(errno.ELOOP, "not a plain directory (symlink?)", path)


def _free_dir(path: str) -> str:
    """``path``, or ``path.1``, ``path.2`` ... when something that is not a plain directory is in the way."""
    candidate, n = path, 0
    while os.path.lexists(candidate) and (os.path.islink(candidate) or not os.path.isdir(candidate)):
        n += 1
        candidate = f"{path}.{n}"
    return candidate


def _meta_dir(dump_path: str, *parts: str) -> str:
    path = os.path.join(dump_path, META_DIR)
    _ensure_dir(dump_path, allow_link=True)
    _ensure_dir(path)
    for part in parts:
        path = os.path.join(path, part)
        _ensure_dir(path)
    return path


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (what filelock does on POSIX, without its import cost at every rank's
    start); filelock elsewhere. Raises CoordError after LOCK_TIMEOUT."""
    if os.path.islink(path):
        raise CoordError(errno.ELOOP, "lock file is a symlink", path)
    try:
        import fcntl
    except ImportError:
        import filelock

        with filelock.FileLock(path, timeout=LOCK_TIMEOUT, mode=FILE_MODE):
            yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CoordError(errno.ETIMEDOUT, f"lock not acquired in {LOCK_TIMEOUT:.0f} s", path)
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_json(path: str) -> Optional[Any]:
    """Parsed JSON, or None when the file is missing. Never follows a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CoordError(errno.ELOOP, "refusing to read through a symlink", path)
        raise
    with os.fdopen(fd, "r", encoding="utf-8") as fh:
        return json.load(fh)


def write_json_atomic(path: str, obj: Any, durable: bool = True) -> None:
    """Write JSON to a new 0640 temp file (O_EXCL|O_NOFOLLOW) and os.replace it over ``path``; fsync'd first
    when ``durable``."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory or ".", f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1)
            fh.write("\n")
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _rel(dump_path: str, root: str) -> str:
    try:
        return os.path.relpath(os.path.abspath(root), os.path.abspath(dump_path))
    except ValueError:
        return os.path.abspath(root)


def _identity(attempt: int, rank: Optional[int], key: str) -> Dict[str, Any]:
    pid = os.getpid()
    return {
        "key": key,
        "rank": rank,
        "pid": pid,
        "host": hostname(),
        "attempt": attempt,
        "run_id": run_id(),
        "start_time": _process_start_time(pid),
        "claimed_at": _now(),
    }


def _is_self(claim: Dict[str, Any]) -> bool:
    return claim.get("host") == hostname() and claim.get("pid") == os.getpid()


def _claim_is_live(claim: Dict[str, Any]) -> bool:
    if claim.get("host") == hostname():
        return _pid_alive(claim.get("pid"), claim.get("start_time"))
    # Another host: liveness cannot be checked. A different known run id means an older job.
    mine, theirs = run_id(), claim.get("run_id") or ""
    return not (mine and theirs and mine != theirs)


def _warn(message: str) -> None:
    warnings.warn("[msprobe-launch] " + message, RuntimeWarning, stacklevel=3)


def resolve_process_root(dump_path: str, rank: Optional[int]) -> str:
    """Directory under which this process writes ``step{N}/rank{R}/`` (or ``proc{pid}/``).

    ``dump_path`` itself for attempt 0, ``dump_path/attempt{k}`` after the k-th elastic restart, and a
    ``duplicate_rank{R}_{host}_{pid}`` directory inside that when a live process already claimed the rank
    (a warning names it). The directory exists on return. Repeated calls return the same root.
    """
    pid = os.getpid()
    attempt = current_attempt()
    key = paths.rank_dir_name(rank, pid)
    dump_abs = os.path.abspath(dump_path)
    cache_key = (dump_abs, key, attempt, pid)
    if cache_key in _roots:
        return _roots[cache_key]
    base = dump_path if attempt == 0 else os.path.join(dump_path, paths.attempt_dir_name(attempt))
    if attempt and os.path.islink(base):  # never write through a symlink planted in the dump path
        base = _free_dir(f"{base}_{_safe_host()}_{pid}")
        _warn(f"attempt{attempt} in {dump_path} is a symlink; writing to {base}")
    duplicate_root = _free_dir(os.path.join(base, paths.duplicate_dir_name(key, _safe_host(), pid)))
    root = base
    try:
        mark_run(dump_path)  # first: a launcher starting on another node must never see our data unmarked
        claims = _meta_dir(dump_path, CLAIMS_DIR)
        claim_path = os.path.join(claims, paths.claim_name(attempt, key))
        lock_path = os.path.join(claims, paths.claim_lock_name(attempt, key))
        with _lock(lock_path):
            try:
                other = _read_json(claim_path)
            except (ValueError, CoordError):
                other = None  # unreadable claim: ours replaces it
            if isinstance(other, dict) and not _is_self(other) and _claim_is_live(other):
                root = duplicate_root
                _warn(
                    f"{key} (attempt {attempt}) is already claimed by pid {other.get('pid')} on "
                    f"{other.get('host')}; this process (pid {pid} on {hostname()}) writes to {root} instead "
                    "so that neither overwrites the other"
                )
            else:
                claim = _identity(attempt, rank, key)
                claim["root"] = _rel(dump_path, base)
                write_json_atomic(claim_path, claim, durable=False)
                _held.setdefault((dump_abs, pid), []).append((claim_path, lock_path))
    except Exception as exc:
        _warn(f"cannot coordinate through {dump_path} ({exc}); duplicate ranks will not be detected")
    try:
        _ensure_dir(root, allow_link=root == dump_path)
    except Exception as exc:
        _warn(f"cannot create {root} ({exc})")
    _roots[cache_key] = root
    return root


def versions() -> Dict[str, str]:
    """Versions of python, msprobe-launch and of the frameworks already imported (never imports them)."""
    import sys

    out = {"python": platform.python_version()}
    for name in ("torch", "mindspore"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__version__", None):
            out[name] = str(module.__version__)
    out["msprobe_launch"] = _own_version()
    return out


def _own_version() -> str:
    """msprobe-launch's installed version. Its dist-info is looked up directly: importlib.metadata parses every
    distribution on sys.path, which was half of a rank's coordination time."""
    import sys

    prefix = "msprobe_launch-"
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as it:
                found = [e.name for e in it if e.name.startswith(prefix) and e.name.endswith(".dist-info")]
        except OSError:
            continue
        for name in found:
            try:
                with open(os.path.join(entry or ".", name, "METADATA"), encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                pass
    try:
        from importlib.metadata import version

        return version("msprobe-launch")
    except Exception:
        return "unknown"


def _env_int(name: str) -> Optional[int]:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _new_entry(rank: Optional[int], root_rel: str) -> Dict[str, Any]:
    return {
        "rank": rank,
        "host": hostname(),
        "pid": os.getpid(),
        "attempt": current_attempt(),
        "run_id": run_id(),
        "root": root_rel,
        "node_rank": _env_int("GROUP_RANK"),  # torchrun's node index (the rendezvous assigns it under c10d)
        "local_rank": _env_int("LOCAL_RANK"),
        # the launcher that started this process finishes it if it dies (see finish_node)
        "launcher_pid": _env_int("MSPROBE_AGENT_PID"),
        "duplicate": os.path.basename(root_rel).startswith(paths.DUPLICATE_PREFIX),
        "status": "running",
        "start_time": _now(),
        "end_time": None,
        "steps": [],
    }


def _entry_path(dump_path: str, entry: Dict[str, Any]) -> str:
    key = paths.rank_dir_name(entry.get("rank"), entry.get("pid") or 0)
    return os.path.join(_meta_dir(dump_path, paths.PROCS_DIR),
                        paths.process_entry_name(entry.get("attempt") or 0, key, _safe_host(), entry.get("pid") or 0))


def mark_run(dump_path: str, rid: Optional[str] = None) -> None:
    """Create the run id's marker in ``dump_path`` unless it exists: another node's launcher then recognises the
    data as this job's (``dumpformat.manifest.run_seen``) with one stat."""
    rid = run_id() if rid is None else rid
    if not rid:
        return
    marker = os.path.join(_meta_dir(dump_path, paths.RUNS_DIR), paths.run_marker_name(rid))
    if os.path.lexists(marker):
        return
    try:  # O_EXCL: the first process of the run creates it, nobody ever writes into it
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE))
    except FileExistsError:
        pass


def manifest_register(dump_path: str, *, rank: Optional[int], root: str, config: Dict[str, Any],
                      extra: Optional[Dict[str, Any]] = None) -> None:
    """Write this process's manifest entry (call once, when dumping starts). Touches only its own files."""
    key = (os.path.abspath(dump_path), os.getpid())
    try:
        entry = _new_entry(rank, _rel(dump_path, root))
        entry["config"] = config
        entry["versions"] = versions()
        entry.update(extra or {})
        path = _entry_path(dump_path, entry)
        write_json_atomic(path, entry, durable=False)
        _entries[key] = (path, entry)
    except Exception as exc:
        _warn(f"cannot write the manifest entry in {dump_path} ({exc})")


def manifest_finish(dump_path: str, *, rank: Optional[int], root: str, steps: List[int], status: str,
                    flight: Optional[Dict[str, Any]] = None) -> None:
    """Record the steps written and the exit status in this process's entry (call once, at process end), and
    release the claims."""
    key = (os.path.abspath(dump_path), os.getpid())
    try:
        path, entry = _entries.pop(key, (None, None))
        if entry is None:
            entry = _new_entry(rank, _rel(dump_path, root))
        entry = dict(entry, rank=rank, steps=sorted({int(s) for s in steps}), status=status, end_time=_now())
        if flight is not None:
            entry["flight_recorder"] = flight
        new_path = _entry_path(dump_path, entry)
        write_json_atomic(new_path, entry, durable=False)
        if path is not None and path != new_path:  # registered before the rank was known (proc{pid})
            os.unlink(path)
    except Exception as exc:
        _warn(f"cannot write the manifest entry in {dump_path} ({exc})")
    release_claims(dump_path)


def rewrite_entry(dump_path: str, entry: Dict[str, Any]) -> None:
    """Replace the entry of a process of this host that has ended (the launcher, after the job)."""
    write_json_atomic(_entry_path(dump_path, entry), entry)


def release_claims(dump_path: str) -> None:
    """Delete the claims this process holds under ``dump_path`` (only those still naming it)."""
    held = _held.pop((os.path.abspath(dump_path), os.getpid()), [])
    for claim_path, lock_path in held:
        try:
            with _lock(lock_path):
                claim = _read_json(claim_path)
                if isinstance(claim, dict) and _is_self(claim):
                    os.unlink(claim_path)
        except (OSError, ValueError):
            pass
        except Exception as exc:
            _warn(f"cannot release the claim {claim_path} ({exc})")


def _steps_on_disk(dump_path: str, root_rel: str, rank: Optional[int], pid: Any) -> List[int]:
    names = {paths.rank_dir_name(rank, pid), paths.rank_dir_name(None, pid)}
    root = os.path.join(dump_path, root_rel)
    steps = []
    try:
        for entry in os.scandir(root):
            step = paths.parse_step(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False) \
                    and any(os.path.isdir(os.path.join(entry.path, n)) for n in names):
                steps.append(step)
    except OSError:
        pass
    return sorted(steps)


def rank_dirs(dump_path: str, entry: Dict[str, Any]) -> List[str]:
    """The step/rank directories a process of this entry wrote (found on disk)."""
    root = os.path.join(dump_path, entry.get("root") or ".")
    pid = entry.get("pid")
    out = []
    for step in _steps_on_disk(dump_path, entry.get("root") or ".", entry.get("rank"), pid):
        for name in dict.fromkeys((paths.rank_dir_name(entry.get("rank"), pid), paths.rank_dir_name(None, pid))):
            d = os.path.join(root, paths.step_dir_name(step), name)
            if os.path.isdir(d) and not os.path.islink(d):
                out.append(d)
    return out


def is_mine(entry: Dict[str, Any], launcher_pid: Optional[int] = None) -> bool:
    """Whether a process entry belongs to this node: same host and, when both are known, started by this
    launcher (two launchers may share a host, e.g. in tests)."""
    if entry.get("host") != hostname():
        return False
    theirs = entry.get("launcher_pid")
    return launcher_pid is None or theirs is None or theirs == launcher_pid


def finish_node(dump_path: str, launcher_pid: Optional[int] = None) -> List[Dict[str, Any]]:
    """After the job, on one node: mark this node's processes that died without ``manifest_finish`` (killed by
    the agent on a restart, crashed) as 'died', with the steps found on disk, and return the entries of every
    process of this node. A live process, and every other host's process, is left alone: its entry is its
    own. The dead process's entry is rewritten atomically; it has no other writer any more."""
    return _finish(dump_path, launcher_pid)[0]


def _finish(dump_path: str, launcher_pid: Optional[int]) -> Tuple[List[Dict[str, Any]], int]:
    out, died = [], 0
    for path, entry in combined.iter_entries(dump_path, _safe_host()):
        if not is_mine(entry, launcher_pid):
            continue
        if entry.get("status") == "running" and not _pid_alive(entry.get("pid"), None):
            entry = dict(entry, status="died", end_time=_now(),
                         steps=_steps_on_disk(dump_path, entry.get("root") or ".", entry.get("rank"), entry.get("pid")))
            died += 1
            try:
                write_json_atomic(path, entry)
            except Exception as exc:
                _warn(f"cannot update {path} ({exc})")
        out.append(entry)
    return out, died


def manifest_reconcile(dump_path: str, launcher_pid: Optional[int] = None) -> int:
    """finish_node, counting the entries it marked 'died'."""
    return _finish(dump_path, launcher_pid)[1]


def write_combined(dump_path: str) -> Optional[Dict[str, Any]]:
    """Write ``msprobe_manifest.json``, the combined view of every process entry, atomically; only the launcher
    with the job-wide view calls it, once, after the job. Returns the manifest (None if there is no entry)."""
    entries = [e for _, e in combined.iter_entries(dump_path)]
    if not entries:
        return None
    manifest = combined.build(entries, updated=_now())
    try:
        write_json_atomic(os.path.join(dump_path, MANIFEST_NAME), manifest)
    except Exception as exc:
        _warn(f"cannot write {os.path.join(dump_path, MANIFEST_NAME)} ({exc})")
    return manifest
