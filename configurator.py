"""
Settings for every script: a dataclass gives each one a type, a default and (in its trailing
comment) a meaning; a TOML file overrides some, `--key=value` flags override those. Nothing is
exec'd; a wrong key or value is one clear line. Also here: what the settings device="auto" and
dtype="auto" mean on this machine, and TrainConfig, train.py's settings (bench/ reads them too).

    python train.py configs/shakespeare_char_gpu.toml --batch_size=16 --compile=true
    python train.py --help
"""
import ast
import dataclasses
import difflib
import inspect
import io
import math
import os
import sys
import tokenize
import tomllib
import types
import typing
from dataclasses import dataclass, fields
from typing import Literal

import torch

from data.loader import SHAKESPEARE_CHAR_DIR
from model import Activation, GPTConfig, Positions


class ConfigError(ValueError):
    pass


def fail(message, status=2):
    """The one way scripts report bad input: a single line on stderr, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def fail_together(error):
    """fail() on every process of a torchrun job if any of them found bad input (each says the first
    rank's words), so that none is left waiting for the others; a single process just fails."""
    if torch.distributed.is_initialized():
        errors = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(errors, None if error is None else str(error))
        error = next((e for e in errors if e), None)
    if error:
        fail(error)


def type_name(tp):
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(c) for c in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    return "none" if tp is type(None) else tp.__name__


def convert(key, tp, value, from_text):
    """Check (TOML) or parse (command line text) one value against the field's type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is not a valid choice; choose one of: {type_name(tp)}")
        return value
    if type(None) in args:  # Optional[X]
        if from_text and value.lower() in ("none", "null", ""):
            return None
        return convert(key, next(a for a in args if a is not type(None)), value, from_text)
    if tp is bool:
        if not from_text:
            ok = isinstance(value, bool)
        elif value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        else:
            ok = False
    elif tp in (int, float):
        ok = not isinstance(value, bool) and isinstance(value, (int,) if tp is int else (int, float))
        if from_text:
            try:
                value, ok = tp(value), True
            except ValueError:
                ok = False
    else:  # str
        ok = from_text or isinstance(value, str)
    if ok and tp is float and not math.isfinite(float(value)):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if ok:
        return tp(value)
    raise ConfigError(f"{key} must be {type_name(tp)}, got {value!r}")


def field_comments(cls):
    """{field: its trailing comment} for a dataclass and the dataclasses it extends (a subclass's own
    comment wins): the comments in the source are the one description of each setting."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = inspect.getsource(klass)
        on_line = {tok.start[0]: tok.string.lstrip("# ").strip()
                   for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        for node in ast.parse(source).body[0].body:
            if isinstance(node, ast.AnnAssign) and node.lineno in on_line:
                comments[node.target.id] = on_line[node.lineno]
    return comments


def as_typed(value):
    """A value as one would type it after --key= (true, none, plain words; quoted where needed)."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and (not value or not value.isprintable() or " " in value):
        return repr(value)
    return str(value)


def help_text(cls):
    """What --help prints: every setting with its default, its meaning and its type, in columns."""
    hints, defaults, comments = typing.get_type_hints(cls), cls(), field_comments(cls)
    flags = {f.name: f"--{f.name}={as_typed(getattr(defaults, f.name))}" for f in dataclasses.fields(cls)}
    width = max(map(len, flags.values()))
    lines = [f"usage: python {os.path.relpath(sys.argv[0])} [config.toml ...] [--key=value ...]",
             "A TOML file overrides the defaults below; --key=value overrides both.", ""]
    lines += [f"  {flag:<{width}}  {comments.get(name, '')} [{type_name(hints[name])}]" for name, flag in flags.items()]
    return "\n".join(lines)


def load_config(cls, argv):
    """Build a `cls` dataclass from defaults, then TOML files, then --key=value flags, in that order."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(cls))
        sys.exit(0)

    def check_key(key, where):
        if key not in hints:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"unknown setting {key!r} in {where}; {hint}valid settings: {', '.join(names)}")

    for arg in [a for a in argv if a.startswith("--") and "=" not in a]:  # before files: `--input a.txt` is this
        raise ConfigError(f"write flags as --key=value (e.g. {arg}=...), got {arg!r}")
    values = {}
    for path in [a for a in argv if not a.startswith("--")]:  # files first, so flags win
        if not os.path.isfile(path):
            here = sorted(os.listdir("configs")) if os.path.isdir("configs") else []
            raise ConfigError(f"config file {path!r} not found" + (f"; configs/ has: {', '.join(here)}" if here else ""))
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # TOML files are UTF-8
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
        for key, value in table.items():
            check_key(key, path)
            values[key] = convert(key, hints[key], value, from_text=False)
    for arg in [a for a in argv if a.startswith("--")]:
        key, _, raw = arg[2:].partition("=")
        check_key(key, "the command line")
        values[key] = convert(key, hints[key], raw, from_text=True)
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass's own range checks
        raise ConfigError(str(e)) from None


def config_from_argv(cls):
    """The config a script was started with (sys.argv), or exit with one line saying what is wrong."""
    try:
        return load_config(cls, sys.argv[1:])
    except ConfigError as e:
        fail(e)


DType = typing.Literal["auto", "float32", "bfloat16", "float16"]  # the choices of every script's dtype setting


def pick_device(name):
    """The device the setting `device` names: auto picks cuda, then mps, then cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    kind = name.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use --device=cpu (or auto)")
    index = name.partition(":")[2]
    if kind == "cuda" and index and not (index.isdigit() and int(index) < torch.cuda.device_count()):
        raise ValueError(f"device={name!r}: this machine has CUDA devices 0 to {torch.cuda.device_count() - 1}")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} but MPS is not available here; use --device=cpu (or auto)")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda, cuda:N or mps")
    return name


def pick_dtype(name, device_type, training=True):
    """The torch dtype the setting `dtype` names. auto: bf16 on GPUs that have it (else fp16); on
    CPUs with bf16 instructions bf16 for training, fp32 for sampling one sequence, whose matrices
    are too small for bf16 to pay."""
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


def check_threads(n):
    if n < 0:
        raise ValueError(f"threads must be >= 0 (0: the CPUs this process may use), got {n}")


def pick_threads(n, processes_here=1):
    """The setting `threads`: torch's CPU threads. 0: OMP_NUM_THREADS if it is set, else the CPUs
    this process may run on (its affinity: a container or taskset may allow fewer than the machine
    has), shared among the processes torchrun started on this machine. More threads than free
    cores is the worst case: OpenMP threads spin waiting for each other, and a step can take many
    times as long as with one thread."""
    check_threads(n)
    if n:
        return n
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, usable // processes_here)


def cpu_has_bf16():
    """bf16 autocast pays on CPUs with bf16 matrix instructions (see bench/train.py); elsewhere fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass
class TrainConfig(GPTConfig):
    # the model: every GPTConfig setting, with the CPU recipe's defaults where they differ
    vocab_size: int = 0  # 0: the data's (meta.json); more pads the embedding (e.g. 50304 for GPU speed)
    block_size: int = 64  # the context: tokens per training sequence
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    pos_embedding: Positions = "rope"
    activation: Activation = "gelu"  # the exact GELU, as nanoGPT's nn.GELU(): GPT-2's tanh form is slower on some CPUs
    # I/O
    out_dir: str = "out"  # where ckpt.pt, metrics.jsonl and loss.png go
    data_dir: str = SHAKESPEARE_CHAR_DIR  # train.bin, val.bin and meta.json from data/prepare.py
    init_from: str = "scratch"  # scratch, resume (out_dir/ckpt.pt), or GPT-2 weights: gpt2, gpt2-medium, a local HF dir
    overwrite: bool = False  # a new run may replace a trained checkpoint in out_dir (else it refuses)
    eval_only: bool = False  # print the initial model's train and val loss, write nothing, stop
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
    optimizer: Literal["adamw", "muon"] = "muon"  # muon: Muon for the blocks' matrices, AdamW for the rest
    learning_rate: float = 2e-3  # AdamW's peak rate; muon_lr and min_lr follow the same schedule
    muon_lr: float = 0.02  # Muon's peak rate
    max_iters: int = 1_000_000  # stop after this many iterations
    max_seconds: float = 190.0  # > 0: stop after this much training time (evaluations not counted)
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9  # AdamW's momentum
    beta2: float = 0.99  # AdamW's second-moment decay
    grad_clip: float = 1.0  # clip the gradient norm to this; 0: no clipping
    warmup_iters: int = 100  # iterations of linear warm-up
    lr_decay_iters: int = 0  # iterations of cosine decay when max_seconds is 0; 0: max_iters
    min_lr: float = 2e-4  # AdamW's rate at the end of the decay
    # system
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: DType = "auto"  # autocast precision; auto: bf16 where it pays, else fp16 on GPUs, fp32 on CPUs
    threads: int = 0  # torch's CPU threads; 0: OMP_NUM_THREADS, else the CPUs this process may use (1 is best on a busy machine)
    compile: bool = False  # torch.compile the model
    parallelism: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (DDP) or shard (FSDP2) the model
    seed: int = 1337  # for the weights, the batches and dropout

    def __post_init__(self):
        for name in ("batch_size", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("gradient_accumulation_steps", "max_iters", "max_seconds", "vocab_size", "warmup_iters",
                     "min_lr", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("learning_rate", "muon_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        check_threads(self.threads)
        model_config(self, self.vocab_size or 1)  # the model's own checks (n_embd % n_head, ...)


def model_config(cfg, vocab_size):
    """The GPTConfig that cfg's model settings describe, for a vocabulary of vocab_size tokens."""
    return GPTConfig(**{**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}, "vocab_size": vocab_size})
