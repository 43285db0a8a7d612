"""A small MindSpore training script with no msprobe code (CPU, PyNative).

Single process:   python examples/train_ms.py [--steps N]
Two workers:      msrun --worker_num 2 --local_worker_num 2 --join True examples/train_ms.py
With dumping:     msprobe-launch --engine msrun --worker_num 2 --local_worker_num 2 examples/train_ms.py
Under msrun (RANK_ID set) it initialises mindspore.communication and averages gradients over the workers.
"""

import argparse
import os

import mindspore as ms
import numpy as np
from mindspore import mint, nn, ops


class Block(nn.Cell):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Dense(dim, dim)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.act(self.fc(x)) + x


class Net(nn.Cell):
    def __init__(self, dim: int = 8, classes: int = 3):
        super().__init__()
        self.inp = nn.Dense(4, dim)
        self.block = Block(dim)
        self.head = nn.Dense(dim, classes)

    def construct(self, x):
        h = mint.nn.functional.relu(ops.gelu(self.inp(x)))
        h = self.block(h)
        return self.head(mint.mul(ops.tanh(h), 0.5))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    distributed = "RANK_ID" in os.environ and "MS_WORKER_NUM" in os.environ
    rank, size = 0, 1
    if distributed:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank, size = get_rank(), get_group_size()
    ms.set_seed(1)
    rng = np.random.default_rng(rank)

    net = Net()
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_reducer = nn.DistributedGradReducer(opt.parameters) if distributed else None

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for step in range(args.steps):
        x = ms.Tensor(rng.standard_normal((6, 4)).astype(np.float32))
        y = ms.Tensor(rng.integers(0, 3, size=(6,)).astype(np.int32))
        loss, grads = grad_fn(x, y)
        if grad_reducer is not None:
            grads = grad_reducer(grads)
        opt(grads)
        if distributed:
            loss = loss.copy()
            mint.distributed.all_reduce(loss)  # in place: the mean loss over the workers, for the log line
            loss = loss / size
        print(f"rank {rank}/{size} step {step} loss {float(loss):.6f}", flush=True)


if __name__ == "__main__":
    main()
