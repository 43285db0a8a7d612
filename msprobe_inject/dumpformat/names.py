"""Record names, built and parsed here and nowhere else, for both frameworks.

* API calls: ``{Prefix}.{api}.{index}.{forward|backward}`` (``Functional.linear.0.forward``,
  ``Tensor.__add__.1.backward``, MindSpore's ``Primitive.add.Add.0.forward``);
* module (PyTorch) and cell (MindSpore) calls: ``{Module|Cell}.{path}.{Class}.{forward|backward}.{index}``,
  with ``{index}.`` before the path when the model was given as a list;
* parameter gradients: ``{Module|Cell}.{path}.{Class}.parameters_grad.{k}``;
* ``save()`` at level debug: ``{name}.{count}.debug`` and ``{name}_grad.{count}.debug``.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional

MODULE_ROOTS = ("Module", "Cell")
FORWARD = "forward"
BACKWARD = "backward"
PARAMETERS_GRAD = "parameters_grad"
DEBUG = "debug"
_MODULE_DIRECTIONS = (FORWARD, BACKWARD, PARAMETERS_GRAD)


# ---- built ----

def api_base(prefix: str, api: str) -> str:
    """The part of an API record name that does not change between calls: ``Functional.linear.``."""
    return f"{prefix}.{api}."


# The names built at every record are a template's format method (one C call; a Python function's frame costs more
# than the formatting itself). api_key(base, index, direction): ``Functional.linear.0.forward``.
api_key: Callable[[str, int, str], str] = "{}{}.{}".format


def module_prefix(root: str, path: str, cls: str, model_index: Optional[int] = None) -> str:
    """``Module.fc1.Linear.``: the part of a module record name that does not change between calls."""
    idx = f"{model_index}." if model_index is not None else ""
    return f"{root}.{idx}{path}.{cls}."


# module_key(prefix, direction, index): ``Module.fc1.Linear.forward.0`` from the prefix ``Module.fc1.Linear.``
module_key: Callable[[str, str, int], str] = "{}{}.{}".format
# param_grad_key(prefix, k): ``Module.fc1.Linear.parameters_grad.{k}`` from the prefix ``Module.fc1.Linear.``
param_grad_key: Callable[[str, int], str] = ("{}" + PARAMETERS_GRAD + ".{}").format


def debug_key(name: str, count: int) -> str:
    return f"{name}.{count}.{DEBUG}"


def debug_grad_key(name: str, count: int) -> str:
    return f"{name}_grad.{count}.{DEBUG}"


# ---- parsed ----

class RecordName(NamedTuple):
    kind: str  # "api" | "module" | "debug"
    root: str  # the API prefix ("Functional", "Tensor", "Primitive"...), "Module"/"Cell", or the save() name
    path: str  # the API ("linear", "add.Add") or the module path ("0.layers.1.fc"); "" for debug
    cls: str  # the module class ("Linear"); "" otherwise
    direction: str  # "forward" | "backward" | "parameters_grad" | "debug"
    index: int


def parse(name: str) -> Optional[RecordName]:
    """The parts of a record name, or None for a name this format does not produce.

    The index's C scanner (msprobe_readers/_jrows.c) relies on the kind and direction of an ASCII name not
    depending on which ASCII digits it holds: keep it so (tests/readers/test_index_jrows.py checks it)."""
    parts = name.split(".")
    if len(parts) < 3 or not parts[-1].isdigit() and not parts[-2].isdigit():
        return None
    if parts[-1] == DEBUG and parts[-2].isdigit():
        return RecordName("debug", ".".join(parts[:-2]), "", "", DEBUG, int(parts[-2]))
    if parts[0] in MODULE_ROOTS and len(parts) >= 4 and parts[-2] in _MODULE_DIRECTIONS and parts[-1].isdigit():
        return RecordName("module", parts[0], ".".join(parts[1:-3]), parts[-3], parts[-2], int(parts[-1]))
    if parts[-1] in (FORWARD, BACKWARD) and parts[-2].isdigit():
        return RecordName("api", parts[0], ".".join(parts[1:-2]), "", parts[-1], int(parts[-2]))
    return None


def is_module(name: str) -> bool:
    """A module/cell record (forward, backward or parameters_grad) of either framework."""
    p = parse(name)
    return p is not None and p.kind == "module"


def is_api(name: str) -> bool:
    p = parse(name)
    return p is not None and p.kind == "api"


def is_parameters_grad(name: str) -> bool:
    """A module/cell's parameter gradient record: ``Module.fc1.Linear.parameters_grad.0``."""
    p = parse(name)
    return p is not None and p.kind == "module" and p.direction == PARAMETERS_GRAD


def module_path(name: str) -> Optional[str]:
    """``module.fc2`` from ``Module.module.fc2.Linear.forward.0`` (or a Cell's); None for other records."""
    p = parse(name)
    return p.path if p is not None and p.kind == "module" else None


def module_of(name: str) -> Optional[str]:
    """``Module.fc1.Linear`` from any of that module's record names; None for other records."""
    p = parse(name)
    return name.rsplit(".", 2)[0] if p is not None and p.kind == "module" else None


def call_of(name: str) -> Optional[str]:
    """The call a forward or backward record belongs to, without its direction: ``Functional.linear.0`` from
    ``Functional.linear.0.backward``, ``Module.fc1.Linear.0`` from ``Module.fc1.Linear.backward.0`` (so that
    both directions of a call share one label); None for parameters_grad, debug and other records."""
    p = parse(name)
    if p is None or p.direction not in (FORWARD, BACKWARD):
        return None
    if p.kind == "api":
        return name[: -len(p.direction) - 1]
    return f"{name.rsplit('.', 2)[0]}.{p.index}"


def forward_counterpart(name: str) -> List[str]:
    """Records whose stack stands for ``name``: itself, then its forward (backward records have no stack)."""
    out = [name]
    p = parse(name)
    if p is None:
        return out
    if p.kind == "api" and p.direction == BACKWARD:
        out.append(name[: -len(BACKWARD)] + FORWARD)
    elif p.kind == "module" and p.direction == BACKWARD:
        out.append(module_key(name.rsplit(".", 2)[0] + ".", FORWARD, p.index))
    elif p.kind == "module" and p.direction == PARAMETERS_GRAD:
        prefix = name.rsplit(".", 2)[0] + "."
        out += [module_key(prefix, FORWARD, p.index), module_key(prefix, FORWARD, 0)]
    return out
