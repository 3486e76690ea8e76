"""
Train a GPT. On one CPU out of the box:

    python train.py                                   # Shakespeare characters, a few minutes
    python train.py configs/shakespeare_char_gpu.toml --batch_size=32
    torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_124m.toml

Settings: the TrainConfig dataclass below; a TOML file overrides it; --key=value overrides both.
"""
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Literal

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
from tqdm.auto import tqdm

from attention import check_backend
from checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from configurator import config_from_argv, fail
from mfu import flops_per_token, peak_flops
from model import GPT, GPTConfig
from plots import plot_losses
from prepare import load_meta, open_split, prepare_shakespeare_char

DEFAULT_DATA_DIR = "data/shakespeare_char"
EVAL_SEED = 0  # evaluation batches are the same for every run and seed, so val losses compare
SCHEDULE_KEYS = ("learning_rate", "min_lr", "max_iters", "lr_decay_iters", "warmup_iters", "max_seconds")
# decide which weights exist and their shapes: a resumed run must ask for what the first run asked for
SHAPE_KEYS = ("block_size", "n_layer", "n_head", "n_embd", "bias", "pos_embedding", "norm", "qk_norm")


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"
    data_dir: str = DEFAULT_DATA_DIR  # holds train.bin, val.bin, meta.json (see prepare.py)
    init_from: str = "scratch"  # "scratch", "resume" (from out_dir/ckpt.pt), or GPT-2: "gpt2", "gpt2-medium", a local HF dir
    eval_only: bool = False  # print the train and val loss of the initial model (e.g. GPT-2 on your data), then stop
    eval_interval: int = 1000
    eval_iters: int = 200  # batches per evaluation; the same batches every time
    log_interval: int = 50
    wandb_log: bool = False
    wandb_project: str = "gpt"
    wandb_run_name: str = "run"
    # data
    batch_size: int = 32
    block_size: int = 64
    gradient_accumulation_steps: int = 1  # summed over all ranks
    # model (see model.GPTConfig)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    attention: Literal["manual", "sdpa", "flash", "fa2", "fa3"] = "manual"
    pos_embedding: Literal["learned", "rope"] = "rope"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    qk_norm: bool = False
    zero_init: bool = False
    # optimizer: AdamW, or Muon for the blocks' matrices; linear warm-up then cosine decay to min_lr
    optimizer: Literal["adamw", "muon"] = "muon"
    learning_rate: float = 2e-3  # AdamW's; min_lr and muon_lr decay with it in proportion
    muon_lr: float = 0.02
    max_iters: int = 1_000_000
    max_seconds: float = 190.0  # > 0: stop after this much training time; the schedule then follows time
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 turns clipping off
    warmup_iters: int = 100
    lr_decay_iters: int = 0  # 0: decay over max_iters
    min_lr: float = 2e-4
    # system
    device: str = "auto"  # auto picks cuda, then mps, then cpu; or e.g. "cuda:1"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    parallelism: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (DDP) or shard (FSDP2) the model
    seed: int = 1337

    def __post_init__(self):
        for name in ("batch_size", "block_size", "gradient_accumulation_steps", "eval_interval", "eval_iters",
                     "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_iters < 0 or self.max_seconds < 0:
            raise ValueError("max_iters and max_seconds must not be negative")
        GPTConfig(**model_args(self, vocab_size=1))  # the model's own checks (n_embd % n_head, ...)


def model_args(cfg, **extra):
    names = {f.name for f in fields(GPTConfig)}
    return {**{k: v for k, v in asdict(cfg).items() if k in names}, **extra}


def pick_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    kind = name.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use --device=cpu (or auto)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} but MPS is not available here; use --device=cpu (or auto)")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda, cuda:N or mps")
    return name


def pick_dtype(name, device_type, training=True):
    """auto: bf16 on GPUs that have it (else fp16); on CPUs with bf16 instructions bf16 for training,
    fp32 for sampling one sequence, whose matrices are too small for bf16 to pay."""
    if name == "auto":
        if device_type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if device_type == "cpu" and training and cpu_has_bf16() else torch.float32
    dtype = getattr(torch, name)
    if dtype == torch.bfloat16 and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU cannot do bfloat16; use --dtype=float16 (or auto)")
    if dtype == torch.float16 and device_type == "cpu":
        raise ValueError("float16 autocast is not supported for training on CPU; use --dtype=bfloat16 or float32")
    return dtype


