"""
What a training run leaves in its out_dir, and how it is read back.

ckpt.pt, the checkpoint, holds everything needed to continue exactly. It cannot be half-written:
saving writes a temporary file beside the target, flushes it to disk and renames it over the old
one, so a crash or kill mid-save leaves the previous checkpoint intact. It cannot run code: loading
uses torch.load(weights_only=True), tensors and plain Python data only.

metrics.jsonl and loss.png are the run's record: every logged value, and the loss curves, which
TrainingLog writes as it prints the log lines.
"""
import glob
import json
import math
import os
import pickle
import random
import socket
import time
import zipfile
from dataclasses import asdict

import numpy as np
import torch

from configurator import fail
from model import BUSY_SHARE, GPT, WEIGHT_SETTINGS, GPTConfig, peak_flops

# what train.py writes into a checkpoint and needs back to resume
RESUME_KEYS = ("model", "optimizer", "scaler", "model_config", "config", "tokenizer", "iter_num", "best_val_loss",
               "trained_seconds", "rng")
# settings a resumed run may change, at the price of not matching an uninterrupted run
SCHEDULE_SETTINGS = ("learning_rate", "min_lr", "max_iters", "lr_decay_iters", "warmup_iters", "max_seconds")


def ckpt_path(out_dir):
    return os.path.join(out_dir, "ckpt.pt")


def save_checkpoint(state, path):
    """Write state to path atomically. Temporary files left by a killed save are cleared, but never
    one whose process is still alive (another run saving into the same out_dir)."""
    pattern = os.path.join(glob.escape(os.path.dirname(os.path.abspath(path))), f".{glob.escape(os.path.basename(path))}.tmp*")
    for stale in glob.glob(pattern):
        pid = stale.rsplit(".tmp", 1)[1]
        if pid.isdigit() and not process_alive(int(pid)):
            os.remove(stale)
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except RuntimeError as e:  # torch's zip writer reports a failed write (a full disk) this way
        cause = e.__context__ if isinstance(e.__context__, OSError) else None
        raise OSError(getattr(cause, "errno", None), cause.strerror if cause else str(e).splitlines()[0]) from e


def process_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_checkpoint(path, map_location="cpu"):
    """Load a checkpoint written by save_checkpoint; ValueError with the file's name if it can't be."""
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint at {path}; train one first with `python train.py` "
                         "(or pass --out_dir=DIR holding ckpt.pt)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path} contains Python objects that are not plain data or tensors, so it was not "
                         f"loaded (weights_only=True keeps a checkpoint from running code): {str(e).splitlines()[-1]}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is truncated or corrupt and cannot be loaded ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None


def clean_state_dict(state_dict):
    """Drop the prefixes torch.compile (`_orig_mod.`) and DDP (`module.`) add, so any checkpoint
    loads into a plain model."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def model_from_checkpoint(checkpoint, path, **overrides):
    """The GPT a loaded checkpoint holds, with `overrides` of settings that leave the weights as they
    are (attention backend, dropout); ValueError naming `path` if it does not fit this code's model."""
    try:
        model = GPT(GPTConfig(**{**checkpoint["model_config"], **overrides}))
        model.load_state_dict(clean_state_dict(checkpoint["model"]))
    except (KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f"{path} does not match this code's model (an incompatible config): "
                         f"{str(e).splitlines()[0]}") from None
    return model


