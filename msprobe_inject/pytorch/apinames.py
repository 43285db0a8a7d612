"""Which torch callables are dumped at L1, and under which msprobe name.

The TorchFunctionMode receives the callable object itself (``torch._C._nn.gelu``, ``TensorBase.add``),
so names come from a table built once from msprobe's API list. Python operators reach the mode as
the plain method (``a + b`` arrives as ``TensorBase.add``); msprobe records them under the dunder
(``Tensor.__add__``, ``Tensor.__radd__``), so the calling instruction decides the name.
"""

from __future__ import annotations

import dis
import json
import os
import sys
from types import FrameType
from typing import Any, Dict, Optional, Tuple

import torch

_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "pytorch_apis.json")

# (prefix, api) per callable, e.g. F.gelu -> ("Functional", "gelu")
ApiName = Tuple[str, str]

_BINARY = {  # method name -> (operator symbol -> dunder)
    "add": {"+": "__add__", "+=": "__iadd__"},
    "sub": {"-": "__sub__", "-=": "__isub__"},
    "mul": {"*": "__mul__", "*=": "__imul__"},
    "matmul": {"@": "__matmul__"},
    "div": {"/": "__truediv__"},
    "remainder": {"%": "__mod__"},
    "bitwise_and": {"&": "__rand__"},
    "bitwise_or": {"|": "__ror__"},
    "bitwise_xor": {"^": "__rxor__"},
    "add_": {"+=": "__iadd__"},
    "sub_": {"-=": "__isub__"},
    "mul_": {"*=": "__imul__"},
    "div_": {"/=": "__itruediv__"},
    "floor_divide_": {"//=": "__ifloordiv__"},
    "remainder_": {"%=": "__imod__"},
    "pow": {"**": "__pow__"},
    "pow_": {"**=": "__ipow__"},
}
_COMPARE = {"ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__", "eq": "__eq__"}
_UNARY = {"neg": "__neg__", "abs": "__abs__", "bitwise_not": "__invert__"}
_REVERSIBLE = {"add": "__radd__", "mul": "__rmul__"}
_OPERATOR_METHODS = frozenset(_BINARY) | frozenset(_COMPARE) | frozenset(_UNARY)
_PY311 = sys.version_info >= (3, 11)
_OLD_BINARY = {  # Python < 3.11 opcode names
    "BINARY_ADD": "+", "BINARY_SUBTRACT": "-", "BINARY_MULTIPLY": "*", "BINARY_MATRIX_MULTIPLY": "@",
    "BINARY_TRUE_DIVIDE": "/", "BINARY_MODULO": "%", "BINARY_AND": "&", "BINARY_OR": "|", "BINARY_XOR": "^",
    "BINARY_POWER": "**", "INPLACE_ADD": "+=", "INPLACE_SUBTRACT": "-=", "INPLACE_MULTIPLY": "*=",
    "INPLACE_TRUE_DIVIDE": "/=", "INPLACE_FLOOR_DIVIDE": "//=", "INPLACE_MODULO": "%=", "INPLACE_POWER": "**=",
}
_TENSOR_PY = os.path.join("torch", "_tensor.py")


def load_lists() -> Dict[str, Any]:
    with open(_DATA, encoding="utf-8") as fh:
        return json.load(fh)


