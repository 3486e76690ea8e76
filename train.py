"""
Train a GPT. On one CPU out of the box:

    python train.py                                        # Shakespeare characters, 190 s of training
    python train.py configs/shakespeare_char_gpu.toml      # nanoGPT's Shakespeare recipe, one GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_124m.toml

Settings: configurator.TrainConfig (`python train.py --help`). `main` tells the story in order;
the functions after it are its steps, in the order it calls them.
"""
import collections
import contextlib
import math
import os
import random
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from attention import check_backend
from checkpoint import (TrainingLog, check_out_dir, check_resumable, ckpt_path, load_checkpoint,
                        model_from_checkpoint, rng_state, save_checkpoint, set_rng_state, unlock_out_dir)
from configurator import (TrainConfig, config_from_argv, fail, fail_together, model_config, pick_device, pick_dtype,
                          pick_threads)
from data.loader import SHAKESPEARE_CHAR_DIR, Batches, load_meta, open_split
from data.prepare import prepare_shakespeare_char
from model import GPT, RUNTIME_SETTINGS, WEIGHT_SETTINGS

EVAL_SEED = 0  # evaluation batches are the same for every run and seed, so val losses compare


def main(cfg):
    """Train a GPT as cfg says and return it (unwrapped)."""
    stop = StopRequest()  # once training runs, Ctrl-C or SIGTERM finish the step, save and exit non-zero
    try:
        error = None
        try:  # every check comes before anything is written: bad input is one line, exit status 2
            run = set_up(cfg)
            data = load_data(cfg, run)
            checkpoint = load_resume_point(cfg, data.meta, run)
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            np.random.seed(cfg.seed)
            model = build_model(cfg, data.meta, checkpoint, run)
            if run.master and not cfg.eval_only:
                check_out_dir(cfg.out_dir, resuming=checkpoint is not None, overwrite=cfg.overwrite)
        except (ValueError, OSError) as e:
            error = e
        fail_together(error)  # under torchrun, every rank stops if any rank found bad input
        model.to(run.device)
        if run.fsdp:  # FSDP2: each block's parameters, gradients and optimizer state are split across ranks
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
        optimizers = model.configure_optimizers(cfg.optimizer, cfg.learning_rate, cfg.weight_decay,
                                                (cfg.beta1, cfg.beta2), cfg.muon_lr, run.device_type, run.dtype)
        state = TrainState(model, optimizers, torch.amp.GradScaler(run.device_type, enabled=run.dtype == torch.float16),
                           Batches(data.train, cfg.block_size, cfg.batch_size, cfg.seed, run.device))
        if checkpoint is not None:
            restore(state, checkpoint, ckpt_path(cfg.out_dir), run)
            del checkpoint  # free its memory
        step_model = torch.compile(model) if cfg.compile else model  # what the training step calls
        if run.distributed and not run.fsdp:
            step_model = DistributedDataParallel(step_model,
                                                 device_ids=[run.local_rank] if run.device_type == "cuda" else None)
        logger = TrainingLog(cfg, run, model)
        if cfg.eval_only:  # writes nothing
            logger.evaluation(state.iter_num, evaluate(model, data, cfg, run))
        else:
            train(cfg, run, data, state, step_model, logger, stop)
        return model
    finally:
        stop.restore()
        unlock_out_dir(cfg.out_dir)
        end_processes()


@dataclass
class Run:
    """Where this process trains: its place among torchrun's processes, its device and precision."""
    rank: int
    local_rank: int
    world_size: int
    distributed: bool  # started by torchrun
    fsdp: bool  # shard the model (FSDP2) rather than replicate it (DDP)
    accumulation_steps: int  # micro-batches per optimizer step, all ranks together
    device: str
    dtype: torch.dtype


    def __post_init__(self):
        self.master = self.rank == 0  # rank 0 prints and writes
        self.device_type = self.device.split(":")[0]
        # checkpoints hold whole (unsharded) tensors, with or without FSDP
        self.state_options = StateDictOptions(full_state_dict=self.fsdp, cpu_offload=self.fsdp)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype != torch.float32)


