"""
Checkpoints that cannot be half-written and cannot run code.

Saving writes a temporary file beside the target, flushes it to disk and renames it over the old
one, so a crash or kill mid-save leaves the previous checkpoint intact. Loading uses
torch.load(weights_only=True): tensors and plain Python data only, never arbitrary pickled objects.
"""
import glob
import os
import pickle
import zipfile

import torch

from model import GPT, GPTConfig


def save_checkpoint(state, path):
    directory = os.path.dirname(os.path.abspath(path))
    for stale in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(os.path.basename(path))}.tmp*")):
        os.remove(stale)  # left by a save that was killed; the checkpoint itself is intact
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old file or the new one
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, RuntimeError):  # torch's zip writer reports a failed write (a full disk) this way
            cause = e.__context__ if isinstance(e.__context__, OSError) else None
            raise OSError(getattr(cause, "errno", None), cause.strerror if cause else str(e).splitlines()[0]) from e
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        fd = os.open(directory, os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