class ApiTable:
    """Maps callables to msprobe names and decides, once per callable, whether it is dumped."""

    def __init__(self, risk_level: str = "FOCUS", all_apis: bool = False):
        lists = load_lists()
        self.all_apis = all_apis
        core = set(lists["core"]) | {"chain_matmul", "linear"}  # msprobe's CORE set loses these to a typo
        core.discard("chain_matmullinear")
        low = set(lists["low"])
        self.names: Dict[Any, ApiName] = {}
        self.listed: Dict[Any, bool] = {}  # callable -> passes risk_level
        import torch.distributed as dist
        import torch.nn.functional as F

        sources = [
            ("VF", (torch._VF,), lists.get("_VF", [])),
            ("Functional", (F,), lists["functional"]),
            ("Distributed", (dist, getattr(dist, "distributed_c10d", dist)), lists["distributed"]),
            ("Torch", (torch,), lists["torch"]),
            ("Tensor", (torch.Tensor,), lists["tensor"]),
        ]
        try:  # torch_npu ops whenever torch_npu is importable
            import torch_npu  # type: ignore

            sources.append(("NPU", (torch_npu, torch.ops.npu), lists.get("torch_npu", [])))
        except Exception:
            pass
        for prefix, modules, names in sources:
            for name in names:
                for mod in modules:
                    obj = _resolve(mod, name)
                    if obj is None:
                        continue
                    api = name.rsplit(".", 1)[-1]
                    try:
                        if obj in self.names:  # first source wins (F.conv2d is torch.conv2d)
                            continue
                        self.names[obj] = (prefix, api)
                    except TypeError:
                        continue
                    if prefix in ("Distributed", "NPU", "MindSpeed") or risk_level == "ALL":
                        keep = True
                    elif risk_level == "CORE":
                        keep = api in core
                    else:
                        keep = api not in low
                    self.listed[obj] = keep
                    break
        self._custom: Dict[Any, ApiName] = {}

    def lookup(self, func) -> Optional[ApiName]:
        try:
            return self.names.get(func)
        except TypeError:
            return None

    def name_for_unlisted(self, func) -> ApiName:
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__
        if qual.startswith(("TensorBase.", "Tensor.")):
            return "Tensor", qual.split(".", 1)[1]
        mod = getattr(func, "__module__", None) or ""
        if mod.startswith("torch.nn.functional") or mod == "torch._C._nn":
            return "Functional", qual
        if mod.startswith("torch.distributed"):
            return "Distributed", qual
        return "Torch", qual.rsplit(".", 1)[-1]


def _resolve(mod, dotted: str):
    obj = mod
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# ---------------------------------------------------------------- operator naming
_code_cache: Dict[Tuple[Any, int], Optional[Tuple[str, tuple, bool]]] = {}


def operator_site(method: str, frame, args) -> Tuple[Optional[str], bool]:
    """The dunder msprobe would record for a TensorBase method reached through a Python operator (else None), and
    whether it holds for every call of this calling instruction whose second argument is a tensor or not as this
    one's is (False: the left operand's value was looked at)."""
    if method not in _OPERATOR_METHODS or frame is None:
        return None, True
    frame = calling_site(frame)
    if frame is None:
        return None, False
    code = frame.f_code
    key = (code, frame.f_lasti)
    info = _code_cache.get(key, False)
    if info is False:
        info = _code_cache[key] = _analyse(code, frame.f_lasti)
    if info is None:
        return None, True
    kind, left, right_const = info
    if kind in ("unary",):
        return _UNARY.get(method), True
    if kind in _COMPARE_SYMS:
        return _COMPARE.get(method), True
    table = _BINARY.get(method)
    if table is None or kind not in table:
        return None, True
    dunder = table[kind]
    rev = _REVERSIBLE.get(method)
    if rev and kind in ("+", "*") and len(args) > 1 and not isinstance(args[1], torch.Tensor) and not right_const:
        # a constant left operand (2 * x) or none found is the same at every call; a name's value is looked at
        static = not left or (len(left) == 1 and left[0][0] == "LOAD_CONST")
        return (rev if _left_is_scalar(left, frame, args) else dunder), static
    return dunder, True


def calling_site(frame) -> Any:
    """The frame whose instruction an operator's name is read from: the caller's, past torch/_tensor.py's wrapper
    (it wraps __pow__, __ipow__, ...); None where there is none."""
    code = frame.f_code
    if code.co_name == "wrapped" and code.co_filename.endswith(_TENSOR_PY):
        return frame.f_back
    return frame


_COMPARE_SYMS = frozenset(("==", "!=", "<", "<=", ">", ">="))


def _analyse(code, lasti: int):
    try:
        instrs = list(dis.get_instructions(code))
    except Exception:
        return None
    idx = _at(instrs, lasti)
    if idx is None:
        return None
    ins = instrs[idx]
    if ins.opname == "BINARY_OP":
        sym = ins.argrepr
    elif ins.opname in _OLD_BINARY:
        sym = _OLD_BINARY[ins.opname]
    elif ins.opname == "COMPARE_OP":
        return ins.argrepr, (), False
    elif ins.opname in ("UNARY_NEGATIVE", "UNARY_INVERT"):
        return "unary", (), False
    else:
        return None
    left, right, right_at = _operands(instrs, idx)
    # a constant right operand (x * 0.5, x + 1): the tensor that reached the method is the left one, at every call
    # of this site, and the op is not reflected; the left operand need not be looked at each time. Not where a
    # branch joins there (x * (t if c else 0.5)): the constant is one of several right operands
    const = len(right) == 1 and right[0][0] in ("LOAD_CONST", "LOAD_SMALL_INT") \
        and not instrs[idx].is_jump_target and not instrs[right_at].is_jump_target
    return sym, left, const


