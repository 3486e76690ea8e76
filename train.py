"""
Train a GPT. On one CPU out of the box:

    python train.py                                        # Shakespeare characters, 190 s of training
    python train.py configs/shakespeare_char_gpu.toml      # nanoGPT's Shakespeare recipe, one GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_124m.toml

The settings come first (TrainConfig, `python train.py --help`); then `main` tells the story in
order, and the functions after it are its steps.
"""
import collections
import contextlib
import os
import random
import secrets
import shlex
import signal
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal, get_args, get_type_hints

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C while torch loads (a second or two) ends the run at once,
    # as in any Unix tool, not in a traceback from inside an import; the last lines below put Python's back

import numpy as np
import torch
# torch's checkpoint and FSDP modules are imported where a save, a resume or FSDP uses them: they bring DTensor and
# sympy, 0.7-0.8 s of CPU that `--help` and a bad setting's one line need not wait for (a run that trains loads most of
# it anyway, with torch._dynamo: torch.compile and check_model_fits' meta-device model import that)
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function
from tqdm.auto import tqdm

from attention import check_backend
from checkpoint import (OUT_DIR, RESOLVED_SETTINGS, check_not_an_out_dir, check_out_dir, check_resumable,
                        check_resume_fields, ckpt_path, claim_out_dir, load_checkpoint, model_from_checkpoint,
                        resume_elsewhere, rng_state, save_checkpoint, saved_ranks, set_rng_state, smallest_checkpoint,
                        torch_rng_state, trained_optimizer, trained_settings, unlock_out_dir)
from configurator import (as_typed, check_at_least, check_folders_named, check_positive, check_types, config_from_argv,
                          expand_home, fail, first_line, run_command, takes_type, under_torchrun)
from data.loader import Batches, DamagedTokens, load_meta, open_split, tokenizer_meta
from data.prepare import (SHAKESPEARE_CHAR_DIR, SPLITS, gpt2_data_dir, meta_path, prepare_command,
                          prepare_default_corpus, split_paths)
from data.tokenizer import GPT2_VOCAB_SIZE
from distributed import (AgreementSchedule, agree_on_stop, die_with_launcher, fail_alone, fail_together, gather,
                         leave_process_group, relaunch_command, stop_if_a_peer_is_gone)
from hardware import (DType, autocast, check_threads, compile_failure, cpu_has_bf16, device_type_of, dtype_name,
                      enable_tf32, make_current, memory_bytes, pick_device, pick_dtype, processes_on_this_machine,
                      ran_out_of_memory, set_up_cpu)
from files import NO_ROOM, NOT_WRITABLE, OutputThatMayClose, check_stdout, same_folder
from interrupts import interrupt_on_hang_up, interrupt_on_sigterm, interrupted_by
from log import TrainingLog
from model import GPT, RUNTIME_SETTINGS, WEIGHT_SETTINGS, Activation, GPTConfig, Norm, Positions, check_init_from
from optim import Muon, Optimizer, configure_optimizers, lr_multiplier, schedule_note, set_lr, unused_by_optimizer

EVAL_SEED = 0  # every run and seed evaluates the same batches (of its batch_size rows), so val losses compare
EVAL_SHARE = 0.1  # under max_seconds, an evaluation (both splits) takes at most this share of it


@dataclass
class TrainConfig(GPTConfig):
    # the model: every GPTConfig setting, with the CPU recipe's defaults where they differ
    vocab_size: int = 0  # 0: the data's (meta.json); more pads the embedding (e.g. 50304 for GPU speed)
    block_size: int = 64  # the context: tokens per training sequence
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 0  # width of the residual stream; 0: 128, or 96 on a CPU without bf16 instructions
    bias: bool = False  # biases in Linear and LayerNorm; without them a step has fewer ops: more steps in 190 s
    pos_embedding: Positions = "rope"
    norm: Norm = "rmsnorm"  # normalisation before attention, MLP and head; RMSNorm: no centring, fewer ops
    activation: Activation = "relu2"  # the MLP's nonlinearity; relu(x)^2: cheaper than GELU, as good or better in 190 s
    # I/O
    out_dir: str = OUT_DIR  # where ckpt.pt, metrics.jsonl and loss.png go
    data_dir: str = SHAKESPEARE_CHAR_DIR  # train.bin, val.bin and meta.json from data/prepare.py
    init_from: str = "scratch"  # scratch, resume (out_dir/ckpt.pt), or GPT-2 weights: gpt2, gpt2-medium, a local HF dir
    overwrite: bool = False  # a new run may replace out_dir's trained checkpoint, at its first save (else it refuses)
    eval_only: bool = False  # print the initial model's train and val loss and stop, writing nothing to out_dir
    eval_interval: int = 1000  # iterations between evaluations (and checkpoints)
    eval_iters: int = 200  # batches per evaluation; the same batches every time
    log_interval: int = 50  # iterations between log lines
    wandb_log: bool = False  # also log to Weights & Biases (offline without an API key)
    wandb_project: str = "gpt"  # the wandb project
    wandb_run_name: str = "run"  # the wandb run's name
    # data
    batch_size: int = 32  # sequences per micro-batch, per process
    gradient_accumulation_steps: int = 0  # micro-batches per optimizer step, all processes together; 0: one per process
    # optimizer: linear warm-up, then cosine decay to min_lr, following the clock if max_seconds > 0
    optimizer: Optimizer = "muon"  # muon: Muon for the blocks' matrices, AdamW for the rest
    learning_rate: float = 2e-3  # AdamW's peak rate; muon_lr and min_lr follow the same schedule
    muon_lr: float = 0.02  # Muon's peak rate
    max_iters: int = 1_000_000  # stop after this many iterations (the schedule's end only if max_seconds is 0)
    max_seconds: float = 190.0  # > 0: stop after this much training time (evaluations not counted)
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9  # AdamW's momentum
    beta2: float = 0.99  # AdamW's second-moment decay
    grad_clip: float = 1.0  # clip the gradient norm to this; 0: no clipping
    warmup_iters: int = 100  # iterations of linear warm-up
    lr_decay_iters: int = 0  # the iteration where the cosine decay reaches min_lr, when max_seconds is 0; 0: max_iters
    min_lr: float = 0.0  # AdamW's rate at the end of the decay (0: all rates decay to zero, which learns more)
    # system
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: DType = "auto"  # autocast precision; auto: bf16 where it pays, else fp16 on CUDA, fp32 on CPUs and MPS
    threads: int = 0  # torch's CPU threads; 0: OMP_NUM_THREADS, else the CPUs this process may use (1 is best on
                      # a busy machine)
    compile: bool = True  # torch.compile the model (and Muon on a CPU) before training starts; cached on disk:
                          # later runs compile in seconds
    parallelism: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (DDP) or shard (FSDP2) the model
    seed: int = 1337  # for the weights, the batches and dropout

    OWN_STARTS = ("scratch", "resume")  # init_from's starts of train.py's own; any other names GPT-2 weights
    # under torchrun, each machine's own: its device and threads, and paths, whose contents run_identity compares
    PER_MACHINE = ("device", "threads", "out_dir", "data_dir", "init_from")

    def __post_init__(self):
        check_types(self)  # TrainConfig(eval_only="false") would evaluate; batch_size=2.5 a TypeError deep in torch
        check_at_least(self, 1, "batch_size", "eval_interval", "eval_iters", "log_interval")
        check_at_least(self, 0, "gradient_accumulation_steps", "max_iters", "max_seconds", "vocab_size", "n_embd",
                       "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip")
        check_positive(self, "learning_rate", "muon_lr")
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr={self.min_lr} is above learning_rate={self.learning_rate}, where the decay "
                             "starts; it must be at most that")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.max_seconds == 0 and self.lr_decay_iters and self.lr_decay_iters <= self.warmup_iters:
            until_max_iters = ", or to 0 to decay until max_iters" * (self.max_iters > self.warmup_iters + 1)
            raise ValueError(f"lr_decay_iters={self.lr_decay_iters} would end the decay before warm-up ends "
                             f"(warmup_iters={self.warmup_iters}); set --lr_decay_iters above {self.warmup_iters}"
                             f"{until_max_iters}")
        check_threads(self.threads)
        check_folders_named(self, "out_dir", "data_dir")
        expand_home(self, "out_dir", "data_dir", "init_from")
        check_init_from(self.init_from, own=self.OWN_STARTS)
        check_model_settings(self)

    @property
    def from_weights(self):
        """init_from names GPT-2's weights (a hub name or a local folder) to start from."""
        return self.init_from not in self.OWN_STARTS


