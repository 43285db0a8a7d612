"""Helpers for the reader tests: hand-written dumps, a test script run through the real launcher, msprobe-dump
run as its console script runs it, a PNG decoder."""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from launch_util import HERE, launch, run, runtime_available

SCRIPTS = os.path.join(HERE, "scripts")
DUMP_CLI = [sys.executable, "-m", "msprobe_readers.cli"]  # what the msprobe-dump console script runs
NAN = float("nan")
LIB = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"


def e2e(test: Callable) -> Callable:
    """A test that runs a real job through the launcher (needs the in-rank runtime)."""
    test = pytest.mark.skipif(not runtime_available(),
                              reason="the in-rank runtime (msprobe_inject.zero_code) is missing")(test)
    return pytest.mark.e2e(test)


# ---- hand-written dumps ----

def leaf(mx: Any = 1.0, mn: Any = -1.0, mean: Any = 0.0, norm: Any = 2.0, shape: Sequence[int] = (2,),
         **extra: Any) -> Dict[str, Any]:
    """One tensor entry of a record, as msprobe writes it."""
    out = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": mn,
           "Mean": mean, "Norm": norm, "requires_grad": False}
    out.update(extra)
    return out


def fwd(*args: Any) -> Dict[str, Any]:
    """A forward record with these input tensors and one output tensor."""
    return {"input_args": list(args), "input_kwargs": {}, "output": [leaf()]}


def write_dump(directory: Any, data: Dict[str, Any], header: Optional[Dict[str, Any]] = None,
               stack: Optional[Dict[str, Any]] = None, construct: Optional[Dict[str, Any]] = None) -> None:
    """dump.json (and stack.json, construct.json) of one rank directory, formatted as msprobe formats them."""
    os.makedirs(directory, exist_ok=True)
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
    doc.update(header or {})
    with open(os.path.join(directory, "dump.json"), "w") as fh:
        json.dump(doc, fh, indent=1)  # bare NaN tokens, as msprobe writes them
    if stack is not None:
        with open(os.path.join(directory, "stack.json"), "w") as fh:
            json.dump(stack, fh, indent=1)
    if construct is not None:
        with open(os.path.join(directory, "construct.json"), "w") as fh:
            json.dump(construct, fh, indent=1)


def frame(path: str, line: int, func: str, code: str) -> str:
    """One line of stack.json, as msprobe writes it."""
    return f"File {path}, line {line}, in {func}, \n {code}"


# ---- real jobs and the CLI ----


_LAUNCHED: Dict[tuple, Tuple[str, subprocess.CompletedProcess]] = {}


def launch_script(tmp_path: Any, script: str, *script_args: str, level: str = "mix",
                  dump: str = "dump") -> Tuple[str, subprocess.CompletedProcess]:
    """Run tests/scripts/SCRIPT on 2 ranks (gloo, CPU) through msprobe-launch; returns (dump path, launcher run).

    The job runs once per session for each script, arguments and level: a later call gets a copy of that dump in
    its own tmp_path (the index form builds its index there), beside the same launcher run."""
    key = (script, script_args, level, dump)
    if key not in _LAUNCHED:
        first = tempfile.mkdtemp(prefix="launched-")
        atexit.register(shutil.rmtree, first, True)
        args = ["--standalone", "--nproc-per-node", "2", "--level", level, "--dump-path", dump,
                os.path.join(SCRIPTS, script), *script_args]
        proc = launch(args, first, timeout=240)
        assert proc.returncode == 0, \
            f"launcher failed\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
        _LAUNCHED[key] = os.path.join(first, dump), proc
    done, proc = _LAUNCHED[key]
    os.makedirs(str(tmp_path), exist_ok=True)
    out = os.path.join(str(tmp_path), dump)
    shutil.copytree(done, out, symlinks=True)
    return out, proc


INDEX_FIRST = False  # set by the records_source fixture: reading commands bring the index up to date first
_READING = ("summary", "ranks", "diff", "report")


def dump_cli(args: Sequence[str], cwd: Any, timeout: float = 120) -> subprocess.CompletedProcess:
    args = list(args)
    if INDEX_FIRST and args and args[0] in _READING and not {"--no-index", "--help", "-h"} & set(args):
        args.insert(1, "--index")
    return run(DUMP_CLI + args, str(cwd), timeout=timeout)


def load_data(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["data"]


def _bad(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def first_nonfinite(path: str) -> Optional[Tuple[int, str]]:
    """(position, record) of the first record with a NaN/Inf statistic, read with plain json (independent check)."""
    def walk(v: Any) -> bool:
        if isinstance(v, dict):
            return any(_bad(v.get(k)) for k in ("Max", "Min", "Mean", "Norm")) or any(walk(x) for x in v.values())
        if isinstance(v, list):
            return any(walk(x) for x in v)
        return False

    for i, (name, rec) in enumerate(load_data(path).items()):
        if walk(rec):
            return i, name
    return None


def line_of(path: str, marker: str) -> int:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if marker in line:
                return n
    raise AssertionError(f"{marker!r} not in {path}")


def read_png(path: str) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) to an (h, w, channels) array."""
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, [], 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos:pos + 4], "big")
        kind, body = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
            depth, color, interlace = body[8], body[9], body[12]
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    data = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = width * bpp
    rows = data.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        ftype, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 1:  # Sub: running sum per channel
            cur = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        elif ftype == 2:  # Up
            cur = (line + prev) % 256
        else:  # Average / Paeth depend on the reconstructed left pixel: one pixel at a time
            cur = np.zeros(stride, dtype=np.int32)
            lst: List[int] = line.tolist()
            up: List[int] = prev.tolist()
            res = [0] * stride
            for i in range(stride):
                a = res[i - bpp] if i >= bpp else 0
                b = up[i]
                if ftype == 3:
                    res[i] = (lst[i] + (a + b) // 2) % 256
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    res[i] = (lst[i] + pred) % 256
            cur = np.array(res, dtype=np.int32)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3].astype(np.uint8)


def count_color(img: np.ndarray, rgb: Tuple[int, int, int], tol: int = 12) -> int:
    diff = np.abs(img.astype(np.int32) - np.array(rgb, dtype=np.int32)).max(axis=2)
    return int((diff <= tol).sum())