def _operands(instrs, idx) -> tuple:
    """Instructions that computed the left and the right operand of the binary op at idx (straight-line code only;
    () where one cannot be told), and the index where the right one starts."""
    depth = 0
    i = idx - 1
    right_start = None
    while i >= 0:
        ins = instrs[i]
        if ins.opname in ("CACHE", "EXTENDED_ARG", "NOP", "RESUME"):
            i -= 1
            continue
        try:
            eff = dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
        except (ValueError, TypeError):
            return (), (), idx
        depth += eff
        if right_start is None and depth >= 1:
            right_start = i
            depth -= 1
            i -= 1
            continue
        if right_start is not None and depth >= 1:
            return _ops(instrs[i:right_start]), _ops(instrs[right_start:idx]), right_start
        i -= 1
    if right_start is None:
        return (), (), idx
    return (), _ops(instrs[right_start:idx]), right_start


def _ops(instrs) -> tuple:
    """(opname, argval) of each instruction that computes something."""
    return tuple((x.opname, x.argval) for x in instrs if x.opname not in ("CACHE", "EXTENDED_ARG", "NOP"))


def _left_is_scalar(left: tuple, frame, args) -> bool:
    """Best effort: does the left operand evaluate to a non-tensor? (then the op was reflected)"""
    if not left:
        return False
    loads = [(op, val) for op, val in left if op.startswith("LOAD_")]
    if len(left) == 1 and left[0][0] == "LOAD_CONST":
        return True
    # a simple name or attribute chain: evaluate it
    if loads and len(loads) == len(left) and left[0][0] in ("LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF") \
            and all(op in ("LOAD_ATTR",) for op, _ in left[1:]):
        ok, val = _lookup(frame, left[0][1])
        if not ok:
            return False
        try:
            for _, attr in left[1:]:
                val = getattr(val, attr)
        except Exception:
            return False
        return not isinstance(val, torch.Tensor)
    # an expression: scalar when none of the names it loads is a tensor
    for op, val in loads:
        if op in ("LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF"):
            ok, v = _lookup(frame, val)
            if not ok or isinstance(v, torch.Tensor) or isinstance(v, torch.nn.Module):
                return False
    return True


def _lookup(frame, name):
    if not isinstance(name, str):
        return False, None
    for ns in (frame.f_locals, frame.f_globals, frame.f_builtins):
        if name in ns:
            return True, ns[name]
    return False, None


# ---------------------------------------------------------------- argument spelling
_sig_cache: Dict[Any, Any] = {}
_call_cache: Dict[Tuple[Any, int], Any] = {}
_CALL_OPS = ("CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_KW")


def respell(func: Any, args: tuple, kwargs: Dict[str, Any], frame: Optional[FrameType]) -> Tuple[tuple, Dict[str, Any]]:
    """Restore the caller's positional/keyword split for a Python-level torch function.

    ``F.layer_norm(x, shape, w, b, eps)`` re-dispatches itself as ``(x, shape, weight=w, bias=b, eps=eps)``;
    msprobe records the call as the caller wrote it, so the caller's CALL instruction decides. Which argument goes
    where depends only on the function, the calling instruction, the number of positional arguments and the keyword
    names: worked out once (a signature's bind) and kept as a plan, that each later call applies.
    """
    try:
        # frame: handle_torch_function -> the torch function -> its caller
        if frame is None or frame.f_code.co_name != "handle_torch_function":
            return args, kwargs
        caller = frame.f_back.f_back if frame.f_back is not None else None
        if caller is None:
            return args, kwargs
        code = caller.f_code
        # the code object's id, not the object (its hash reads its constants): the entry holds the object, so the id
        # is not reused while the entry lives
        key = (func, id(code), caller.f_lasti, len(args), tuple(kwargs))
        got = _plans.get(key)
        if got is None:
            if len(_plans) >= 4096:  # full (generated code): each call bound, as a plan would be made for nothing
                return _bound(func, code, caller.f_lasti, args, kwargs)
            got = _plans[key] = (_plan(func, code, caller.f_lasti, args, kwargs), code)
        plan = got[0]
        if plan is None:
            return args, kwargs
        if plan is _BIND:
            return _bound(func, code, caller.f_lasti, args, kwargs)
        n, from_kwargs, kws = plan
        a = args[:n]
        if from_kwargs:
            a += tuple(map(kwargs.__getitem__, from_kwargs))
        kw = {}
        for name, i in kws:  # no comprehension: each is a frame of its own here
            kw[name] = args[i] if type(i) is int else kwargs[i]
        return a, kw
    except Exception:
        return args, kwargs