def set_up(cfg):
    """Read torchrun's RANK, LOCAL_RANK, WORLD_SIZE; pick device and dtype; check; join the group."""
    distributed = "RANK" in os.environ
    rank, local_rank, world_size = (int(os.environ.get(k, 0 if k != "WORLD_SIZE" else 1))
                                    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = pick_device(cfg.device)
    if distributed and device.startswith("cuda"):
        device = f"cuda:{local_rank}"
    dtype = pick_dtype(cfg.dtype, device.split(":")[0])
    torch.set_num_threads(pick_threads(cfg.threads, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    check_backend(cfg.attention, device.split(":")[0], dtype, cfg.dropout)
    fsdp = distributed and cfg.parallelism == "fsdp"
    if fsdp and cfg.optimizer == "muon":
        raise ValueError("optimizer='muon' needs whole matrices and does not run on FSDP's shards; "
                         "use --optimizer=adamw with --parallelism=fsdp")
    accumulation_steps = cfg.gradient_accumulation_steps or world_size
    if accumulation_steps % world_size:
        raise ValueError(f"gradient_accumulation_steps={accumulation_steps} must be a multiple of the number of "
                         f"processes ({world_size}), or 0 for one micro-batch per process")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # TF32 matmuls
    if distributed:
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Run(rank, local_rank, world_size, distributed, fsdp, accumulation_steps, device, dtype)


Data = collections.namedtuple("Data", "train val meta")  # token ids (memory-mapped), meta.json


def load_data(cfg, run):
    """The prepared token files (the default corpus is prepared by each machine's first process)."""
    missing = not os.path.exists(os.path.join(cfg.data_dir, "meta.json"))
    try:
        if cfg.data_dir == SHAKESPEARE_CHAR_DIR and missing and run.local_rank == 0:
            print(f"preparing the Shakespeare corpus in {cfg.data_dir} (first run only)")
            prepare_shakespeare_char(cfg.data_dir)
    finally:  # the others wait for the first process of each machine, even if it failed
        if run.distributed:
            torch.distributed.barrier()
    meta = load_meta(cfg.data_dir)
    data = Data(*(open_split(cfg.data_dir, split, meta["vocab_size"]) for split in ("train", "val")), meta)
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) <= cfg.block_size:
            raise ValueError(f"{cfg.data_dir}/{split}.bin has {len(tokens)} tokens, not more than "
                             f"block_size={cfg.block_size}; use a smaller --block_size or more text")
    if cfg.vocab_size and cfg.vocab_size < data.meta["vocab_size"]:
        raise ValueError(f"vocab_size={cfg.vocab_size} is smaller than the {data.meta['vocab_size']} tokens of "
                         f"{cfg.data_dir}; use --vocab_size=0 for the data's own")
    if cfg.init_from not in ("scratch", "resume") and data.meta["tokenizer"] != "gpt2":
        raise ValueError(f"init_from={cfg.init_from!r} needs data tokenised with GPT-2's BPE, but {cfg.data_dir} "
                         f"holds {data.meta['tokenizer']} tokens; prepare it with "
                         "`python data/prepare.py --tokenizer=gpt2 ...`")
    return data


def load_resume_point(cfg, meta, run):
    """With init_from=resume, out_dir's checkpoint, checked to hold the model these settings ask for."""
    if cfg.init_from != "resume":
        return None
    checkpoint = load_checkpoint(ckpt_path(cfg.out_dir))
    check_resumable(checkpoint, ckpt_path(cfg.out_dir), cfg, cfg.vocab_size or meta["vocab_size"], quiet=not run.master)
    return checkpoint


def build_model(cfg, meta, checkpoint, run):
    """The GPT to train: from the checkpoint, new from cfg, or GPT-2's weights (whose shape wins)."""
    runtime = {k: getattr(cfg, k) for k in RUNTIME_SETTINGS}
    if checkpoint is not None:  # weights go in before sharding: every rank reads the whole file
        return model_from_checkpoint(checkpoint, ckpt_path(cfg.out_dir), **runtime)
    wanted = model_config(cfg, cfg.vocab_size or meta["vocab_size"])
    if cfg.init_from == "scratch":
        return GPT(wanted)
    model = GPT.from_pretrained(cfg.init_from, **runtime)
    model.crop_block_size(cfg.block_size)
    c = model.config
    ignored = [f"{k}={getattr(wanted, k)}" for k in WEIGHT_SETTINGS if getattr(wanted, k) != getattr(c, k)]
    if ignored and run.master:
        print(f"init_from={cfg.init_from}: the model's shape comes from the weights ({c.n_layer} layers, "
              f"{c.n_head} heads, n_embd {c.n_embd}, {c.pos_embedding} positions, {c.norm}); "
              f"not used: {', '.join(ignored)}")
    return model


class Clock:
    """Training time: wall-clock seconds across resumes, with evaluations left out."""

    def __init__(self, seconds_before=0.0):
        self.seconds_before, self.started, self.paused_for, self.paused_at = seconds_before, time.time(), 0.0, None

    def seconds(self):
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


def restore(state, checkpoint, path, run):
    """Continue where the checkpoint left off: optimizer, scaler, progress and every RNG."""
    set_optimizer_state_dict(state.model, state.optimizers, checkpoint["optimizer"], options=run.state_options)
    state.scaler.load_state_dict(checkpoint["scaler"])
    state.iter_num, state.best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    state.clock = Clock(checkpoint["trained_seconds"])
    set_rng_state(checkpoint["rng"], state.batches.generator)
    if run.master:
        print(f"resuming from {path} at iteration {state.iter_num}")


@torch.no_grad()
def evaluate(model, data, cfg, run):
    """Mean loss over the same eval_iters batches of each split every time, shared out between ranks."""
    model.eval()
    losses = {}
    for split, tokens in (("train", data.train), ("val", data.val)):
        fixed = Batches(tokens, cfg.block_size, cfg.batch_size, seed=EVAL_SEED, device=run.device)
        total = torch.zeros((), device=run.device)
        # a bar only where someone watches: a terminal, and evaluations long enough to wait for
        shown = tqdm(fixed.offsets(cfg.eval_iters), desc=f"eval {split}", leave=False, mininterval=1.0,
                     disable=not (run.master and sys.stderr.isatty()))
        for k, offsets in enumerate(shown):
            if k % run.world_size == run.rank:
                x, y = fixed.load(offsets)
                with run.autocast():
                    total += model(x, y)[1].float()
        if run.distributed:
            torch.distributed.all_reduce(total)
        losses[split] = total.item() / cfg.eval_iters
    model.train()
    return losses


def train(cfg, run, data, state, step_model, logger, stop):
    """The loop: evaluate and save every eval_interval iterations and at the end, take a step, log;
    stop at max_iters, at max_seconds of training, or on a signal."""
    start_iter, elapsed, out_of_time = state.iter_num, state.clock.seconds(), False
    logger.open(state.iter_num)
    stop.start()
    while True:
        last = state.iter_num >= cfg.max_iters or out_of_time
        if last or (state.iter_num % cfg.eval_interval == 0 and state.iter_num != start_iter):
            logger.check_finite(state.iter_num)
            with state.clock.paused():  # evaluating, saving and drawing are not training time
                losses = evaluate(state.model, data, cfg, run)
                state.best_val_loss = min(state.best_val_loss, losses["val"])
                save(state, cfg, data.meta, run, "evaluation", final=last)
                logger.evaluation(state.iter_num, losses, elapsed)
        if last:
            break
        multiplier = lr_multiplier(cfg, state.iter_num, elapsed)
        logger.add_loss(train_step(state, step_model, cfg, run, multiplier))
        state.iter_num += 1
        if state.iter_num % cfg.log_interval == 0:
            logger.steps(state.iter_num, cfg.learning_rate * multiplier, state.clock.seconds())
        elif run.distributed:
            continue  # the ranks act on clock and signals only where they agree on them, once per log line
        signum, elapsed = agree(run, stop.signum, state.clock.seconds())
        out_of_time = cfg.max_seconds > 0 and elapsed >= cfg.max_seconds
        if signum:
            logger.check_finite(state.iter_num)
            save(state, cfg, data.meta, run, f"stopped by {signal.Signals(signum).name} after iteration "
                                             f"{state.iter_num}", final=True)
            if run.master:
                print(f"resume with: python train.py {shlex.join([*sys.argv[1:], '--init_from=resume'])}")
            sys.exit(128 + signum)
    if run.master:
        print(f"done: {state.iter_num} iterations in {state.clock.seconds():.1f} s of training; best val loss "
              f"{state.best_val_loss:.4f}; checkpoint {ckpt_path(cfg.out_dir)}; sample with: python sample.py "
              f"--out_dir={shlex.quote(cfg.out_dir)}")
    logger.close()


def lr_multiplier(cfg, it, elapsed):
    """The learning rate as a fraction of its peak: linear warm-up over warmup_iters, then a cosine
    down to min_lr/learning_rate as training progresses, by the clock if max_seconds is set."""
    if it < cfg.warmup_iters:
        return (it + 1) / (cfg.warmup_iters + 1)
    decay_iters = (cfg.lr_decay_iters or cfg.max_iters) - cfg.warmup_iters
    progress = elapsed / cfg.max_seconds if cfg.max_seconds > 0 else (it - cfg.warmup_iters) / max(1, decay_iters)
    floor = cfg.min_lr / cfg.learning_rate
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (1.0 - floor)


def train_step(state, step_model, cfg, run, lr_multiplier):
    """One optimizer step: this rank's share of the micro-batches (gradients are all-reduced only
    after the last), then clipping and the update. Returns the mean loss, on the device."""
    for optimizer in state.optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lr_multiplier
    mine = state.batches.offsets(run.accumulation_steps)[run.rank::run.world_size]
    total = 0.0
    for i, offsets in enumerate(mine):
        x, y = state.batches.load(offsets)
        sync = i == len(mine) - 1
        if run.fsdp:
            step_model.set_requires_gradient_sync(sync)
        no_sync = step_model.no_sync() if run.distributed and not run.fsdp and not sync else contextlib.nullcontext()
        with no_sync, run.autocast():
            loss = step_model(x, y)[1] / len(mine)
        state.scaler.scale(loss).backward()
        total += loss.detach()
    if cfg.grad_clip > 0:
        for optimizer in state.optimizers:
            state.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(step_model.parameters(), cfg.grad_clip)
    for optimizer in state.optimizers:
        state.scaler.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    state.scaler.update()
    return total


def agree(run, signum, elapsed):
    """(signal, training seconds) for every rank to act on, the largest of each: the clock drives the
    schedule, and a signal to one rank stops all (one landing during the all_reduce counts next time)."""
    if not run.distributed:
        return signum, elapsed
    agreed = torch.tensor([float(signum), elapsed], dtype=torch.float64, device=run.device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return int(agreed[0]), agreed[1].item()


class StopRequest:
    """From start() until restore(): remembers a Ctrl-C (SIGINT) or SIGTERM instead of dying mid-step."""

    def __init__(self):
        self.signum, self.previous = 0, {}

    def start(self):
        self.previous = {s: signal.signal(s, self.request) for s in (signal.SIGINT, signal.SIGTERM)}

    def request(self, signum, frame):
        self.signum = signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def save(state, cfg, meta, run, reason, final=False):
    """Every rank takes part (FSDP gathers the shards); rank 0 writes. A failed write (a full disk,
    say) leaves the previous checkpoint as it was; training goes on unless it was the last."""
    model_state = get_model_state_dict(state.model, options=run.state_options)
    optimizer_state = get_optimizer_state_dict(state.model, state.optimizers, options=run.state_options)
    if not run.master:
        return
    path = ckpt_path(cfg.out_dir)
    checkpoint = {"model": model_state, "optimizer": optimizer_state, "scaler": state.scaler.state_dict(),
                  "model_config": asdict(state.model.config), "config": asdict(cfg), "tokenizer": meta,
                  "iter_num": state.iter_num, "best_val_loss": state.best_val_loss,
                  "trained_seconds": state.clock.seconds(), "rng": rng_state(state.batches.generator)}
    try:
        save_checkpoint(checkpoint, path)
    except OSError as e:
        kept = f"; {path} still holds the previous checkpoint" if os.path.exists(path) else ""
        message = f"could not write {path} at iteration {state.iter_num}: {e.strerror or e}{kept}"
        if final:
            fail(message + "; free some space, or pick another --out_dir, and run again", status=1)
        print(f"warning: {message}; training goes on and tries again at the next evaluation")
        return
    print(f"saved {path} ({reason})")


def end_processes():
    """Leave the process group, after a barrier (so rank 0 finishes its last save) unless failing."""
    if torch.distributed.is_initialized():
        if sys.exc_info()[0] in (None, SystemExit):
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(config_from_argv(TrainConfig))
