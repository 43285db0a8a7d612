"""DDP job in which rank 1's input batch has a NaN at step 1 (no msprobe code)."""

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
    if rank == 1 and step == 1:
        x[0, 0] = float("nan")
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