_plans: Dict[tuple, tuple] = {}
_BIND = "bind"  # a plan: the signature takes *args or **kwargs, so each call is bound


def _signature(func):
    sig = _sig_cache.get(func)
    if sig is None:
        import inspect

        sig = _sig_cache[func] = inspect.signature(func)
    return sig


def _spelled(code, lasti):
    key = (code, lasti)
    spelled = _call_cache.get(key, False)
    if spelled is False:
        spelled = _call_spelling(code, lasti)
        if len(_call_cache) < 4096:  # each entry keeps its code object: generated code would grow it without end
            _call_cache[key] = spelled
    return spelled


def _bound(func, code, lasti, args, kwargs):
    """The caller's split of one call, from the signature's bind (the definition the plans are checked against)."""
    spelled = _spelled(code, lasti)
    split = spelled and _split(_signature(func), spelled, args, kwargs)
    if not split:
        return args, kwargs
    bound, names, n_pos, kw_names = split
    return tuple(bound[n] for n in names[:n_pos]), {n: bound[n] for n in kw_names if n in bound}


def _split(sig, spelled, args, kwargs):
    """(the bind's arguments, their names, the caller's positional count, its keyword names), or None where the
    caller's spelling cannot be restored: more positional arguments than the bind has, or a count that would put a
    keyword among the positional arguments too (a function that drops a defaulted argument before torch's function
    handling, f(x, None, k=1) passed on as (x, k=1); a method called through its class, Tensor.split(x, 2, dim=0),
    counted as bound): such a call is recorded as torch passed it."""
    n_pos, kw_names = spelled
    bound = sig.bind(*args, **kwargs).arguments
    names = list(bound)
    if names and names[0] == "self":
        n_pos += 1  # x.split(2): the bound tensor is not counted by CALL
    if n_pos > len(names) or any(n in kw_names for n in names[:n_pos]):
        return None
    return bound, names, n_pos, kw_names


def _plan(func, code, lasti, args, kwargs):
    """What _bound does for calls of this shape: (n, keys, pairs), the positional arguments being args[:n] and then
    kwargs' values at keys, the keywords the pairs' (name, source), a source an index into args or a key of kwargs;
    None: the call is recorded as torch passed it; _BIND: bound at each call."""
    import inspect

    spelled = _spelled(code, lasti)
    if spelled is None:
        return None
    sig = _signature(func)
    params = list(sig.parameters.values())
    if any(p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for p in params):
        return _BIND
    try:
        split = _split(sig, spelled, args, kwargs)
    except TypeError:
        return None  # the function itself rejects the call
    if split is None:
        return None
    bound, names, n_pos, kw_names = split
    # positional arguments fill the first parameters in order (so they come first in the bind's order), the others
    # come by name
    src = {p.name: i for i, p in enumerate(params[:len(args)])}
    source = {n: src.get(n, n) for n in names}
    n = min(n_pos, len(args))
    return n, tuple(names[n:n_pos]), tuple((name, source[name]) for name in kw_names if name in bound)


def _call_spelling(code, lasti):
    try:
        instrs = list(dis.get_instructions(code))
    except Exception:
        return None
    idx = _at(instrs, lasti)
    if idx is None or instrs[idx].opname not in _CALL_OPS:
        return None
    ins = instrs[idx]
    argc = ins.arg or 0
    kw: tuple = ()
    if ins.opname == "CALL_FUNCTION_KW" or ins.opname == "CALL_KW":
        prev = instrs[idx - 1]
        if prev.opname == "LOAD_CONST" and isinstance(prev.argval, tuple):
            kw = prev.argval
        else:
            return None
    elif ins.opname == "CALL":
        j = idx - 1
        while j >= 0 and instrs[j].opname in ("PRECALL", "CACHE", "EXTENDED_ARG"):
            j -= 1
        if j >= 0 and instrs[j].opname == "KW_NAMES":
            kw = instrs[j].argval if isinstance(instrs[j].argval, tuple) else code.co_consts[instrs[j].arg]
    return argc - len(kw), tuple(kw)


def _at(instrs, lasti: int):
    """Index of the instruction executing at lasti (3.11 may report the offset of its last cache entry)."""
    best = None
    for i, ins in enumerate(instrs):
        if ins.offset > lasti:
            break
        best = i
    return best
