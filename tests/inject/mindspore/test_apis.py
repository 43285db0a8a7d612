"""MindSpore API wrappers (mindspore/apis.py): @jit code compiles against the original APIs."""

from __future__ import annotations

import glob
import json

import pytest
from util import ms_env as _env
from util import run_py

pytest.importorskip("mindspore")




JIT_SCRIPT = """
import numpy as np, mindspore as ms
from mindspore import nn, ops
from msprobe_inject.mindspore import PrecisionDebugger
ms.set_device("CPU")
debugger = PrecisionDebugger(dump_path="./jit", level="L1")

@ms.jit
def scaled_tanh(x):
    return ops.tanh(x) * 2

class Inner(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones((4, 4), np.float32)), name="w")

    @ms.jit
    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.w))

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        return scaled_tanh(self.inner(self.fc(x))).sum() + ops.sin(x).sum()

net = Net()
opt = nn.SGD(net.trainable_params(), 0.1)
gf = ms.value_and_grad(net, None, opt.parameters)
for _ in range(2):
    debugger.start(net)
    loss, grads = gf(ms.Tensor(np.ones((2, 4), np.float32)))
    opt(grads)
    debugger.stop()
    debugger.step()
print("loss", float(loss))
"""


def test_jit_functions_and_cells_still_compile_under_l1(tmp_path):
    """@jit code is compiled from source: it must see the original APIs, not our wrappers or hooks."""
    run_py(JIT_SCRIPT, str(tmp_path), env=_env())
    body = json.load(open(glob.glob(str(tmp_path / "jit" / "step1" / "*" / "dump.json"))[0]))
    keys = list(body["data"])
    want = {"Primitive.matmul.MatMul.0.backward", "Functional.sin.0.forward", "Tensor.__add__.0.backward"}
    assert want <= set(keys), keys
