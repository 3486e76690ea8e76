"""
The run's log, written by rank 0: a line on the terminal per log_interval and per evaluation, the
same values as records in out_dir/metrics.jsonl (and Weights & Biases when asked), and the loss
curves redrawn into out_dir/loss.png at each evaluation. These are side outputs: a failure to write
them warns once (per place: out_dir's files, wandb), and training goes on.
"""
import json
import math
import netrc
import os
import time
import urllib.parse
from dataclasses import asdict

import torch

from checkpoint import ckpt_path
from configurator import real_number, whole_number
from files import atomic_write
from hardware import BusyCheck, dtype_name, peak_flops, threads_text


class TrainingLog:
    """What rank 0 reports: a line per log_interval and per evaluation on the terminal, the same as
    records in out_dir (MetricsLog). Recent losses stay on the device, so reading them
    costs one host sync per log line, not one per step; under torchrun every rank keeps its own, and a
    line's loss is the mean over all of them (rank 0's alone would be its share of the batch)."""

    def __init__(self, cfg, setup, model):
        self.cfg, self.master, self.losses, self.metrics = cfg, setup.master, [], None
        self.world_size = setup.world_size if setup.distributed else 1
        self.ckpt_path = ckpt_path(cfg.out_dir)
        self.fp16 = setup.dtype == torch.float16  # its GradScaler skips steps with a non-finite loss itself
        self.tokens_per_iter = setup.accumulation_steps * cfg.batch_size * cfg.block_size
        self.flops_per_iter = model.flops_per_token() * self.tokens_per_iter / setup.world_size
        # eval_only writes nothing: not even the CPU's measured peak, which MFU needs only in training
        measure = setup.master and not cfg.eval_only
        self.peak, source = peak_flops(setup.device_type, setup.dtype) if measure else (None, "")
        self.device_type, self.dtype = setup.device_type, setup.dtype
        self.busy = BusyCheck(self.tokens_per_iter) if setup.device_type == "cpu" else None
        if setup.master:
            processes = f"{setup.world_size} process(es)" + (f" {cfg.parallelism}" if setup.distributed else "")
            print(f"{model.num_params() / 1e6:.2f}M parameters | device {setup.device} | "
                  f"dtype {dtype_name(setup.dtype)} | attention {cfg.attention} | {threads_text()} | {processes} | "
                  f"{self.tokens_per_iter:,} tokens/iter" + (f" | MFU against {source}" if measure else ""))

    def open(self, iter_num, run_id):
        """Training of run run_id begins at iter_num: start the records in out_dir, then the clock between
        log lines (wandb's start, seconds long, is not training)."""
        if self.master:
            wandb = (self.cfg.wandb_project, self.cfg.wandb_run_name, asdict(self.cfg)) if self.cfg.wandb_log else None
            resumed_at = iter_num if self.cfg.init_from == "resume" else None
            self.metrics = MetricsLog(self.cfg.out_dir, run_id, resumed_at, wandb)
        self.last_time, self.last_iter = time.time(), iter_num
        if self.busy:
            self.busy.restart()

    def add_loss(self, loss):
        """A training step's loss (a tensor on the device, read at the next log line)."""
        self.losses.append(loss)
        if not self.master:
            return
        warning = self.busy.step() if self.busy else None
        if warning:
            print(warning)

    def nonfinite(self, iter_num, checkpointed):
        """The error for a non-finite loss among the steps since the last log line, naming its
        iteration (and out_dir's checkpoint, if it is this run's: checkpointed), or None. Each rank checks its
        own share's losses: one rank's overflow is the whole batch's, and the log line's mean would show it."""
        if not self.losses or self.fp16:
            return None
        values = torch.stack(self.losses).tolist()
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is None:
            return None
        where = f"; the last good checkpoint is {self.ckpt_path}" if checkpointed else ""
        rates = "--learning_rate and --muon_lr" if self.cfg.optimizer == "muon" else "--learning_rate"
        precision = ", or train in --dtype=float32" if self.dtype == torch.bfloat16 else ""  # fp16 never comes here
        return (f"the loss became {values[bad]} at iteration {iter_num - len(values) + bad + 1}; lower "
                f"{rates}{precision}{where}")

    def print_progress(self, iter_num, lr, seconds):
        """The log line of the steps since the last one: mean loss, rate, speed and MFU. Every rank calls it."""
        loss = torch.stack(self.losses).float().mean()
        self.losses.clear()
        if self.world_size > 1:  # each rank's mean is over as many sequences; gloo has no AVG
            torch.distributed.all_reduce(loss)
            loss /= self.world_size
        if not self.master:
            return
        now = time.time()
        seconds_per_iter = (now - self.last_time) / (iter_num - self.last_iter)
        tokens_per_s = self.tokens_per_iter / seconds_per_iter
        flops = self.flops_per_iter / seconds_per_iter
        if self.peak and self.device_type == "cpu" and flops > self.peak:  # the probe was low (a busy moment): raise it
            self.peak = peak_flops(self.device_type, self.dtype, reached=flops)[0]
        mfu = flops / self.peak if self.peak else None  # None: no peak known for this device (JSON's null)
        loss = loss.item()
        print(f"iter {iter_num}: loss {loss:.4f}, lr {lr:.2e}, {seconds_per_iter * 1000:.1f} ms/iter, "
              f"{tokens_per_s:,.0f} tokens/s" + (f", MFU {mfu:.1%}" if mfu is not None else ""))
        self.metrics.write({"iter": iter_num, "loss": loss, "lr": lr, "ms_per_iter": seconds_per_iter * 1000,
                            "tokens_per_s": tokens_per_s, "mfu": mfu, "seconds": round(seconds, 3)})
        self.last_time, self.last_iter = now, iter_num

    def evaluation(self, iter_num, losses, seconds=None, saved=False):
        """An evaluation's losses, on the terminal and in the records (saved: this run's checkpoint has
        just been written, so that the records of runs before it go), and the picture redrawn."""
        if not self.master:
            return
        if self.busy:
            self.busy.restart()
        print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if self.metrics:  # not with eval_only, which writes nothing
            if saved:
                self.metrics.forget_other_runs()
            self.metrics.write({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                "seconds": round(seconds, 3)})
            self.metrics.draw()
        # the next log line's speed counts from here: an evaluation, and drawing its picture, are not training
        self.last_time, self.last_iter = time.time(), iter_num

    def saved(self):
        """A stop's checkpoint has been written: the records of runs before this one go, and the picture
        is redrawn (of this run: it may not have reached an evaluation)."""
        if self.metrics:
            self.metrics.forget_other_runs()
            self.metrics.draw()

    def close(self):
        if self.metrics:
            self.metrics.close()


