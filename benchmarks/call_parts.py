"""Where a tiny recorded call's time goes: ``percall.py``'s loop (``Linear(4, 4)``, ``relu``, ``*``, ``+`` in two
small modules, with backward) under the explicit API, in one process, with one part of the recording switched off at
a time: the ways in turn over the rounds (reversed every other round), so all see the same machine and memory. Then
the writer thread's CPU time in the loop, by event kind.

    python benchmarks/call_parts.py [--level L1] [--rounds 15] [--iters 200]

Ways: "all", "python api path" (the API calls' common case through apis.py's Python instead of its C, _apicall.c),
"no backward hook" (no hook on the output's node, so no backward record either), "no encoding" (values encoded as
empty), "records not sent" (nothing journaled or handed to the writer thread), "no stacks". The C common case calls
the encoder, the stack and the node hook itself, so the ways that replace one of those run the Python path, and their
"less" is against "python api path" ("python api path"'s against "all"). The figures are diagnostics: a way that is
not the code's never runs in a job. The shares overlap (a record not encoded is also shorter to journal and to
write).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import native  # noqa: E402
from percall import tiny_model  # noqa: E402
from writer_cpu import time_handlers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    native.ensure()  # before the tool's import, which loads them

    from msprobe_inject import recorder as R
    from msprobe_inject import writer as W
    from msprobe_inject.pytorch import PrecisionDebugger, apis, encode

    model, x = tiny_model()
    tmp = tempfile.mkdtemp(prefix="msprobe_call_parts_")
    with open(os.path.join(tmp, "config.json"), "w") as fh:
        json.dump({"task": "statistics", "dump_path": os.path.join(tmp, "dump"), "level": a.level}, fh)
    debugger = PrecisionDebugger(config_path=os.path.join(tmp, "config.json"))

    def body() -> None:
        model(x).sum().backward()

    def nothing(*_a, **_k):
        return None

    def empty(self, value, pending, files=None):
        return []

    slots = {"bwd": (apis.ApiHooks, "_register_backward"), "enc": (encode.Encoder, "encode"),
             "send": (W.DumpWriter, "send"), "stack": (W.DumpWriter, "stack")}
    orig = {k: getattr(cls, n) for k, (cls, n) in slots.items()}
    ways = {"all": {}, "python api path": {}, "no backward hook": {"bwd": nothing}, "no encoding": {"enc": empty},
            "records not sent": {"send": nothing}, "no stacks": {"stack": nothing}}
    fast = apis._fast_call

    def set_way(way: str) -> None:
        for k, (cls, n) in slots.items():
            setattr(cls, n, ways[way].get(k, orig[k]))
        # a known stack's C call from the recording frames goes with DumpWriter.stack
        apis.stack_at = R.stack_at = None if way == "no stacks" else W.stack_at
        # the C common case (apis._fast_call) calls what the ways replace itself: they run apis.py's Python path
        apis._fast_call = fast if way == "all" else None

    for _ in range(20):  # warm-up, unrecorded
        body()
    debugger.start(model=model)
    got: dict = {w: [] for w in ways}
    for r in range(a.rounds):
        for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            set_way(way)
            for _ in range(20):
                body()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                body()
            got[way].append((time.perf_counter() - t0) / a.iters * 1e6)
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
    set_way("all")

    # the writer thread's CPU in the same loop: its handlers timed on its own clock, the rest of its thread by the
    # process's CPU time less the training thread's
    debugger.stop()  # a new step: its documents hold the timed iterations' records alone
    debugger.step()
    debugger.start(model=model)
    wr = debugger.runtime.writer
    wr.flush()
    cpu, count = time_handlers(wr)
    n = a.iters * 5
    p0, t0 = time.process_time(), time.thread_time()
    for _ in range(n):
        body()
    wr.flush()
    p1, t1 = time.process_time(), time.thread_time()
    debugger.stop()

    print(f"\n{a.level}, µs per iteration, medians of {a.rounds} rounds of {a.iters} iterations")
    for way, ts in got.items():
        med = statistics.median(ts)
        # a part's share against the same code less that part: the ways' against the Python path's
        ref = "all" if way in ("all", "python api path") else "python api path"
        less = statistics.median(got[ref]) - med
        print(f"  {way:<20}{med:>9.1f}{'' if way == 'all' else f'{less:>9.1f} less':>14}")
    total = ((p1 - p0) - (t1 - t0)) / n * 1e6
    print(f"the writer thread's CPU over {n} iterations of one step: {total:.1f} µs per iteration (the step's "
          "documents, written at its end, included)")
    for name in cpu:
        print(f"  {name:<16}{count[name] / n:>8.2f} per iteration {cpu[name] / count[name] * 1e6:>10.2f} µs each "
              f"{cpu[name] / n * 1e6:>8.1f} µs per iteration")
    print(f"  {'the rest (its loop, the queue)':<64}{total - sum(cpu.values()) / n * 1e6:>8.1f} µs per iteration")


if __name__ == "__main__":
    main()
