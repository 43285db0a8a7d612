"""Process classification and activation for the msprobe-launch bootstrap (loaded only when dumping is asked for).

Entry points: ``sitecustomize.py`` in this directory (PYTHONPATH form) and the ``msprobe_launch.pth``
startup hook (env-only form) both call ``startup(origin)``; it runs at most once per process.
A rank ("worker") claims itself (MSPROBE_CLAIMED_PID / MSPROBE_CLAIMED_RANK), installs a meta-path
post-import hook and calls ``msprobe_inject.zero_code.activate_pytorch()`` (``activate_mindspore()``)
once ``torch`` (``mindspore``) has been imported. Helpers (resource tracker, spawn and DataLoader workers,
compile workers, msrun's scheduler, children of a rank) and launchers (torchrun, msrun, ...) stay inert.
The classification rules are documented in the README. Nothing here raises into user code.

For the runtime: ``is_active_worker()`` is true only in the claiming process (not in its fork children).
"""

import os
import sys

_BOOT_DIR = os.path.dirname(os.path.abspath(__file__))
_BOOT_SUFFIX = os.sep + os.path.join("msprobe_inject", "_boot")
# Cheap pre-check: envvars.wants_dump() can only be true when one of these is set.
_TRIGGERS = ("MSPROBE_DUMP_PATH", "MSPROBE_CONFIG", "MSPROBE_ENABLE")
# Imported module -> function of msprobe_inject.zero_code to call once it is imported.
_TARGETS = {"torch": "activate_pytorch", "mindspore": "activate_mindspore"}

_RANK_VARS = ("RANK", "RANK_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_HELPER_MARKERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.semaphore_tracker",
    "multiprocessing.forkserver",
    "_inductor/compile_worker",
    "_inductor.compile_worker",
)
_LAUNCHER_SCRIPTS = ("torchrun", "msrun", "deepspeed", "accelerate", "msprobe-launch", "msprobe-dump", "msprobe")
_LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.elastic",
    "deepspeed.launcher",
    "accelerate.commands",
    "mindspore.parallel.cluster",
    "msprobe_launch",
    "msprobe.msprobe",
)

_state = {"started": False, "role": None, "reason": None, "owner": None, "finder": None, "activated": set()}


def _warn(message):
    try:
        sys.stderr.write(f"[msprobe-launch] warning: {message}\n")
    except Exception:
        pass


def _log(event, **fields):
    """Append one JSON line to $MSPROBE_BOOT_LOG (debugging and tests); silent on any failure."""
    path = os.environ.get("MSPROBE_BOOT_LOG")
    if not path:
        return
    try:
        import json

        record = {"pid": os.getpid(), "ppid": os.getppid(), "event": event}
        record.update(fields)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except Exception:
        pass


def _argv():
    # sys.argv is incomplete while site runs (e.g. ['-c']); orig_argv is the real command line (3.10+).
    argv = getattr(sys, "orig_argv", None)
    if argv:
        return list(argv)
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)


