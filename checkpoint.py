"""
Checkpoints: writing and reading out_dir/ckpt.pt, the checks before a run resumes from one, every
random generator's state, and the lock that keeps two runs out of one out_dir.

ckpt.pt holds everything needed to continue exactly. It cannot be half-written: saving writes a
temporary file beside the target, flushes it to disk and renames it over the old one
(files.atomic_write), so a crash or kill mid-save leaves the previous checkpoint intact. It cannot
run code: loading uses torch.load(weights_only=True), tensors and plain Python data only.
"""
import contextlib
import errno
import fcntl
import math
import os
import pickle
import random
import re
import shlex
import shutil
import socket
import struct
import warnings
import zipfile
from dataclasses import fields

import numpy as np
import torch

from configurator import as_typed, first_line, run_command, whole_number
from data.prepare import meta_path, prepare_command
from data.tokenizer import TokenizerUnavailable, tokenizer_from_meta
from files import (NotSavedByTorch, atomic_write, clear_stale_temporaries, load_torch_file, remove_empty_directories,
                   same_folder, writable_directory)
from model import GPT, WEIGHT_SETTINGS, GPTConfig, check_overrides
from optim import unread_by_schedule, unused_by_optimizer

# what train.py writes into a checkpoint and needs back to resume, and what each field must be, so that a
# damaged checkpoint fails in one line before anything is written, not in the middle of restoring it
RESUME_FIELDS = {"model": dict, "optimizer": dict, "scaler": dict, "model_config": dict, "config": dict,
                 "tokenizer": dict, "iter_num": int, "best_val_loss": (int, float), "trained_seconds": (int, float),
                 "rng": dict}
# and what it writes and reads back where it is there, which older checkpoints lack: the run's name
# (train.TrainState.run_id; None: a run resumed from a checkpoint without one), and meta.json's record of
# the token files it trained on
OPTIONAL_RESUME_FIELDS = {"run_id": (str, type(None)), "splits": dict}
# settings whose "auto" or 0 train.py records as the run resolved it (train.as_run); a checkpoint written
# before it did holds the auto or 0 itself, which does not say what that run used: not compared
RESOLVED_SETTINGS = ("dtype", "gradient_accumulation_steps")
# train.py's settings that leave what a run trains as it is: where it reads and writes, what it shows, how
# its arithmetic is spread over threads, kernels and processes (rounding aside), and the seed (a resumed
# run draws from the checkpoint's generators). Every other setting but the model's (WEIGHT_SETTINGS, which
# must stay) changes the training: a resumed run may change it, and check_resumable names the change
NEUTRAL_SETTINGS = ("out_dir", "init_from", "overwrite", "eval_only", "eval_interval", "eval_iters", "log_interval",
                    "wandb_log", "wandb_project", "wandb_run_name", "device", "threads", "compile", "attention",
                    "parallelism", "seed")

# what an evaluation of the same weights gives (--eval_only, which trains nothing) changes with: the batches'
# shape and number, and the arithmetic's precision
EVALUATION_SETTINGS = ("batch_size", "eval_iters", "dtype")


OUT_DIR = "out"  # train.py's out_dir, and so where sample.py looks, unless told otherwise


def ckpt_path(out_dir):
    return os.path.join(out_dir, "ckpt.pt")


def check_not_an_out_dir(init_from):
    """ValueError saying how to read it where init_from, given as GPT-2's weights, is a train.py out_dir."""
    if os.path.isfile(ckpt_path(init_from)):
        raise ValueError(f"init_from={init_from!r} is not GPT-2's weights: it holds train.py's ckpt.pt: give "
                         f"--init_from=resume --out_dir={as_typed(init_from)}")


def save_checkpoint(state, path):
    """Write state to path atomically (files.atomic_write); OSError if it cannot be written."""
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except RuntimeError as e:  # torch's zip writer reports a failed write (a full disk) this way
        cause = e.__context__ if isinstance(e.__context__, OSError) else None
        raise OSError(getattr(cause, "errno", None), cause.strerror if cause else first_line(e)) from e


