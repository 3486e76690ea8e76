"""
Which training recipe gets further in the same wall-clock budget? Runs train.py (as subprocesses)
for each config, for several seeds, interleaved (ref, default, ref, default, ...) so load on a
shared machine hits every config alike, each into its own out_dir; then evaluates every final
checkpoint on the same fixed val (and train) batches and prints the mean and spread per config.

    python bench/recipe.py                                           # 190 s per run, 3 seeds, 2 configs
    python bench/recipe.py --max_seconds=5 --seeds=1 --eval_batches=5 --out=/tmp/recipe.json   # smoke test
    git worktree add /tmp/base HEAD~5 && python bench/recipe.py --configs=default --base_repo=/tmp/base   # vs a commit
    python bench/recipe.py --configs=default,my_change.toml --iterations=1200 --seeds=1,2,3,4   # equal work
    python bench/recipe.py --threads=2 --parallel=6 --device=cpu   # a 12-core machine runs a 2-core CPU's six at once

Budget: train.py --max_seconds (its schedule follows the clock; evaluation time is not counted) with
--max_iters large, so every run stops on time, not on iterations. With --iterations=N every run
trains N iterations on train.py's iteration schedule (--max_seconds=0) instead: for a change that
leaves a step's cost as it was, this takes the machine's speed, which swings from minute to minute on
a shared machine, out of the comparison, and leaves only the seeds' spread (bench/README.md).
train.py's periodic evaluations are turned off (--eval_interval huge) and its final one shortened
(--eval_iters=train_eval_iters): this script does the evaluation that counts. "default" in --configs
means train.py with no config file.
With --parallel=N, N runs train at once, each pinned (taskset) to --threads cores that no other run uses,
one thread of each core (SMT siblings would share its arithmetic): the runs still share the memory bus and
the last-level cache, which a 2-core machine's single run has to itself, so compare configs within one
such sitting, not with a sequential one.
Evaluation: eval_batches batches of eval_batch_size x eval_block_size tokens from val.bin, drawn once
from a generator seeded with eval_seed, the same for every checkpoint (eval_block_size defaults to the
smallest block_size among the runs, so every model can take it); float32, no dropout. The same for
train.bin gives the train loss; gap = val - train. Each checkpoint is scored by the model code of the
checkout whose train.py trained it (bench/checkpoint_losses.py, run there), not by this one's.
"""
import os
import sys

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json
import queue
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch

from bench.benchutil import (ROOT, fail, fmt, machine_info, md_table, out_path, parse, print_machine, resolve_device,
                             run, split_list, write_json)
from attention import check_backend
from checkpoint import ckpt_path, load_checkpoint
from configurator import ConfigError, check_at_least, check_positive, load_config
from data.loader import Batches, open_split
from hardware import check_threads, device_type_of, pick_device, pick_dtype, separate_cores, usable_cpus
from interrupts import interrupted_by
from train import TrainConfig, training_dropout


# train.py's settings that recipe.py gives each run (train_args), and the flag of its own that sets each instead
RECIPE_SETS = {"seed": "--seeds", "max_seconds": "--max_seconds", "max_iters": "--iterations", "out_dir": "--work_dir"}


