"""
Training-step throughput (tokens/s) and MFU, variants side by side: eager vs torch.compile, fp32 vs
bf16 autocast, manual vs sdpa vs flash attention, AdamW vs Muon, GELU's tanh form vs the exact GELU.

    python bench/train.py                                         # the CPU default model: dtype x attention
    python bench/train.py configs/gpt2_124m.toml --batch_size=16 --variants=compile --attention=flash --dtype=bfloat16
    python bench/train.py --variants=attention --attentions=sdpa,flash --repeats=3 --out=/tmp/t.json
    python bench/train.py --variants=none --matmuls=true         # how much of the step is its matrix multiplies

A step is train.py's own train_step, called as train.py calls it: batches drawn and loaded from a
token array, forward under autocast, backward, gradient clipping, the optimizer step
(optim.configure_optimizers: AdamW, or Muon) and zero_grad, on random tokens (no dataset needed;
speed does not depend on the data), at the peak learning rate. All variants start from the same
weights and see the same batches.

Time: every variant is built first; compiled ones are compiled as train.py compiles them (on a batch
of zeros, before the first step: building and compiling are reported as "compile s"); each takes a
first step, timed apart, and runs `warmup` untimed steps; then `repeats` rounds each time one sample of every
variant in turn (A B C A B C ...), and the median sample is reported, so load on a shared machine hits them alike.
Tokens/s = batch_size * block_size * grad_accum / median step time. MFU = model.flops_per_token()
* tokens/s / hardware.peak_flops(device, the variant's dtype): a datasheet number on a GPU, a measured
matmul peak on a CPU (so CPU MFU is relative to what torch's matmul reaches there).
Peak memory (CUDA only): max_memory_allocated during one step above what was allocated before it,
i.e. activations, gradients and temporaries, not the weights or optimizer state already resident.
"""
import os
import sys

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import contextlib
import io
import itertools
import shutil
import signal
import statistics
import tempfile
import time
import typing
from dataclasses import asdict, dataclass, replace
from typing import ClassVar, Optional

import numpy as np
import torch

import train
from attention import BACKENDS, Backend, check_backend
from bench.benchutil import (ROOT, cuda_peak, fail, failure, fmt, machine_info, md_table, os_costs, out_path, parse,
                             print_machine, profiled, resolve_device, run, set_threads, show_compiled_kernels,
                             split_list, summary, timed, top_ops, write_json)
from configurator import ConfigError, as_typed, check_at_least, load_config
from data.loader import load_meta
from data.prepare import TOKEN_DTYPE, meta_path
from data.tokenizer import GPT2_VOCAB_SIZE
from hardware import DType, device_type_of, dtype_name, enable_tf32, peak_flops, pick_dtype
from interrupts import Terminated
from model import GPT, Activation
from optim import Optimizer
from train import TrainConfig, model_config, with_machine_width

AXES = ("compile", "dtype", "attention", "optimizer", "activation")
# --variants=execution: how nanoGPT executes a step on a CPU (fp32, PyTorch's SDPA, no compile) against
# this repo's defaults (TrainConfig's dtype, attention and compile), same model, same optimizer
DEFAULTS = TrainConfig()
EXECUTIONS = {"nanogpt": {"compile": False, "dtype": "float32", "attention": "sdpa"},
              "default": {"compile": DEFAULTS.compile, "dtype": DEFAULTS.dtype, "attention": DEFAULTS.attention}}