def load_checkpoint(path):
    """Load a checkpoint written by save_checkpoint; ValueError with the file's name if it can't be."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a checkpoint; move it away, or pass --out_dir=DIR holding "
                         "ckpt.pt")
    if os.path.islink(path) and not os.path.exists(path):
        raise ValueError(f"{path} is a link to {os.readlink(path)}, which does not exist; point it at a checkpoint")
    if not os.path.isfile(path):
        out_dir = os.path.dirname(path)
        if os.path.isfile(out_dir):
            raise ValueError(f"out_dir={out_dir!r} is a file, not a folder; pass --out_dir=DIR holding ckpt.pt")
        if os.path.isfile(os.path.join(out_dir, "config.json")):  # weights in Hugging Face's format, GPT-2's say
            raise ValueError(f"{out_dir} holds a config.json, not train.py's ckpt.pt: for Hugging Face weights give "
                             f"--init_from={as_typed(out_dir)}")
        # --out_dir given for --data_dir: `train.py --out_dir=` that folder would train on other data
        if os.path.isfile(meta_path(out_dir)):
            raise ValueError(f"{out_dir} holds prepared data (meta.json), not a checkpoint: train on it with "
                             f"`{run_command('train.py')} --data_dir={shlex.quote(out_dir)}`, then sample its "
                             f"checkpoint with `{run_command('sample.py')}`")
        there = "" if same_folder(out_dir, OUT_DIR) else f" --out_dir={shlex.quote(out_dir)}"
        raise ValueError(f"no checkpoint at {path}; train one first with `{run_command('train.py')}{there}` "
                         "(or pass --out_dir=DIR holding ckpt.pt)")
    try:
        with warnings.catch_warnings():  # damage makes torch warn on its way (a pickle protocol, TypedStorage)
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
            return load_torch_file(path)
    except NotSavedByTorch:
        raise ValueError(f"{path} is not a checkpoint: truncated, or a file of another kind (torch.save writes "
                         "a zip archive); train again (--overwrite=true replaces it), or point --out_dir at the run "
                         "that wrote it") from None
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines()]
        named_global = re.search(r"GLOBAL (\S+)", str(e))
        if named_global:  # a class or function by name: loading it would run code (torch's advice, to allow
            # it, is left out: a damaged byte names a class no one wrote, and the user is not to trust it)
            raise ValueError(f"{path} contains a Python object that is not plain data or tensors, "
                             f"{named_global[1]}, so it was not loaded (weights_only=True keeps a checkpoint from "
                             "running code)") from None
        # torch's reason follows its "WeightsUnpickler error:", on that line or (torch 2.13) the next one
        after = "\n".join(lines).partition("WeightsUnpickler error:")[2].splitlines()
        detail = next((line.strip() for line in after if line.strip()), lines[0] if lines else "")
        raise ValueError(f"{path} is corrupt and cannot be loaded ({detail})") from None
    # a damaged pickle also derails torch's unpickler into Python's own errors (a memo key it never stored,
    # an assert on a record's form, a short struct), each as likely as the other: one byte flipped decides
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError, IndexError, TypeError,
            AttributeError, AssertionError, struct.error) as e:
        raise ValueError(f"{path} is truncated or corrupt and cannot be loaded "
                         f"({first_line(e, with_type=True)})") from None


def clean_state_dict(state_dict):
    """Drop the prefixes torch.compile (`_orig_mod.`) and DDP (`module.`) add to a wrapped model's keys. train.py
    saves the plain model's, but a fork's loop that saves the wrapped model's state_dict (nanoGPT's sample.py
    strips `_orig_mod.` for such files) writes them, and its checkpoints load too."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


def model_from_checkpoint(checkpoint, path, **overrides):
    """The GPT a loaded checkpoint holds, with `overrides` of settings that leave the weights as they
    are (RUNTIME_SETTINGS: attention backend, dropout); ValueError naming `path` if it does not fit this
    code's model."""
    check_overrides(overrides, "the checkpoint's")
    try:
        settings = {**checkpoint["model_config"], **overrides}
        known = {f.name for f in fields(GPTConfig)}
        unknown = ", ".join(name for name in settings if name not in known)
        if unknown:
            raise ValueError(f"its model_config has settings this code's GPTConfig does not know ({unknown}): it was "
                             "written by other (forked or newer) code")
        model = GPT(GPTConfig(**settings))
        weights = clean_state_dict(checkpoint["model"])
        misfit = weights_misfit(model.state_dict(), weights)
        if misfit:
            raise ValueError(f"its weights do not fit the model its model_config describes ({misfit}): the file is "
                             "damaged, or was written by other code")
        model.load_state_dict(weights)
    except (KeyError, TypeError, AttributeError, ValueError, RuntimeError) as e:  # a foreign or damaged file
        detail = " ".join(str(e).split())
        raise ValueError(f"{path} does not match this code's model: "
                         f"{detail[:300]}{'...' if len(detail) > 300 else ''}") from None
    return model


