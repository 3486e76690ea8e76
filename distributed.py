"""
What torchrun's processes agree on, so that none is left waiting for the others: a verdict on bad
input or a fault, when to stop (a signal, the clock, a non-finite loss) and how often to ask, and
leaving the process group; and a worker's tie to torchrun. In a single process each of these is
what that one process says.
"""
import ctypes
import os
import re
import shlex
import signal
import socket
import sys
import traceback

import torch

from configurator import fail, python_command, under_torchrun
from hardware import processes_on_this_machine


PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent ends (linux/prctl.h)
# under torchrun the ranks compare signals, the clock and the loss this often: an agreement is one tiny
# all_reduce, and a machine that slows down stretches the wait for the next one (torchrun gives its
# workers 30 s between its SIGTERM and a SIGKILL)
AGREE_SECONDS = 1.0


def fail_together(error, status=2, rank_0_checks=False, same=None):
    """fail() on every process of a torchrun job if any of them found an error (each says the first
    rank's words, and which rank and machine that was where not every rank found it: a file one
    machine lacks, say; not for a check that rank 0 alone makes, rank_0_checks), so that none is left
    waiting for the others; a single process just fails. Exit status 2 for bad input, 1 for a fault.
    same: {what: as a line shows it} that every process must share (the run's settings, say); where
    theirs differ, every process fails too, naming the first difference and where it is."""
    reports = gather((None if error is None else str(error), socket.gethostname(), same))
    found = [(rank, message, host) for rank, (message, host, _) in enumerate(reports) if message]
    if found:
        rank, message, host = found[0]
        where = "" if rank_0_checks or len(found) == len(reports) else f" (found by rank {rank}, on {host})"
        fail(message + where, status=status)
    differ = disagreement([shared for _, _, shared in reports], [host for _, host, _ in reports]) if same else ""
    if differ:
        fail(differ, status=status)


def disagreement(shared, hosts):
    """The first thing in which the processes' `shared` dicts differ, as a line that says what each has;
    "" where they agree."""
    for key, first in shared[0].items():
        rank = next((rank for rank, theirs in enumerate(shared) if theirs.get(key) != first), None)
        if rank is not None:
            return (f"the processes of this torchrun job differ in {key}: {first} on rank 0 (on {hosts[0]}), "
                    f"{shared[rank].get(key)} on rank {rank} (on {hosts[rank]}); give every machine the same command "
                    "(with values where auto or 0 lets each machine choose) and the same files: the data, and the "
                    "checkpoint or GPT-2 weights it starts from (each machine reads its own copies)")
    return ""


def fail_alone(message, status=1):
    """fail() for what this process met on its own, while the others may be waiting for it in a
    collective: under torchrun, the line and an exit at once, without the barrier of leaving the
    group (torchrun then ends the others); a single process just fails."""
    if not torch.distributed.is_initialized():
        fail(message, status=status)
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(status)  # not sys.exit: the finally blocks would reach for a group the others may have left