@dataclass
class TrainBench:
    USAGE: ClassVar[str] = ("[train_config.toml] [--key=value ...]\nA train.py config (configs/...) sets the "
                            "model and its training; --key=value sets the options below, which override it.")
    config: str = ""  # a TOML of train.py settings (configs/...); "": train.TrainConfig's defaults (the CPU model)
    n_layer: Optional[int] = None  # transformer blocks; none: from the config
    n_head: Optional[int] = None  # attention heads; none: from the config
    n_embd: Optional[int] = None  # width of the residual stream; none: from the config
    block_size: Optional[int] = None  # tokens per sequence; none: from the config
    batch_size: Optional[int] = None  # sequences per micro-batch; none: from the config
    grad_accum: int = 1  # micro-batches per optimizer step (the config's gradient_accumulation_steps is ignored)
    variants: str = "auto"  # axes compared, from compile,dtype,attention,optimizer,activation; auto:
                            # dtype,attention on CPU, those and compile on CUDA; none: the base only; execution:
                            # nanoGPT's way of running a step vs this repo's defaults
    attentions: str = "manual,sdpa,flash"  # the attention axis' values
    dtypes: str = "float32,bfloat16"  # the dtype axis' values
    optimizers: str = "adamw,muon"  # the optimizer axis' values
    activations: str = "gelu_tanh,gelu,relu2"  # the activation axis' values
    compile: Optional[bool] = None  # base value where compile is not compared; none: the config's
    dtype: Optional[DType] = None  # base value; none: the config's
    attention: Optional[Backend] = None  # base value; none: the config's
    optimizer: Optional[Optimizer] = None  # base value; none: the config's
    activation: Optional[Activation] = None  # base value; none: the config's
    vocab_size: int = 0  # 0: the config's vocab_size, else its data_dir's meta.json if it exists, else GPT-2's 50257
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    warmup: int = 3  # untimed steps per variant, after compilation
    repeats: int = 10  # interleaved timed rounds; the median is reported
    steps_per_sample: int = 1  # optimizer steps per timing sample (with --loop: as many as the loop's)
    threads: int = 0  # torch threads; 0: the CPUs this process may use (or OMP_NUM_THREADS)
    seed: int = 1337  # for the weights (the same in every variant) and the random batches
    loop: int = 0  # > 0: in every round also time train.py's own loop (train.train) over this many iterations,
                   # against as many steps alone
    profile: int = 0  # > 0: then profile this many steps of each variant: time per phase and the costliest ops
                      # and compiled kernels
    matmuls: bool = False  # then time the matrix multiplies of each variant's step: inside the step (profiled),
                           # and each alone (the same shapes, strides, dtypes)
    out: str = ""  # JSON path; "": bench/results/train-<device>.json

    def __post_init__(self):
        check_at_least(self, 0, "loop", "profile", "warmup")
        check_at_least(self, 1, "grad_accum", "repeats", "steps_per_sample")
        check_at_least(self, 0, "vocab_size", meaning="0: the config's")
        if self.loop and self.steps_per_sample != 1:
            raise ValueError(f"loop={self.loop} times the steps alone over as many iterations as the loop: "
                             f"steps_per_sample={self.steps_per_sample} would not be used; give one of the two")
        fixed = [f"--{name}" for name in EXECUTIONS["default"] if getattr(self, name) is not None]
        if self.variants == "execution" and fixed:
            raise ValueError(f"variants=execution runs nanoGPT's execution and this repo's defaults as they are: "
                             f"{', '.join(fixed)} would not be used; drop {'it' if len(fixed) == 1 else 'them'}")
        TrainConfig(seed=self.seed)  # train.py's own check of a seed (ValueError)


def parse_args(argv):
    """A bare path (python bench/train.py configs/x.toml) means --config=path."""
    given = [a.partition("=")[2] for a in argv if a.startswith("--config=")]
    files = [a for a in argv if not a.startswith("-")] + given  # -h is a flag too
    if len(files) > 1:
        fail(f"give at most one train.py config file, got {', '.join(files)}")
    flags = [a for a in argv if a.startswith("-") and not a.startswith("--config=")] + [f"--config={f}" for f in files]
    return parse(TrainBench, flags)


def train_config(cfg):
    """train.TrainConfig from the TOML plus this script's shape flags (train.py's own checks apply)."""
    argv = [cfg.config] if cfg.config else []
    argv += [f"--{k}={getattr(cfg, k)}" for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size")
             if getattr(cfg, k) is not None]
    try:
        return load_config(TrainConfig, argv)
    except ConfigError as e:
        fail(e)