def unread_note(cfg, distributed):
    """A note naming the settings cfg gives (not at their defaults) that this run never reads, and why; ""
    where there are none."""
    unread = {**{name: f"optimizer={cfg.optimizer}" for name in unused_by_optimizer(cfg)},
              "wandb_project": not cfg.wandb_log and "wandb_log=false",
              "wandb_run_name": not cfg.wandb_log and "wandb_log=false",
              "parallelism": not distributed and "one process: it applies under torchrun",
              # what a run over the checkpoint (--init_from=scratch) takes; a damaged one's error suggests it
              "overwrite": (cfg.init_from == "resume" and "init_from=resume continues the checkpoint") or
                           (cfg.eval_only and "eval_only=true writes nothing")}
    defaults = type(cfg)()
    given = [f"{name}={as_typed(getattr(cfg, name))} ({why})" for name, why in unread.items()
             if why and getattr(cfg, name) != getattr(defaults, name)]
    return f"note: not used in this run: {', '.join(given)}" if given else ""


# n_embd=0's width: 128, or 96 on a CPU without bf16 instructions. Such a CPU trains in fp32 at about a
# quarter of bf16's arithmetic a second, and in its 190 s a narrower model, taking more steps, learns more
# (bench/README.md, "On an AVX2-only CPU")
MACHINE_WIDTHS = (128, 96)


def with_machine_width(cfg, device_type):
    """cfg with n_embd=0 made this machine's width (MACHINE_WIDTHS); a set n_embd stays."""
    if cfg.n_embd:
        return cfg
    wide, narrow = MACHINE_WIDTHS
    return replace(cfg, n_embd=narrow if device_type == "cpu" and not cpu_has_bf16() else wide)


def model_config(cfg, vocab_size, **overrides):
    """The GPTConfig that cfg's model settings describe, for a vocabulary of vocab_size tokens."""
    return GPTConfig(**{**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}, "vocab_size": vocab_size,
                        **overrides})


def check_model_settings(cfg):
    """The model's own checks (n_embd % n_head, ...) on cfg's settings. n_embd=0 must pass them at every
    machine width (MACHINE_WIDTHS); where n_head does not, the error lists the n_head that do."""
    for n_embd in (cfg.n_embd,) if cfg.n_embd else MACHINE_WIDTHS:
        try:
            model_config(cfg, cfg.vocab_size or 1, n_embd=n_embd)
        except ValueError as e:
            if cfg.n_embd or cfg.n_head < 1:  # not the widths' doing: the model's own words
                raise
            heads = [n_head for n_head in range(1, min(MACHINE_WIDTHS) + 1) if fits_every_width(cfg, n_head)]
            if not heads:  # no n_head fits: another setting is wrong (dropout=1.5, say), which one head's check names
                model_config(cfg, cfg.vocab_size or 1, n_embd=n_embd, n_head=1)
                raise
            wide, narrow = MACHINE_WIDTHS
            raise ValueError(f"n_head={cfg.n_head} does not fit every width n_embd=0 may mean ({wide}, or {narrow} on "
                             f"a CPU without bf16 instructions): at {n_embd}, {str(e).split(';')[0]}; with n_embd=0, "
                             f"n_head can be one of {', '.join(map(str, heads))} (or set --n_embd)") from None


def fits_every_width(cfg, n_head):
    """Whether a model of cfg's settings with n_head heads passes the model's checks at every MACHINE_WIDTHS."""
    try:
        for n_embd in MACHINE_WIDTHS:
            model_config(cfg, cfg.vocab_size or 1, n_embd=n_embd, n_head=n_head)
    except ValueError:
        return False
    return True


def main(cfg):
    """Train a GPT as cfg says and return it (unwrapped); torch's deterministic mode is left as it was."""
    stop = StopRequest()  # in training a signal (Ctrl-C, SIGTERM) finishes the step, saves, exits; before, one line
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        error, note, model, state = None, "", None, None
        try:  # bad input: one line, exit status 2, before any output (load_data may first prepare the corpus)
            check_stdout()
            stop.watch()
            setup = set_up(cfg)
            data = load_data(cfg, setup)
            checkpoint = load_resume_point(cfg, setup)
            cfg, note = as_run(cfg, setup, checkpoint)  # what the checkpoint and the log record, and a resume compares
            check_data(cfg, data)
            note = "\n".join(filter(None, [note, schedule_note(cfg), unread_note(cfg, setup.distributed)]))
            check_backend(cfg.attention, setup.device_type, setup.dtype, training_dropout(cfg))
            if checkpoint is not None:
                changed = check_resumable(checkpoint, ckpt_path(cfg.out_dir), cfg, data.meta, data.splits,
                                          chosen_here=keepable_here(setup, checkpoint["config"]))
                note = "\n".join(filter(None, [note, changed]))
            seed_everything(cfg.seed)
            model, start = build_model(cfg, data, checkpoint, setup)
            note = "\n".join(filter(None, [weights_note(cfg, data.meta, model, setup.device_type), note]))
            state = new_train_state(cfg, setup, model, data.train)
            if setup.distributed:  # dropout: every rank its own masks (the weights were drawn alike)
                torch.manual_seed(cfg.seed + setup.rank)
            if checkpoint is not None:
                stateless = resume_state(state, checkpoint, ckpt_path(cfg.out_dir), setup, cfg)
                note = "\n".join(filter(None, [note, stateless]))
                del checkpoint  # free its memory
            if setup.master and not cfg.eval_only:
                claim_out_dir(cfg.out_dir, smallest_checkpoint(model), resuming=cfg.init_from == "resume")
        except (ValueError, OSError) as e:
            error = e
        fail_together(error, same=None if error else run_identity(cfg, data, state, start))  # all go on, or none
        if setup.master:
            print_start(cfg, state.iter_num, note)
        logger = TrainingLog(cfg, setup, model)
        if cfg.eval_only:  # writes nothing to out_dir
            logger.evaluation(state.iter_num, evaluate(model, data, cfg, setup))
        else:
            train(cfg, setup, data, state, wrap_model(cfg, setup, model, state.optimizers), logger, stop)
        return model
    except KeyboardInterrupt as e:  # once train() runs, Ctrl-C is a stop request: this is before, nothing to save
        fail("interrupted before training started; nothing was trained", status=128 + interrupted_by(e))
    except DamagedTokens as e:  # found in a batch, by this rank alone
        fail_alone(damaged_tokens(e, cfg, data.meta, has_checkpoint(cfg, state)), status=1)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError too
        if ran_out_of_memory(e):
            fail_alone(out_of_memory(cfg, e, has_checkpoint(cfg, state), building=model is None), status=1)
        stop_if_a_peer_is_gone(e, what_is_kept(cfg, has_checkpoint(cfg, state)))
        raise
    finally:  # put back only where changed: the call imports inductor's config, which a Ctrl-C amid torch's lazy
        if torch.are_deterministic_algorithms_enabled() != deterministic:  # imports (building the model) leaves broken
            torch.use_deterministic_algorithms(deterministic)
        unlock_out_dir(cfg.out_dir)
        try:  # the stop's handlers stay until the group is left: a signal now is noted, not a death mid-barrier
            leave_process_group()
        finally:
            stop.release()


