"""Run by tests/test_distributed.py under torchrun: train.py's main(), then report how far the
ranks' final weights are apart (they must be identical: DDP keeps replicas in lockstep)."""
import sys

import torch
import torch.distributed as dist

from configurator import load_config
from train import TrainConfig, main, shut_down_distributed

model = main(load_config(TrainConfig, sys.argv[1:]))
flat = torch.cat([getattr(p, "full_tensor", lambda: p)().detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
if dist.get_rank() == 0:
    print(f"max difference between ranks: {max((g - flat).abs().max().item() for g in gathered)}")
shut_down_distributed()