def unused_note(tcfg):
    """A line naming what the config sets that this benchmark does not use ("" where nothing): its weights
    (the model is random, of the shape shown) and its micro-steps (--grad_accum sets them)."""
    unused = [f"{name}={as_typed(getattr(tcfg, name))}" for name in ("init_from", "gradient_accumulation_steps")
              if getattr(tcfg, name) != getattr(DEFAULTS, name)]
    return f"note: not used here: {', '.join(unused)} (random weights of the shape above; --grad_accum sets the " \
           "micro-steps)\n" if unused else ""


def vocab_size(cfg, tcfg):
    """(vocabulary size, where it came from): as train.py would pick it, unless --vocab_size is given."""
    if cfg.vocab_size:
        return cfg.vocab_size, "--vocab_size"
    if tcfg.vocab_size:  # train.py's own setting: the data's vocabulary, padded
        return tcfg.vocab_size, f"vocab_size in {cfg.config}"
    data_dir = os.path.join(ROOT, tcfg.data_dir)  # an absolute data_dir stays as it is
    if os.path.exists(meta_path(data_dir)):
        return load_meta(data_dir)["vocab_size"], meta_path(data_dir)
    return GPT2_VOCAB_SIZE, "GPT-2 (no meta.json in the config's data_dir)"


def variant_list(cfg, tcfg, device_type):
    listed = {"compile": [False, True],  # each list checked, whatever is compared
              "dtype": [resolved_dtype_name(d, device_type)
                        for d in split_list(cfg.dtypes, "dtypes", allowed=typing.get_args(DType))],
              "attention": split_list(cfg.attentions, "attentions", allowed=BACKENDS),
              "optimizer": split_list(cfg.optimizers, "optimizers", allowed=typing.get_args(Optimizer)),
              "activation": split_list(cfg.activations, "activations", allowed=typing.get_args(Activation))}
    if cfg.variants == "execution":
        optimizer = cfg.optimizer or tcfg.optimizer
        activation = cfg.activation or tcfg.activation
        specs = [{"execution": name, **spec, "optimizer": optimizer, "activation": activation}
                 for name, spec in EXECUTIONS.items()]
        for spec in specs:
            spec["dtype"] = resolved_dtype_name(spec["dtype"], device_type)
        return ["execution"], specs
    if cfg.variants == "auto":
        axes = ["dtype", "attention"] if device_type != "cuda" else ["compile", "dtype", "attention"]
    elif cfg.variants == "none":
        axes = []
    else:
        axes = split_list(cfg.variants, "variants", allowed=AXES)
    fixed = [axis for axis in axes if getattr(cfg, axis) is not None]
    if fixed:  # the table would show the axis' values, and the JSON the value given
        lists = [f"--{axis}s=..." for axis in fixed if axis != "compile"]  # compile is compared as false and true
        fail(f"variants={cfg.variants} compares {', '.join(axes)} here: "
             f"{', '.join(f'--{axis}={as_typed(getattr(cfg, axis))}' for axis in fixed)} would not be used; "
             + (f"name the values to compare ({', '.join(lists)}), or " if lists else "")
             + "time one alone with --variants=none")
    base = {"compile": tcfg.compile if cfg.compile is None else cfg.compile,
            "dtype": resolved_dtype_name(cfg.dtype or tcfg.dtype, device_type),
            "attention": cfg.attention or tcfg.attention,
            "optimizer": cfg.optimizer or tcfg.optimizer,
            "activation": cfg.activation or tcfg.activation}
    values = [listed[axis] if axis in axes else [base[axis]] for axis in AXES]
    return axes, [dict(zip(AXES, combo)) for combo in itertools.product(*values)]


def resolved_dtype_name(dtype, device_type):
    """A variant's dtype as its name says it: "auto" becomes what train.py picks on this device."""
    return dtype_name(pick_dtype("auto", device_type)) if dtype == "auto" else dtype


