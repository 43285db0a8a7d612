"""Where a configuration's overhead goes, on the GPT-2 step of ``overhead.py``: the step with recording on, with one
part of it switched off at a time, and without recording, in one process (each way two steps in a row, the first
not counted; the ways in turn, reversed every other round), so all see the same machine, memory and model.

    python benchmarks/record_parts.py [--rounds 12] [--only "L0 flight;monitor;L1"] [--ways "no tool;all"]
        [--inside 8]

Ways: "no tool" (the debugger not started: its hooks return at once), "all", "no encoding" (values and tensors
encoded as empty: no statistics read), "no stacks", "no records sent" (records, members and construct entries
dropped before the writer and its journal), "no module backward" (no backward capture of module calls), "bare
hooks" (no encoding, no stacks, no records sent), and "no writer encoding" (the writer thread takes the runs of
records it encodes in one C call without encoding them: its hold on the interpreter, which the training thread waits
for, and its CPU, gone; its documents then nearly empty; where the writer encodes record by record, a flight
recorder's, this way is "all"), "python api path" (the API calls' common case through apis.py's Python instead of its
C, ``_apicall.c``, and so the monitor preset's module calls; the C calls the encoder, the stacks and the send itself,
so "no encoding", "no stacks", "no records sent", "bare hooks" and the timing inside run the Python path too; a
parameter gradient's hook keeps the C it was made with in every way). Prints each way's median step and its overhead
over "no tool"; a part's share is what switching it off took away from the overhead of "all". These figures are
diagnostics: a way that is not the code's never runs in a job. Also each round's "all" over its "no tool" (steps
seconds apart, so the machine's drift over the run cancels): their median and quartiles. ``--ways`` runs only the
ways named ("no tool" and "all" always), so that more rounds of those fit in the same time.

Then ``--inside`` more steps of "all" with the recording's functions timed (exclusive time: a function's time less that
of the timed functions it calls), medians in ms per step: the statistics (``Encoder.encode``, ``Encoder.tensor``), the
journal and the hand-off to the writer (``DumpWriter.send``), the stacks (``DumpWriter.stack``: a stack's first sight,
the later ones are the callers' own time in ``writer.stack_at``), the step directory's opening (``Session.ensure_open``:
once per step, the records' own test of it is theirs), the recorder's module, gradient and backward bodies around those,
start, stop and step, and the forward side of a module call's backward capture (``_ModuleBackward.inputs`` and
``outputs``: the view or function its tensors pass through, and the hook on its node). What the step's overhead holds
besides these is torch's hook dispatch, the hooks' own Python before they reach the recorder, the API hooks, and what
the timing itself adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import native  # noqa: E402
from abba import debugger_for  # noqa: E402
from overhead import gpt2, train_step  # noqa: E402

PARTS = {  # part -> (module path, class, method names), timed by exclusive time
    "statistics": ("msprobe_inject.pytorch.encode", "Encoder", ("encode", "tensor")),
    "journal and hand-off": ("msprobe_inject.writer", "DumpWriter", ("send",)),
    "stacks": ("msprobe_inject.writer", "DumpWriter", ("stack",)),
    "step directory check": ("msprobe_inject.session", "Session", ("ensure_open",)),
    "recorder bodies": ("msprobe_inject.recorder", "Recorder",
                        ("module_enter", "module_exit", "module_backward", "module_backward_pre", "backward_record",
                         "param_grad", "record", "merge", "place", "keep")),
    "start, stop, step": ("msprobe_inject.recorder", "Recorder", ("start", "stop", "step")),
    "module backward set-up": ("msprobe_inject.pytorch.modules", "_ModuleBackward", ("inputs", "outputs")),
}
WAYS = ("no tool", "all", "no encoding", "no stacks", "no records sent", "no module backward", "bare hooks",
        "no writer encoding", "python api path")
_DROPPED = ("Record", "Merge", "Construct")


def run(name: str, rounds: int, warmup: int, tmp: str, inside_steps: int = 8, ways: tuple = WAYS) -> dict:
    from msprobe_inject import recorder, writer
    from msprobe_inject.pytorch import apis, modules

    debugger = debugger_for(name, tmp)
    rec = debugger.runtime
    enc_type, writer_type = type(rec.encoder), type(rec.writer)
    real = {"encode": enc_type.encode, "tensor": enc_type.tensor, "send": writer_type.send,
            "stack": writer_type.stack}
    module_bwd = rec.module_bwd

    def send_control_only(self, ev, push=False):  # flushes and step ends still reach the writer
        return None if type(ev).__name__ in _DROPPED else real["send"](self, ev, push)

    events_into = writer.events_into
    records = (writer.Record, writer.Merge)

    def events_skipped(batch, i, types, _records):
        # the run events_into would take, taken without a byte encoded (the writer thread's hold on the
        # interpreter while it encodes: what the training thread waits for)
        ts, n = types[:4], len(batch)
        while i < n and type(batch[i]) in ts and (type(batch[i]) not in records or batch[i].pending is None):
            i += 1
        return i

    fast = apis._fast_call
    module_fast = modules._fast_pre, modules._fast_post

    def set_way(way: str) -> None:
        # the API calls' C common case calls the encoder, the stacks and the send itself: the ways that replace those
        # (and the timing inside, which wraps them) run apis.py's Python path, "python api path" alone
        python_path = ("no encoding", "no stacks", "no records sent", "bare hooks", "python api path", "inside")
        apis._fast_call = None if way in python_path else fast
        # so do a module call's at the monitor preset (modules._fast_pre, _fast_post); a parameter gradient's hook keeps
        # the function it was made with, the C's (its body is then not timed inside)
        modules._fast_pre, modules._fast_post = (None, None) if way in python_path else module_fast
        enc_type.encode, enc_type.tensor = real["encode"], real["tensor"]
        writer_type.send, writer_type.stack = real["send"], real["stack"]
        rec.module_bwd = module_bwd
        if way in ("no encoding", "bare hooks"):
            enc_type.encode = lambda self, value, pending, files, keys=None: []
            enc_type.tensor = lambda self, t, pending, file_name: {}
        apis.stack_at = recorder.stack_at = writer.stack_at
        if way in ("no stacks", "bare hooks"):
            writer_type.stack = lambda self, key, skip: None
            apis.stack_at = recorder.stack_at = None  # a known stack's C call from the recording frames too
        if way in ("no records sent", "bare hooks"):
            writer_type.send = send_control_only
        if way == "no module backward":
            rec.module_bwd = False
        writer.events_into = events_skipped if way == "no writer encoding" else events_into

    model, opt, ids = gpt2()
    for _ in range(warmup):
        train_step(model, opt, ids, debugger)
    got: dict = {w: [] for w in ways}
    for r in range(rounds):
        for way in (ways if r % 2 == 0 else ways[::-1]):
            set_way(way)
            dbg = None if way == "no tool" else debugger
            for k in range(2):
                t0 = time.perf_counter()
                train_step(model, opt, ids, dbg)
                if k:
                    got[way].append(time.perf_counter() - t0)
    set_way("inside")
    out = {w: statistics.median(v) * 1e3 for w, v in got.items()}
    # each round's "all" over its "no tool", a few seconds apart: the machine's drift between rounds cancels
    out["ratios"] = [a / b for a, b in zip(got["all"], got["no tool"])]
    out["inside"] = inside(lambda: train_step(model, opt, ids, debugger), steps=inside_steps) if inside_steps else {}
    return out


def inside(step, steps: int) -> dict:
    """Median ms per step spent inside each of PARTS (exclusive time), over ``steps`` steps, and the step's median."""
    import importlib

    acc = {part: 0.0 for part in PARTS}
    open_calls: list = []  # time of timed callees, one slot per timed call in progress
    saved = []

    def exclusive(f, part):
        def wrapped(*a, **k):
            open_calls.append(0.0)
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                acc[part] += dt - open_calls.pop()
                if open_calls:
                    open_calls[-1] += dt
        return wrapped

    for part, (mod, cls_name, methods) in PARTS.items():
        cls = getattr(importlib.import_module(mod), cls_name)
        for m in methods:
            saved.append((cls, m, cls.__dict__[m]))
            setattr(cls, m, exclusive(cls.__dict__[m], part))
    got: dict = {part: [] for part in (*PARTS, "step")}
    try:
        for _ in range(steps):
            for part in acc:
                acc[part] = 0.0
            t0 = time.perf_counter()
            step()
            got["step"].append(time.perf_counter() - t0)
            for part, v in acc.items():
                got[part].append(v)
    finally:
        for cls, m, f in saved:
            setattr(cls, m, f)
    return {k: statistics.median(v) * 1e3 for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="L0 flight;monitor;L1")
    ap.add_argument("--inside", type=int, default=8, help="steps timed inside the recording's parts (0: none)")
    ap.add_argument("--ways", default=";".join(WAYS), help="the ways run, of: " + "; ".join(WAYS)
                    + " (\"no tool\" and \"all\" always)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    picked = {w.strip() for w in a.ways.split(";")} | {"no tool", "all"}
    unknown = picked - set(WAYS)
    if unknown:
        raise SystemExit(f"--ways: unknown {sorted(unknown)}; allowed values: {'; '.join(WAYS)}")
    ways = tuple(w for w in WAYS if w in picked)
    if a.worker:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run(a.worker, a.rounds, a.warmup, tmp, a.inside, ways)), flush=True)
        return
    native.ensure()
    print(f"{'configuration':<14}{'way':<20}{'step ms':>9}{'overhead':>10}{'share':>8}   medians of {a.rounds} steps")
    insides = []
    for name in a.only.split(";"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--rounds",
                               str(a.rounds), "--warmup", str(a.warmup), "--inside", str(a.inside), "--ways", a.ways],
                              capture_output=True, text=True, timeout=3600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[0][7:])
        base, total = r["no tool"], r["all"] - r["no tool"]
        for w in ways:
            over = r[w] - base
            share = f"{(total - over) / total:>8.2f}" if w not in ("no tool", "all") and total > 0 else f"{'':>8}"
            print(f"{name if w == ways[0] else '':<14}{w:<20}{r[w]:>9.1f}{over:>+10.1f}{share}")
        q = statistics.quantiles(r["ratios"], n=4) if len(r["ratios"]) > 1 else r["ratios"] * 3
        print(f"{'':<14}{'all / no tool':<20}{statistics.median(r['ratios']):>9.3f}   per round, median "
              f"(quartiles {q[0]:.3f}–{q[2]:.3f})")
        if r["inside"]:
            insides.append((name, r["inside"], total))
    if not insides:
        return
    print(f"\n{'configuration':<14}{'part':<22}{'ms/step':>9}{'of overhead':>13}   "
          f"inside \"all\", medians of {a.inside} steps")
    for name, parts, total in insides:
        print(f"{name:<14}{'step (timed)':<22}{parts['step']:>9.1f}")
        for part in PARTS:
            share = f"{parts[part] / total:>13.2f}" if total > 0 else f"{'-':>13}"
            print(f"{'':<14}{part:<22}{parts[part]:>9.2f}{share}")
        rest = total - sum(parts[p] for p in PARTS)
        print(f"{'':<14}{'the rest of overhead':<22}{rest:>9.2f}" + (f"{rest / total:>13.2f}" if total > 0 else ""))


if __name__ == "__main__":
    main()
