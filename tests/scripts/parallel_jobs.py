"""The jobs people run today, tiny and on gloo: tensor parallel, FSDP2, DDP + activation checkpointing,
DDP + no_sync gradient accumulation + bf16 autocast, torch.compile.
``python parallel_jobs.py KIND [--nan-rank R] [--hang]``; prints ``LOSS <step> <value>`` per step on rank 0."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import init  # noqa: E402

STEPS = 2


class Block(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, blocks: int = 2, ckpt: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(8, 4)
        self.ckpt = ckpt

    def forward(self, x):
        for b in self.blocks:
            if self.ckpt:
                from torch.utils.checkpoint import checkpoint

                x = x + checkpoint(b, x, use_reentrant=False)
            else:
                x = x + b(x)
        return self.head(x)


def build(kind: str, rank: int, world: int):
    torch.manual_seed(0)
    model = Net(ckpt=kind == "ckpt")
    if kind == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        for b in model.blocks:
            parallelize_module(b, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    elif kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind == "fsdp_tp":  # a 2-D mesh: data-parallel FSDP2 shards over tensor-parallel blocks
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        for b in model.blocks:
            parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(b, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif kind in ("ckpt", "ddp_amp"):
        model = nn.parallel.DistributedDataParallel(model)
    elif kind == "compile":  # data parallel and compiled, as jobs run it
        model = torch.compile(nn.parallel.DistributedDataParallel(model))
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tp", "fsdp2", "fsdp_tp", "ckpt", "ddp_amp", "compile"])
    ap.add_argument("--nan-rank", type=int, default=-1)
    ap.add_argument("--hang", action="store_true", help="rank 1 never joins the step-1 collectives")
    a = ap.parse_args()
    rank = init()
    world = dist.get_world_size()
    model = build(a.kind, rank, world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if a.kind in ("fsdp2", "fsdp_tp") else \
        torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        # TP needs the same batch on every rank; the others shard the data
        x = torch.randn(4 * world, 8, generator=g)
        y = torch.randint(0, 4, (4 * world,), generator=g)
        if a.kind not in ("tp",):
            part = rank // 2 if a.kind == "fsdp_tp" else rank  # the two ranks of a tensor-parallel pair share it
            x, y = x[part * 4:(part + 1) * 4], y[part * 4:(part + 1) * 4]
        if a.nan_rank == rank and step == 1:
            x = x.clone()
            x[0, 0] = float("nan")
        if a.hang and step == 1 and rank == 1:  # the job's own hang: both ranks wait in C, in a collective
            print("HANGING", flush=True)
            dist.recv(torch.empty(1), src=0)
        if a.kind == "ddp_amp":  # two micro-batches, the first without the gradient all-reduce
            with model.no_sync():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x[:2]), y[:2])
                loss.backward()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x[2:]), y[2:])
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        val = loss.detach().clone()
        dist.all_reduce(val)
        if rank == 0:
            print(f"LOSS {step} {val.item() / world:.6f}", flush=True)
    # both ranks leave gloo together: a rank that tore its group down while the other was still in it aborted
    # now and then ("terminate called without an active exception"), without the tool as with it (3 of 18 runs of
    # the FSDP2 job without the tool; with the barrier, 0 of 12)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