def variant_name(v, axes):
    if "execution" in v:  # its name and what it stands for
        return f"{v['execution']}: {'compiled' if v['compile'] else 'eager'} {v['dtype']} {v['attention']}"
    parts = {"compile": "compiled" if v["compile"] else "eager", "dtype": v["dtype"], "attention": v["attention"],
             "optimizer": v["optimizer"], "activation": v["activation"]}
    return " ".join(parts[a] for a in (axes or AXES))


class Variant:
    """One model, its optimizers and train.py's training step, as train.py would set them up with
    this variant's settings on one process."""

    def __init__(self, spec, tcfg, vocab, device, tokens, grad_accum, seed, out_dir):
        device_type = device_type_of(device)
        self.dtype = pick_dtype(spec["dtype"], device_type)  # ValueError if unsupported here
        check_backend(spec["attention"], device_type, self.dtype, tcfg.dropout)
        # as a run of train.py with these settings, whose loop (time_loop) evaluates and saves only at its end
        self.cfg = replace(tcfg, vocab_size=vocab, seed=seed, out_dir=out_dir, max_seconds=0, eval_iters=1,
                           eval_interval=10**9, **{axis: spec[axis] for axis in AXES})
        self.setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False,
                                 accumulation_steps=grad_accum, device=device, dtype=self.dtype)
        torch.manual_seed(self.cfg.seed)  # the same initial weights for every variant
        self.raw = GPT(model_config(self.cfg, vocab))
        self.state = train.new_train_state(self.cfg, self.setup, self.raw, tokens)
        self.data = train.Data(tokens, tokens, {"tokenizer": "random", "vocab_size": vocab})
        torch.use_deterministic_algorithms(False)  # as train.py's process starts: compile_model may switch it on
        with contextlib.redirect_stdout(io.StringIO()) as said:  # its "compiling" lines
            self.model = train.wrap_model(self.cfg, self.setup, self.raw, self.state.optimizers)
        self.compile_failed = "torch.compile failed" in said.getvalue()
        # a process-wide mode: each variant's steps run under its own, not under the last one built's
        self.deterministic = torch.are_deterministic_algorithms_enabled()

    def step(self):
        """train.py's train_step at the peak learning rate: returns the step's mean loss."""
        torch.use_deterministic_algorithms(self.deterministic)
        return train.train_step(self.state, self.model, self.cfg, self.setup, 1.0)

    def time_loop(self, iterations):
        """Seconds per iteration of train.py's own loop, train.train, over `iterations` more iterations:
        schedule, step, loss bookkeeping, log lines, clock and signal checks, as its clock counts them
        (the evaluation and the save at its end are left out, as train.py leaves them out)."""
        self.cfg.max_iters = self.state.iter_num + iterations
        torch.use_deterministic_algorithms(self.deterministic)
        stop, before = train.StopRequest(), self.state.clock.seconds()
        with contextlib.redirect_stdout(io.StringIO()):  # its log lines
            logger = train.TrainingLog(self.cfg, self.setup, self.raw)
            try:
                train.train(self.cfg, self.setup, self.data, self.state, self.model, logger, stop)
            except SystemExit:
                if not stop.signum:
                    raise  # any other exit passes through as it is
            finally:
                stop.release()
        if stop.signum:  # Ctrl-C or SIGTERM: train.py's loop saved and exited, or heard it in its last save and ended
            raise Terminated() if stop.signum == signal.SIGTERM else KeyboardInterrupt()
        return (self.state.clock.seconds() - before) / iterations


def set_up_device(device_type, specs):
    """TF32 on CUDA, as train.py does; room in torch.compile's cache for every compiled variant."""
    if device_type == "cuda":
        enable_tf32()
    if any(s["compile"] for s in specs):  # every compiled model is one more cache entry for GPT.forward
        import torch._dynamo.config as dynamo_config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(64, getattr(dynamo_config, name)))