def print_start(cfg, iter_num, note):
    """Where the run starts, if it resumes or evaluates another model than out_dir's, and the notes on its settings."""
    if cfg.init_from == "resume":
        print(f"{'evaluating' if cfg.eval_only else 'resuming from'} {ckpt_path(cfg.out_dir)} at iteration {iter_num}")
    elif cfg.eval_only and os.path.isfile(ckpt_path(cfg.out_dir)):  # whose numbers a reader would take for its own
        print(f"evaluating the model of init_from={cfg.init_from}, not {ckpt_path(cfg.out_dir)}: --init_from=resume "
              "evaluates that")
    if note:
        print(note)


def seed_everything(seed):
    """Python's, NumPy's and torch's generators, as a run of this seed draws from them from the start."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


@dataclass
class Setup:
    """How this process trains: its place among torchrun's processes, its device and precision."""
    rank: int
    local_rank: int
    world_size: int
    distributed: bool  # started by torchrun
    fsdp: bool  # shard the model (FSDP2) rather than replicate it (DDP)
    accumulation_steps: int  # micro-batches per optimizer step, all ranks together
    device: str
    dtype: torch.dtype
    chosen_here: tuple = ()  # the settings of checkpoint.RESOLVED_SETTINGS left at auto (or 0) for this machine

    def __post_init__(self):
        self.master = self.rank == 0  # rank 0 prints and writes
        self.device_type = device_type_of(self.device)

    def state_options(self, **changes):
        """How a checkpoint holds the model and optimizer state: whole (unsharded) tensors, with or without FSDP."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions
        return StateDictOptions(full_state_dict=self.fsdp, cpu_offload=self.fsdp, **changes)

    def autocast(self):
        return autocast(self.device_type, self.dtype)


def set_up(cfg):
    """Read torchrun's RANK, LOCAL_RANK, WORLD_SIZE; pick device and dtype; check; join the group."""
    distributed = under_torchrun()
    rank, local_rank, world_size = (int(os.environ.get(k, 0 if k != "WORLD_SIZE" else 1))
                                    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    processes = processes_on_this_machine()
    device = process_device(cfg.device, distributed, local_rank, processes)
    make_current(device)  # first: dtype=auto and the attention backends ask the current GPU
    if device.startswith("cuda"):
        enable_tf32()
    dtype = pick_dtype(cfg.dtype, device_type_of(device))
    set_up_cpu(cfg.threads, processes)
    fsdp = distributed and cfg.parallelism == "fsdp"
    if fsdp and cfg.optimizer == "muon" and not cfg.eval_only:  # an evaluation steps no optimizer
        raise ValueError("optimizer='muon' needs whole matrices and does not run on FSDP's shards; " + (
            "resume a run trained with Muon with --parallelism=ddp (a resumed run keeps its optimizer), one trained "
            "with AdamW with --optimizer=adamw" if cfg.init_from == "resume" else
            "use --optimizer=adamw with --parallelism=fsdp, or --parallelism=ddp"))
    accumulation_steps = micro_batches(cfg.gradient_accumulation_steps, world_size)
    if distributed:
        die_with_launcher()
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    chosen_here = tuple(k for k in RESOLVED_SETTINGS if getattr(cfg, k) == getattr(type(cfg)(), k))
    return Setup(rank, local_rank, world_size, distributed, fsdp, accumulation_steps, device, dtype, chosen_here)


def micro_batches(gradient_accumulation_steps, world_size):
    """The micro-batches of an optimizer step, all ranks together, that the setting asks for (0: one per
    rank); ValueError where the ranks cannot share them."""
    steps = gradient_accumulation_steps or world_size
    if steps % world_size:
        raise ValueError(f"gradient_accumulation_steps={steps} must be a multiple of the number of processes "
                         f"({world_size}), or 0 for one micro-batch per process")
    return steps


def keepable_here(setup, saved):
    """Of the settings left to this machine (setup.chosen_here), those whose value in a checkpoint's config
    (saved) would run here too, so that a resume's note may name the flag that keeps it: not fp16 on a CPU,
    say, nor micro-batches that this many ranks cannot share."""
    runs_here = {"dtype": lambda value: pick_dtype(value, setup.device_type),
                 "gradient_accumulation_steps": lambda value: micro_batches(value, setup.world_size)}
    keepable = []
    for name in setup.chosen_here:
        try:
            runs_here[name](saved[name])
        except (KeyError, ValueError, TypeError, AttributeError):  # not saved, not a value, or not one for here
            continue
        keepable.append(name)
    return tuple(keepable)


def process_device(name, distributed, local_rank, processes_here):
    """The device this process trains on, as the setting `device` names it; a GPU always with its index
    (cuda:N), which torch.cuda.set_device needs: under torchrun the local rank's, else the current one."""
    if distributed and name.startswith("cuda:"):  # one GPU cannot be every process's own
        raise ValueError(f"device={name} names one GPU, but under torchrun each process takes its local "
                         "rank's; give --device=cuda (and CUDA_VISIBLE_DEVICES=... to choose the GPUs)")
    device = pick_device(name)
    if distributed and device == "mps":  # torchrun's CPU backend, gloo, carries CPU and CUDA tensors only
        raise ValueError("under torchrun this machine's GPU (mps) cannot exchange gradients; "
                         "train on its CPUs with --device=cpu, or with plain `python train.py` on the GPU")
    if device != "cuda":
        return device
    if not distributed:
        return f"cuda:{torch.cuda.current_device()}"
    if processes_here > torch.cuda.device_count() or local_rank >= torch.cuda.device_count():
        raise ValueError(f"torchrun started {processes_here} processes on this machine, which has "
                         f"{torch.cuda.device_count()} GPU(s): one each; use --nproc_per_node="
                         f"{torch.cuda.device_count()}")
    return f"cuda:{local_rank}"


# token ids (memory-mapped), meta.json's tokenizer, and its record of the token files (their lengths)
Data = collections.namedtuple("Data", "train val meta splits", defaults=[None])


def load_data(cfg, setup):
    """The prepared token files (the default corpus is prepared by each machine's first process, where its
    folder holds no token files: someone's own, without the meta.json this code writes, are refused, not replaced)."""
    missing = not any(os.path.exists(path) for path in (meta_path(cfg.data_dir), *split_paths(cfg.data_dir)))
    try:
        if same_folder(cfg.data_dir, SHAKESPEARE_CHAR_DIR) and missing and setup.local_rank == 0:
            print(f"preparing the Shakespeare corpus in {cfg.data_dir} (first run only)")
            try:
                prepare_default_corpus(cfg.data_dir)
            except KeyboardInterrupt as e:  # before training, Ctrl-C is not a stop request: there is nothing to save
                fail(f"interrupted while preparing {cfg.data_dir}; it holds no data yet: run again to prepare it",
                     status=128 + interrupted_by(e))
    finally:  # the others wait for the first process of each machine, even if it failed
        if setup.distributed:
            torch.distributed.barrier()
    meta = load_meta(cfg.data_dir)
    train, val = (open_split(cfg.data_dir, split, meta) for split in SPLITS)
    # older code's meta.json records no token files: their lengths, for a resume to compare
    splits = meta.get("splits") or {split: {"tokens": len(tokens)} for split, tokens in zip(SPLITS, (train, val))}
    return Data(train, val, tokenizer_meta(meta), splits)


def check_data(cfg, data):
    """ValueError unless the data suits the run's settings (a resumed run's, as_run's: its block_size, say)."""
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) <= cfg.block_size:  # a resumed run's block_size is its checkpoint's, not to be changed
            fix = ("more text, or the data it trained on" if cfg.init_from == "resume" else
                   "a smaller --block_size or more text")
            raise ValueError(f"{cfg.data_dir}/{split}.bin has {len(tokens)} tokens, not more than "
                             f"block_size={cfg.block_size}; use {fix}")
    if cfg.vocab_size and cfg.vocab_size < data.meta["vocab_size"]:
        raise ValueError(f"vocab_size={cfg.vocab_size} is smaller than the {data.meta['vocab_size']} tokens of "
                         f"{cfg.data_dir}; use --vocab_size=0 for the data's own")
    if cfg.from_weights:
        check_not_an_out_dir(cfg.init_from)
        if data.meta["tokenizer"] != "gpt2":
            there = gpt2_data_dir(cfg.data_dir) or "DIR"  # the same plays in GPT-2's tokens, or text of one's own
            how = prepare_command(there, "gpt2")
            raise ValueError(f"init_from={cfg.init_from!r} needs data tokenised with GPT-2's BPE, but {cfg.data_dir} "
                             f"holds {data.meta['tokenizer']} tokens; prepare such data with `{how}` and give "
                             f"--data_dir={as_typed(there)}")


