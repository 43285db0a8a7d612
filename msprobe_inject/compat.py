"""Scripts written for msprobe (``from msprobe.pytorch import ...``) run under the launcher unchanged
when mindstudio-probe is not installed: ``msprobe`` and ``msprobe.pytorch`` resolve to our modules."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_ALIASES = {"msprobe.pytorch": "msprobe_inject.pytorch", "msprobe.mindspore": "msprobe_inject.mindspore"}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "msprobe" or fullname in _ALIASES:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name == "msprobe":
            import types

            mod = types.ModuleType("msprobe")
            mod.__path__ = []  # a namespace for the aliases below
            return mod
        return importlib.import_module(_ALIASES[spec.name])

    def exec_module(self, module):
        pass


def install_msprobe_alias() -> bool:
    """Alias msprobe to us only when the real msprobe is absent. Returns True when installed."""
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return True
    if "msprobe" in sys.modules:
        return False
    try:
        if importlib.util.find_spec("msprobe") is not None:
            return False
    except (ImportError, ValueError):
        pass
    sys.meta_path.append(_AliasFinder())
    return True
