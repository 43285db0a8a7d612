"""Seed 001's Quick Start network, instrumented as the seed shows. argv: MODULE CONFIG [STEPS]"""
import importlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

dbg = importlib.import_module(sys.argv[1])
dbg.seed_all()
debugger = dbg.PrecisionDebugger(config_path=sys.argv[2])


class ModuleOP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features=8, out_features=4)

    def forward(self, x):
        x1 = self.linear(x)
        r1 = F.relu(x1)
        return r1


if __name__ == "__main__":
    model = ModuleOP()
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    for _ in range(steps):
        debugger.start(model=model)
        x = torch.randn(10, 8)
        out = model(x)
        loss = out.sum()
        loss.backward()
        debugger.stop()
        debugger.step()