def random_tokens(cfg, tcfg, vocab):
    """A stream of random token ids for train.py's batch sampler to draw from, as it draws from train.bin."""
    n = max(100_000, 4 * tcfg.batch_size * (tcfg.block_size + 1) * cfg.grad_accum)
    dtype = TOKEN_DTYPE if vocab <= np.iinfo(TOKEN_DTYPE).max + 1 else np.int64
    return np.random.default_rng(cfg.seed).integers(vocab, size=n).astype(dtype)


def prepare_variant(cfg, spec, rec, tcfg, vocab, device, tokens, out_dir):
    """The Variant of spec, built, compiled (as train.py compiles, before its first step) and warmed
    up, its first numbers in rec; None if it cannot run here or failed (rec says why), its tensors
    freed by then."""
    device_type = device_type_of(device)
    started = time.perf_counter()
    try:
        v = Variant(spec, tcfg, vocab, device, tokens, cfg.grad_accum, cfg.seed, out_dir)
    except ValueError as e:
        rec.update(status="unsupported", message=str(e))
        return None
    if spec["compile"]:
        rec["compile_seconds"] = time.perf_counter() - started
        if v.compile_failed:
            rec.update(status="failed", message="torch.compile failed here; train.py would train uncompiled")
            return None
    try:
        rec["first_step_seconds"] = timed(v.step, device)
        for _ in range(cfg.warmup):
            v.step()
        rec["loss_after_warmup"] = v.step().item()
        if device_type == "cuda":
            rec["peak_step_bytes"] = cuda_peak(v.step, device)[1]
    except Exception as e:  # noqa: BLE001 - an OOM or a compile failure costs one variant, not the run
        rec.update(status="failed", message=failure(e))
        return None
    rec["num_params"] = v.raw.num_params()
    rec["flops_per_token"] = v.raw.flops_per_token()
    rec["peak_flops"], rec["peak_source"] = peak_flops(device_type, v.dtype)
    compiled = f"compiled in {rec['compile_seconds']:.1f} s, " if spec["compile"] else ""
    print(f"ready: {rec['name']} ({compiled}first step {rec['first_step_seconds']:.2f} s; "
          f"loss {rec['loss_after_warmup']:.3f})", flush=True)
    return v


def time_variants(cfg, variants, device, tokens_per_step):
    """`repeats` rounds, one timing sample of every variant each; then each record's step time,
    tokens/s and MFU."""
    samples = {id(rec): [] for _, rec in variants}
    loops = {id(rec): [] for _, rec in variants}
    steps = cfg.loop or cfg.steps_per_sample  # the loop and the step alone are timed over as many iterations
    for _ in range(cfg.repeats):
        for v, rec in variants:
            if rec["status"] != "ok":
                continue
            try:
                samples[id(rec)].append(timed(lambda: [v.step() for _ in range(steps)], device) / steps)
                if cfg.loop:
                    loops[id(rec)].append(v.time_loop(cfg.loop))
            except Exception as e:  # noqa: BLE001 - e.g. out of memory with the other variants resident
                rec.update(status="failed", message=failure(e))
    for v, rec in variants:
        if rec["status"] != "ok":
            continue
        rec["step_time"] = summary(samples[id(rec)])
        rec["tokens_per_s"] = tokens_per_step / rec["step_time"]["median"]
        if cfg.loop:  # what train.py's loop costs beyond its step: paired by round, as the machine's speed drifts
            rec["loop_time"] = summary(loops[id(rec)])
            rec["loop_overhead"] = statistics.median(loop / step for loop, step in
                                                     zip(loops[id(rec)], samples[id(rec)])) - 1
        flops = rec["flops_per_token"] * rec["tokens_per_s"]
        if rec["peak_flops"] and flops > rec["peak_flops"]:  # the probe was low: it is raised, MFU stays <= 100%
            rec["peak_flops"] = peak_flops(device_type_of(device), v.dtype, reached=flops)[0]
    peaks = {}  # one peak per dtype in a table: a variant that raised it raised it for the others too
    for v, rec in variants:
        if rec["status"] == "ok" and rec["peak_flops"]:
            peaks[v.dtype] = max(peaks.get(v.dtype, 0), rec["peak_flops"])
    for v, rec in variants:
        if rec["status"] == "ok":
            rec["peak_flops"] = peaks.get(v.dtype)
            rec["mfu"] = rec["flops_per_token"] * rec["tokens_per_s"] / rec["peak_flops"] if rec["peak_flops"] else None


