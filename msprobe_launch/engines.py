"""The runners: torchrun's elastic agent and MindSpore's msrun in this process, or a command as a child.

``execute`` runs a plan: it prints the plan's notes, clears what ``--overwrite`` replaces, puts the workers'
environment into this process (the agent, msrun and a child inherit it), runs the engine, and at the end
of the job finishes this node's ranks only (their manifest entries, the journals of those that died) and
prints the dump summary. Each runner
returns the launcher's exit code (README "Exit codes").
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional

from msprobe_launch.plan import DumpPlan, LaunchPlan

# README "Exit codes": 0 success, 2 usage (found by the plan), a failed worker's or the command's own code,
# 128 + N for signal N, 127 for a command that cannot be started.
EXIT_CANNOT_START = 127
EXIT_INTERRUPTED = 128 + signal.SIGINT


def exit_status(returncode: int) -> int:
    """A child's return code as an exit code: killed by signal N (a negative code) gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def worker_failure_code(exitcode: Any) -> int:
    """The exit code for torchrun's first failed worker: its own code, 128 + N if signal N ended it, else 1."""
    if isinstance(exitcode, int) and exitcode < 0:
        return exit_status(exitcode)
    return exitcode if isinstance(exitcode, int) and 0 < exitcode < 256 else 1