def weights_misfit(expected, weights):
    """The first thing that keeps `weights` (a state dict) from loading where `expected` (the model's own
    state dict) is, in a few words; "" if they fit."""
    for name, tensor in expected.items():
        if name not in weights:
            return f"no {name}"
        if tuple(weights[name].shape) != tuple(tensor.shape):
            shape = " x ".join(map(str, weights[name].shape)) or "a number"
            return f"{name} is {shape}, where that model has {' x '.join(map(str, tensor.shape)) or 'a number'}"
    extra = [name for name in weights if name not in expected]
    return f"{extra[0]}, which that model does not have" if extra else ""


def check_resumable(checkpoint, path, cfg, meta, splits=None, chosen_here=()):
    """ValueError unless the checkpoint holds the model that cfg (a train.py config) asks for, and was
    trained on tokens of the same tokenizer as the data's (meta, its meta.json). A model setting may be
    the first run's or the model's: with init_from=gpt2 the weights decided the shape, so the same command
    line resumes, and so does one that gives the weights' own shape. Returns a note naming every other
    setting that changed since, but NEUTRAL_SETTINGS (with eval_only, the EVALUATION_SETTINGS), and token
    files that changed (splits: meta.json's record of them), for train.py to print once every check has
    passed ("" if nothing did). chosen_here: the RESOLVED_SETTINGS that cfg holds as this machine resolved
    their defaults (dtype=auto, say): the note says how to keep the checkpoint's, as it does for a default."""
    check_resume_fields(checkpoint, path)
    defaults, optimizer = type(cfg)(), trained_optimizer(checkpoint)
    saved = {**checkpoint["config"], "optimizer": optimizer}
    # an evaluation reads no optimizer state: these two concern a run that trains on
    if not cfg.eval_only and keyed_by_position(checkpoint["optimizer"]):
        raise ValueError(f"{path} names the parameters in its optimizer state by position, as this code's first "
                         "version saved it, not by name: resume cannot match that state to the model; evaluate it "
                         "(--eval_only=true) or sample from it (sample.py), or train it on with the code that wrote it")
    if not cfg.eval_only and optimizer != cfg.optimizer:
        raise ValueError(f"{path} was trained with optimizer={optimizer} (now {cfg.optimizer}); its optimizer state "
                         f"fits only that one: resume with --optimizer={optimizer} (or the config file the run was "
                         "started with)")
    # (vocab_size, 0 meaning the data's, is compared below: as set, or as the vocabulary it resolves to)
    before = {k: v for k, v in trained_settings(checkpoint).items() if k != "vocab_size"}
    model = checkpoint["model_config"]
    differ = {k: model.get(k, v) for k, v in before.items()  # the weights' own value
              if v != getattr(cfg, k) and model.get(k) != getattr(cfg, k)}
    flags = [f"--{k}={as_typed(v)}" for k, v in differ.items()]  # a config file may have changed under the run
    differ = [f"{k}={v} (now {getattr(cfg, k)})" for k, v in differ.items()]
    if checkpoint["tokenizer"] != meta:  # the same vocabulary size is not the same vocabulary
        same_dir = same_folder(str(saved.get("data_dir", "")), cfg.data_dir)
        again = prepare_command(cfg.data_dir, checkpoint["tokenizer"].get("tokenizer"))  # as the run was tokenised
        remedy = (f"{cfg.data_dir} was prepared again since: prepare it from the text the run was trained on "
                  f"(`{again}`), or start a new run" if same_dir else
                  f"resume on the data it was trained on (--data_dir={as_typed(saved.get('data_dir', '...'))})")
        raise ValueError(f"{path} was trained on other tokens than {cfg.data_dir} holds "
                         f"({tokenizer_difference(checkpoint['tokenizer'], meta)}); {remedy}")
    vocab_size = cfg.vocab_size or meta["vocab_size"]  # set as before (where GPT-2's weights overrode it), or the same
    if cfg.vocab_size != saved.get("vocab_size") and model["vocab_size"] != vocab_size:
        differ.append(f"a vocabulary of {model['vocab_size']} tokens (now {vocab_size})")
    if differ:
        same = f" ({' '.join(flags)})" if flags else ""
        raise ValueError(f"{path} was trained with {', '.join(differ)}; resume with the same model settings{same} and "
                         "data")
    unread = WEIGHT_SETTINGS + NEUTRAL_SETTINGS + unused_by_optimizer(cfg) + unread_by_schedule(cfg)
    compared = EVALUATION_SETTINGS if cfg.eval_only else [  # nothing trains: only what changes the evaluation
        f.name for f in fields(cfg) if f.name not in unread]
    was = {name: saved.get(name, getattr(defaults, name)) for name in compared  # newer settings: their default
           if not (name in RESOLVED_SETTINGS and saved.get(name) == getattr(defaults, name))}
    before, now = checkpoint.get("splits"), splits or {}  # None in a checkpoint older than the record
    if "data_dir" in was and (same_folder(str(was["data_dir"]), cfg.data_dir) or same_token_files(before, now)):
        del was["data_dir"]  # another spelling of the folder, or a copy of its files: the same tokens
    # a limit at what the checkpoint has reached would leave nothing to train, which resume refuses: not offered
    spent = {"max_iters": checkpoint["iter_num"], "max_seconds": checkpoint["trained_seconds"]}
    kept = {name: f" (the default; --{name}={as_typed(value)} keeps the checkpoint's)"  # how to keep it
            for name, value in was.items() if (getattr(cfg, name) == getattr(defaults, name) or name in chosen_here)
            and not (name in spent and 0 < value <= spent[name])}
    changed = [f"{name} {value} -> {getattr(cfg, name)}{kept.get(name, '')}" for name, value in was.items()
               if value != getattr(cfg, name)]
    changed += [f"{cfg.data_dir}'s {name}.bin {token_count(before[name])} -> {token_count(now[name])}"
                + (" tokens" if token_count(before[name]) != token_count(now[name]) else " other tokens")
                for name in now if name in (before or {}) and other_tokens(before[name], now[name])]
    follows = ("the evaluation follows the new values" if cfg.eval_only else
               "training follows the new values, so this run will not match an uninterrupted one")
    unknown = (f"note: {path} is older than the record of the token files a run trained on: that {cfg.data_dir} "
               "still holds them cannot be checked (prepared again since, it may hold other text)"
               if before is None else "")
    return "\n".join(filter(None, [f"note: {', '.join(changed)} since the checkpoint; {follows}" if changed else "",
                                   unknown]))