def run_identity(cfg, data, state, start):
    """What every process of a torchrun job must share, as a line shows it (fail_together compares them): the
    settings but those each machine has its own of (PER_MACHINE), the data's tokens, the model's shape (GPT-2's
    weights set it) and the weights it starts from (build_model's start), wherever a machine keeps them. Ranks
    that differed trained apart, hung, or failed later."""
    shared = {f"--{name}": as_typed(value) for name, value in asdict(cfg).items() if name not in cfg.PER_MACHINE}
    splits = [f"{split}.bin {record['tokens']:,} tokens" + (f" (crc32 {record['crc32']:08x})" if "crc32" in record
                                                            else "") for split, record in data.splits.items()]
    shared["the data"] = f"{data.meta['tokenizer']} tokens of a vocabulary of {data.meta['vocab_size']}: " + \
        ", ".join(splits)
    shared["the model"] = ", ".join(f"{name}={as_typed(getattr(state.model.config, name))}" for name in WEIGHT_SETTINGS)
    shared["the weights"] = start
    return shared


def load_resume_point(cfg, setup):
    """With init_from=resume, out_dir's checkpoint, checked to hold every field a resume reads; else None,
    once out_dir is known to hold no trained run this one would write over (before GPT-2's weights are read;
    on several machines, rank 0's out_dir, the one it writes: another's disk may hold an older run's there)."""
    resuming, several_machines = cfg.init_from == "resume", setup.world_size > processes_on_this_machine()
    if not cfg.eval_only and (resuming or setup.master or not several_machines):
        check_out_dir(cfg.out_dir, resuming=resuming, overwrite=cfg.overwrite, data_dir=cfg.data_dir)
    if not resuming:
        return None
    path = ckpt_path(cfg.out_dir)
    if several_machines and not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path} on this machine: each machine reads out_dir from its own disk; "
                         "copy out_dir from the machine that holds it to the same path here (or keep out_dir on a "
                         "shared filesystem), or train one first")
    checkpoint = load_checkpoint(path)
    check_resume_fields(checkpoint, ckpt_path(cfg.out_dir))
    return checkpoint


def as_run(cfg, setup, checkpoint):
    """(cfg with what its defaults, 0s and auto mean in this run, a note naming the model settings it took
    from the checkpoint or ""). A resumed run's model settings where cfg leaves them at their defaults,
    so that the same command line resumes on another CPU (n_embd=0 is this machine's width,
    with_machine_width) or after a default changed (the note names the weights' own values: a run that
    started from GPT-2's weights kept its first command line's settings, which the weights overrode); an
    evaluation's optimizer, the one whose state the checkpoint holds (nothing trains); dtype and
    gradient_accumulation_steps as set_up resolved them; data_dir in one spelling (data/x/ is data/x)."""
    taken = {}
    if checkpoint is not None:  # a setting given otherwise is compared, and refused, by check_resumable
        default, hints = type(cfg)(), get_type_hints(type(cfg))
        taken = {k: v for k, v in trained_settings(checkpoint).items()  # a damaged type is compared, not taken
                 if getattr(cfg, k) == getattr(default, k) and takes_type(hints[k], v)}
        try:
            cfg = replace(cfg, **taken)
        except ValueError as e:  # a value this code no longer has (an activation it dropped, say)
            raise ValueError(f"{ckpt_path(cfg.out_dir)} was trained with a setting this code does not take ({e}); "
                             "resume it with the code that wrote it, or start a new run") from None
        trained_with = trained_optimizer(checkpoint)
        if trained_with not in get_args(Optimizer) and not cfg.eval_only:  # an evaluation reads no optimizer state
            raise ValueError(f"{ckpt_path(cfg.out_dir)} was trained with optimizer={trained_with!r}, which this code "
                             "does not have; resume it with the code that wrote it, or start a new run")
        if cfg.eval_only and trained_with in get_args(Optimizer):
            cfg = replace(cfg, optimizer=trained_with)
        model = checkpoint["model_config"]  # vocab_size as set: 0 is the data's, whatever the model's vocabulary
        taken = {k: v if k == "vocab_size" else model.get(k, v) for k, v in taken.items()}
    resolved = with_machine_width(type(cfg)(), setup.device_type)  # a default is noted only where it differs
    shown = [f"{k}={v}" for k, v in taken.items() if v != getattr(resolved, k)]
    kept = (f"note: the model's settings as the checkpoint has them, where this run left them at (or set them to) "
            f"their defaults: {', '.join(shown)}" if shown else "")
    return replace(with_machine_width(cfg, setup.device_type), device=setup.device, dtype=dtype_name(setup.dtype),
                   gradient_accumulation_steps=setup.accumulation_steps,
                   data_dir=os.path.normpath(cfg.data_dir)), kept