def build_optimizers(model, cfg, device_type):
    """AdamW for everything (model.configure_optimizers), or Muon (torch.optim.Muon: momentum made
    orthogonal by Newton-Schulz) for the 2-D weights inside the blocks and AdamW for the rest."""
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        optimizers = [model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, device_type)]
    else:
        matrices = [p for p in model.transformer.h.parameters() if p.dim() == 2]
        optimizers = [model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, device_type,
                                                 exclude=matrices),
                      torch.optim.Muon(matrices, lr=cfg.muon_lr, weight_decay=cfg.weight_decay)]
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]  # the schedule scales every group's own peak
    return optimizers


def cpu_has_bf16():
    """bf16 autocast pays on CPUs with bf16 matrix instructions (see bench/train.py); elsewhere fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def learning_rate(cfg, it, progress):
    """Linear warm-up over warmup_iters, then cosine from learning_rate to min_lr as progress goes 0 -> 1."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


class Batches:
    """Random windows of the token stream. At each optimizer step one generator, seeded the same on
    every rank, draws offsets for all micro-steps of all ranks; rank r takes its own slice, so ranks
    never read the same batch and N ranks see exactly what 1 rank sees over N micro-steps."""

    def __init__(self, data, block_size, batch_size, seed, device):
        self.data, self.block_size, self.batch_size, self.device = data, block_size, batch_size, device
        self.generator = torch.Generator().manual_seed(seed)

    def offsets(self, n_batches):
        """(n_batches, batch_size) random start positions: one row per batch."""
        return torch.randint(len(self.data) - self.block_size, (n_batches, self.batch_size), generator=self.generator)

    def load(self, offsets):
        """Inputs x and next-token targets y, each (batch_size, block_size), read in one gather."""
        rows = torch.from_numpy(self.data[offsets.numpy()[:, None] + np.arange(self.block_size + 1)].astype(np.int64))
        x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        if self.device.startswith("cuda"):  # pinned memory lets the copy overlap with compute
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)


def rng_state(batches):
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "batches": batches.generator.get_state()}


def set_rng_state(state, batches):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    batches.generator.set_state(state["batches"])


def check_writable(out_dir):
    """Find an unwritable or full out_dir before training, not after hours of it."""
    probe = os.path.join(out_dir, f".write-test{os.getpid()}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ValueError(f"cannot write to out_dir={out_dir!r}: {e.strerror}; pick another --out_dir "
                         "or free some space") from None
    finally:
        if os.path.exists(probe):
            os.remove(probe)


