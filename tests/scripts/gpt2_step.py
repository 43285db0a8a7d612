"""A tiny GPT-2 training step (random init, no download), instrumented as the seeds show.

argv: MODULE CONFIG [STEPS]
"""
import importlib
import sys

import torch

dbg = importlib.import_module(sys.argv[1])
dbg.seed_all()
debugger = dbg.PrecisionDebugger(config_path=sys.argv[2])

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
for _ in range(steps):
    ids = torch.randint(0, 50, (2, 8))
    debugger.start(model=model)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
