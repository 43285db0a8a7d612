"""A small MindSpore network instrumented as the seeds show; argv: MODULE CONFIG [STEPS].

MODULE is msprobe.mindspore (mindstudio-probe, the reference) or msprobe_inject.mindspore (ours).
MS_NET_NAN_STEP=S plants a NaN in step S's input.
The network uses a Cell reused twice, a Primitive held by a Cell (ops.Mul), mint.nn.functional,
mindspore.ops, mindspore.mint and Tensor operators, and trains with value_and_grad + SGD.
"""

import importlib
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops

mod_name, cfg_path = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
if mod_name == "msprobe.mindspore":
    # mindstudio-probe's Norm is mint.norm, i.e. the LinalgVectorNorm kernel that MindSpore 2.10 does not
    # register for CPU (the run aborts with no records). Its processor falls back to ops.norm when mint
    # has no 'norm': hide that one attribute from the processor's view of mint; nothing else changes.
    import msprobe.core.dump.data_dump.data_processor.mindspore_processor as _proc

    class _MintWithoutNorm:
        def __getattr__(self, name):
            if name == "norm":
                raise AttributeError(name)
            return getattr(mint, name)

    _proc.mint = _MintWithoutNorm()
PrecisionDebugger = importlib.import_module(mod_name).PrecisionDebugger
ms.set_device("CPU")
ms.set_seed(1)
np.random.seed(1)


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.act = nn.ReLU()
        self.mul = ops.Mul()

    def construct(self, x):
        return self.act(self.mul(self.fc(x), 2.0))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Dense(4, 2)

    def construct(self, x):
        h = self.block(x)
        h = mint.nn.functional.relu(h) + x
        h = mint.mul(ops.tanh(h), 0.5)
        h = self.block(h)
        return self.head(h)


net = Net()
opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
loss_fn = nn.MSELoss()


def forward(x, y):
    return loss_fn(net(x), y)


grad_fn = ms.value_and_grad(forward, None, opt.parameters)
debugger = PrecisionDebugger(config_path=cfg_path)
nan_step = int(os.environ.get("MS_NET_NAN_STEP", "-1"))  # a NaN planted in that step's input
for step in range(steps):
    xs = np.random.randn(3, 4).astype(np.float32)
    if step == nan_step:
        xs[0, 0] = np.nan
    x = ms.Tensor(xs)
    y = ms.Tensor(np.random.randn(3, 2).astype(np.float32))
    debugger.start(net)
    loss, grads = grad_fn(x, y)
    opt(grads)
    debugger.stop()
    debugger.step()
print("loss", float(loss))