def main(cfg):
    # ---- distributed set-up: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE ----
    ddp = "RANK" in os.environ
    rank, local_rank, world_size = (int(os.environ.get(k, d)) for k, d in
                                    (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    master = rank == 0
    try:
        device = pick_device(cfg.device)
        if ddp and device.startswith("cuda"):
            device = f"cuda:{local_rank}"
        device_type = device.split(":")[0]
        dtype = pick_dtype(cfg.dtype, device_type)
        check_backend(cfg.attention, device_type, dtype, cfg.dropout)
        if ddp and cfg.parallelism == "fsdp" and cfg.optimizer == "muon":
            raise ValueError("optimizer='muon' needs whole matrices and does not run on FSDP's shards; "
                             "use --optimizer=adamw with --parallelism=fsdp")
        if cfg.gradient_accumulation_steps % world_size:
            raise ValueError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a multiple "
                             f"of the number of processes ({world_size})")
        missing = not os.path.exists(os.path.join(cfg.data_dir, "meta.json"))
        if cfg.data_dir == DEFAULT_DATA_DIR and missing and local_rank == 0:  # on every machine that lacks it
            print(f"preparing the Shakespeare corpus in {cfg.data_dir} (first run only)")
            prepare_shakespeare_char(cfg.data_dir)
        if ddp:
            torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo")
            torch.distributed.barrier()  # the first process of each machine may have prepared the data
        train_data, val_data = open_split(cfg.data_dir, "train"), open_split(cfg.data_dir, "val")
        meta = load_meta(cfg.data_dir)
        for split, data in (("train", train_data), ("val", val_data)):
            if len(data) <= cfg.block_size:
                raise ValueError(f"{cfg.data_dir}/{split}.bin has {len(data)} tokens, not more than "
                                 f"block_size={cfg.block_size}; use a smaller --block_size or more text")
        if cfg.init_from not in ("scratch", "resume") and meta["tokenizer"] != "gpt2":
            raise ValueError(f"init_from={cfg.init_from!r} needs data tokenised with GPT-2's BPE, but {cfg.data_dir} "
                             f"holds {meta['tokenizer']} tokens; prepare it with `python prepare.py --tokenizer gpt2 ...`")
        ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        checkpoint = load_checkpoint(ckpt_path) if cfg.init_from == "resume" else None
        if checkpoint is not None:  # compared with the first run's settings: with init_from=gpt2 the
            # weights decided the model's shape, so a resume with the same command line is the same model
            saved = checkpoint["config"]
            differ = [f"{k}={saved.get(k)} (now {getattr(cfg, k)})" for k in SHAPE_KEYS if saved.get(k) != getattr(cfg, k)]
            if checkpoint["model_config"]["vocab_size"] != meta["vocab_size"]:
                differ.append(f"a vocabulary of {checkpoint['model_config']['vocab_size']} tokens "
                              f"(now {meta['vocab_size']})")
            if differ:
                raise ValueError(f"{ckpt_path} was trained with {', '.join(differ)}; resume with the same "
                                 "model settings and data")
            changed = [f"{k} {checkpoint['config'][k]} -> {getattr(cfg, k)}" for k in SCHEDULE_KEYS
                       if checkpoint["config"].get(k) != getattr(cfg, k)]
            if changed and master:
                print(f"note: {', '.join(changed)} since the checkpoint; the learning-rate schedule follows "
                      "the new values, so this run will not match an uninterrupted one")
    except (ValueError, OSError) as e:
        fail(e)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    if device_type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # ---- model and optimizer ----
    try:
        if checkpoint is not None:  # weights go in before sharding: every rank reads the whole file
            model = model_from_checkpoint(checkpoint, ckpt_path, dropout=cfg.dropout, attention=cfg.attention)
        elif cfg.init_from == "scratch":
            model = GPT(GPTConfig(**model_args(cfg, vocab_size=meta["vocab_size"])))
        else:
            model = GPT.from_pretrained(cfg.init_from, dropout=cfg.dropout, attention=cfg.attention)
            model.crop_block_size(cfg.block_size)
            ignored = [f"{k}={getattr(cfg, k)}" for k in SHAPE_KEYS if getattr(cfg, k) != getattr(model.config, k)]
            if ignored and master:
                c = model.config
                print(f"init_from={cfg.init_from}: the model's shape comes from the weights ({c.n_layer} layers, "
                      f"{c.n_head} heads, n_embd {c.n_embd}, {c.pos_embedding} positions, {c.norm}); "
                      f"not used: {', '.join(ignored)}")
        if master and not cfg.eval_only:  # the last check before training: nothing is written until
            check_writable(cfg.out_dir)  # every setting is known good
    except ValueError as e:
        fail(e)
    model.to(device)
    fsdp = ddp and cfg.parallelism == "fsdp"
    if fsdp:  # FSDP2: each block's parameters, gradients and optimizer state are split across ranks
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    # checkpoints hold whole (unsharded) tensors keyed by parameter name, with or without FSDP
    state_options = StateDictOptions(full_state_dict=fsdp, cpu_offload=fsdp)
    raw_model = model
    optimizers = build_optimizers(model, cfg, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)
    batches = Batches(train_data, cfg.block_size, cfg.batch_size, cfg.seed, device)
    iter_num, best_val_loss, trained_before = 0, float("inf"), 0.0
    if checkpoint is not None:
        set_optimizer_state_dict(model, optimizers, checkpoint["optimizer"], options=state_options)
        scaler.load_state_dict(checkpoint["scaler"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
        trained_before = checkpoint["trained_seconds"]
        set_rng_state(checkpoint["rng"], batches)
        if master:
            print(f"resuming from {ckpt_path} at iteration {iter_num}")
    checkpoint = None  # free memory
    if cfg.compile:
        model = torch.compile(model)
    if ddp and not fsdp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device_type == "cuda" else None)
    autocast = torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)
    micro_steps = cfg.gradient_accumulation_steps // world_size
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    flops_per_iter = flops_per_token(raw_model.config, raw_model.num_params()) * tokens_per_iter
    peak, peak_source = peak_flops(device_type, dtype) if master else (None, "")
    if master:
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters | device {device} | dtype {str(dtype)[6:]} | "
              f"attention {cfg.attention} | {world_size} process(es) {cfg.parallelism if ddp else ''}| "
              f"{tokens_per_iter:,} tokens/iter | MFU against {peak_source}")

    @torch.no_grad()
    def estimate_loss():
        """Mean loss over the same eval_iters batches of each split at every evaluation; the ranks
        share the batches out and add up their sums."""
        out = {}
        raw_model.eval()
        for split, data in (("train", train_data), ("val", val_data)):
            fixed = Batches(data, cfg.block_size, cfg.batch_size, seed=EVAL_SEED, device=device)
            total = torch.zeros((), device=device)
            # a bar only where someone watches: a terminal, and evaluations long enough to wait for
            shown = tqdm(fixed.offsets(cfg.eval_iters), desc=f"eval {split}", leave=False, mininterval=1.0,
                         disable=not (master and sys.stderr.isatty()))
            for k, offsets in enumerate(shown):
                if k % world_size == rank:
                    x, y = fixed.load(offsets)
                    with autocast:
                        total += raw_model(x, y)[1].float()
            if ddp:
                torch.distributed.all_reduce(total)
            out[split] = total.item() / cfg.eval_iters
        raw_model.train()
        return out

    def save(reason, final=False):
        """Every rank takes part (FSDP gathers the shards); rank 0 writes. A failed write (a full
        disk, say) leaves the previous checkpoint as it was; training goes on unless it was the last."""
        model_state = get_model_state_dict(raw_model, options=state_options)
        optimizer_state = get_optimizer_state_dict(raw_model, optimizers, options=state_options)
        if master:
            state = {"model": model_state, "optimizer": optimizer_state, "scaler": scaler.state_dict(),
                     "model_config": asdict(raw_model.config), "config": asdict(cfg), "tokenizer": meta,
                     "iter_num": iter_num, "best_val_loss": best_val_loss, "trained_seconds": training_seconds(),
                     "rng": rng_state(batches)}
            try:
                save_checkpoint(state, ckpt_path)
            except OSError as e:
                kept = f"; {ckpt_path} still holds the previous checkpoint" if os.path.exists(ckpt_path) else ""
                message = f"could not write {ckpt_path} at iteration {iter_num}: {e.strerror or e}{kept}"
                if final:
                    fail(message + "; free some space, or pick another --out_dir, and run again", status=1)
                print(f"warning: {message}; training goes on and tries again at the next evaluation")
                return
            print(f"saved {ckpt_path} ({reason})")

    if cfg.eval_only:  # writes nothing
        result = estimate_loss()
        if master:
            print(f"iter {iter_num}: train loss {result['train']:.4f}, val loss {result['val']:.4f}")
        return raw_model

    # ---- logging ----
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    metrics_file = open(metrics_path, "a") if master else None

    def log(record):
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
        if cfg.wandb_log:
            wandb.log(record, step=record["iter"])

    if cfg.wandb_log and master:
        import wandb
        has_key = bool(os.environ.get("WANDB_API_KEY")) or os.path.exists(os.path.expanduser("~/.netrc"))
        mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg), mode=mode)
        if mode == "offline":
            print("wandb: no API key found, logging offline to ./wandb; upload later with `wandb sync wandb/offline-run-*`")

    # ---- stop cleanly on Ctrl-C / SIGTERM: finish the step, save, exit non-zero ----
    stop_signal = 0

    def request_stop(signum, frame):
        nonlocal stop_signal
        stop_signal = signum

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    # ---- the training loop ----
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    start_iter, run_start = iter_num, time.time()

    def training_seconds():  # wall-clock spent training, across resumes, evaluations left out
        return trained_before + time.time() - run_start
    losses = []  # recent per-step losses, checked and averaged at each log line (one host sync per log)
    last_log_time, last_log_iter = time.time(), iter_num

    def check_losses():
        """Stop on a non-finite loss, naming the iteration; a fp16 GradScaler skips such steps itself."""
        if not losses or scaler.is_enabled():
            return
        values = torch.stack(losses).tolist()
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            at = iter_num - len(values) + bad[0] + 1  # 1-based, like the log lines
            last_good = f"; the last good checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else ""
            fail(f"the loss became {values[bad[0]]} at iteration {at}; lower --learning_rate or use "
                 f"--dtype=float32 or bfloat16{last_good}", status=1)

    elapsed, out_of_time = training_seconds(), False
    while True:
        last = iter_num >= cfg.max_iters or out_of_time
        if last or (iter_num % cfg.eval_interval == 0 and iter_num != start_iter):
            if master:
                check_losses()
            eval_start = time.time()
            result = estimate_loss()
            run_start += time.time() - eval_start  # evaluation is not training time
            best_val_loss = min(best_val_loss, result["val"])
            save("evaluation", final=last)
            if master:
                print(f"iter {iter_num}: train loss {result['train']:.4f}, val loss {result['val']:.4f}")
                log({"iter": iter_num, "train_loss": result["train"], "val_loss": result["val"],
                     "seconds": round(elapsed, 3)})
                plot_losses(metrics_path, os.path.join(cfg.out_dir, "loss.png"))
        if last:
            break

        progress = elapsed / cfg.max_seconds if cfg.max_seconds > 0 else \
            (iter_num - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
        lr = learning_rate(cfg, iter_num, progress)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * lr / cfg.learning_rate
        step_loss = 0.0
        for micro_step, offsets in enumerate(batches.offsets(cfg.gradient_accumulation_steps)[rank::world_size]):
            x, y = batches.load(offsets)
            sync = micro_step == micro_steps - 1  # all-reduce gradients only after the last micro-step
            if fsdp:
                model.set_requires_gradient_sync(sync)
            with (model.no_sync() if ddp and not fsdp and not sync else contextlib.nullcontext()), autocast:
                loss = model(x, y)[1] / micro_steps
            scaler.scale(loss).backward()
            step_loss += loss.detach()
        if cfg.grad_clip > 0:
            for optimizer in optimizers:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        for optimizer in optimizers:
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()
        losses.append(step_loss)
        iter_num += 1

        if master and iter_num % cfg.log_interval == 0:
            check_losses()
            now = time.time()
            mean_loss = torch.stack(losses).float().mean().item()
            seconds_per_iter = (now - last_log_time) / (iter_num - last_log_iter)
            tok_s = tokens_per_iter / seconds_per_iter
            mfu = flops_per_iter / world_size / seconds_per_iter / peak if peak else float("nan")
            print(f"iter {iter_num}: loss {mean_loss:.4f}, lr {lr:.2e}, {seconds_per_iter * 1000:.1f} ms/iter, "
                  f"{tok_s:,.0f} tokens/s, MFU {mfu:.1%}")
            log({"iter": iter_num, "loss": mean_loss, "lr": lr, "ms_per_iter": seconds_per_iter * 1000,
                 "tokens_per_s": tok_s, "mfu": mfu, "seconds": round(training_seconds(), 3)})
            losses.clear()
            last_log_time, last_log_iter = now, iter_num

        if ddp and iter_num % cfg.log_interval:
            continue  # the ranks' clock and stop signal may differ: act on them only once they agree
        elapsed, stop = training_seconds(), stop_signal
        if ddp:  # ranks agree on the clock (it drives the schedule) and stop together on a signal; the
            # agreement waits for the GPU, so it happens once per log_interval, not at every step.
            # stop_signal itself is left alone: a signal that lands during the all_reduce counts next time
            agreed = torch.tensor([float(stop), elapsed], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
            stop, elapsed = int(agreed[0]), agreed[1].item()
        out_of_time = cfg.max_seconds > 0 and elapsed >= cfg.max_seconds
        if stop:
            if master:
                check_losses()
            save(f"stopped by {signal.Signals(stop).name} after iteration {iter_num}", final=True)
            if master:
                print(f"resume with: python train.py {' '.join(sys.argv[1:])} --init_from=resume")
            shut_down_distributed()
            sys.exit(128 + stop)

    if master:
        print(f"done: {iter_num} iterations in {training_seconds():.1f} s of training; best val loss {best_val_loss:.4f}; "
              f"checkpoint {ckpt_path}; sample with: python sample.py --out_dir={cfg.out_dir}")
        metrics_file.close()
        if cfg.wandb_log:
            wandb.finish()
    return raw_model


def shut_down_distributed():
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # let rank 0 finish its last save; tearing down earlier can hang
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(config_from_argv(TrainConfig))
    shut_down_distributed()