def same_token_files(before, now):
    """Whether two records of a data folder's token files (meta.json's splits) say the same files, checksums
    and all."""
    return bool(before) and before == now and all(isinstance(r, dict) and "crc32" in r for r in now.values())


def other_tokens(before, now):
    """Whether two records of a token file differ: in what both record where both are meta.json's ({tokens,
    largest_id}, and crc32 since it was added), else in length (data prepared by older code records none, and
    a run then records its files' lengths)."""
    if all(isinstance(r, dict) and "largest_id" in r for r in (before, now)):
        return any(before[k] != now[k] for k in before.keys() & now.keys())
    return token_count(before) != token_count(now)


def token_count(record):
    """A token file's length as meta.json's record of it says, in words ("?" where a damaged one does not)."""
    return f"{record['tokens']:,}" if isinstance(record, dict) and whole_number(record.get("tokens")) else "?"


def trained_optimizer(checkpoint):
    """The optimizer the checkpoint's run trained with: AdamW where its config does not say, the only one
    its code had before the setting came (TrainConfig's default may differ)."""
    return checkpoint["config"].get("optimizer", "adamw")


def keyed_by_position(optimizer_state):
    """Whether an optimizer state names its parameters by position (torch's Optimizer.state_dict, which this
    code's first version saved) rather than by name (torch.distributed.checkpoint's, since)."""
    state, groups = optimizer_state["state"], optimizer_state["param_groups"]
    params = [g["params"] for g in (groups if isinstance(groups, list) else ())
              if isinstance(g, dict) and isinstance(g.get("params"), list)]
    names = [*(state if isinstance(state, dict) else ()), *(p for group in params for p in group)]
    return any(type(name) is int for name in names)  # not a bool: a damaged file's, not a position