def build_model(cfg, data, checkpoint, setup):
    """(The GPT to train: from the checkpoint, new from cfg, or GPT-2's weights, whose shape wins; what its
    weights start from, as a line shows it, for run_identity); ValueError where its heads do not suit the
    attention backend on this device (a size only the weights may set), or the data holds tokens past the
    weights' vocabulary."""
    runtime = {k: getattr(cfg, k) for k in RUNTIME_SETTINGS}
    if checkpoint is not None:  # weights go in before sharding: every rank reads the whole file
        model = model_from_checkpoint(checkpoint, ckpt_path(cfg.out_dir), **runtime)
        start = f"ckpt.pt at iteration {checkpoint['iter_num']} of run {checkpoint.get('run_id')}"
    elif cfg.init_from == "scratch":
        wanted = model_config(cfg, cfg.vocab_size or data.meta["vocab_size"])
        check_model_fits(wanted, training=not cfg.eval_only)
        model, start = GPT(wanted), "new ones, drawn from --seed"
    else:  # GPT-2's weights, cropped to block_size
        model = GPT.from_pretrained(cfg.init_from, **runtime)
        model.crop_block_size(cfg.block_size)
        check_vocabulary(cfg, data, model.config.vocab_size)
        start = f"GPT-2 weights of crc32 {weights_crc32(model):08x}"  # each machine may keep them at its own path
    c = model.config
    check_backend(cfg.attention, setup.device_type, setup.dtype, training_dropout(cfg), c.n_embd // c.n_head)
    return model, start


def weights_crc32(model):
    """The CRC-32 of every byte of the model's weights (GPT-2 124M's: a fifth of a second on a CPU)."""
    crc = 0
    for tensor in model.state_dict().values():
        crc = zlib.crc32(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def check_vocabulary(cfg, data, vocab_size):
    """ValueError where a split holds a token id past GPT-2's weights' vocabulary (a model of fewer tokens than
    GPT-2's), as meta.json records the largest (older preparations do not: the first batch past it stops)."""
    largest, split = max((record.get("largest_id", -1), split) for split, record in data.splits.items())
    if largest >= vocab_size:
        raise ValueError(f"{cfg.data_dir}/{split}.bin holds token id {largest}, past the {vocab_size} tokens of the "
                         f"vocabulary of {cfg.init_from}'s weights: fine-tune weights of GPT-2's vocabulary "
                         f"({GPT2_VOCAB_SIZE}), or give --data_dir data tokenised for these weights")


def weights_note(cfg, meta, model, device_type):
    """For a run from GPT-2's weights ("" for any other): the model its weights made, and which of cfg's model
    settings their shape overrode."""
    if not cfg.from_weights:
        return ""
    wanted, c = model_config(cfg, cfg.vocab_size or meta["vocab_size"]), model.config
    defaults = with_machine_width(type(cfg)(), device_type)
    ignored = [f"{k}={getattr(wanted, k)}" for k in WEIGHT_SETTINGS  # the user's settings, not train.py's defaults
               if getattr(wanted, k) != getattr(c, k) and getattr(cfg, k) != getattr(defaults, k)]
    return (f"init_from={cfg.init_from}: the model's settings come from the weights ({c.n_layer} layers, "
            f"{c.n_head} heads, n_embd {c.n_embd}, {c.pos_embedding} positions, {c.norm})"
            + (f"; not used: {', '.join(ignored)}" if ignored else ""))


def training_dropout(cfg):
    """The dropout this run's forwards use: none where it only evaluates (a model in eval mode drops nothing)."""
    return 0.0 if cfg.eval_only else cfg.dropout


def check_model_fits(config, training):
    """ValueError if a new model would outgrow this machine's memory, where it is built: its fp32 weights,
    and where it trains their gradients and at least one optimizer state each too (Muon's momentum; AdamW
    keeps two). A mistyped n_layer or mlp_ratio would build blocks for minutes before memory ran out.
    Counted from a model of one block and one of two, built without memory (the meta device)."""
    with torch.device("meta"):
        one, two = (sum(p.numel() for p in GPT(replace(config, n_layer=n)).parameters()) for n in (1, 2))
    blocks, outside = config.n_layer * (two - one), 2 * one - two  # outside the blocks: embeddings, head, last norm
    n_params, memory = blocks + outside, memory_bytes("cpu")
    need, what = (12 * n_params, "to train (fp32 weights, gradients, optimizer state)") if training else (
        4 * n_params, "of fp32 weights")
    if memory is not None and need > memory:
        larger = "--n_layer, --n_embd, --mlp_ratio" if blocks >= outside else "--vocab_size, --n_embd"
        raise ValueError(f"n_layer={config.n_layer}, n_embd={config.n_embd}, mlp_ratio={config.mlp_ratio} and "
                         f"vocab_size={config.vocab_size} make a model of {n_params:,} parameters, "
                         f"{need / 2**30:,.0f} GiB {what}, and this process may use {memory / 2**30:,.1f} GiB: "
                         f"make it smaller ({larger})")


def new_train_state(cfg, setup, model, train_tokens):
    """The model on its device (sharded by FSDP2 when asked), its optimizers, a grad scaler and the
    batch sampler, at iteration 0."""
    model.to(setup.device)
    if setup.fsdp:  # FSDP2: each block's parameters, gradients and optimizer state are split across ranks
        # over the training device's ranks: fully_shard's own default mesh is the machine's accelerator,
        # a GPU even where --device=cpu trains on gloo
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(setup.device_type, (setup.world_size,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizers = configure_optimizers(model, cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
                                      (cfg.beta1, cfg.beta2), cfg.muon_lr, setup.device_type, setup.dtype)
    scaler = torch.amp.GradScaler(setup.device_type, enabled=setup.dtype == torch.float16)
    return TrainState(model, optimizers, scaler, Batches(train_tokens, cfg.block_size, cfg.batch_size, cfg.seed,
                                                         setup.device, model.config.vocab_size))


class Clock:
    """Training time: wall-clock seconds across resumes, counted from start(), with evaluations left out."""

    def __init__(self, seconds_before=0.0):
        self.seconds_before, self.started, self.paused_for, self.paused_at = seconds_before, None, 0.0, None

    def start(self):
        """Count from now on (what was counted before is kept)."""
        self.seconds_before, self.started, self.paused_for = self.seconds(), time.time(), 0.0

    def seconds(self):
        if self.started is None:
            return self.seconds_before
        return self.seconds_before + (self.paused_at or time.time()) - self.started - self.paused_for

    @contextlib.contextmanager
    def paused(self):
        self.paused_at = time.time()
        try:
            yield
        finally:
            self.paused_for, self.paused_at = self.paused_for + time.time() - self.paused_at, None


@dataclass
class TrainState:
    """What a step changes and a checkpoint keeps: the model (unwrapped), its optimizers and grad
    scaler, the batch sampler, how far training has got and how long it took."""
    model: GPT
    optimizers: list
    scaler: torch.amp.GradScaler
    batches: Batches
    iter_num: int = 0
    best_val_loss: float = float("inf")
    clock: Clock = field(default_factory=Clock)
    # a run's name in its checkpoints and metrics records, drawn when it starts (from the OS, not the seeded
    # generators; each rank its own, and rank 0's is the one written) and kept across resumes. None: a
    # checkpoint written before runs had one
    run_id: str | None = field(default_factory=lambda: secrets.token_hex(4))
    saved: bool = False  # this run has written out_dir's ckpt.pt (a new one may find an earlier run's there)


def load_training_state(state, checkpoint, path, setup):
    """The optimizers' state (their rates, decay and betas stay this run's settings), the scaler's and every
    RNG's, from checkpoint into state. Returns the parameters it holds no optimizer state for."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    if state.scaler.is_enabled() and not checkpoint["scaler"]:  # a scaler that was off saved nothing
        raise ValueError(f"{path} was trained in bf16 or fp32, without fp16's loss scaling; resume in the "
                         "dtype it was trained in (--dtype=bfloat16 or --dtype=float32)")
    settings = [[{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
                for opt in state.optimizers]
    try:
        # a parameter that never had a gradient (a fork's unused layer) has no state to load: a note, not a stop
        stateless = [name for name, p in state.model.named_parameters()
                     if p.requires_grad and name not in checkpoint["optimizer"]["state"]]
        set_optimizer_state_dict(state.model, state.optimizers, checkpoint["optimizer"],
                                 options=setup.state_options(strict=False))
        for optimizer, groups in zip(state.optimizers, settings):  # loading put back the first run's
            for group, setting in zip(optimizer.param_groups, groups):
                group.update(setting)
        state.scaler.load_state_dict(checkpoint["scaler"])
        set_rng_state(checkpoint["rng"], state.batches.generator, setup.rank, setup.device_type)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, ZeroDivisionError,
            AttributeError) as e:  # fields of the wrong shape
        raise ValueError(f"{path} is damaged ({first_line(e, with_type=True)}): "
                         "resume cannot continue from it; start a new run (--overwrite=true replaces it)") from None
    return stateless


def resume_state(state, checkpoint, path, setup, cfg):
    """Continue where the checkpoint left off: the optimizers' state (their rates, decay and betas stay
    this run's settings), scaler, progress and every RNG. ValueError if cfg leaves nothing to train.
    Returns a note naming the parameters the checkpoint holds no optimizer state for ("" if none, or where
    nothing trains: eval_only, which takes the weights and where the run stands, and no optimizer state)."""
    stateless = [] if cfg.eval_only else load_training_state(state, checkpoint, path, setup)
    state.iter_num, state.best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    state.clock = Clock(checkpoint["trained_seconds"])
    state.run_id = checkpoint.get("run_id")
    reached = [name for name, done in (("max_iters", state.iter_num >= cfg.max_iters),
                                       ("max_seconds", 0 < cfg.max_seconds <= state.clock.seconds())) if done]
    if reached and not cfg.eval_only:  # the limits that stop it, not one that is off (max_seconds=0)
        limits = " and ".join(f"{name}={getattr(cfg, name)}" for name in reached)
        flags = " and ".join(f"--{name}" for name in reached)
        raise ValueError(f"{path} has trained {state.iter_num} iterations in {state.clock.seconds():.0f} s, as far "
                         f"as {limits} {'go' if len(reached) > 1 else 'goes'}: nothing is left to train; raise "
                         f"{flags} to train on, or evaluate it with --eval_only=true")
    if cfg.eval_only:
        return ""
    notes = [f"note: {path} holds no optimizer state for {', '.join(stateless)} (no gradient reached them, or the "
             "file lost it): their optimizer state starts anew" if stateless else ""]
    if cfg.dropout > 0 and saved_ranks(checkpoint) != setup.world_size:  # each rank draws its masks from its own
        notes.append(f"note: {path} was trained by {saved_ranks(checkpoint)} process(es), this run has "
                     f"{setup.world_size}: dropout's masks do not continue as they would have")
    return "\n".join(filter(None, notes))


def wrap_model(cfg, setup, model, optimizers):
    """The model as the training step calls it: compiled if asked, and in DDP under torchrun."""
    wrapped = compile_model(model, cfg, setup, optimizers) if cfg.compile else model
    if setup.distributed and not setup.fsdp:
        device_ids = [setup.local_rank] if setup.device_type == "cuda" else None
        wrapped = DistributedDataParallel(wrapped, device_ids=device_ids)
    return wrapped


def compile_model(model, cfg, setup, optimizers):
    """torch.compile(model), compiled now, on a batch of zeros (forward and backward, no update and no
    random number drawn), so that compiling is not training time; on a CPU, Muon's update too, where
    its small ops cost more than their arithmetic (Muon.compile). Inductor keeps what it compiled on
    disk, and the next run with these shapes compiles in seconds. On a CPU, deterministic as eager.
    The model itself, with a note, where it cannot be compiled (no C++ compiler, say)."""
    if setup.master:
        print("compiling the model (not training time; the first run on a machine takes longest)", flush=True)
    if setup.device_type == "cpu":  # the same seed, the same run: inductor's own kernel for the embedding's
        torch.use_deterministic_algorithms(True)  # gradient adds from racing threads; this mode calls ATen's
    started, compiled = time.time(), torch.compile(model)
    x, y = (torch.zeros(cfg.batch_size, cfg.block_size, dtype=torch.long, device=setup.device) for _ in range(2))
    try:
        with torch.random.fork_rng(devices=[] if setup.device_type == "cpu" else [setup.device],
                                   device_type=setup.device_type):
            with setup.autocast():
                loss = compiled(x, y)[1]
            loss.backward()
            for optimizer in optimizers:  # measured on CPUs only (bench/README.md): on GPUs it stays eager
                if isinstance(optimizer, Muon) and setup.device_type == "cpu":
                    optimizer.compile()
    except Exception as e:  # noqa: BLE001 - compilers fail in many ways; training goes on without one
        if ran_out_of_memory(e):  # not the compiler's failure: training uncompiled would need more memory
            raise
        if setup.master:
            print(f"note: torch.compile failed ({compile_failure(e)}); training uncompiled "
                  "(--compile=false skips the attempt)")
        return model
    finally:
        model.zero_grad(set_to_none=True)
    if setup.master:
        print(f"compiled in {time.time() - started:.1f} s")
    return compiled


@torch.no_grad()
def evaluation_batches(model, data, cfg, setup):
    """How many batches per split an evaluation takes: eval_iters, or under a time budget as many as
    run in EVAL_SHARE of max_seconds for both splits together (a note says so), timed on one batch
    here, before the clock starts; the slowest rank's time decides, so that all take as many."""
    if cfg.max_seconds <= 0:
        return cfg.eval_iters
    x, y = Batches(data.val, cfg.block_size, cfg.batch_size, EVAL_SEED, setup.device, model.config.vocab_size).load(
        torch.zeros(cfg.batch_size, dtype=torch.long))
    model.eval()
    with setup.autocast():
        model(x, y)  # the first call of a shape costs extra
        started = time.time()
        model(x, y)[1].item()
        seconds = time.time() - started
    model.train()
    seconds = max(gather(seconds))  # a plain number: no float64 on the device, which MPS lacks
    rounds = max(1, int(EVAL_SHARE * cfg.max_seconds / (2 * seconds)))  # forwards per rank and split
    n_batches = min(cfg.eval_iters, rounds * setup.world_size)
    if n_batches < cfg.eval_iters and setup.master:
        print(f"note: an evaluation of 2 x {cfg.eval_iters} batches would take "
              f"~{2 * -(-cfg.eval_iters // setup.world_size) * seconds:.0f} s, more than {EVAL_SHARE:.0%} of "
              f"max_seconds={cfg.max_seconds:g}; each evaluation takes 2 x {n_batches} (--eval_iters asks for fewer; "
              "a run counted in iterations, --max_seconds=0 --max_iters=N, takes all)")
    return n_batches


@torch.no_grad()
def evaluate(model, data, cfg, setup, n_batches=None):
    """Mean loss over the same n_batches (default eval_iters) batches of each split every time, shared
    out between ranks: rank r takes batches r, r + world_size, ... Every rank runs as many forwards
    (FSDP gathers the weights in each, with all ranks), the last one a repeat that counts for nothing
    where the batches do not divide evenly."""
    n_batches = n_batches or cfg.eval_iters
    model.eval()
    losses = {}
    rounds = -(-n_batches // setup.world_size)
    for split, tokens in (("train", data.train), ("val", data.val)):
        eval_batches = Batches(tokens, cfg.block_size, cfg.batch_size, EVAL_SEED, setup.device, model.config.vocab_size)
        offsets = eval_batches.offsets(n_batches)
        total = torch.zeros((), device=setup.device)
        # a bar only where someone watches: a terminal, and evaluations long enough to wait for
        for r in tqdm(range(rounds), desc=f"eval {split}", leave=False, mininterval=1.0,
                      disable=not (setup.master and sys.stderr.isatty())):
            k = r * setup.world_size + setup.rank
            x, y = eval_batches.load(offsets[min(k, n_batches - 1)])
            with setup.autocast():
                loss = model(x, y)[1].float()
            if k < n_batches:
                total += loss
        if setup.distributed:
            torch.distributed.all_reduce(total)
        losses[split] = total.item() / n_batches
    model.train()
    return losses


def train(cfg, setup, data, state, wrapped_model, logger, stop):
    """The loop: evaluate and save every eval_interval iterations and at the end, take a step, log;
    stop at max_iters, at max_seconds of training, or on a signal."""
    start_iter, elapsed, signum = state.iter_num, state.clock.seconds(), 0
    out_of_time = cfg.max_seconds > 0 and elapsed >= cfg.max_seconds
    agreements = AgreementSchedule(cfg.max_seconds)
    n_eval = evaluation_batches(state.model, data, cfg, setup)
    logger.open(state.iter_num, state.run_id)
    stop.start()
    state.clock.start()
    while True:
        last = state.iter_num >= cfg.max_iters or out_of_time
        due = last or (state.iter_num % cfg.eval_interval == 0 and state.iter_num != start_iter)
        saved = False
        if due:  # a stop right before an evaluation still makes it, as an uninterrupted run would
            saved = evaluate_and_save(state, cfg, data, setup, logger, n_eval,
                                      stopped(signum, state) if signum and not last else "evaluation",
                                      final=last or bool(signum))
            if not signum:  # one asked for while it evaluated stops here, at what it saved
                signum = agree_on_stop(stop.signum, elapsed, False, setup.device)[0]
        if last:
            break
        if signum:
            if not saved:
                save(state, cfg, data, setup, stopped(signum, state), final=True)  # written, or every rank has failed
                logger.saved()
            if setup.master:
                again = [arg for arg in sys.argv[1:]  # a resumed run's says it once; a resume reads no --overwrite
                         if arg != "--init_from=resume" and not arg.startswith("--overwrite=")]
                print(f"resume with: {relaunch_command([*again, '--init_from=resume'])}")
            sys.exit(128 + signum)
        multiplier = lr_multiplier(cfg, state.iter_num, elapsed)
        logger.add_loss(train_step(state, wrapped_model, cfg, setup, multiplier))
        state.iter_num += 1
        logged = state.iter_num % cfg.log_interval == 0
        if setup.distributed and not (logged or agreements.due(state.iter_num)):
            continue  # the ranks act on the clock, signals and the loss only where they agree on them
        problem = (logger.nonfinite(state.iter_num, has_checkpoint(cfg, state))
                   if logged or setup.distributed or stop.signum else None)
        signum, elapsed, failed = agree_on_stop(stop.signum, state.clock.seconds(), problem is not None, setup.device)
        if failed:
            fail_together(problem, status=1)  # each rank checks its own losses
        agreements.agreed(state.iter_num, elapsed)
        if logged:
            logger.print_progress(state.iter_num, cfg.learning_rate * multiplier, state.clock.seconds())
        out_of_time = cfg.max_seconds > 0 and elapsed >= cfg.max_seconds
    if setup.master:
        print(f"done: {state.iter_num} iterations in {state.clock.seconds():.1f} s of training; checkpoint "
              f"{ckpt_path(cfg.out_dir)}, the last weights (best val loss on the way {state.best_val_loss:.4f}); "
              f"sample with: {run_command('sample.py')} --out_dir={shlex.quote(cfg.out_dir)}")
    logger.close()


def stopped(signum, state):
    """A stop's save, in words."""
    return f"stopped by {signal.Signals(signum).name} after iteration {state.iter_num}"


def evaluate_and_save(state, cfg, data, setup, logger, n_eval, reason, final):
    """Evaluate on n_eval batches of each split, save the checkpoint (for `reason`) and log both losses;
    the clock stops meanwhile: evaluating, saving and drawing are not training time. Whether it saved."""
    fail_together(logger.nonfinite(state.iter_num, has_checkpoint(cfg, state)), status=1)
    with state.clock.paused():
        losses = evaluate(state.model, data, cfg, setup, n_eval)
        state.best_val_loss = min(state.best_val_loss, losses["val"])
        saved = save(state, cfg, data, setup, reason, final=final)
        # the clock itself, not the last time the ranks agreed on (under torchrun, only every few seconds)
        logger.evaluation(state.iter_num, losses, state.clock.seconds(), saved)
    return saved


def train_step(state, wrapped_model, cfg, setup, multiplier):
    """One optimizer step: this rank's share of the micro-batches (gradients are all-reduced only
    after the last), then clipping and the update, at `multiplier` times the peak learning rates.
    Returns the mean loss, on the device."""
    set_lr(state.optimizers, multiplier)
    my_batches = state.batches.share(setup.accumulation_steps, setup.rank, setup.world_size)
    total = 0.0
    for i, offsets in enumerate(my_batches):
        x, y = state.batches.load(offsets)
        sync = i == len(my_batches) - 1
        if setup.fsdp:
            wrapped_model.set_requires_gradient_sync(sync)
        ddp_no_sync = setup.distributed and not setup.fsdp and not sync
        with wrapped_model.no_sync() if ddp_no_sync else contextlib.nullcontext():
            with setup.autocast(), record_function("forward"):  # labels for bench/train.py --profile
                loss = wrapped_model(x, y)[1] / len(my_batches)
            with record_function("backward"):
                state.scaler.scale(loss).backward()
        total += loss.detach()
    with record_function("clip"):
        for optimizer in state.optimizers:  # fp16: the gradients at their true size (without a scaler: nothing)
            state.scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(wrapped_model.parameters(), cfg.grad_clip)
    # fp16's scaler skips the step of an optimizer whose own gradients overflowed: with Muon beside AdamW, an
    # overflow in either must skip both (Muon stepped on its momentum alone, the clipped gradients zeroed)
    overflowed = state.scaler.is_enabled() and len(state.optimizers) > 1 and not torch.isfinite(
        torch.nn.utils.get_total_norm([p.grad for p in wrapped_model.parameters() if p.grad is not None])).item()
    for optimizer in state.optimizers:
        if not overflowed:
            state.scaler.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    state.scaler.update()  # after an overflow: a smaller scale
    return total


class StopRequest:
    """From start() until release(): remembers a Ctrl-C (SIGINT), SIGTERM or a hang-up (SIGHUP: the terminal or
    ssh session the run was started from went away) instead of dying mid-step; a hang-up ignored (nohup) stays so.
    From watch(): a reader of stdout that goes away (python train.py | head) is a stop request too
    (SIGPIPE), and what is printed after it is dropped, instead of a BrokenPipeError mid-training; and
    until start(), in a process of its own (not torchrun's), SIGTERM interrupts as Ctrl-C does, rather than
    ending the process at once while the corpus is prepared or the model compiles (a silent death that left
    out_dir locked)."""

    def __init__(self):
        self.signum, self.training, self.previous, self.stdout, self.line_buffering = 0, False, {}, None, None

    def start(self):
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # what was there before watch(), release() puts back
            if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN):
                self.previous.setdefault(s, signal.signal(s, self.request))
        self.training = True

    def watch(self):
        if not under_torchrun():  # a rank would wait for its peers at the group's exit: torchrun's SIGTERM ends it
            self.previous[signal.SIGTERM] = interrupt_on_sigterm()
            hang_up = interrupt_on_hang_up()
            if hang_up is not None:
                self.previous[signal.SIGHUP] = hang_up
        self.stdout, sys.stdout = sys.stdout, OutputThatMayClose(sys.stdout, self.output_closed)
        # a line at a time into a pipe too (| tee, | head), not a block buffer that holds minutes of the log
        self.line_buffering = getattr(self.stdout, "line_buffering", None)
        if self.line_buffering is False:
            self.stdout.reconfigure(line_buffering=True)

    def request(self, signum, frame):
        self.signum = self.signum or signum  # the first names the stop: torchrun follows a Ctrl-C with a SIGTERM

    def output_closed(self, error):
        """stdout takes no more text: its reader left (a stop, quietly, as a Unix tool stops), or its disk
        is full: a stop once training runs (said, and the rest of the log goes to stderr), else the end."""
        if isinstance(error, BrokenPipeError):
            self.request(signal.SIGPIPE, None)
        elif not self.training:  # before training, or an evaluation alone: nothing to save
            fail(f"could not write to stdout: {error.strerror or error}", status=1)
        else:
            sys.stderr.write(f"warning: the log cannot be written to stdout ({error.strerror or error}); the run "
                             "stops as on a signal, after a save, and says the rest here\n")
            self.request(signal.SIGPIPE, None)

    def release(self):
        """Put back the handlers, and stdout, that were there before."""
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.stdout is not None:
            sys.stdout = self.stdout
            if self.line_buffering is False:
                self.stdout.reconfigure(line_buffering=False)


def save(state, cfg, data, setup, reason, final=False):
    """Every rank takes part (FSDP gathers the shards); rank 0 writes, and every rank learns whether it
    could (the return value). A failed write (a full disk, say) leaves the previous checkpoint as it was;
    training goes on unless it was the last."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    model_state = get_model_state_dict(state.model, options=setup.state_options())
    optimizer_state = get_optimizer_state_dict(state.model, state.optimizers, options=setup.state_options())
    torch_states = gather(torch_rng_state(setup.device_type))  # each rank's dropout generators
    path, problem, fix = ckpt_path(cfg.out_dir), None, ""
    # a step can blow the weights up while its loss was still finite: such weights never replace a checkpoint
    broken = next((k for k, t in model_state.items() if not torch.isfinite(t).all()), None) if setup.master else None
    kept = f", {path} is kept" if has_checkpoint(cfg, state) else ""
    fail_together(None if broken is None else f"the weights are not finite (NaN or inf, in {broken}) at iteration "
                  f"{state.iter_num}, though every loss logged was: not saved{kept}; lower --learning_rate (and "
                  "--muon_lr)", status=1, rank_0_checks=True)
    if setup.master:
        checkpoint = {"model": model_state, "optimizer": optimizer_state, "scaler": state.scaler.state_dict(),
                      "model_config": asdict(state.model.config), "config": asdict(cfg), "tokenizer": data.meta,
                      "splits": data.splits or {},
                      "iter_num": state.iter_num, "best_val_loss": state.best_val_loss,
                      "trained_seconds": state.clock.seconds(),
                      "rng": rng_state(state.batches.generator, torch_states), "run_id": state.run_id}
        problem, fix = write_checkpoint(checkpoint, path, cfg, state)
    if final:  # no evaluation is left to try again at
        fail_together(problem and after_a_failed_save(problem, fix, cfg, has_checkpoint(cfg, state)),
                      status=1, rank_0_checks=True)  # rank 0 writes it
    elif problem:
        print(f"warning: {problem}; {fix + ': ' if fix else ''}training goes on and tries again at the next evaluation")
    written = gather(problem is None)[0]  # rank 0's: every rank then says the same of out_dir's checkpoint
    state.saved = state.saved or written
    if written and setup.master:
        print(f"saved {path} ({reason})")
    return written


def write_checkpoint(checkpoint, path, cfg, state):
    """Write it (checkpoint.save_checkpoint): (None, "") or (what went wrong, what would fix it where that is
    known, or ""), in words."""
    try:
        save_checkpoint(checkpoint, path)
        return None, ""
    except OSError as e:
        whose = "the previous" if has_checkpoint(cfg, state) else "an earlier run's"  # --overwrite=true's
        kept = f"; {path} still holds {whose} checkpoint" if os.path.exists(path) else ""
        fix = "free some space" if e.errno in NO_ROOM else "make out_dir writable" if e.errno in NOT_WRITABLE else ""
        return f"could not write {path} at iteration {state.iter_num}: {e.strerror or e}{kept}", fix


def after_a_failed_save(problem, fix, cfg, checkpointed):
    """The line for a run whose last save failed (write_checkpoint's problem and fix): go on from the checkpoint
    it has (has_checkpoint), where it is once fixed or from a copy; else run again."""
    if checkpointed:
        here = f"{fix} and resume (--init_from=resume), or " if fix else ""
        return f"{problem}; {here}{resume_elsewhere(cfg.out_dir)}"
    return f"{problem}; {fix + ', or ' if fix else ''}pick another --out_dir, and run again"


def has_checkpoint(cfg, state):
    """Whether out_dir's ckpt.pt holds this run: the one it resumed from, or one it has saved since. A new
    run with --overwrite=true finds an earlier run's there, and leaves it until its own first save."""
    this_runs = cfg.init_from == "resume" or (state is not None and state.saved)
    return this_runs and os.path.exists(ckpt_path(cfg.out_dir))


def what_is_kept(cfg, checkpointed):
    """What a run that stops on an error leaves: its last checkpoint (has_checkpoint), or nothing."""
    return f"the last checkpoint, {ckpt_path(cfg.out_dir)}, is kept" if checkpointed else "nothing was saved"


def damaged_tokens(error, cfg, meta, checkpointed):
    """The line for a run whose batch held a token past the vocabulary (DamagedTokens): the command that prepares
    its data again, and what it kept (has_checkpoint)."""
    return f"{error} (`{prepare_command(cfg.data_dir, meta['tokenizer'])}`); {what_is_kept(cfg, checkpointed)}"


def out_of_memory(cfg, error, checkpointed, building=False):
    """The line for a run whose model (while building it), or model and micro-batches, do not fit in
    its device's memory; checkpointed: out_dir holds this run's checkpoint (has_checkpoint)."""
    kept = what_is_kept(cfg, checkpointed)
    # torch's first words, "CUDA out of memory"; a CPU's allocator says more about itself than about memory
    said = "out of memory"
    if isinstance(error, torch.OutOfMemoryError):
        said = str(error).split(". ")[0].split(" (")[0][:80]
    if building:
        return (f"{said} while building the model (n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, or the weights of "
                f"init_from={cfg.init_from}): it does not fit in this machine's memory; make it smaller; {kept}")
    shorter = "" if cfg.init_from == "resume" else ", or lower --block_size"  # a resume keeps the model's
    return (f"{said} with micro-batches of batch_size={cfg.batch_size} x "
            f"block_size={cfg.block_size} tokens; halve --batch_size and double --gradient_accumulation_steps "
            f"(now {cfg.gradient_accumulation_steps}) to keep the batch{shorter}; {kept}")


if __name__ == "__main__":
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:  # set at the top, while the imports ran
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here Ctrl-C raises KeyboardInterrupt
    main(config_from_argv(TrainConfig))