def gather(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank of a torchrun job; [obj] in a single process."""
    if not torch.distributed.is_initialized():
        return [obj]
    objects = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(objects, obj)
    return objects


def agree_on_stop(signum, elapsed, failed, device):
    """(signal, training seconds, failed) for every rank to act on, the largest of each: the clock
    drives the schedule, a signal to one rank stops all (one landing during the all_reduce counts
    next time), and a rank that saw a non-finite loss fails all. One all_reduce."""
    if not torch.distributed.is_initialized():
        return signum, elapsed, failed
    agreed = torch.tensor([float(signum), elapsed, float(failed)], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return int(agreed[0]), agreed[1].item(), bool(agreed[2])


class AgreementSchedule:
    """The iterations at which torchrun's ranks agree (agree_on_stop): about every AGREE_SECONDS of
    training whatever log_interval is, and more often as max_seconds nears, from the pace between the
    last two agreements. The gap at most doubles from one agreement to the next, so a first step that
    ran fast cannot set a gap far longer than AGREE_SECONDS. Every rank computes it from the same agreed
    numbers, so all pick the same iteration; no host sync happens in between."""

    def __init__(self, max_seconds):
        self.max_seconds, self.next_iter, self.last = max_seconds, 0, None

    def due(self, iter_num):
        return iter_num >= self.next_iter

    def agreed(self, iter_num, elapsed):
        step = 1
        if self.last is not None and iter_num > self.last[0] and elapsed > self.last[1]:
            per_iter = (elapsed - self.last[1]) / (iter_num - self.last[0])
            # half the time left, near the end: a pace that slows cannot carry the run far past max_seconds
            left = (self.max_seconds - elapsed) / 2 if self.max_seconds > 0 else AGREE_SECONDS
            gap = self.next_iter - self.last[0]  # the one this agreement ends
            step = max(1, min(2 * gap, int(min(AGREE_SECONDS, left) / per_iter)))
        self.last, self.next_iter = (iter_num, elapsed), iter_num + step


def relaunch_command(args):
    """The command line that starts this script again with args: `python train.py ARGS`, or under
    torchrun, torchrun with its own options (read from its process, where Linux shows them)."""
    if not under_torchrun():
        return shlex.join([python_command(), os.path.relpath(sys.argv[0]), *args])
    options = torchrun_options()
    return shlex.join(["torchrun", *options, os.path.relpath(sys.argv[0]), *args]) + machines_note(options)


def machines_note(options):
    """For torchrun's options that span several machines, a shell comment to follow the command: that
    every machine runs it, each with its own --node_rank where the options give this one's."""
    text = " ".join(options)
    nnodes = re.search(r"--nnodes[= ](\S+)", text)  # N, or MIN:MAX machines; 1 where not given
    if not nnodes or nnodes[1] in ("1", "1:1"):
        return ""
    return "  # on every machine" + ", each with its own --node_rank" * bool(re.search(r"--node[_-]rank\b", text))


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
        return [f"--nproc_per_node={processes_on_this_machine()}"]
    return launcher[start:end]


def die_with_launcher():
    """Under torchrun on Linux: be killed when torchrun ends without stopping this process (when it is
    itself SIGKILLed, say), rather than live on, waiting in a collective for ranks that are gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if os.getppid() == 1:  # torchrun ended before the call took effect
        os._exit(1)


def stop_if_a_peer_is_gone(error, kept=""):
    """Under torchrun, if error says another rank has gone (gloo: its connection closed; NCCL: the
    backend's error), exit now with one line that says so, and what is kept (the last checkpoint): the one
    who died has its own log, and nothing here can finish (a save or a barrier would wait for it)."""
    text = str(error)
    if not torch.distributed.is_initialized() or not (
            isinstance(error, torch.distributed.DistError) or "closed by peer" in text or "reset by peer" in text):
        return
    # gloo's first sentence, after where in its source it was raised: "[.../pair.cc:537] Read error ...: Connection
    # reset by peer. This is typically caused by ..."
    said = (text.splitlines() or [""])[0].split("] ", 1)[-1].split(". ")[0][:160]
    fail_alone(f"another process of this torchrun job stopped, so this one cannot go on ({said}); that "
               f"process's log says why{'; ' + kept if kept else ''}")


def leave_process_group():
    """Leave the process group, after a barrier (so rank 0 finishes its last save) unless failing."""
    if torch.distributed.is_initialized():
        kind, _, frames = sys.exc_info()
        if kind in (None, SystemExit):
            try:
                torch.distributed.barrier()
            except RuntimeError as e:  # a peer that died meanwhile: one line, not gloo's traceback
                stop_if_a_peer_is_gone(e)
                raise
        if frames is not None:
            # the frames an exit or error left (train's, after a SIGTERM) hold the DDP wrapper: freed at the
            # interpreter's exit, its reducer would free the gloo group last, holding the GIL while it waits
            # for the group's threads, one of which may need the GIL to free a collective's tensors: a hang.
            # Freed now, while the group is registered, the group goes below, and its threads with it.
            traceback.clear_frames(frames)
        torch.distributed.destroy_process_group()