# a step's phases by their profiler labels (train_step's own, and those torch.optim gives every step)
PHASES = {"forward": "forward", "backward": "backward", "clip": "clip",
          "Optimizer.step#AdamW.step": "optimizer AdamW", "Optimizer.step#Muon.step": "optimizer Muon"}


def profile_variants(cfg, variants, device):
    """Where a step's time goes: torch.profiler over cfg.profile steps of each variant; per phase
    (train_step's labels, torch.optim's) and the ops that take the most time of their own, per step, in ms."""
    for v, rec in variants:
        if rec["status"] != "ok":
            continue
        faults, kernel_s = os_costs(lambda: [v.step() for _ in range(cfg.profile)])  # apart: the profiler allocates too
        wall, prof = profiled(lambda: [v.step() for _ in range(cfg.profile)], device)
        wall /= cfg.profile
        phases = {PHASES[e.key]: e.cpu_time_total / 1e3 / cfg.profile for e in prof.key_averages() if e.key in PHASES}
        rec["profile"] = {"step_ms": wall * 1e3, "phases_ms": phases,
                          "top_ops_ms": {k: us / 1e3 / cfg.profile for k, us in top_ops(prof, 12).items()},
                          "page_faults_per_step": None if faults is None else faults / cfg.profile,
                          "kernel_cpu_ms_per_step": None if kernel_s is None else kernel_s * 1e3 / cfg.profile}
        print(f"\nprofile of {rec['name']}: {wall * 1e3:.1f} ms per step under the profiler; by phase: "
              + ", ".join(f"{k} {ms:.1f} ms ({ms / (wall * 1e3):.0%})" for k, ms in phases.items()))
        if faults is not None:
            print(f"without the profiler, per step: {faults / cfg.profile:,.0f} page faults, "
                  f"{kernel_s * 1e3 / cfg.profile:.1f} ms of CPU time in the kernel")
        ops = rec["profile"]["top_ops_ms"].items()
        print(md_table(["op (self time)", "ms/step", "share"],
                       [[k, f"{ms:.2f}", f"{ms / (wall * 1e3):.1%}"] for k, ms in ops]))


# the matrix multiplies a step calls, as the profiler names them, and how many of their arguments are tensors
MATMULS = {"aten::mm": 2, "aten::bmm": 2, "aten::addmm": 3, "aten::baddbmm": 3}
PROFILER_DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16,
                   "double": torch.float64}


def step_matmuls(v, device):
    """Every matrix multiply one step of v makes, in its order, as (function, tensors, keywords) that
    repeat it on new tensors of the same shapes, strides and dtypes (random values: a matmul's time
    does not depend on them), from the profiler's record of the step's ops."""
    _, prof = profiled(v.step, device, record_shapes=True)
    calls = []
    for e in prof.events():
        if e.name not in MATMULS:
            continue
        n_tensors = MATMULS[e.name]
        keywords = {"beta": e.concrete_inputs[3], "alpha": e.concrete_inputs[4]} if n_tensors == 3 else {}
        if len(e.input_shapes) > n_tensors + len(keywords):  # a compiled graph passes its own buffer: out=
            keywords["out"] = like_argument(e, len(e.input_shapes) - 1, device)
        calls.append((getattr(torch, e.name.removeprefix("aten::")),
                      [like_argument(e, i, device) for i in range(n_tensors)], keywords))
    return calls


