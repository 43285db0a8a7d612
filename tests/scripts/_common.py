"""Shared pieces of the reader test scripts: a process group from the launcher's environment, a tiny MLP."""

import os
import socket

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def init() -> int:
    if "RANK" not in os.environ:  # plain `python script.py`: a world of one
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    return dist.get_rank()


class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden if layers > 2 else 2)
        if layers > 2:
            self.fc3 = nn.Linear(hidden, 2)
        self.layers = layers

    def forward(self, x):
        x = F.relu(self.fc1(x))  # line marker: fc1
        x = self.fc2(x)
        if self.layers > 2:
            x = self.fc3(F.relu(x))
        return x
