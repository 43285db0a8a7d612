"""A 3-layer MLP trained for 2 steps on every rank; ``--scale fc2=1.5`` changes one layer's weights.

Two runs that differ only in that option differ first in that layer (no msprobe code).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import MLP, init

parser = argparse.ArgumentParser()
parser.add_argument("--scale", default="", help="LAYER=FACTOR: multiply that layer's weight after init")
args = parser.parse_args()
rank = init()
torch.manual_seed(0)
model = MLP(layers=3)
if args.scale:
    layer, factor = args.scale.split("=")
    with torch.no_grad():
        getattr(model, layer).weight.mul_(float(factor))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(100 + rank)
for _step in range(2):
    x = torch.randn(4, 8, generator=gen)
    y = torch.randn(4, 2, generator=gen)
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
