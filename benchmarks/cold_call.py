"""What a small call costs warm (in a tight loop) and cold (right after a torch op that streams 16 MB through the
caches, as the ops of a training step do), in one process, the two ways alternating call by call.

    python benchmarks/cold_call.py [--calls 2000]

The calls: a torch op on a 256-element tensor (``torch.relu``), the encoder's entry for that tensor (one recorded
tensor of the tool), a hook on an autograd node (``grad_fn.register_hook``, what each recorded call's backward record
costs in the forward), ``os.getpid()`` (a system call the hooks make), a Python attribute read, and an empty timing
pair (what ``perf_counter_ns`` itself adds). Prints the median ns of each, warm and cold, and their ratio. The
tool's per-record cost in a step is made of such calls: what a tight loop measures is not what a step pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from abba import debugger_for  # noqa: E402


def _noop(grad_inputs, grad_outputs) -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        enc = debugger_for("L1", tmp).runtime.encoder
        t = torch.randn(256)
        node = (torch.randn(256, requires_grad=True) * 2).grad_fn
        big = torch.randn(4 * 2**20)  # 16 MB, more than this machine's last-level cache share

        class Holder:
            pid = 0

        h = Holder()
        calls = {
            "empty timing pair": lambda: None,
            "torch.relu, 256 floats": lambda: torch.relu(t),
            "encoder entry, 256 floats": lambda: enc.encode([t], [], None),
            "grad_fn.register_hook": lambda: node.register_hook(_noop),
            "os.getpid()": os.getpid,
            "attribute read": lambda: h.pid,
        }
        got = {(name, way): [] for name in calls for way in ("warm", "cold")}
        for name, f in calls.items():
            for _ in range(50):
                f()
            for i in range(2 * a.calls):
                way = ("warm", "cold")[i % 2]
                if way == "cold":
                    big.add_(1.0)
                else:
                    f()  # the same call just before: its code and data are in the caches
                t0 = time.perf_counter_ns()
                f()
                got[(name, way)].append(time.perf_counter_ns() - t0)
    print(f"{'call':<28}{'warm ns':>10}{'cold ns':>10}{'ratio':>8}   medians of {a.calls} calls each way")
    for name in calls:
        w, c = (statistics.median(got[(name, way)]) for way in ("warm", "cold"))
        print(f"{name:<28}{w:>10.0f}{c:>10.0f}{c / w:>8.2f}")


if __name__ == "__main__":
    main()
