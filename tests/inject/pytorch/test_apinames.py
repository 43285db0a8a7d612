"""apinames: how a call is spelled in its record."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function

from msprobe_inject.pytorch import apinames


class _Spelling(TorchFunctionMode):
    """Each Python-level torch function's split, from respell (its plan) and from the signature's bind."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if type(func) is type(_calls) and kwargs:  # as DumpMode asks for it
            frame = sys._getframe(1)
            caller = frame.f_back.f_back
            self.seen.append((func.__name__, apinames.respell(func, args, kwargs, frame),
                              apinames._bound(func, caller.f_code, caller.f_lasti, args, kwargs)))
        return func(*args, **kwargs)


def _scaled(*tensors, scale=1.0):
    if has_torch_function(tensors):
        return handle_torch_function(_scaled, tensors, *tensors, scale=scale)
    return tensors[0] * scale


def _calls(x, w, b, logits, target):
    F.layer_norm(x, (4,), w, b, 1e-5)  # torch passes weight, bias and eps by keyword
    F.layer_norm(x, (4,), weight=w, eps=1e-6)
    F.layer_norm(x, normalized_shape=(4,), bias=b)
    F.dropout(x, 0.0, training=False)
    F.dropout(x, p=0.0, inplace=False)
    F.softmax(x, -1, dtype=torch.float64)
    F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")
    F.normalize(x, 2.0, dim=1)
    x.split(2, dim=0)  # a method: the bound tensor is not counted by CALL
    _scaled(w, b, scale=2.0)  # *tensors: bound at each call
    torch.functional.norm(x, p="fro", dim=(0, 1))


def _same(a, b) -> bool:
    if type(a) is tuple and type(b) is tuple:  # a bind's *args: a new tuple of the same objects
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a is b


def test_each_calls_split_from_its_plan_is_the_signatures_bind():
    """respell binds a function's signature once per calling instruction and call shape and applies the plan after:
    every call's positional arguments and keywords are the objects the bind gives, call after call with new values;
    a function taking *args is bound at each call."""
    apinames._plans.clear()
    mode = _Spelling()
    with mode:
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            x, w, b = torch.randn(4, 4, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g)
            _calls(x, w, b, torch.randn(3, 5, generator=g), torch.randint(0, 5, (3,), generator=g))
    assert len(mode.seen) == 3 * 11, [s[0] for s in mode.seen]
    for name, (args, kwargs), (want_args, want_kwargs) in mode.seen:
        assert _same(args, want_args), name
        assert list(kwargs) == list(want_kwargs) and all(_same(kwargs[k], want_kwargs[k]) for k in kwargs), name
    split = [(name, len(a), list(k)) for name, (a, k), _ in mode.seen[:11]]
    assert split[:5] == [("layer_norm", 5, []), ("layer_norm", 2, ["weight", "eps"]),
                         ("layer_norm", 1, ["normalized_shape", "bias"]), ("dropout", 2, ["training"]),
                         ("dropout", 1, ["p", "inplace"])], split
    assert ("split", 2, ["dim"]) in split and ("_scaled", 2, ["scale"]) in split, split
    plans = [p for p, _ in apinames._plans.values()]
    assert sum(p is apinames._BIND for p in plans) == 1 and sum(isinstance(p, tuple) for p in plans) >= 9, plans