def trained_settings(checkpoint):
    """The model settings the checkpoint's run was given (its config), by name. A setting the first run's
    code did not have yet was at GPTConfig's default: GPT-2's way, the only one that code knew
    (TrainConfig's default for it may differ); vocab_size only where it was saved."""
    saved = checkpoint["config"]
    return {k: saved.get(k, getattr(GPTConfig, k)) for k in WEIGHT_SETTINGS if k in saved or k != "vocab_size"}


GPU_GENERATORS = {"cuda": torch.cuda, "mps": torch.mps}  # the GPUs whose generators a checkpoint keeps
RNG_KEYS = ("python", "torch", *GPU_GENERATORS, "numpy", "batches")  # what rng_state saves
NEWER_RNG_KEYS = ("mps",)  # saved since Apple's GPUs resume exactly: a resume takes an older checkpoint without


def field_problems(checkpoint, keys):
    """What is wrong with the checkpoint's fields named in keys, against the kinds in RESUME_FIELDS
    ("no model", "tokenizer is list", ...); [] where nothing is."""
    if not isinstance(checkpoint, dict):
        return [f"a {type(checkpoint).__name__}, not a dict of fields"]
    return [f"{key} is {type(checkpoint[key]).__name__}" if key in checkpoint else f"no {key}" for key in keys
            if not isinstance(checkpoint.get(key), RESUME_FIELDS[key]) or isinstance(checkpoint.get(key), bool)]


def checkpoint_tokenizer(checkpoint, path):
    """The tokenizer the checkpoint was trained with (its copy of meta.json's record); a ValueError naming
    the file where that record is damaged, rather than one that blames a meta.json."""
    try:
        return tokenizer_from_meta(checkpoint["tokenizer"])
    except TokenizerUnavailable:  # the install's fault, not the file's: training again would not help
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path} is damaged (its tokenizer record: {type(e).__name__}: {e}); train again, or use "
                         "a copy of an earlier checkpoint") from None


def check_resume_fields(checkpoint, path):
    """ValueError naming what is wrong if a field of the checkpoint is missing or not what resume reads."""
    missing = [key for key in RESUME_FIELDS if key not in checkpoint] if isinstance(checkpoint, dict) else RESUME_FIELDS
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by this train.py (nanoGPT's "
                         "checkpoints, say, hold only weights this code reads differently); start a new run "
                         "(--overwrite=true replaces it)")
    wrong = field_problems(checkpoint, RESUME_FIELDS)
    if not wrong:
        wrong = [f"rng lacks {key}" for key in RNG_KEYS if key not in checkpoint["rng"] and key not in NEWER_RNG_KEYS]
        if not whole_number(checkpoint["model_config"].get("vocab_size")):
            wrong.append("model_config lacks vocab_size")
        wrong += [f"the optimizer state lacks {key}" for key in ("state", "param_groups")
                  if key not in checkpoint["optimizer"]]
        if checkpoint["iter_num"] < 0:
            wrong.append(f"iter_num is {checkpoint['iter_num']}")
        if not 0 <= checkpoint["trained_seconds"] < math.inf:  # NaN too
            wrong.append(f"trained_seconds is {checkpoint['trained_seconds']}")
        wrong += [f"{key} is {type(checkpoint[key]).__name__}" for key, kinds in OPTIONAL_RESUME_FIELDS.items()
                  if key in checkpoint and not isinstance(checkpoint[key], kinds)]
    if wrong:
        raise ValueError(f"{path} is damaged ({', '.join(wrong)}): resume cannot continue from it; start a new "
                         "run (--overwrite=true replaces it), or resume from a copy of an earlier checkpoint")
    checkpoint_tokenizer(checkpoint, path)


def tokenizer_difference(trained, data):
    """How two tokenizers' meta.json records differ, in words: which characters, or which tokenizers."""
    if all(isinstance(m, dict) and m.get("tokenizer") == "char" for m in (trained, data)):
        only_trained = "".join(sorted(set(trained.get("chars", "")) - set(data.get("chars", ""))))
        only_data = "".join(sorted(set(data.get("chars", "")) - set(trained.get("chars", ""))))
        if not only_trained and not only_data:
            return "the same characters, numbered differently"
        sides = [f"only the {whose} has {some_characters(chars)}"
                 for whose, chars in (("checkpoint's", only_trained), ("data's", only_data)) if chars]
        return f"character vocabularies: {', '.join(sides)}"
    trained_name, data_name = (m.get("tokenizer", "?") if isinstance(m, dict) else "?" for m in (trained, data))
    return f"the checkpoint's tokenizer is {trained_name}, the data's {data_name}"


