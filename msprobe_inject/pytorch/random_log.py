"""random_save(): a CSV of random-API calls (api_name, stack), as msprobe writes it."""

from __future__ import annotations

import csv
import io
import os
import random as _pyrandom
import time
import traceback

import torch
from torch.overrides import TorchFunctionMode

from ..dumpformat import files, paths

_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
           "multinomial", "poisson", "uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_",
           "log_normal_", "cauchy_", "dropout", "dropout_"}


class _RandomMode(TorchFunctionMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _RANDOM:
            self.log.add(f"torch_random.{name}")
        return func(*args, **(kwargs or {}))


class _Log:
    def __init__(self, path):
        self.path = path
        self.counts: dict = {}
        self.rows: list = []

    def add(self, base):
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        self.rows.append((f"{base}.{n}", "".join(traceback.format_stack(limit=8)[:-2])))

    def write(self):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["api_name", "stack"])
        w.writerows(self.rows)
        files.write_atomic(self.path, b"\xef\xbb\xbf" + buf.getvalue().encode("utf-8"))


def install(output_path: str) -> None:
    import atexit

    files.makedirs(output_path)
    try:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    except Exception:
        rank = None
    tag = paths.rank_dir_name(rank, os.getpid())
    log = _Log(os.path.join(output_path, f"random_{tag}_{time.strftime('%Y%m%d%H%M%S')}.csv"))
    _RandomMode(log).__enter__()
    for name in ("random", "randint", "uniform", "gauss", "choice", "shuffle"):
        orig = getattr(_pyrandom, name)

        def wrapper(*a, __o=orig, __n=name, **k):
            log.add(f"python_random.{__n}")
            return __o(*a, **k)

        setattr(_pyrandom, name, wrapper)
    atexit.register(log.write)
    _ = torch