class MetricsLog:
    """out_dir/metrics.jsonl: one JSON record per log line and per evaluation, sent to Weights &
    Biases too when wandb=(project, run name, config) is given; draw() redraws out_dir/loss.png.
    Each record names its run (run_id). A resumed run keeps its own records up to its checkpoint's
    iteration (resumed_at), and not those of a run that started in out_dir since and saved no
    checkpoint. A new run keeps the records of the run before it (whose checkpoint --overwrite=true
    leaves until the new run's first save) until forget_other_runs(). These are side outputs: a
    failure to write them warns once per place, and training goes on."""

    def __init__(self, out_dir, run_id, resumed_at=None, wandb=None):
        self.path, self.png = os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "loss.png")
        self.file, self.wandb, self.warned, self.run_id = None, None, set(), run_id
        # a record without "run" is from before runs had one, as is its checkpoint (run_id None)
        kept = [r for r in read_metrics(self.path, until=resumed_at) if resumed_at is None or r.get("run") == run_id]
        self.others_kept = any(r.get("run") != run_id for r in kept)
        self.rewrite(kept)
        if wandb is not None:
            self.wandb = start_wandb(*wandb, warn=lambda e: self.warn(e, "wandb"))

    def warn(self, error, where="out_dir"):
        """Say once per place (out_dir's files, wandb) that records could not go there."""
        if where in self.warned:
            return
        said = "; ".join(line.strip() for line in str(getattr(error, "strerror", None) or error).splitlines()
                         if line.strip())[:300]  # one line: wandb's settings errors take several
        if where == "wandb":
            print(f"warning: wandb cannot log this run: {said}; training goes on")
        else:
            print(f"warning: could not record the metrics (metrics.jsonl, loss.png) in {os.path.dirname(self.path)}: "
                  f"{said}; training and checkpoints go on")
        self.warned.add(where)

    def write(self, record):
        try:
            if self.file:
                self.file.write(json.dumps({**record, "run": self.run_id}) + "\n")
                self.file.flush()
        except OSError as e:  # a full disk: never the end of training
            self.warn(e)
        try:
            if self.wandb:
                self.wandb.log(record, step=record["iter"])
        except Exception as e:  # wandb's own troubles, of many kinds
            self.warn(e, "wandb")

    def rewrite(self, records):
        """Start the file again with these records (whole lines: a torn last one is gone), then append."""
        try:
            if self.file:
                self.file.close()
            atomic_write(self.path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in records).encode()))
            self.file = open(self.path, "a")
        except OSError as e:
            self.file = None
            self.warn(e)

    def forget_other_runs(self):
        """This run's checkpoint is out_dir's now: the records of the run before it go."""
        if self.others_kept:
            self.rewrite([r for r in read_metrics(self.path) if r.get("run") == self.run_id])
            self.others_kept = False

    def draw(self):
        if self.others_kept:  # loss.png stays the earlier run's, as its checkpoint and records do
            return
        try:
            plot_losses(self.path, self.png, self.run_id)
        except Exception as e:  # noqa: BLE001 - matplotlib's and the disk's: a picture never stops training
            self.warn(e)

    def close(self):
        if self.file:
            self.file.close()
        if self.wandb:
            self.wandb.finish()