@dataclass
class RecipeBench:
    configs: str = "configs/nanogpt_cpu_reference.toml,default"  # comma-separated TOMLs; "default": no file
    base_repo: str = ""  # another checkout (a git worktree of an older commit): each config runs with its train.py too
    max_seconds: float = TrainConfig.max_seconds  # training-time budget of every run (train.py --max_seconds)
    iterations: int = 0  # > 0: every run trains this many iterations instead, on the iteration schedule (equal work)
    seeds: str = "1337,1338,1339"  # comma-separated; one run per config per seed
    train_args: str = ""  # extra train.py flags for every run, e.g. "--compile=false"
    train_eval_iters: int = 10  # train.py's own final evaluation (not the one reported here)
    threads: int = 0  # OMP_NUM_THREADS for the runs; 0: leave unset
    parallel: int = 1  # runs at once, each pinned to `threads` cores of its own: a many-core machine measuring
                       # a small one
    work_dir: str = ""  # where the out_dirs go; "": recipe-<time> in the temporary directory
    run_timeout: float = 0.0  # seconds before a run is killed; 0: 3 * max_seconds + 300 (none with iterations)
    eval_batches: int = 200  # fixed batches per split for the final evaluation
    eval_batch_size: int = 12  # sequences per evaluation batch
    eval_block_size: int = 0  # 0: the smallest block_size among the runs
    eval_seed: int = 4242  # seeds the draw of the evaluation batches
    device: str = "auto"  # for the runs (train.py --device, unless --train_args names one) and the evaluation
    out: str = ""  # JSON path; "": bench/results/recipe-<device>.json

    def __post_init__(self):
        check_positive(self, "max_seconds")
        check_at_least(self, 0, "iterations", meaning="0: a time budget")
        check_at_least(self, 1, "eval_batches", "eval_batch_size", "train_eval_iters", "parallel")
        check_at_least(self, 0, "eval_block_size", meaning="0: the smallest block_size among the runs")
        check_at_least(self, 0, "run_timeout", meaning="0: 3 * max_seconds + 300")
        check_at_least(self, 0, "threads", meaning="0: leave OMP_NUM_THREADS unset")
        check_threads(self.threads, "threads")  # what each run's train.py would refuse, said before any runs
        if self.parallel > 1 and self.threads == 0:
            raise ValueError(f"parallel={self.parallel} needs --threads=N, the cores each run gets (2 for a 2-core "
                             "CPU)")
        if self.work_dir and os.path.exists(self.work_dir) and not os.path.isdir(self.work_dir):
            raise ValueError(f"work_dir={self.work_dir!r} is a file, not a folder; pick another path")
        try:
            flags = shlex.split(self.train_args)
        except ValueError as e:  # an unclosed quote, say
            raise ValueError(f"train_args={self.train_args!r} cannot be split into flags ({e})") from None
        for flag in flags:  # train.py takes the last of a flag given twice: these would quietly undo the table's
            if flag in ("-h", "--help"):  # load_config would print train.py's settings as this script's
                raise ValueError("train_args cannot ask for --help; python train.py --help lists the settings it takes")
            key = flag[2:].partition("=")[0]
            if key in RECIPE_SETS:
                raise ValueError(f"train_args sets {key}, which recipe.py sets for each run; use {RECIPE_SETS[key]}")


def label(config):
    """A run's name: its config's, "base-" first for a run of the base checkout's train.py."""
    repo, config = config if isinstance(config, tuple) else (ROOT, config)
    name = "default" if config == "default" else os.path.splitext(os.path.basename(config))[0]
    return name if repo == ROOT else f"base-{name}"


def train_args(cfg, config, seed, out_dir):
    """The arguments of one run's train.py: its config file, the device, the budget, then --train_args."""
    budget = ["--max_seconds=0", f"--max_iters={cfg.iterations}"] if cfg.iterations else \
        [f"--max_seconds={cfg.max_seconds}", "--max_iters=1000000000"]
    return ([] if config == "default" else [config]) + [
        f"--out_dir={out_dir}", f"--seed={seed}", f"--device={cfg.device}", *budget, "--eval_interval=1000000000",
        f"--eval_iters={cfg.train_eval_iters}"] + shlex.split(cfg.train_args)