def some_characters(chars, shown=20):
    """chars as a message shows them: all of a few, or the first of many (a CJK text's thousands) and their count."""
    if len(chars) <= shown:
        return repr(chars)
    return f"{len(chars):,} characters, {chars[:shown]!r} and {len(chars) - shown:,} more"


def check_out_dir(out_dir, resuming, overwrite, data_dir):
    """Before the work, reading only: out_dir is a folder (or none yet), a new run does not destroy a
    trained checkpoint unless told to, nor write among another corpus's token files (out_dir and data_dir
    mixed up: the run would train on data_dir, not on the data it was meant for)."""
    path = ckpt_path(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir={out_dir!r} is a file, not a folder; pick another --out_dir")
    if not resuming and os.path.isfile(meta_path(out_dir)) and not same_folder(out_dir, data_dir):
        raise ValueError(f"out_dir={out_dir!r} holds prepared data (meta.json), and this run trains on "
                         f"{data_dir}: to train on it, give --data_dir={as_typed(out_dir)} and another --out_dir; "
                         "else pick another --out_dir")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a checkpoint; move it away or pick another --out_dir")
    if not resuming and not overwrite and os.path.exists(path):
        raise ValueError(f"{path} holds a trained run: continue it with --init_from=resume, pick another "
                         "--out_dir, or start again in this one with --overwrite=true")


def claim_out_dir(out_dir, checkpoint_bytes, resuming=False):
    """Once every check has passed, before training (not after hours of it): out_dir can be written (a 1 MiB
    probe: not read-only), it is this run's alone (lock_out_dir), and it has room for a checkpoint of at least
    checkpoint_bytes once a killed save's temporary file is gone (the lock's holder alone writes ckpt.pt, so
    every such file it finds is stale, whatever process its name gives). Directories made here go again
    with the lock where the run leaves them empty (stopped before its first save, or refused here). Resuming,
    another folder holds no checkpoint: the error says to copy this one where it can be written."""
    instead = f"{resume_elsewhere(out_dir)}, or evaluate it where it is with --eval_only=true" if resuming else \
        "pick another --out_dir"
    with writable_directory(out_dir, "out_dir", instead=instead) as made:  # leaves no empty out_dir
        pass
    if resuming:  # another folder holds no checkpoint
        lock_out_dir(out_dir, made, no_locks=f"copy it to a disk that takes them (cp -r {shlex.quote(out_dir)} NEW) "
                                             "and resume there with --out_dir=NEW, or evaluate it where it is with "
                                             "--eval_only=true")
    else:
        lock_out_dir(out_dir, made)
    clear_stale_temporaries(ckpt_path(out_dir), locked=True)
    try:  # the room, once a killed save's file no longer takes it
        with writable_directory(out_dir, "out_dir", room=1 << 20, instead=instead):
            pass
    except ValueError:
        unlock_out_dir(out_dir)
        raise
    free = shutil.disk_usage(out_dir).free
    if free < checkpoint_bytes:
        unlock_out_dir(out_dir)
        raise ValueError(f"out_dir={out_dir!r} has {free / 1e6:,.1f} MB free, and a checkpoint of this model "
                         f"takes at least {checkpoint_bytes / 1e6:,.1f} MB (its weights and optimizer state); "
                         f"free some space, or {instead}")


def resume_elsewhere(out_dir):
    """How to go on from out_dir's checkpoint where out_dir cannot be written."""
    return (f"copy it to a folder that can be written (cp -r {shlex.quote(out_dir)} NEW) and resume there with "
            "--out_dir=NEW")


def smallest_checkpoint(model):
    """Bytes that a checkpoint of model takes at least: its weights, and one optimizer slot each (Muon's
    momentum; AdamW keeps two)."""
    return 2 * sum(p.numel() * p.element_size() for p in model.parameters())


HELD_LOCKS = {}  # out_dir -> (the open file descriptor of its .lock, the directories made for it), while held


def lock_out_dir(out_dir, made=(), no_locks="pick an --out_dir on a disk that takes them"):
    """Claim out_dir for this process, so that two runs never share it: an exclusive flock on
    out_dir/.lock, taken in one atomic step and released by the kernel when the process ends,
    however it ends (a killed run leaves no lock to take over). The file names the host and process
    holding it, for the message another run gets: a ValueError naming that run. no_locks: what to do where
    the filesystem takes no locks (a resumed run: copy its checkpoint to another disk)."""
    path = os.path.join(out_dir, ".lock")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a directory or a dangling link where the lock goes, say
            raise ValueError(f"cannot lock out_dir={out_dir!r}: {path} cannot be opened as a file ({e.strerror}); "
                             "remove it, or pick another --out_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            host, _, pid = read_lock(path).partition(" ")
            raise ValueError(f"{out_dir} is in use by process {pid or '?'} on {host or '?'} (see {path}); wait for "
                             "that run to end (then continue it with --init_from=resume) or pick another "
                             "--out_dir") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL):
                raise
            HELD_LOCKS[out_dir] = fd, made  # a filesystem that takes no locks (exFAT, FAT, Lustre without -o flock)
            unlock_out_dir(out_dir)  # the file and the folders made for it go again
            raise ValueError(f"cannot lock out_dir={out_dir!r}, which keeps a second run out of it: its filesystem "
                             f"takes no locks ({e.strerror or e}); {no_locks}") from None
        try:  # the file at path may be one a finishing run removed after this process opened it
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    HELD_LOCKS[out_dir] = fd, made
    os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):  # a full disk: the flock holds all the same, and claim_out_dir says what is full
        os.write(fd, f"{socket.gethostname()} {os.getpid()}".encode())