def run_torchrun(args: Any) -> int:
    """``torch.distributed.run.run(args)`` in this process (``args``: its parser's namespace)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        sys.stderr.write(exc.format_msg() + "\n")
        _, failure = exc.get_first_failure()
        return worker_failure_code(getattr(failure, "exitcode", 1))
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def run_msrun(argv: List[str]) -> int:
    """MindSpore's msrun in this process, as ``msrun ARGV``."""
    from mindspore.parallel.cluster import run as msrun

    saved_argv, saved_path = sys.argv, os.environ.get("PATH", "")
    # msrun starts the literal 'python' through PATH: make it this interpreter (its venv).
    os.environ["PATH"] = os.path.dirname(sys.executable) + (os.pathsep + saved_path if saved_path else "")

    def sigterm_to_sigint(signum: int, frame: Any) -> None:
        signal.raise_signal(signal.SIGINT)  # msrun traps SIGINT only; SIGTERM would orphan the workers

    previous = signal.signal(signal.SIGTERM, sigterm_to_sigint)
    sys.argv = ["msrun"] + argv
    try:
        msrun.run(msrun.get_args())
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        sys.stderr.write(f"msprobe-launch: msrun failed: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        sys.argv = saved_argv
        signal.signal(signal.SIGTERM, previous)


def run_command(argv: List[str]) -> int:
    """``argv`` as a child process that gets SIGINT/SIGTERM sent to the launcher; its exit code."""
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        sys.stderr.write(f"msprobe-launch: cannot run {shlex.join(argv)}: {exc.strerror or exc}\n")
        return EXIT_CANNOT_START

    def forward(signum: int, frame: Any) -> None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return exit_status(code)


RUNNERS: Dict[str, Callable[[LaunchPlan], int]] = {
    "torchrun": lambda plan: run_torchrun(plan.torchrun_args),
    "msrun": lambda plan: run_msrun(plan.argv),
    "command": lambda plan: run_command(plan.argv),
}


def _clear(entries: List[str]) -> None:
    for p in entries:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def apply_env(plan: LaunchPlan) -> None:
    """The workers' environment, in this process: the engine (and through it every worker) inherits it."""
    for var in plan.env_unset:
        os.environ.pop(var, None)
    os.environ.update(plan.env_set)


def print_summary(dump_path: str, select: Optional[Callable[[Any], bool]] = None) -> None:
    """The readers' summary table of a dump (of the rank directories ``select`` accepts, when given)."""
    from msprobe_readers.cli import print_summary as summary

    summary(dump_path, select=select)


def _argv_node_rank(argv: List[str]) -> Optional[int]:
    for i, arg in enumerate(argv):
        for spelling in ("--node_rank", "--node-rank"):
            value = arg[len(spelling) + 1:] if arg.startswith(spelling + "=") else \
                (argv[i + 1] if arg == spelling and i + 1 < len(argv) else None)
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


def is_lead(entries: List[Dict[str, Any]], engine: str = "command", argv: Optional[List[str]] = None) -> bool:
    """Whether this launcher has the job-wide view: its ranks are on node 0 (torchrun's GROUP_RANK, which the
    c10d rendezvous assigns), msrun's ``--node_rank`` is 0, or nothing says there is more than one node."""
    node_ranks = {e.get("node_rank") for e in entries if isinstance(e.get("node_rank"), int)}
    if node_ranks:
        return 0 in node_ranks
    if engine == "msrun":
        return (_argv_node_rank(argv or []) or 0) == 0
    return True


def recover_node(dump_path: str, entries: List[Dict[str, Any]]) -> None:
    """Rebuild the files of this node's ranks that died mid-step, from their journals. Only rank directories of
    processes known to be dead are touched: a rank of another node may still be writing its last step."""
    from msprobe_inject.coord import rank_dirs
    from msprobe_inject.dumpformat.journal import needs_recovery, recover, remove_spares

    for entry in entries:
        if entry.get("status") != "died":
            continue
        for d in rank_dirs(dump_path, entry):
            if isinstance(entry.get("pid"), int):
                remove_spares(d, pid=entry["pid"])
            if not needs_recovery(d):
                continue
            try:
                res = recover(d)
                sys.stderr.write(f"[msprobe-launch] recovered {res.get('records', 0)} records of a rank that "
                                 f"did not finish from its journal: {d} (step marked incomplete)\n")
            except OSError as exc:
                sys.stderr.write(f"[msprobe-launch] could not recover {d}: {exc}\n")


def recover_flight(dump_path: str, entries: List[Dict[str, Any]]) -> None:
    """Flight recorder: the rings of this node's ranks that died without exiting (kill -9) survive them in
    node-local spill directories; their window is written now (msprobe_inject.flight.recover_spill)."""
    from msprobe_inject.coord import rewrite_entry
    from msprobe_inject.flight import recover_spill

    for i, entry in enumerate(entries):
        if entry.get("status") != "died":
            continue
        res = recover_spill(dump_path, entry)
        if res is None:
            continue
        steps = res.pop("recovered_steps")
        entry = entries[i] = dict(entry, steps=sorted(set(entry.get("steps") or []) | set(steps)),
                                  flight_recorder=res)
        rewrite_entry(dump_path, entry)
        if steps:
            sys.stderr.write(f"[msprobe-launch] flight recorder: rank {entry.get('rank')} died without exiting; "
                             f"its steps {steps[0]}-{steps[-1]} were written from its ring\n")


def _own(dump_path: str, entries: List[Dict[str, Any]]) -> Callable[[Any], bool]:
    from msprobe_inject.dumpformat import paths

    keys = set()
    for e in entries:
        pid = e.get("pid") or 0
        for name in (paths.rank_dir_name(e.get("rank"), pid), paths.rank_dir_name(None, pid)):
            keys.add((e.get("root") or ".", name))
    return lambda proc: proc.key in keys


def finish_job(dump: DumpPlan, engine: str = "command", argv: Optional[List[str]] = None) -> None:
    """After the job, on this node: close the manifest entries of this node's dead ranks and rebuild their files
    from their journals, then print the summary: the job-wide one and the combined manifest from the launcher
    with the job-wide view, this node's ranks from the others. Nothing of another node or of a live process is
    written. A failure here is reported and never changes the job's exit code."""
    if not (dump.dumping and dump.dump_path and os.path.isdir(dump.dump_path)):
        return
    entries: List[Dict[str, Any]] = []
    try:
        from msprobe_inject.coord import finish_node

        entries = finish_node(dump.dump_path, os.getpid())
    except Exception as exc:
        sys.stderr.write(f"[msprobe-launch] could not update the manifest: {exc}\n")
    try:
        recover_node(dump.dump_path, entries)
    except Exception as exc:
        sys.stderr.write(f"[msprobe-launch] could not recover journals: {exc}\n")
    try:
        recover_flight(dump.dump_path, entries)
    except Exception as exc:
        sys.stderr.write(f"[msprobe-launch] could not recover the flight recorder's rings: {exc}\n")
    lead = is_lead(entries, engine, argv)
    if lead:
        try:
            from msprobe_inject.coord import write_combined

            write_combined(dump.dump_path)
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not write the manifest: {exc}\n")
    try:
        sys.stdout.flush()
        if lead:
            print_summary(dump.dump_path)
        else:
            print(f"msprobe dump summary of this node's ranks (node 0's launcher prints the job's; "
                  f"`msprobe-dump summary {dump.dump_path}` at any time):")
            print_summary(dump.dump_path, _own(dump.dump_path, entries))
    except Exception as exc:
        sys.stderr.write(f"[msprobe-launch] could not summarise {dump.dump_path}: {exc}\n")
    if dump.index and entries:
        try:
            from msprobe_readers import index

            done = index.build(dump.dump_path, select=_own(dump.dump_path, entries))
            sys.stderr.write(f"[msprobe-launch] indexed {done['directories']} step/rank directories of this node "
                             f"({done['rows']} rows): msprobe-dump sql {dump.dump_path} \"SELECT ...\"\n")
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not index {dump.dump_path}: {exc}\n")


def _build_node_hooks() -> None:
    """The ranks' C++ node hooks, compiled for this torch before any rank starts if not in the cache yet (they
    only load them: msprobe_inject.nodehook). Whatever happens, the job runs: without them its ranks register
    their hooks through torch's Python API."""
    try:
        from msprobe_inject import nodehook

        said = nodehook.build(announce=lambda what: sys.stderr.write(f"[msprobe-launch] {what}\n"))
    except Exception as exc:
        said = f"not built ({type(exc).__name__}: {exc})"
    if said:
        sys.stderr.write(f"[msprobe-launch] C++ node hooks {said}\n")


def execute(plan: LaunchPlan) -> int:
    """Run the plan in this process (the agent / msrun manager) and print the summary. Returns the exit code."""
    for note in plan.notes:
        sys.stderr.write(f"[msprobe-launch] {note}\n")
    if plan.dump.clear_first:
        sys.stderr.write(f"[msprobe-launch] --overwrite: removing earlier dump data in {plan.dump.dump_path}\n")
        _clear(plan.dump.clear_first)
    if plan.node_hooks:
        _build_node_hooks()
    apply_env(plan)
    if plan.dump.dumping and plan.dump.dump_path:
        try:  # before any rank starts: a node's launcher starting later recognises this job's data
            from msprobe_inject.coord import mark_run

            mark_run(plan.dump.dump_path)
        except Exception as exc:
            sys.stderr.write(f"[msprobe-launch] could not mark the run in {plan.dump.dump_path}: {exc}\n")
    code = RUNNERS[plan.engine](plan)
    finish_job(plan.dump, plan.engine, plan.argv)
    return code