def cpu_sets(cfg, device):
    """With --parallel=N: N lists of `threads` CPUs, each on cores no other list uses; else [None] (no pinning)."""
    if cfg.parallel == 1:
        return [None]
    if device != "cpu":  # pinned CPUs say nothing of runs that would share one GPU
        fail(f"parallel={cfg.parallel} runs train.py on CPUs of their own, but device={cfg.device} is {device} here; "
             "add --device=cpu")
    cores = separate_cores()[:usable_cpus()]  # no more than a CPU quota (a container's --cpus) lets run at once
    if len(cores) < cfg.parallel * cfg.threads:
        fail(f"parallel={cfg.parallel} x threads={cfg.threads} needs {cfg.parallel * cfg.threads} cores; this process "
             f"may use {len(cores)}; lower --parallel")
    if not shutil.which("taskset"):
        fail("parallel > 1 pins each run to its CPUs with taskset, which is not installed (util-linux); use "
             "--parallel=1")
    return [cores[i * cfg.threads:(i + 1) * cfg.threads] for i in range(cfg.parallel)]


def run_train(cfg, config, seed, out_dir, cpus, children):
    """One train.py run, on the CPUs `cpus` only if given; its record. Its process is in the set `children`
    while it runs."""
    repo, config = config if isinstance(config, tuple) else (ROOT, config)
    argv = [sys.executable, os.path.join(repo, "train.py")] + train_args(cfg, config, seed, out_dir)
    if cpus:
        argv = ["taskset", "--cpu-list", ",".join(map(str, cpus))] + argv
    env = dict(os.environ)
    if cfg.threads > 0:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
    os.makedirs(out_dir, exist_ok=True)
    timeout = cfg.run_timeout or (None if cfg.iterations else 3 * cfg.max_seconds + 300)
    start = time.time()
    with open(os.path.join(out_dir, "train.log"), "w") as log:
        log.write(" ".join(shlex.quote(a) for a in argv) + "\n")
        log.flush()
        with subprocess.Popen(argv, cwd=repo, stdout=log, stderr=subprocess.STDOUT, env=env) as proc:
            children.add(proc)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
                log.write(f"killed after run_timeout={timeout} s\n")
            finally:
                children.discard(proc)
    rec = {"config": config, "repo": "base" if repo != ROOT else "this", "label": label((repo, config)), "seed": seed,
           "out_dir": out_dir, "returncode": rc, "cpus": cpus,
           "wall_seconds": round(time.time() - start, 1)}
    if rc != 0:
        with open(os.path.join(out_dir, "train.log")) as f:
            lines = [l.strip() for l in f if l.strip()]
        rec["error"] = lines[-1] if lines else "no output"
    return rec


def fixed_batches(data, block_size, cfg, device):
    b = Batches(data, block_size, cfg.eval_batch_size, cfg.eval_seed, device)
    return [b.load(offsets) for offsets in b.offsets(cfg.eval_batches)]


def spread(values):
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values)}


