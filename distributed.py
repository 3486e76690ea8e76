"""
What torchrun's processes agree on, so that none is left waiting for the others: a verdict on bad
input, when to stop (a signal, the clock), and leaving the process group. In a single process each
of these is what that one process says.
"""
import os
import shlex
import sys

import torch

from configurator import fail


def fail_together(error):
    """fail() on every process of a torchrun job if any of them found bad input (each says the first
    rank's words), so that none is left waiting for the others; a single process just fails."""
    if torch.distributed.is_initialized():
        errors = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(errors, None if error is None else str(error))
        error = next((e for e in errors if e), None)
    if error:
        fail(error)


def agree_on_stop(signum, elapsed, device):
    """(signal, training seconds) for every rank to act on, the largest of each: the clock drives the
    schedule, and a signal to one rank stops all (one landing during the all_reduce counts next time)."""
    if not torch.distributed.is_initialized():
        return signum, elapsed
    agreed = torch.tensor([float(signum), elapsed], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return int(agreed[0]), agreed[1].item()


def relaunch_command(args):
    """The command line that starts this script again with args: `python train.py ARGS`, or under
    torchrun, torchrun with its own options (read from its process, where Linux shows them)."""
    if "LOCAL_WORLD_SIZE" not in os.environ:  # not started by torchrun
        return shlex.join(["python", os.path.relpath(sys.argv[0]), *args])
    return shlex.join(["torchrun", *torchrun_options(), os.path.relpath(sys.argv[0]), *args])


def torchrun_options():
    """The options torchrun was started with: what stands between `torchrun` (or `-m torch.distributed.run`)
    and this script on its command line; where that cannot be read, the number of processes here."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:  # torchrun starts its workers itself
            launcher = [arg.decode() for arg in f.read().split(b"\0") if arg]
    except (OSError, UnicodeDecodeError):
        launcher = []
    names = [os.path.basename(arg) for arg in launcher]
    start = next((i + 1 for i, name in enumerate(names) if name in ("torchrun", "torch.distributed.run")), None)
    script = os.path.basename(sys.argv[0])
    end = next((i for i, name in enumerate(names) if start is not None and i >= start and name == script), None)
    if end is None:
        return [f"--nproc_per_node={os.environ['LOCAL_WORLD_SIZE']}"]
    return launcher[start:end]


def leave_process_group():
    """Leave the process group, after a barrier (so rank 0 finishes its last save) unless failing."""
    if torch.distributed.is_initialized():
        if sys.exc_info()[0] in (None, SystemExit):
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