def check_resumable(checkpoint, path, cfg, vocab_size, quiet=False):
    """ValueError unless the checkpoint holds the model that cfg (a train.py config, with vocab_size
    resolved from the data) asks for. It is compared with the first run's settings, not the model's:
    with init_from=gpt2 the weights decided the shape, and the same command line must resume."""
    missing = [key for key in RESUME_KEYS if key not in checkpoint] if isinstance(checkpoint, dict) else RESUME_KEYS
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by this train.py (nanoGPT's "
                         "checkpoints, say, hold only weights this code reads differently); start a new run")
    saved, defaults = checkpoint["config"], type(cfg)()
    if saved.get("optimizer", defaults.optimizer) != cfg.optimizer:
        raise ValueError(f"{path} was trained with optimizer={saved.get('optimizer', defaults.optimizer)} "
                         f"(now {cfg.optimizer}); its optimizer state fits only that one: resume with the same")
    # a model setting the first run's code did not have yet was at GPTConfig's default: GPT-2's way,
    # the only one that code knew (TrainConfig's default for it may differ)
    before = {k: saved.get(k, getattr(GPTConfig, k)) for k in WEIGHT_SETTINGS}
    differ = [f"{k}={before[k]} (now {getattr(cfg, k)})" for k in WEIGHT_SETTINGS if before[k] != getattr(cfg, k)]
    if checkpoint["model_config"]["vocab_size"] != vocab_size:
        differ.append(f"a vocabulary of {checkpoint['model_config']['vocab_size']} tokens (now {vocab_size})")
    if differ:
        raise ValueError(f"{path} was trained with {', '.join(differ)}; resume with the same model settings and data")
    changed = [f"{k} {saved.get(k)} -> {getattr(cfg, k)}" for k in SCHEDULE_SETTINGS if saved.get(k) != getattr(cfg, k)]
    if changed and not quiet:
        print(f"note: {', '.join(changed)} since the checkpoint; the learning-rate schedule follows the new "
              "values, so this run will not match an uninterrupted one")


def check_out_dir(out_dir, resuming, overwrite):
    """Before training, not after hours of it: a new run does not destroy a trained checkpoint
    unless told to, out_dir can be written (a 1 MiB probe: not full, not read-only), and it is
    this run's alone (lock_out_dir)."""
    path = ckpt_path(out_dir)
    if not resuming and not overwrite and os.path.exists(path):
        raise ValueError(f"{path} holds a trained run: continue it with --init_from=resume, pick another "
                         "--out_dir, or start again in this one with --overwrite=true")
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
    lock_out_dir(out_dir)


def lock_out_dir(out_dir):
    """Claim out_dir for this process, so that two runs never share it: out_dir/.lock names the
    host and process of the run that holds it. A lock whose process is gone (on this host) is
    taken over; a live one is a ValueError naming that run."""
    path, me = os.path.join(out_dir, ".lock"), f"{socket.gethostname()} {os.getpid()}"
    while True:
        try:
            with open(path, "x") as f:
                f.write(me)
            return
        except FileExistsError:
            host, _, pid = read_lock(path).partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
                os.remove(path)  # left by a run that was killed
                continue
            raise ValueError(f"{out_dir} is in use by process {pid or '?'} on {host or '?'} (see {path}); wait for "
                             f"that run to end or pick another --out_dir (delete {path} if that run is gone)") from None


def unlock_out_dir(out_dir):
    """Give out_dir back, if this process holds it."""
    path = os.path.join(out_dir, ".lock")
    if read_lock(path) == f"{socket.gethostname()} {os.getpid()}":
        os.remove(path)


def read_lock(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):  # none there, or no out_dir at all
        return ""


