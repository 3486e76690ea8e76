"""Run by tests/test_distributed.py under torchrun: train.py's main(), then each rank saves its final
weights (its own shard of them, under FSDP) to out_dir/weights-rank<R>.pt, for the test to check
that DDP's replicas ended identical. main() has left its process group by then, as it must."""
import os
import sys

import torch
import torch.distributed as dist

from configurator import load_config
from train import TrainConfig, main

cfg = load_config(TrainConfig, sys.argv[1:])
model = main(cfg)
assert not dist.is_initialized(), "main() tears its process group down"
flat = torch.cat([getattr(p, "to_local", lambda: p)().detach().flatten() for p in model.parameters()])
torch.save(flat, os.path.join(cfg.out_dir, f"weights-rank{os.environ['RANK']}.pt"))
