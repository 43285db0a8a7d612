"""apinames: how a call is spelled in its record."""

from __future__ import annotations

import inspect
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function

from msprobe_inject.pytorch import apinames


class _Spelling(TorchFunctionMode):
    """Each Python-level torch function's split, from respell (its plan) and from the signature's bind; and how many
    binds respell itself made."""

    def __init__(self):
        super().__init__()
        self.seen: list = []
        self.binds = 0

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if type(func) is type(_calls) and kwargs:  # as DumpMode asks for it
            frame = sys._getframe(1)
            caller = frame.f_back.f_back
            before = _BINDS[0]
            got = apinames.respell(func, args, kwargs, frame)
            self.binds += _BINDS[0] - before
            self.seen.append((func.__name__, got, apinames._bound(func, caller.f_code, caller.f_lasti, args, kwargs)))
        return func(*args, **kwargs)


_BINDS = [0]
_bind = inspect.Signature.bind


def _counted_bind(self, *args, **kwargs):
    _BINDS[0] += 1
    return _bind(self, *args, **kwargs)


def _two(x, y=None, scale=1.0):
    """One calling instruction, two shapes of the call torch function handling sees: (x,) or (x, y)."""
    if has_torch_function((x,)):
        if y is None:
            return handle_torch_function(_two, (x,), x, scale=scale)
        return handle_torch_function(_two, (x,), x, y, scale=scale)
    return x * scale


def _scaled(*tensors, scale=1.0):
    if has_torch_function(tensors):
        return handle_torch_function(_scaled, tensors, *tensors, scale=scale)
    return tensors[0] * scale


def _calls(x, w, b, logits, target, i):
    F.layer_norm(x, (4,), w, b, 1e-5)  # torch passes weight, bias and eps by keyword
    F.layer_norm(x, (4,), weight=w, eps=1e-6)
    F.layer_norm(x, normalized_shape=(4,), bias=b)
    F.dropout(x, 0.0, training=False)
    F.dropout(x, p=0.0, inplace=False)
    F.softmax(x, -1, dtype=torch.float64)
    F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")
    F.normalize(x, 2.0, dim=1)
    _two(x, None if i % 2 else w, scale=2.0)  # (x,): the None the caller wrote is not passed on
    x.split(2, dim=0)  # a method: the bound tensor is not counted by CALL
    torch.Tensor.split(x, 2, dim=0)  # called through its class: counted
    _scaled(w, b, scale=2.0)  # *tensors: bound at each call
    torch.functional.norm(x, p="fro", dim=(0, 1))


def _same(a, b) -> bool:
    if type(a) is tuple and type(b) is tuple:  # a bind's *args: a new tuple of the same objects
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a is b


def _assert_same_split(name, got, want) -> None:
    (args, kwargs), (want_args, want_kwargs) = got, want
    assert _same(args, want_args), name
    assert list(kwargs) == list(want_kwargs) and all(_same(kwargs[k], want_kwargs[k]) for k in kwargs), name


def test_each_calls_split_from_its_plan_is_the_signatures_bind(monkeypatch):
    """respell binds a function's signature once per calling instruction and call shape and applies the plan after:
    every call's positional arguments and keywords are the objects the bind gives, call after call with new values
    (one instruction calling with two shapes too); a function taking *args is bound at each call; a caller's spelling
    that would put a keyword among the positional arguments too is recorded as torch passed the call."""
    monkeypatch.setattr(inspect.Signature, "bind", _counted_bind)
    monkeypatch.setattr(apinames, "_plans", {})
    mode = _Spelling()
    binds = []
    with mode:
        for i in range(6):
            g = torch.Generator().manual_seed(i)
            x, w, b = torch.randn(4, 4, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g)
            before = mode.binds
            _calls(x, w, b, torch.randn(3, 5, generator=g), torch.randint(0, 5, (3,), generator=g), i)
            binds.append(mode.binds - before)
    assert len(mode.seen) == 6 * 13, [s[0] for s in mode.seen]
    for name, got, want in mode.seen:
        _assert_same_split(name, got, want)
    # planned once per shape: then only the *args function's calls are bound (and _two's other shape once)
    assert binds == [13, 2, 1, 1, 1, 1], binds
    assert _SPLITS == [(name, len(a), list(k)) for name, (a, k), _ in mode.seen[:13]]
    assert ("_two", 1, ["scale"]) == [(n, len(a), list(k)) for n, (a, k), _ in mode.seen[13:26]][8]
    plans = [p for p, _ in apinames._plans.values()]
    assert sum(p is apinames._BIND for p in plans) == 1 and sum(isinstance(p, tuple) for p in plans) == 11, plans
    # the sources themselves (equal objects, like two False keywords, would not tell a wrong one from the right one)
    assert (2, ("weight", "bias", "eps"), ()) in plans and (1, ("p",), (("training", "training"),)) in plans, plans


# each call's (function, positional arguments, keywords) as the caller wrote it, or as torch passed it
_SPLITS = [("layer_norm", 5, []), ("layer_norm", 2, ["weight", "eps"]), ("layer_norm", 1, ["normalized_shape", "bias"]),
           ("dropout", 2, ["training"]), ("dropout", 1, ["p", "inplace"]), ("softmax", 2, ["dtype"]),
           ("cross_entropy", 2, ["ignore_index", "reduction"]), ("normalize", 2, ["dim"]), ("_two", 2, ["scale"]),
           ("split", 2, ["dim"]), ("split", 2, ["dim"]), ("_scaled", 2, ["scale"]), ("norm", 1, ["p", "dim"])]


def test_a_full_plan_cache_binds_each_call_and_keeps_no_more_plans(monkeypatch):
    """Past 4,096 plans (code generated at run time: each new code object a new calling instruction) a call is bound
    as it comes, with the split a plan gives, and neither a plan nor the calling instruction's spelling is kept."""
    monkeypatch.setattr(inspect.Signature, "bind", _counted_bind)
    x, w, b = torch.randn(4, 4), torch.randn(4), torch.randn(4)
    logits, target = torch.randn(3, 5), torch.randint(0, 5, (3,))
    monkeypatch.setattr(apinames, "_plans", {})
    planned = _Spelling()
    with planned:
        for _ in range(2):
            _calls(x, w, b, logits, target, 0)
    monkeypatch.setattr(apinames, "_plans", {("filler", i): (None, None) for i in range(4096)})
    monkeypatch.setattr(apinames, "_call_cache", {("filler", i): None for i in range(4096)})
    full = _Spelling()
    with full:
        _calls(x, w, b, logits, target, 0)
    assert len(apinames._plans) == len(apinames._call_cache) == 4096 and full.binds == 13
    assert [(n, len(a), list(k)) for n, (a, k), _ in full.seen] == _SPLITS
    for (name, got, _), (_, want, _) in zip(full.seen, planned.seen[13:]):
        _assert_same_split(name, got, want)