def check_configs(cfg):
    """The --configs list, each "default" or an absolute path to a file (given relative to the repository
    root or to the current directory): the runs start in the checkout whose train.py they run."""
    configs = split_list(cfg.configs, "configs")
    for c in configs:
        if c != "default" and not os.path.isfile(os.path.join(ROOT, c)) and not os.path.isfile(c):
            fail(f"config file {c!r} not found (paths are relative to the repository root; 'default' means none)")
    given, configs = configs, [c if c == "default" else os.path.join(ROOT, c) if os.path.isfile(os.path.join(ROOT, c))
                               else os.path.abspath(c) for c in configs]
    if len({label(c) for c in configs}) != len(configs):
        fail("configs must have different file names (they label the runs)")
    here, settings = os.getcwd(), {}
    for name, c in zip(given, configs):  # train.py's own checks of the settings it will get, before any run trains
        try:
            os.chdir(ROOT)  # where the runs start: a relative --init_from is found from there
            settings[name] = load_config(TrainConfig, train_args(cfg, c, seed=0, out_dir="out"))
        except (ConfigError, ValueError) as e:
            with_args = f" with --train_args={cfg.train_args!r}" if cfg.train_args else ""
            fail(f"{'the default config' if c == 'default' else name}{with_args}: {e}")
        finally:
            os.chdir(here)
    # what the evaluation after training refuses, known now from the settings (it checks the checkpoints again)
    data_dirs = {os.path.normpath(os.path.join(ROOT, t.data_dir)) for t in settings.values()}
    if len(data_dirs) > 1:
        fail(f"the configs train on different data ({', '.join(sorted(data_dirs))}); their losses would not compare")
    too_small = [name for name, t in settings.items() if t.block_size < cfg.eval_block_size]
    if too_small:
        fail(f"eval_block_size={cfg.eval_block_size} exceeds the block_size of {', '.join(too_small)}")
    for name, t in settings.items():  # a device this machine lacks, or an attention it cannot run: every run
        try:  # would fail after starting
            device_type = device_type_of(pick_device(t.device))
            check_backend(t.attention, device_type, pick_dtype(t.dtype, device_type), training_dropout(t))
        except ValueError as e:
            fail(f"{'the default config' if name == 'default' else name}: {e}")
    if cfg.base_repo:
        if not os.path.isfile(os.path.join(cfg.base_repo, "train.py")):
            fail(f"base_repo={cfg.base_repo!r} holds no train.py; give a checkout, e.g. `git worktree add "
                 "/tmp/base HEAD~1`")
        if os.path.samefile(cfg.base_repo, ROOT):
            fail(f"base_repo={cfg.base_repo!r} is this checkout: the base is another one, e.g. `git worktree add "
                 "/tmp/base HEAD~1`")
        check_base_settings(cfg, configs, given)
        configs = [(os.path.abspath(cfg.base_repo), c) for c in configs] + configs  # base first: label order
    return configs


def check_base_settings(cfg, configs, given):
    """One line, before any run trains, where the base checkout's train.py lacks a setting that a config or
    train_args gives it (an option newer than the base): its every run would fail at its start while this
    checkout's trained. Its settings are the names its --help lists; a train.py without one is not checked."""
    import tomllib  # here, after configurator's check that this Python has it (3.11)
    helped = subprocess.run([sys.executable, "train.py", "--help"], cwd=cfg.base_repo, capture_output=True, text=True,
                            env={**os.environ, "TORCHDYNAMO_DISABLE": "1"}, timeout=300)
    known = set(re.findall(r"^\s*--(\w+)", helped.stdout, re.M))
    if helped.returncode != 0 or not known:
        return
    for name, c in zip(given, configs):
        keys = []
        if c != "default":
            with open(c, "rb") as f:
                keys = list(tomllib.load(f))
        keys += [a[2:].partition("=")[0] for a in train_args(cfg, c, seed=0, out_dir="out") if a.startswith("--")]
        lacking = sorted(set(keys) - known)
        if lacking:
            fail(f"base_repo={cfg.base_repo!r}: its train.py has no setting {', '.join(lacking)}, which "
                 f"{'the default config' if c == 'default' else name}"
                 f"{f' with --train_args={cfg.train_args!r}' if cfg.train_args else ''} gives it; every base run "
                 "would fail at its start: compare configs that both checkouts take")


def train_one(cfg, config, seed, work, free_cpus, interrupted, children):
    """One run, on a CPU set taken from the queue free_cpus and given back after; its record, or None if
    the Event `interrupted` was set first. Its start and its end are one line, or two where other runs may
    print between them (CPU sets to pin to)."""
    out_dir = os.path.join(work, f"{label(config)}-seed{seed}")
    cpus = free_cpus.get()
    if interrupted.is_set():
        free_cpus.put(cpus)
        return None
    on = f" on CPUs {','.join(map(str, cpus))}" if cpus else ""
    print(f"train: {label(config)} seed {seed}{on} -> {out_dir} ...", end="\n" if cpus else " ", flush=True)
    try:
        rec = run_train(cfg, config, seed, out_dir, cpus, children)
    finally:
        free_cpus.put(cpus)
    if rec["returncode"] in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # train.py's exit when stopped
        interrupted.set()
    done = f"{'ok' if rec['returncode'] == 0 else 'FAILED: ' + rec['error']} ({rec['wall_seconds']} s)"
    print(f"train: {label(config)} seed {seed}: {done}" if cpus else done, flush=True)
    return rec