def start_wandb(project, name, config, warn):
    """The wandb module, logging this run (offline when there is no API key); None, with a warning,
    if it cannot start (not installed, or no network for an online run): training goes on without it."""
    mode = os.environ.get("WANDB_MODE") or ("online" if wandb_api_key_found() else "offline")
    try:
        import wandb
        wandb.init(project=project, name=name, config=config, mode=mode)
    except Exception as e:  # not installed, or wandb's own kinds of errors
        warn(e)
        return None
    if mode == "offline":
        why = "WANDB_MODE=offline" if os.environ.get("WANDB_MODE") else "no API key found"
        print(f"wandb: {why}, logging offline to ./wandb; upload later with `wandb sync wandb/offline-run-*`")
    return wandb


def wandb_api_key_found():
    """Whether wandb has an API key: WANDB_API_KEY, or `wandb login`'s entry for its server in the netrc
    file wandb reads ($NETRC, else ~/.netrc; a netrc of other machines' passwords only is no key)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:  # the path given: as wandb, no refusal of a file others may read
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):  # none, or not a netrc wandb could read either
        return False


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
                it = record.get("iter") if isinstance(record, dict) else None
                if whole_number(it) and (until is None or it <= until):
                    records.append(record)  # a record without a whole iteration number is damaged: skipped
    except (OSError, UnicodeDecodeError):  # none there, or not a readable file (a directory, say)
        pass
    return records


def plot_losses(metrics_path, png_path, run_id):
    """Train and val loss against iterations and against training time, from run run_id's records in
    metrics.jsonl (a record that lacks a number the picture needs, edited by hand, say, is left out)."""
    from matplotlib.figure import Figure  # to a file, without pyplot: no screen, no backend set for the process

    records = [r for r in read_metrics(metrics_path) if r.get("run") == run_id]
    steps = [r for r in records if has_numbers(r, "loss", "seconds")]
    evals = [r for r in records if has_numbers(r, "train_loss", "val_loss", "seconds")]
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, x in zip(axes, ("iter", "seconds")):
        # dots too: the one logged step of a short run (under twice --log_interval's 50) is no line at all
        ax.plot([r[x] for r in steps], [r["loss"] for r in steps], ".-", markersize=3, alpha=0.4,
                label="train (logged steps)")
        ax.plot([r[x] for r in evals], [r["train_loss"] for r in evals], "o-", label="train (eval)")
        ax.plot([r[x] for r in evals], [r["val_loss"] for r in evals], "o-", label="val (eval)")
        ax.set_xlabel("iteration" if x == "iter" else "training seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy loss")
    axes[0].legend()
    fig.tight_layout()
    atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))


def has_numbers(record, *keys):
    return all(real_number(record.get(k)) for k in keys)
