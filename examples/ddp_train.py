"""A small DDP training job on CPU (gloo) with no msprobe code in it.

    msprobe-launch --nproc-per-node 2 examples/ddp_train.py
    torchrun --nproc-per-node 2 examples/ddp_train.py          # the same job without dumping
    python examples/ddp_train.py                               # one process, world size 1

Options exercise the corners the launcher must handle: DataLoader worker processes
(``--num-workers N --mp-context fork|spawn``, also env DDP_NUM_WORKERS / DDP_MP_CONTEXT), a child
process started by the script (``--subprocess``), and a rank failing in the first attempt of an elastic
job (``--fail-rank R --fail-step S``, for ``--max-restarts``).
"""

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomRegression(Dataset):
    """Deterministic inputs and targets (module level so that spawn workers can unpickle it)."""

    def __init__(self, size: int = 64, dim: int = 8, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, dim, generator=gen)
        self.y = torch.randn(size, 2, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--num-workers", type=int, default=int(os.environ.get("DDP_NUM_WORKERS", "0")),
                        help="DataLoader worker processes (env DDP_NUM_WORKERS, default 0)")
    parser.add_argument("--mp-context", choices=("fork", "spawn", "forkserver"),
                        default=os.environ.get("DDP_MP_CONTEXT") or None,
                        help="start method of the DataLoader workers (env DDP_MP_CONTEXT)")
    parser.add_argument("--subprocess", action="store_true", help="start a child Python that imports torch")
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits with code 3 ...")
    parser.add_argument("--fail-step", type=int, default=1, help="... after this step, in the first attempt only")
    return parser.parse_args()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    args = parse_args()
    if "RANK" not in os.environ:  # plain `python ddp_train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(1234)
    model = DistributedDataParallel(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    dataset = RandomRegression()
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False),
        num_workers=args.num_workers,
        multiprocessing_context=args.mp_context if args.num_workers > 0 else None,
    )

    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"rank {rank} attempt {attempt} step {step} loss {loss.item():.6f}", flush=True)
            if args.fail_rank == rank and args.fail_step == step and attempt == 0:
                print(f"rank {rank} fails on purpose after step {step}", flush=True)
                sys.exit(3)
            step += 1
            if step >= args.steps:
                break

    if args.subprocess:
        subprocess.run([sys.executable, "-c", "import torch; print('child process', torch.ones(2).sum().item())"],
                       check=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