def unlock_out_dir(out_dir):
    """Give out_dir back, if this process holds it: the file goes first, then the flock, then the
    directories made for it if the run left nothing in them."""
    fd, made = HELD_LOCKS.pop(out_dir, (None, ()))
    if fd is not None:
        try:
            os.remove(os.path.join(out_dir, ".lock"))
        except OSError:  # out_dir was removed, or made read-only, under the run: the flock goes all the same
            pass
        os.close(fd)
        remove_empty_directories(made)


def read_lock(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):  # none there, or no out_dir at all
        return ""


def torch_rng_state(device_type):
    """This process's torch generators, which dropout draws from: the CPU's, and {device_type: state}
    of the GPU it trains on ({} in a CPU run, which leaves a machine's GPU alone)."""
    gpu = GPU_GENERATORS.get(device_type)
    return torch.get_rng_state(), {device_type: gpu.get_rng_state()} if gpu else {}


def rng_state(generator, torch_states):
    """Every random number generator a run draws from (Python, NumPy, the batch sampler's generator,
    and each rank's torch generators: torch_states, torch_rng_state() of every rank in rank order),
    as tensors and plain data that weights_only loading accepts."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": [cpu for cpu, _ in torch_states],
            **{kind: [gpu.get(kind, torch.empty(0)) for _, gpu in torch_states] for kind in GPU_GENERATORS},
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "batches": generator.get_state()}


def saved_ranks(checkpoint):
    """How many processes trained the run that saved the checkpoint (each kept its torch generators)."""
    torch_states = checkpoint["rng"]["torch"]
    return len(torch_states) if isinstance(torch_states, list) else 1


def set_rng_state(state, generator, rank, device_type):
    """Put back what rng_state saved; rank's own torch generators, its GPU's where it trains on one and the
    checkpoint holds that kind's (one saved before Apple's GPUs were kept has none). A rank the run was not
    saved from keeps the generators it was seeded with (train.py: seed + rank), its dropout masks its own;
    a run resumed on more processes than it was saved from cannot continue exactly (saved_ranks says so)."""
    random.setstate(state["python"])
    cpu, gpu = (states if isinstance(states, list) else [states]
                for states in (state["torch"], state.get(device_type, [])))
    if not cpu:
        raise ValueError("it keeps no process's torch generator")
    if rank < len(cpu):
        torch.set_rng_state(cpu[rank])
    if device_type in GPU_GENERATORS and rank < len(gpu) and gpu[rank].numel():
        GPU_GENERATORS[device_type].set_rng_state(gpu[rank])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    generator.set_state(state["batches"])