def rng_state(generator):
    """Every random number generator a run draws from (Python, NumPy, torch, CUDA, and the batch
    sampler's generator), as tensors and plain data that weights_only loading accepts."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "batches": generator.get_state()}


def set_rng_state(state, generator):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    generator.set_state(state["batches"])


class MetricsLog:
    """out_dir/metrics.jsonl: one JSON record per log line and per evaluation, sent to Weights &
    Biases too when wandb=(project, run name, config) is given; draw() redraws out_dir/loss.png.
    A new run starts the file afresh; a resumed one keeps the records up to its checkpoint's
    iteration (resumed_at). These are side outputs: a failure to write them warns once, and
    training goes on."""

    def __init__(self, out_dir, resumed_at=None, wandb=None):
        self.path, self.png = os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "loss.png")
        self.file, self.wandb, self.warned = None, None, False
        kept = read_metrics(self.path, until=resumed_at) if resumed_at is not None else []
        try:
            atomic_write(self.path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in kept).encode()))
            self.file = open(self.path, "a")
        except OSError as e:
            self.warn(e)
        if wandb is not None:
            self.wandb = start_wandb(*wandb, warn=self.warn)

    def warn(self, error):
        if not self.warned:
            print(f"warning: could not record the metrics (metrics.jsonl, loss.png or wandb) in "
                  f"{os.path.dirname(self.path)}: {getattr(error, 'strerror', None) or error}; training and "
                  "checkpoints go on")
            self.warned = True

    def write(self, record):
        try:
            if self.file:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()
            if self.wandb:
                self.wandb.log(record, step=record["iter"])
        except Exception as e:  # a full disk, or wandb's own troubles: never the end of training
            self.warn(e)

    def draw(self):
        try:
            plot_losses(self.path, self.png)
        except Exception as e:
            self.warn(e)

    def close(self):
        if self.file:
            self.file.close()
        if self.wandb:
            self.wandb.finish()


def start_wandb(project, name, config, warn):
    """The wandb module, logging this run (offline when there is no API key); None, with a warning,
    if it cannot start (no network for an online run, say): training goes on without it."""
    import wandb
    has_key = bool(os.environ.get("WANDB_API_KEY")) or os.path.exists(os.path.expanduser("~/.netrc"))
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    try:
        wandb.init(project=project, name=name, config=config, mode=mode)
    except Exception as e:  # wandb raises its own kinds of errors
        warn(e)
        return None
    if mode == "offline":
        print("wandb: no API key found, logging offline to ./wandb; upload later with `wandb sync wandb/offline-run-*`")
    return wandb


def read_metrics(path, until=None):
    """The records of a metrics.jsonl, skipping a line that a crash left half-written; with until,
    only those up to that iteration. No file: no records."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "iter" in record and (until is None or record["iter"] <= until):
                    records.append(record)
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    return records


