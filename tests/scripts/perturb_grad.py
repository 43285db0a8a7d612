"""DDP job in which rank 1 perturbs fc2.weight's gradient after the all-reduce, at step 1 (no msprobe code).

The noise is added through numpy so that the perturbation itself is no torch call (no extra record).
"""

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import MLP, init
from torch.nn.parallel import DistributedDataParallel

rank = init()
torch.manual_seed(0)
model = DistributedDataParallel(MLP())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(100 + rank)
for step in range(3):
    x = torch.randn(4, 8, generator=gen)
    y = torch.randn(4, 2, generator=gen)
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()  # DDP's all-reduce has finished when backward returns
    if rank == 1 and step == 1:
        grad = model.module.fc2.weight.grad.numpy()  # shares memory with the tensor
        grad += np.random.default_rng(0).normal(0.0, 0.5, grad.shape).astype(grad.dtype)
    optimizer.step()
dist.destroy_process_group()
