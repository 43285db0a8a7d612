"""Per-thread state of the PyTorch adapter, shared by its API, module and stepping hooks."""

from __future__ import annotations

import types
from typing import Any

import torch

from .. import nodehook
from ..threadstate import quiet_sections, thread_state

_NO_TF = torch._C.DisableTorchFunction

# Whether a hook runs inside torch.compile's or export's tracing, asked as ``dynamo_compiling() or
# COMPILER._is_compiling_flag`` at every hook: torch.compiler.is_compiling() is two interpreter frames (it asks
# torch.jit.is_scripting() first), these one frame and an attribute read. Dynamo folds is_dynamo_compiling() to True
# where it traces a hook, so it never reads the flag there (a guard on it would recompile); the flag is what
# non-strict export and a compile session's other tracing (AOTAutograd, make_fx) set.
_compiler = getattr(torch, "compiler", None)
if hasattr(_compiler, "is_dynamo_compiling") and hasattr(_compiler, "_is_compiling_flag"):
    dynamo_compiling = _compiler.is_dynamo_compiling
    COMPILER: Any = _compiler
else:  # another torch: its own question, and no flag of its own to read
    dynamo_compiling = getattr(_compiler, "is_compiling", lambda: False)
    COMPILER = types.SimpleNamespace(_is_compiling_flag=False)

# The C++ node hooks of this torch when built (msprobe_inject.nodehook): hook_after(t, fn) in place of
# t.grad_fn.register_hook(fn), hook_single(value, fn) for a module call's capture of one plain tensor (t[...] and its
# grad_fn.register_prehook(fn)); None where they are not built, and the hooks go through torch's Python API
_native = nodehook.load()
hook_after = getattr(_native, "post", None)
hook_single = getattr(_native, "hook_single", None)
# DisableTorchFunction as two C functions over torch's thread-local state, for the C quiet sections
_NO_TF_C = getattr(_native, "tf_guard", None)


# The hooks' per-thread state (threadstate.thread_state): each attribute and a thread's first value
_FIELDS = (
    ("busy", False),  # the tool itself is running: hooks pass straight through
    ("in_api", False),  # inside a recorded API: nested APIs are neither recorded nor counted
    ("stack", list),  # enclosing module records (construct.json parents, mix-level list)
    ("mframes", list),  # module forward frames between pre-hook and hook
    ("depth", 0),  # module call depth: 0 is a top-level call (the model)
    ("recompute", 0),  # module forwards open inside a backward pass (activation checkpointing)
    ("recompute_in_api", False),  # in_api before the outermost of them
)


tls = thread_state(_FIELDS)


# The tool's own tensor work: hooks pass straight through (busy) and our calls skip torch-function handling (the dump
# mode's Python handler costs microseconds per attribute read in hooks that run while it is pushed). Quiet() is one
# section, entered with `with`: in C, no interpreter frame (threadstate.quiet_sections).
Quiet = quiet_sections(tls, _NO_TF, _NO_TF_C)