def train_all(cfg, configs, seeds, work, sets):
    """One train.py run per seed and config, interleaved, as many at a time as there are CPU sets, each on
    a set no other running one has; their records, in that order. Ctrl-C reaches the runs in flight too
    (the terminal signals its whole process group), and each saves and stops; the rest do not start, whether
    this process or a run's train.py (which may see it first) tells of it. SIGTERM (`timeout`, a scheduler) reaches
    this process alone: it is passed on to the runs in flight, which stop as on Ctrl-C."""
    free_cpus, interrupted, children, signum = queue.Queue(), threading.Event(), set(), signal.SIGINT
    for cpus in sets:
        free_cpus.put(cpus)
    pool = ThreadPoolExecutor(len(sets))
    started = [pool.submit(train_one, cfg, config, seed, work, free_cpus, interrupted, children)
               for seed in seeds for config in configs]
    try:
        runs = [run.result() for run in started]
    except KeyboardInterrupt as e:
        interrupted.set()
        signum = interrupted_by(e)
        if signum == signal.SIGTERM:
            for proc in list(children):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)  # the runs in flight end as they save
        runs = [None if run.cancelled() else run.result() for run in started]
    pool.shutdown()
    if interrupted.is_set():
        fail(f"interrupted: {runs.count(None)} of {len(runs)} runs not started; the others' out_dirs are under {work}",
             status=128 + signum)
    return runs


def load_finished(runs, work):
    """(record, checkpoint) of every run that finished with a checkpoint; its numbers into its record."""
    models = []
    for rec in runs:
        if rec["returncode"] != 0:
            continue
        try:
            ckpt = load_checkpoint(ckpt_path(rec["out_dir"]))
        except ValueError as e:
            rec.update(returncode="no checkpoint", error=str(e))
            continue
        rec["iterations"] = ckpt["iter_num"]
        rec["trained_seconds"] = round(ckpt["trained_seconds"], 1)
        rec["ms_per_iter"] = 1e3 * ckpt["trained_seconds"] / max(1, ckpt["iter_num"])  # by train.py's own clock
        rec["train_config"] = ckpt["config"]
        models.append((rec, ckpt))
    if not models:
        fail("no run produced a checkpoint; see the train.log files under " + work, status=1)
    return models


def evaluate_all(cfg, models, device):
    """Every checkpoint's val and train loss on the same fixed batches, into its record; the
    evaluation's settings for the JSON."""
    data_dirs = {os.path.normpath(os.path.join(ROOT, ckpt["config"]["data_dir"])) for _, ckpt in models}  # the base's
    # relative data_dir names the same corpus, prepared in its checkout
    if len(data_dirs) > 1:
        fail(f"the runs trained on different data ({', '.join(sorted(data_dirs))}); their losses do not compare",
             status=1)
    data_dir = data_dirs.pop()
    block = cfg.eval_block_size or min(ckpt["model_config"]["block_size"] for _, ckpt in models)
    too_small = [r["label"] for r, ckpt in models if ckpt["model_config"]["block_size"] < block]
    if too_small:
        fail(f"eval_block_size={block} exceeds the block_size of {', '.join(too_small)}", status=1)
    val = fixed_batches(open_split(data_dir, "val"), block, cfg, device)
    train = fixed_batches(open_split(data_dir, "train"), block, cfg, device)
    print(f"evaluating {len(models)} checkpoints on {cfg.eval_batches} fixed batches of {cfg.eval_batch_size} x "
          f"{block} tokens per split ({data_dir}, seed {cfg.eval_seed})")
    with tempfile.TemporaryDirectory() as tmp:
        batches = os.path.join(tmp, "batches.pt")
        torch.save({"val": val, "train": train}, batches)
        for repo in dict.fromkeys(checkout(cfg, rec) for rec, _ in models):
            mine = [rec for rec, _ in models if checkout(cfg, rec) == repo]
            for rec, losses in zip(mine, losses_by_own_code(repo, mine, batches, cfg, device, tmp)):
                if "error" in losses:
                    rec.update(returncode="not evaluated", error=losses["error"])
                else:
                    rec.update(val_loss=losses["val"], train_loss=losses["train"], gap=losses["val"] - losses["train"])
    return {"data_dir": data_dir, "block_size": block, "batch_size": cfg.eval_batch_size,
            "batches": cfg.eval_batches, "seed": cfg.eval_seed}


