"""DDP job for the flight recorder (no msprobe code unless FLIGHT_MODE=explicit).

FLIGHT_MODE: nan (rank FLIGHT_RANK's input gets a NaN at step FLIGHT_STEP), spike (every rank's loss is
scaled by 1e4 at FLIGHT_STEP), raise (rank FLIGHT_RANK raises at FLIGHT_STEP, after its forward), kill (it
sends itself SIGKILL there), explicit (the script calls
PrecisionDebugger.trigger at FLIGHT_STEP), none. FLIGHT_STEPS steps in all.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import MLP, init
from torch.nn.parallel import DistributedDataParallel

mode = os.environ.get("FLIGHT_MODE", "none")
bad_rank = int(os.environ.get("FLIGHT_RANK", "0"))
bad_step = int(os.environ.get("FLIGHT_STEP", "3"))
steps = int(os.environ.get("FLIGHT_STEPS", "8"))
rank = init()
debugger = None
if mode == "explicit":
    from msprobe_inject.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=os.environ["FLIGHT_DUMP"], level="L1")
torch.manual_seed(0)
model = DistributedDataParallel(MLP())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(100 + rank)
for step in range(steps):
    if debugger is not None:
        debugger.start()
    x = torch.randn(4, 8, generator=gen)
    y = torch.randn(4, 2, generator=gen)
    if step == bad_step and rank == bad_rank and mode == "nan":
        x[0, 0] = float("nan")
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    if step == bad_step and rank == bad_rank and mode == "raise":
        raise RuntimeError(f"planted failure at step {step}")
    if step == bad_step and rank == bad_rank and mode == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if step == bad_step and mode == "spike":
        loss = loss * 1e4
    loss.backward()
    optimizer.step()
    if debugger is not None:
        if step == bad_step and rank == bad_rank:
            debugger.trigger("the script saw something")
        debugger.stop()
        debugger.step()
# the ranks leave gloo together (as tests/scripts/parallel_jobs.py): a rank tearing its group down while another is
# still in it aborts now and then ("terminate called without an active exception"). A rank that raised or was killed
# never gets here, and neither do the others: they wait in that step's all-reduce until the launcher stops them.
dist.barrier()
dist.destroy_process_group()