def like_argument(event, i, device):
    """A new tensor of random values shaped, strided and typed as the i-th argument of a profiled op."""
    return torch.empty_strided(event.input_shapes[i], event.structured_input_strides[i], device=device,
                               dtype=PROFILER_DTYPES[event.input_dtypes[i]]).normal_()


def matmul_flops(tensors):
    """2 * batch * M * K * N for a product of (..., M, K) and (..., K, N) (the last two of `tensors`)."""
    a, b = tensors[-2], tensors[-1]
    return 2 * a.shape[:-1].numel() * a.size(-1) * b.size(-1)


def matmul_ms(prof):
    """Milliseconds a profiled run spent inside its matrix multiplies, each call's whole time."""
    return sum(e.cpu_time_total for e in prof.events() if e.name in MATMULS) / 1e3


def time_matmuls(cfg, variants, device):
    """How much of a step is its matrix multiplies: each variant's, timed inside its steps (the profiler's
    time of those ops over `repeats` profiled steps: the median, against the median step under the
    profiler), and replayed each alone on new tensors of their shapes (its median over repeated calls,
    times its calls: the speed those shapes reach at best, with their operands in cache)."""
    for v, rec in variants:
        if rec["status"] != "ok":
            continue
        calls = step_matmuls(v, device)
        profiles = [profiled(v.step, device) for _ in range(cfg.repeats)]
        alone, counts = {}, {}
        for fn, tensors, keywords in calls:  # the same op on the same shapes is timed once
            key = (fn.__name__, *((t.shape, t.stride(), t.dtype) for t in tensors), keywords.get("beta"),
                   keywords.get("alpha"), "out" in keywords)
            counts[key] = counts.get(key, 0) + 1
            if key not in alone:
                fn(*tensors, **keywords)  # warm-up: oneDNN picks and builds its kernel for these shapes
                alone[key] = statistics.median(timed(lambda: fn(*tensors, **keywords), device)
                                               for _ in range(cfg.repeats))
        rec["matmuls"] = {"calls": len(calls), "gflop": sum(matmul_flops(t) for _, t, _ in calls) / 1e9,
                          "in_step_ms": statistics.median(matmul_ms(prof) for _, prof in profiles),
                          "profiled_step_ms": statistics.median(wall for wall, _ in profiles) * 1e3,
                          "alone_ms": sum(alone[k] * n for k, n in counts.items()) * 1e3,
                          "step_ms": rec["step_time"]["median"] * 1e3}
        m = rec["matmuls"]
        print(f"\nmatrix multiplies of one step of {rec['name']}: {m['calls']} calls, {m['gflop']:.2f} GFLOP; "
              f"inside the step {m['in_step_ms']:.1f} ms of its {m['profiled_step_ms']:.1f} under the profiler "
              f"({m['in_step_ms'] / m['profiled_step_ms']:.0%}, {m['gflop'] * 1e3 / m['in_step_ms']:.0f} GFLOP/s); "
              f"each alone {m['alone_ms']:.1f} ms ({m['gflop'] * 1e3 / m['alone_ms']:.0f} GFLOP/s); "
              f"the step without the profiler {m['step_ms']:.1f} ms")