def _entry_point(argv):
    """('c', code) | ('m', module) | ('script', path) | ('none', '') from an interpreter command line."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "-m"):
            return arg[1], argv[i + 1] if i + 1 < len(argv) else ""
        if arg.startswith("-c") or arg.startswith("-m"):
            return arg[1], arg[2:]
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg == "--":
            return ("script", argv[i + 1]) if i + 1 < len(argv) else ("none", "")
        if arg.startswith("-") and arg != "-":
            i += 1
            continue
        return "script", arg
    return "none", ""


def _rank_signature(env):
    for var in _RANK_VARS:
        value = env.get(var)
        if value not in (None, ""):
            return f"{var}={value}"
    return ""


def _is_launcher(kind, value):
    if kind == "script":
        name = os.path.basename(value)
        if name.endswith(".py"):
            name = name[:-3]
        norm = value.replace(os.sep, "/")
        return name in _LAUNCHER_SCRIPTS or "deepspeed/launcher/" in norm or "torch/distributed/run" in norm
    if kind == "m":
        return any(value == m or value.startswith(m + ".") for m in _LAUNCHER_MODULES)
    return False


def classify(env=None, argv=None):
    """Return (role, reason); role is 'worker', 'helper' or 'launcher'. Rules: the README."""
    env = os.environ if env is None else env
    argv = _argv() if argv is None else argv
    pid = str(os.getpid())
    claimed = env.get("MSPROBE_CLAIMED_PID")
    if claimed and claimed != pid:
        sig = _rank_signature(env)
        # A new rank variable means a launcher between the claiming rank and us assigned a rank: we are one.
        if not sig or sig == env.get("MSPROBE_CLAIMED_RANK", ""):
            return "helper", f"descendant of rank process {claimed}"
    if env.get("MS_ROLE") == "MS_SCHED":
        return "helper", "msrun scheduler"
    kind, value = _entry_point(argv)
    text = " ".join(argv[1:])
    if any(marker in text for marker in _HELPER_MARKERS) or env.get("TORCH_WARM_POOL") == "0":
        return "helper", "multiprocessing or compile helper"
    if _is_launcher(kind, value):
        return "launcher", f"launcher {value}"
    agent = env.get("MSPROBE_AGENT_PID")
    if agent and agent == str(os.getppid()):
        return "worker", "child of the launcher"
    if (kind == "c" and "multiprocessing.spawn" in value) or "--multiprocessing-fork" in argv:
        return "helper", "multiprocessing spawn child"
    sig = _rank_signature(env)
    return "worker", (f"rank from {sig}") if sig else "top-level process"


def _on_boot_path():
    for entry in sys.path:
        if entry and os.path.abspath(entry).endswith(_BOOT_SUFFIX):
            return True
    return False


def _activate(name):
    """Call zero_code.activate_<framework>() once, in the claiming process only."""
    if name in _state["activated"] or _state["owner"] != os.getpid():
        return
    _state["activated"].add(name)
    func_name = _TARGETS[name]
    _log("activate", module=name)
    try:
        import importlib

        zero_code = importlib.import_module("msprobe_inject.zero_code")
    except Exception as exc:
        _warn(f"msprobe_inject.zero_code is not available ({type(exc).__name__}: {exc}); this process will not dump")
        return
    func = getattr(zero_code, func_name, None)
    if func is None:
        _warn(f"msprobe_inject.zero_code has no {func_name}(); this process will not dump")
        return
    try:
        func()
    except Exception as exc:
        _warn(f"{func_name}() failed ({type(exc).__name__}: {exc}); this process will not dump")


class _PostImportFinder:
    """Meta-path finder that lets the other finders locate torch/mindspore and runs a callback after import."""

    def __init__(self, targets):
        self._targets = targets
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._targets or self._busy or fullname in _state["activated"]:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        except Exception:
            return None
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        _wrap_exec_module(spec, fullname)
        return spec


def _wrap_exec_module(spec, fullname):
    loader = spec.loader
    original = loader.exec_module

    def exec_module(module):
        try:
            original(module)
        finally:
            try:
                del loader.exec_module  # back to the class method; the loader object stays untouched
            except AttributeError:
                pass
        try:
            _activate(fullname)
        except Exception as exc:
            _warn(f"activation after importing {fullname} failed: {exc!r}")

    try:
        # An instance attribute keeps module.__loader__ the original object (importlib.resources et al.).
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        spec.loader = _LoaderProxy(loader, exec_module)


class _LoaderProxy:
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _after_fork_in_child():
    # A fork child inherits the hooks but is not the rank: MSPROBE_CLAIMED_PID now names the parent.
    try:
        _state["role"] = "helper"
        _state["reason"] = "fork child of rank process"
        finder = _state.get("finder")
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
        zero_code = sys.modules.get("msprobe_inject.zero_code")
        mark = getattr(zero_code, "mark_inert", None)
        if mark is not None:
            mark()
        _log("fork-child-inert")
    except Exception:
        pass


def _become_worker():
    pid = os.getpid()
    os.environ["MSPROBE_CLAIMED_PID"] = str(pid)
    os.environ["MSPROBE_CLAIMED_RANK"] = _rank_signature(os.environ)
    _state["owner"] = pid
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    finder = _PostImportFinder(_TARGETS)
    _state["finder"] = finder
    sys.meta_path.insert(0, finder)
    activate_loaded()


def activate_loaded():
    """Activate for frameworks imported before the hook was installed (e.g. by a chained sitecustomize)."""
    if _state["role"] != "worker":
        return
    for name in _TARGETS:
        if name in sys.modules and name not in _state["activated"]:
            _activate(name)


def is_active_worker():
    """True in the process that claimed the rank (False in its fork/spawn/exec children and in helpers)."""
    return _state["role"] == "worker" and os.environ.get("MSPROBE_CLAIMED_PID") == str(os.getpid())


def role():
    return _state["role"], _state["reason"]


def startup(origin="sitecustomize"):
    """Classify this process and, for a rank, install the activation hook. At most once; never raises."""
    try:
        if _state["started"]:
            return
        if not any(os.environ.get(k) for k in _TRIGGERS):
            return
        if origin == "pth" and _on_boot_path():
            return  # PYTHONPATH carries a boot dir: its sitecustomize runs next and does the work
        from msprobe_inject import envvars

        if not envvars.wants_dump():
            return
        _state["started"] = True
        role_, reason = classify()
        _state["role"], _state["reason"] = role_, reason
        _log("classify", role=role_, reason=reason, origin=origin, argv=_argv())
        if role_ == "worker":
            _become_worker()
    except Exception as exc:
        _warn(f"bootstrap failed ({type(exc).__name__}: {exc}); this process will not dump")