def checkout(cfg, rec):
    """The checkout whose train.py trained the run of the record rec."""
    return os.path.abspath(cfg.base_repo) if rec["repo"] == "base" else ROOT


def losses_by_own_code(repo, runs, batches, cfg, device, tmp):
    """Each run's {split: mean loss} on the batches saved at `batches`, or {"error": ...}: scored by the model
    code of repo, the checkout whose train.py trained them (bench/checkpoint_losses.py says why)."""
    out = os.path.join(tmp, "losses.json")
    argv = [sys.executable, os.path.join(ROOT, "bench", "checkpoint_losses.py"), out, batches, str(cfg.threads), device,
            *(ckpt_path(rec["out_dir"]) for rec in runs)]
    done = subprocess.run(argv, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        lines = done.stdout.strip().splitlines()
        why = lines[-1] if lines else f"exit status {done.returncode}"
        return [{"error": f"the evaluation by {repo}'s code failed: {why}"}] * len(runs)
    with open(out) as f:
        return json.load(f)


def summarise(configs, runs):
    """{config label: spread of val loss, train loss, gap and iterations over its seeds}, printed."""
    print()
    print(md_table(["config", "seed", "iterations", "train s", "ms/iter", "val loss", "train loss", "gap"],
                   [[r["label"], r["seed"], r.get("iterations", "-"), fmt(r.get("trained_seconds")),
                     fmt(r.get("ms_per_iter")), fmt(r.get("val_loss"), ".4f"), fmt(r.get("train_loss"), ".4f"),
                     fmt(r.get("gap"), ".4f")]
                    if "val_loss" in r else [r["label"], r["seed"], "FAILED", "", "", "", "", ""] for r in runs]))
    summaries = {}
    for c in configs:
        mine = [r for r in runs if r["label"] == label(c) and "val_loss" in r]
        summaries[label(c)] = {k: spread([r[k] for r in mine])
                               for k in ("val_loss", "train_loss", "gap", "iterations", "ms_per_iter")}
    print()
    print(md_table(["config", "runs", "val mean", "val std", "val min-max", "train mean", "gap mean", "iterations mean",
                    "ms/iter mean"],
                   [[name, s["val_loss"]["n"], fmt(s["val_loss"].get("mean"), ".4f"),
                     fmt(s["val_loss"].get("std"), ".4f"),
                     f"{fmt(s['val_loss'].get('min'), '.4f')}-{fmt(s['val_loss'].get('max'), '.4f')}",
                     fmt(s["train_loss"].get("mean"), ".4f"), fmt(s["gap"].get("mean"), ".4f"),
                     fmt(s["iterations"].get("mean"), ".0f"), fmt(s["ms_per_iter"].get("mean"))]
                    for name, s in summaries.items()]))
    return summaries


def paired_difference(configs, seeds, runs):
    """With two configs: their val loss difference per seed (same seed, both configs), printed; else None."""
    if len(configs) != 2:
        return None
    a, b = (label(c) for c in configs)
    diffs = []
    for seed in seeds:
        ra = next((r for r in runs if r["label"] == a and r["seed"] == seed and "val_loss" in r), None)
        rb = next((r for r in runs if r["label"] == b and r["seed"] == seed and "val_loss" in r), None)
        if ra and rb:
            diffs.append(ra["val_loss"] - rb["val_loss"])
    paired = {"a": a, "b": b, "val_loss_a_minus_b": diffs, **spread(diffs)}
    if diffs:
        print(f"val loss {a} - {b}, paired by seed: mean {paired['mean']:+.4f} (min {paired['min']:+.4f}, "
              f"max {paired['max']:+.4f}, n {len(diffs)}); negative means {a} is better")
    return paired


def main(cfg):
    device = resolve_device(cfg.device)  # before the configs, whose runs take it: an error names --device
    configs = check_configs(cfg)
    seeds = split_list(cfg.seeds, "seeds", int)
    if len(set(seeds)) < len(seeds):  # a repeat would run into the first one's out_dir
        fail(f"seeds={cfg.seeds} repeats a seed; give each once (each seed runs once per config)")
    for seed in seeds:  # train.py's own check of a seed, before any run trains
        try:
            TrainConfig(seed=seed)
        except ValueError as e:
            fail(f"seeds={cfg.seeds}: {e}")
    sets = cpu_sets(cfg, device)
    out = out_path(cfg.out, "recipe", device)
    # absolute: each run starts in the checkout whose train.py it runs
    started = time.strftime("%Y%m%d-%H%M%S")
    work = os.path.abspath(cfg.work_dir or os.path.join(tempfile.gettempdir(), f"recipe-{started}"))
    try:
        os.makedirs(work, exist_ok=True)
    except OSError as e:
        fail(f"work_dir={work!r} cannot be made ({e.strerror}); pick another path")
    runs_here = [f"{label(c)}-seed{seed}" for c in configs for seed in seeds]
    earlier = [name for name in runs_here if os.path.exists(os.path.join(work, name))]
    if earlier:  # train.py would refuse their checkpoints only after their logs were written over
        fail(f"work_dir={work!r} holds runs of an earlier recipe ({', '.join(earlier[:3])}"
             f"{', ...' if len(earlier) > 3 else ''}); give another --work_dir, or remove those folders")
    info = machine_info(device)
    if cfg.threads:  # the runs', not this process's
        info["torch_threads"] = cfg.threads
    print_machine(info)
    budget = f"{cfg.iterations} iterations" if cfg.iterations else f"{cfg.max_seconds:g} s of training"
    at_once = f", {cfg.parallel} at a time on CPUs of their own" if cfg.parallel > 1 else ""
    print(f"{len(configs)} configs x {len(seeds)} seeds, {budget} each, interleaved{at_once}; "
          f"out_dirs under {work}")
    runs = train_all(cfg, configs, seeds, work, sets)
    evaluation = evaluate_all(cfg, load_finished(runs, work), device)  # the same batches for every checkpoint
    summaries = summarise(configs, runs)
    paired = paired_difference(configs, seeds, runs)
    for r in runs:
        if r.get("error"):
            print(f"  note: {r['label']} seed {r['seed']}: {r['error']} (log: {r['out_dir']}/train.log)")
    write_json(out, {"benchmark": "recipe", "machine": info, "config": asdict(cfg), "eval": evaluation,
                     "runs": [without_paths(r) for r in runs], "summary": summaries, "paired": paired})


def without_paths(run):
    """A run's record for the JSON, without the temporary folders it used: a failed run's last line (its error)
    names its out_dir as <out_dir>, and the interpreter as python."""
    if "error" in run:
        run = {**run, "error": run["error"].replace(run["out_dir"], "<out_dir>").replace(sys.executable, "python")}
    run = {k: v for k, v in run.items() if k != "out_dir"}
    if "train_config" in run:
        run["train_config"] = {k: v for k, v in run["train_config"].items() if k != "out_dir"}
    return run


if __name__ == "__main__":
    run(main, parse(RecipeBench, sys.argv[1:]))
