"""Where dump files go, and how they are created safely.

Names from user code (save() names, module names) never escape the dump directory; files are
created 0640 and directories 0750; no symlink is followed when creating; writes are atomic.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from typing import Any, Optional

FILE_MODE = 0o640
DIR_MODE = 0o750
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
DIRECT_MIN = 256 << 10  # smaller files: one synchronous device write each would cost more than the copy
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_MAX_NAME = 200  # leaves room for suffixes within the 255-byte file-name limit


def safe_component(name: str) -> str:
    """One path component from an arbitrary string: no separators, no '..', no NUL, bounded length.

    msprobe requires every path component to match [A-Za-z0-9_.:/-]; anything else is replaced by '_'.
    """
    out = _UNSAFE.sub("_", str(name))
    out = re.sub(r"\.{2,}", "_", out)
    if not out or out in (".", ".."):
        out = "_"
    if len(out) > _MAX_NAME:
        import zlib

        out = f"{out[:_MAX_NAME - 9]}~{zlib.crc32(out.encode()):08x}"
    return out


def makedirs(path: str, root: Optional[str] = None) -> None:
    """mkdir -p with mode 0750. No component below ``root`` (the dump path, which itself may be a
    link the user chose) may be a symlink: each one is checked before anything is created in it."""
    path = os.path.abspath(path)
    base = os.path.abspath(root) if root is not None else None
    if base is None or not (path + os.sep).startswith(base + os.sep):
        base = path
        while base and not os.path.isdir(base):
            parent = os.path.dirname(base)
            if parent == base:
                break
            base = parent
    if not os.path.isdir(base):
        os.makedirs(base, DIR_MODE, exist_ok=True)
    cur = base
    rel = os.path.relpath(path, base)
    if rel == ".":
        return
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise OSError(f"refusing to write through symlink {cur}")
        try:
            os.mkdir(cur, DIR_MODE)
        except FileExistsError:
            if os.path.islink(cur) or not os.path.isdir(cur):
                raise OSError(f"refusing to write through {cur}: not a plain directory")


def check_no_symlink(root: str, path: str) -> None:
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith(".."):
        return
    cur = root
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise OSError(f"refusing to write through symlink {cur}")


def _open_new(path: str, append: bool = False, extra: int = 0) -> int:
    flags = os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | extra
    flags |= os.O_APPEND if append else os.O_TRUNC
    return os.open(path, flags, FILE_MODE)


def create_rw(path: str) -> int:
    """A new, empty file opened for reading and writing (a journal that is memory-mapped). A file already at
    path is unlinked, never truncated: a process may still map it, and a truncated mapping faults (SIGBUS).
    Refuses a symlink at path."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, FILE_MODE)


def open_append(path: str):
    """Append-only handle (logs); refuses a symlink at path."""
    return os.fdopen(_open_new(path, append=True), "ab", buffering=0)


@contextlib.contextmanager
def atomic_file(path: str):
    """A binary file object for a temp file beside path, renamed over path when the block succeeds."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = _open_new(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


def write_atomic(path: str, data: Any, size: Optional[int] = None, direct: bool = False) -> None:
    """Write the first size bytes (default: all) of data to a temp file beside path and rename it over
    path; never follows a symlink. With direct, a file of DIRECT_MIN bytes and more (data then starts
    on a page and holds whole pages) goes to the disk with O_DIRECT where the file system takes it: no
    copy into the page cache, no writeback competing with training later."""
    tmp = f"{path}.tmp{os.getpid()}"
    mv = memoryview(data).cast("B")
    size = len(mv) if size is None else size
    fd = -1
    if direct and size >= DIRECT_MIN and _O_DIRECT:
        try:
            fd = _open_new(tmp, extra=_O_DIRECT)
        except OSError:  # EINVAL: no direct I/O here (tmpfs, some network file systems)
            fd = -1
    direct = fd >= 0
    if not direct:
        fd = _open_new(tmp)
    try:
        if direct:
            try:
                _write_all(fd, mv)
                os.ftruncate(fd, size)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                import fcntl  # alignment the device will not take: the page cache after all

                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                _write_all(fd, mv[:size])
        else:
            _write_all(fd, mv[:size])
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(tmp)
        raise


def fsync_tree(directory: str) -> None:
    """Every file below directory, and every directory, on stable storage (the rename of an atomic write is
    durable only once its directory is)."""
    for dirpath, _dirnames, filenames in os.walk(directory, followlinks=False):
        for name in filenames:
            _fsync_path(os.path.join(dirpath, name), os.O_RDONLY)
        _fsync_path(dirpath, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    _fsync_path(os.path.dirname(directory), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags | _O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def within(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.realpath(path).startswith(root + os.sep) or os.path.realpath(path) == root
