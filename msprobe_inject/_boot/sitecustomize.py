"""msprobe-launch bootstrap: msprobe-launch puts this directory first on every worker's PYTHONPATH.

Unless an MSPROBE_* variable asks for dumping it only chains to the sitecustomize it shadows (the way
ddtrace-run does): no torch import, no package import. Otherwise it hands over to
``msprobe_inject._boot.bootstrap.startup()``. Never raises into the interpreter's start-up.
"""

import os
import sys

_BOOT_DIR = os.path.dirname(os.path.abspath(__file__))


def _msprobe_warn(message):
    try:
        sys.stderr.write(f"[msprobe-launch] warning: {message}\n")
    except Exception:
        pass


def _msprobe_bootstrap():
    """msprobe_inject._boot.bootstrap, from the package next to this directory if it is not importable."""
    import importlib

    try:
        return importlib.import_module("msprobe_inject._boot.bootstrap")
    except ImportError as exc:
        if exc.name != "msprobe_inject":
            raise
    # Not installed in this interpreter: load the package this file belongs to, without touching sys.path.
    import importlib.util

    pkg_dir = os.path.dirname(_BOOT_DIR)
    init = os.path.join(pkg_dir, "__init__.py")
    if os.path.exists(init):
        spec = importlib.util.spec_from_file_location("msprobe_inject", init, submodule_search_locations=[pkg_dir])
    else:
        spec = importlib.machinery.ModuleSpec("msprobe_inject", None, is_package=True)
        spec.submodule_search_locations = [pkg_dir]
    module = importlib.util.module_from_spec(spec)
    sys.modules["msprobe_inject"] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("msprobe_inject", None)
        raise
    return importlib.import_module("msprobe_inject._boot.bootstrap")


def _msprobe_same_dir(entry):
    if not entry:
        return False
    try:
        path = os.path.abspath(entry)
        if path == _BOOT_DIR:
            return True
        return os.path.basename(path) == "_boot" and os.path.realpath(path) == os.path.realpath(_BOOT_DIR)
    except Exception:
        return False


def _msprobe_chain():
    """Import the sitecustomize this directory shadows; this module stays registered if there is none."""
    me = sys.modules.get("sitecustomize")
    positions = [i for i, entry in enumerate(sys.path) if _msprobe_same_dir(entry)]
    if not positions:
        return
    for i in reversed(positions):
        del sys.path[i]
    sys.modules.pop("sitecustomize", None)
    try:
        try:
            import sitecustomize  # noqa: F401  (the shadowed one, if any)
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
    except Exception as err:
        # The report site.py gives for a failing sitecustomize.
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n")
    finally:
        if "sitecustomize" not in sys.modules and me is not None:
            sys.modules["sitecustomize"] = me
        if not any(_msprobe_same_dir(entry) for entry in sys.path):
            sys.path.insert(min(positions[0], len(sys.path)), _BOOT_DIR)


_msprobe_boot = None
_msprobe_enable = os.environ.get("MSPROBE_ENABLE", "")
# envvars.is_disabled's spellings, repeated here: deciding must not import the package
if (os.environ.get("MSPROBE_DUMP_PATH") or os.environ.get("MSPROBE_CONFIG") or _msprobe_enable) \
        and _msprobe_enable.strip().lower() not in ("0", "false", "no", "off"):
    try:
        _msprobe_boot = _msprobe_bootstrap()
        _msprobe_boot.startup("sitecustomize")
    except Exception as _exc:
        _msprobe_warn(f"bootstrap failed ({type(_exc).__name__}: {_exc}); this process will not dump")
try:
    _msprobe_chain()
except Exception as _exc:
    _msprobe_warn(f"could not chain the shadowed sitecustomize: {_exc!r}")
if _msprobe_boot is not None:
    try:
        _msprobe_boot.activate_loaded()  # a chained sitecustomize may have imported torch already
    except Exception as _exc:
        _msprobe_warn(f"activation failed: {_exc!r}")
