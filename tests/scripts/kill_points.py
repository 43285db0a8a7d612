"""A small training loop that sends itself SIGKILL at a chosen instant (the zero-loss crash tests).

KILL_AT is "none", "api:S:I" (right after the I-th torch function call of step S returned to the script's own
TorchFunctionMode, which also sees the tool's calls where the tool's mode sits above it) or "bwd:S:J" (inside
backward, in the J-th gradient hook of step S). Before dying the script writes to KILL_INFO how many record
events the tool had sent and its step; with KILL_AT=none it writes the calls and hooks of each step instead.
KILL_FORM=explicit uses PrecisionDebugger (dump path KILL_DUMP) instead of zero-code dumping.
"""

import json
import os
import signal

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

torch.set_num_threads(1)
STEPS = 3
at = os.environ.get("KILL_AT", "none")
target = None
if at != "none":
    kind, s, i = at.split(":")
    target = (kind, int(s), int(i))
info_path = os.environ["KILL_INFO"]
debugger = None
if os.environ.get("KILL_FORM") == "explicit":
    from msprobe_inject.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=os.environ["KILL_DUMP"], level="L1")

counts = {"api": [0] * STEPS, "bwd": [0] * STEPS}
step = 0


def runtime():
    if debugger is not None:
        return debugger.runtime
    from msprobe_inject import zero_code

    return zero_code._state["pytorch"]


def tick(kind):
    counts[kind][step] += 1
    if target == (kind, step, counts[kind][step]):
        rt = runtime()
        fd = os.open(info_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, json.dumps({"sent": rt.writer.records_sent, "step": rt.session.step}).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class Count(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tick("api")
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h.register_hook(lambda g: tick("bwd"))
        low = h.to(torch.bfloat16) * 2  # statistics of a bfloat16 tensor: read on the host, not by the kernel
        h = low.float() + h
        h.register_hook(lambda g: tick("bwd"))
        out = self.fc2(h)
        out.register_hook(lambda g: tick("bwd"))
        return out


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(STEPS)]
with Count():
    for step in range(STEPS):
        if debugger is not None:
            debugger.start()
        x, y = data[step]
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
with open(info_path, "w") as fh:
    json.dump(counts, fh)
