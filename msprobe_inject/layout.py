"""Where dump files go, and how they are created safely.

Names from user code (save() names, module names) never escape the dump directory; files are
created 0640 and directories 0750; no symlink is followed when creating; writes are atomic.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

FILE_MODE = 0o640
DIR_MODE = 0o750
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
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


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step{step}")


def rank_dir_name(rank: Optional[int], pid: int) -> str:
    return f"rank{rank}" if rank is not None else f"proc{pid}"


def makedirs(path: str, root: Optional[str] = None) -> None:
    """mkdir -p with mode 0750. No component below ``root`` (the dump path, which itself may be a
    link the user chose) may be a symlink: one planted inside the dump tree is never written through."""
    path = os.path.abspath(path)
    parts = []
    head = path
    while head and not os.path.isdir(head):
        parts.append(head)
        head = os.path.dirname(head)
        if head == os.path.dirname(head):
            break
    for p in reversed(parts):
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass
    if root is not None:
        check_no_symlink(os.path.abspath(root), path)
    elif parts and os.path.islink(parts[0]):
        raise OSError(f"refusing to write through symlink {parts[0]}")


def check_no_symlink(root: str, path: str) -> None:
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith(".."):
        return
    cur = root
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise OSError(f"refusing to write through symlink {cur}")


def _open_new(path: str, append: bool = False) -> int:
    flags = os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if append else os.O_TRUNC
    return os.open(path, flags, FILE_MODE)


def open_append(path: str):
    """Append-only handle (journals, logs); refuses a symlink at path."""
    return os.fdopen(_open_new(path, append=True), "ab", buffering=0)


def write_atomic(path: str, data: bytes) -> None:
    """Write to a temp file in the same directory and rename over path (never follows a symlink)."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = _open_new(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, path)


def dumps_json(obj: Any) -> bytes:
    # msprobe's own formatting: indent=1, NaN/Infinity tokens, ASCII.
    return json.dumps(obj, indent=1).encode("ascii")


def within(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.realpath(path).startswith(root + os.sep) or os.path.realpath(path) == root