def atomic_write(path, write):
    """write(f) into a temporary file beside path, flush it to disk, then rename it over path:
    readers, and a crash at any moment, see the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        fd = os.open(directory, os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def plot_losses(metrics_path, png_path):
    """Train and val loss against iterations and against training time, from metrics.jsonl."""
    import matplotlib
    matplotlib.use("Agg")  # files only; works on machines without a screen
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x in zip(axes, ("iter", "seconds")):
        ax.plot([r[x] for r in steps], [r["loss"] for r in steps], alpha=0.4, label="train (logged steps)")
        ax.plot([r[x] for r in evals], [r["train_loss"] for r in evals], "o-", label="train (eval)")
        ax.plot([r[x] for r in evals], [r["val_loss"] for r in evals], "o-", label="val (eval)")
        ax.set_xlabel("iteration" if x == "iter" else "training seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy loss")
    axes[0].legend()
    fig.tight_layout()
    try:
        atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)


SPEED_WINDOW = 5.0  # seconds of training per judgement of a run's speed


class TrainingLog:
    """What rank 0 reports: a line per log_interval and per evaluation on the terminal, the same as
    records in out_dir (MetricsLog). Recent losses stay on the device, so reading them
    costs one host sync per log line, not one per step."""

    def __init__(self, cfg, run, model):
        self.cfg, self.master, self.losses, self.metrics = cfg, run.master, [], None
        self.ckpt_path = ckpt_path(cfg.out_dir)
        self.fp16 = run.dtype == torch.float16  # its GradScaler skips steps with a non-finite loss itself
        self.tokens_per_iter = run.accumulation_steps * cfg.batch_size * cfg.block_size
        self.flops_per_iter = model.flops_per_token() * self.tokens_per_iter / run.world_size
        self.peak, source = peak_flops(run.device_type, run.dtype) if run.master else (None, "")
        self.device_type, self.dtype = run.device_type, run.dtype
        self.best_tokens_per_s, self.warned_slow = 0.0, False
        if run.master:
            print(f"{model.num_params() / 1e6:.2f}M parameters | device {run.device} | dtype {str(run.dtype)[6:]} | "
                  f"attention {cfg.attention} | {torch.get_num_threads()} threads | {run.world_size} process(es) "
                  f"{cfg.parallelism if run.distributed else ''}| {self.tokens_per_iter:,} tokens/iter | "
                  f"MFU against {source}")

    def open(self, iter_num):
        """Training begins at iter_num: start the clock between log lines and the records in out_dir."""
        self.last_time, self.last_iter = time.time(), iter_num
        self.restart_speed_window()
        if self.master:
            wandb = (self.cfg.wandb_project, self.cfg.wandb_run_name, asdict(self.cfg)) if self.cfg.wandb_log else None
            resumed_at = iter_num if self.cfg.init_from == "resume" else None
            self.metrics = MetricsLog(self.cfg.out_dir, resumed_at, wandb)

    def add_loss(self, loss):
        if not self.master:
            return
        self.losses.append(loss)
        if self.device_type == "cpu":
            self.window_steps += 1
            seconds = time.time() - self.window_start
            if seconds >= SPEED_WINDOW:
                self.check_speed(self.window_steps * self.tokens_per_iter / seconds,
                                 (time.process_time() - self.window_cpu) / seconds)
                self.restart_speed_window()

    def restart_speed_window(self):
        """Speed is judged over windows of training steps (an evaluation restarts the window)."""
        self.window_start, self.window_cpu, self.window_steps = time.time(), time.process_time(), 0

    def check_finite(self, iter_num):
        """Stop on a non-finite loss, naming its iteration."""
        if not self.losses or self.fp16:
            return
        values = torch.stack(self.losses).tolist()
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            where = f"; the last good checkpoint is {self.ckpt_path}" if os.path.exists(self.ckpt_path) else ""
            fail(f"the loss became {values[bad]} at iteration {iter_num - len(values) + bad + 1}; lower "
                 f"--learning_rate or use --dtype=float32 or bfloat16{where}", status=1)

    def steps(self, iter_num, lr, seconds):
        if not self.master:
            return
        self.check_finite(iter_num)
        now = time.time()
        seconds_per_iter = (now - self.last_time) / (iter_num - self.last_iter)
        tokens_per_s = self.tokens_per_iter / seconds_per_iter
        flops = self.flops_per_iter / seconds_per_iter
        if self.peak and self.device_type == "cpu" and flops > self.peak:  # the probe was low (a busy moment): raise it
            self.peak = peak_flops(self.device_type, self.dtype, seen=flops)[0]
        mfu = flops / self.peak if self.peak else float("nan")
        loss = torch.stack(self.losses).float().mean().item()
        print(f"iter {iter_num}: loss {loss:.4f}, lr {lr:.2e}, {seconds_per_iter * 1000:.1f} ms/iter, "
              f"{tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%}")
        self.metrics.write({"iter": iter_num, "loss": loss, "lr": lr, "ms_per_iter": seconds_per_iter * 1000,
                            "tokens_per_s": tokens_per_s, "mfu": mfu, "seconds": round(seconds, 3)})
        self.losses.clear()
        self.last_time, self.last_iter = now, iter_num

    def check_speed(self, tokens_per_s, cpus_busy):
        """Say once if the CPUs are shared: the process gets well under the CPU time its threads
        could use, or runs at a third of its own best speed. Waiting threads can then make each
        step many times slower than this machine can (see configurator.pick_threads)."""
        threads = torch.get_num_threads()
        self.best_tokens_per_s = max(self.best_tokens_per_s, tokens_per_s)
        starved = threads > 1 and cpus_busy < BUSY_SHARE * threads
        if self.warned_slow or not (starved or tokens_per_s < self.best_tokens_per_s / 3):
            return
        self.warned_slow = True
        print(f"warning: this run is slow for this machine ({tokens_per_s:,.0f} tokens/s, best so far "
              f"{self.best_tokens_per_s:,.0f}; it used {cpus_busy:.1f} of its {threads} threads' CPU time): another "
              f"process is busy on these CPUs. Run with --threads=1 (or OMP_NUM_THREADS=1), or stop the other work")

    def evaluation(self, iter_num, losses, seconds=None):
        if not self.master:
            return
        self.restart_speed_window()
        print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if self.metrics:  # not with eval_only, which writes nothing
            self.metrics.write({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                "seconds": round(seconds, 3)})
            self.metrics.draw()

    def close(self):
        if self.metrics:
            self.metrics.close()