def print_table(cfg, rows):
    base = next((rec for rec in rows if rec.get("tokens_per_s")), None)
    headers = ["variant", "ms/step", "min-max ms", "tokens/s", "MFU", "vs first", "compile s", "peak MiB"]
    headers += ["train.py ms/iter", "loop overhead"] if cfg.loop else []
    table = []
    for rec in rows:
        if not rec.get("tokens_per_s"):
            table.append([rec["name"], rec["status"]] + [""] * (len(headers) - 2))
            continue
        t = rec["step_time"]
        table.append([rec["name"], fmt(t["median"] * 1e3, ".1f"), f"{t['min'] * 1e3:.1f}-{t['max'] * 1e3:.1f}",
                      f"{rec['tokens_per_s']:,.0f}",
                      fmt(rec["mfu"] and rec["mfu"] * 100, ".1f") + ("%" if rec["mfu"] else ""),
                      f"{rec['tokens_per_s'] / base['tokens_per_s']:.2f}x", fmt(rec.get("compile_seconds"), ".1f"),
                      fmt(rec.get("peak_step_bytes") and rec["peak_step_bytes"] / 2**20, ".0f")])
        if cfg.loop:
            table[-1] += [f"{rec['loop_time']['median'] * 1e3:.1f}", f"{rec['loop_overhead']:+.1%}"]
    print()
    print(md_table(headers, table))
    print(f"(median of {cfg.repeats} interleaved samples of {cfg.loop or cfg.steps_per_sample} step(s) after "
          f"{cfg.warmup} warm-up steps; 'vs first' = tokens/s over {base['name']}'s, the first variant that ran; "
          + (f"train.py ms/iter: its loop over {cfg.loop} iterations per round, as its clock counts them; "
             "loop overhead: the median over rounds of the loop's time over the steps' in the same round, minus 1; "
             if cfg.loop else "") + "MFU against "
          f"{'; '.join(sorted({r['peak_source'] for r in rows if r.get('peak_source')}))})")
    for rec in rows:
        if rec.get("message"):
            print(f"  note: {rec['name']}: {rec['status']}: {rec['message']}")


def main(cfg):
    device = resolve_device(cfg.device)
    device_type = device_type_of(device)
    out = out_path(cfg.out, "train", device)
    set_threads(cfg.threads)
    tcfg = with_machine_width(train_config(cfg), device_type)  # the model train.py trains here
    vocab, vocab_from = vocab_size(cfg, tcfg)
    axes, specs = variant_list(cfg, tcfg, device_type)
    set_up_device(device_type, specs)
    if cfg.profile:
        show_compiled_kernels()
    info = machine_info(device)
    print_machine(info)
    B, T = tcfg.batch_size, tcfg.block_size
    tokens_per_step = B * T * cfg.grad_accum
    print(f"model: {tcfg.n_layer} layers, {tcfg.n_head} heads, n_embd {tcfg.n_embd}, block {T}, vocab {vocab} "
          f"({vocab_from}) | batch {B} x {cfg.grad_accum} micro-steps = {tokens_per_step:,} tokens/step | "
          f"{cfg.config or 'TrainConfig defaults'}")
    print(unused_note(tcfg), end="")
    tokens = random_tokens(cfg, tcfg, vocab)

    variants, rows = [], []
    out_dir = tempfile.mkdtemp(prefix="bench-train-")  # where train.py's loop (--loop) saves its checkpoints
    try:
        for i, spec in enumerate(specs):
            rec = {"name": variant_name(spec, axes), **spec, "status": "ok"}
            rows.append(rec)
            os.makedirs(os.path.join(out_dir, str(i)))
            v = prepare_variant(cfg, spec, rec, tcfg, vocab, device, tokens, os.path.join(out_dir, str(i)))
            if v is not None:
                variants.append((v, rec))
            elif device_type == "cuda":  # what a failed variant held is free now
                torch.cuda.empty_cache()
        time_variants(cfg, variants, device, tokens_per_step)
    finally:  # an interrupted run too: checkpoints with optimizer state, per variant
        shutil.rmtree(out_dir, ignore_errors=True)
    if not variants:  # before the JSON: an empty run would overwrite a kept result with nothing
        for rec in rows:
            print(f"  note: {rec['name']}: {rec['status']}: {rec['message']}", file=sys.stderr)
        fail("none of the variants could run here (the notes above say why); nothing was measured or written", status=1)
    print_table(cfg, rows)
    if cfg.profile:
        profile_variants(cfg, variants, device)
    if cfg.matmuls:
        time_matmuls(cfg, variants, device)
    write_json(out, {"benchmark": "train", "machine": info, "config": asdict(cfg), "train_config": asdict(tcfg),
                     "vocab_size": vocab, "tokens_per_step": tokens_per_step, "axes": axes, "variants": rows})


if __name__ == "__main__":
    run(main, parse_args(sys.argv[1:]))
