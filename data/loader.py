"""
Reading a prepared data dir: meta.json (which tokenizer made the tokens), train.bin / val.bin as
read-only memmaps of uint16 token ids, and random training batches drawn from them.
"""
import json
import os
import shlex

import numpy as np
import torch

from configurator import first_line, whole_number
from data.prepare import TOKEN_DTYPE, meta_path, prepare_command, split_path, split_paths
from data.tokenizer import TokenizerUnavailable, tokenizer_from_meta


def prepared_folders_in(folder):
    """The names of the folders directly in folder that hold a meta.json (prepared data), sorted."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # none there, or not a folder
        return []
    return [n for n in names if os.path.isfile(meta_path(os.path.join(folder, n)))]


def load_meta(data_dir):
    """The meta dict of a prepared data dir, checked to name a tokenizer this code has and its size."""
    path = meta_path(data_dir)
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise ValueError(f"data_dir {data_dir} is a file, not a folder: give the folder that data/prepare.py wrote "
                         "(its --out_dir), which holds train.bin, val.bin and meta.json")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path} is not a file (a directory, say); prepare the data again with "
                         f"`{prepare_command(data_dir)}`")
    if not os.path.isfile(path):
        within = prepared_folders_in(data_dir)
        if within:  # data/ for data/shakespeare_char: a folder of prepared ones, not one itself
            shown = ", ".join(within[:5]) + (f" and {len(within) - 5} more" if len(within) > 5 else "")
            raise ValueError(f"no meta.json in {data_dir}, which holds prepared data folders ({shown}): give one of "
                             f"them, e.g. --data_dir={shlex.quote(os.path.join(data_dir, within[0]))}")
        tokens = [os.path.basename(p) for p in split_paths(data_dir) if os.path.exists(p)]
        why = ("it was prepared by nanoGPT (its meta.pkl), whose files this code does not read" if
               os.path.isfile(os.path.join(data_dir, "meta.pkl")) else
               f"its {' and '.join(tokens)} came from elsewhere (data/prepare.py writes meta.json with them), or "
               "a preparation stopped before its end; move them away to keep them" if tokens else
               "it was never prepared or the preparation was interrupted")
        raise ValueError(f"no meta.json in {data_dir}: {why}; run `{prepare_command(data_dir)}`")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        if not (isinstance(meta, dict) and whole_number(meta.get("vocab_size"))):
            raise ValueError("it is not a JSON object with an integer vocab_size")
        tokenizer_from_meta(meta)  # names a tokenizer this code has, and is whole
        splits = meta.get("splits", {})
        if not (isinstance(splits, dict) and all(map(whole_record, splits.values()))):
            raise ValueError("its splits are not {name: {tokens, largest_id, crc32}} with integer values")
    except TokenizerUnavailable:  # the install's fault: preparing the data again would fail the same way
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
        why = (f"it has no {e} field" if isinstance(e, KeyError) else "nested too deep to read"
               if isinstance(e, RecursionError) else first_line(e))
        raise ValueError(f"{path} is damaged ({why}); prepare the data again with "
                         f"`{prepare_command(data_dir)}`") from None
    return meta


def whole_record(record):
    """Whether meta.json's record of a token file has integer tokens, largest_id and crc32 (data prepared
    before the checksum was recorded has none)."""
    return (isinstance(record, dict) and all(whole_number(record.get(k)) for k in ("tokens", "largest_id"))
            and whole_number(record.get("crc32", 0)))


def tokenizer_meta(meta):
    """meta.json's record of the tokenizer alone (what a checkpoint keeps and resume compares),
    without what it says about the token files."""
    return {key: value for key, value in meta.items() if key != "splits"}


def open_split(data_dir, split, meta=None):
    """train.bin / val.bin of data_dir as a read-only uint16 memmap. With meta (meta.json's dict),
    checked to be the file meta.json describes: its length, and the largest id recorded when it was
    prepared inside the vocabulary (one pass over the file where meta.json records none: data
    prepared before it did)."""
    path = split_path(data_dir, split)
    again = prepare_command(data_dir, (meta or {}).get("tokenizer"))
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path} is not a file of tokens (a directory, say); prepare the data again with `{again}`")
    if not os.path.isfile(path):
        raise ValueError(f"no {split}.bin in {data_dir}: it was never prepared or the preparation was "
                         f"interrupted; run `{again}`")
    size = os.path.getsize(path)
    if size == 0 or size % TOKEN_DTYPE.itemsize:
        raise ValueError(f"{path} is {size} bytes, not a whole number (>0) of {TOKEN_DTYPE.name} tokens: it is "
                         "damaged or from an interrupted run; prepare the data again")
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
    if meta is None:
        return tokens
    recorded = meta.get("splits", {}).get(split)
    if recorded and recorded.get("tokens") != len(tokens):
        raise ValueError(f"{path} holds {len(tokens):,} tokens but {data_dir}/meta.json says {recorded.get('tokens')}: "
                         "the files come from different preparations; prepare the data again")
    largest = recorded["largest_id"] if recorded else int(tokens.max())
    if largest >= meta["vocab_size"]:
        raise ValueError(f"{path} holds token id {largest}, outside meta.json's vocabulary of {meta['vocab_size']}: "
                         "its files come from different preparations; prepare the data again")
    return tokens


class DamagedTokens(ValueError):
    """A batch holds a token id outside the model's vocabulary: the file changed since it was prepared."""


class Batches:
    """Random windows of the token stream. At each optimizer step one generator, seeded the same on
    every rank, draws offsets for all micro-steps of all ranks; rank r takes its own slice, so ranks
    never read the same batch and N ranks see exactly what 1 rank sees over N micro-steps. With
    vocab_size, every batch is checked to hold ids below it (a model would fail on others)."""

    def __init__(self, data, block_size, batch_size, seed, device, vocab_size=None):
        self.data, self.block_size, self.batch_size, self.device = data, block_size, batch_size, device
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def offsets(self, n_batches):
        """(n_batches, batch_size) random start positions: one row per batch."""
        return torch.randint(len(self.data) - self.block_size, (n_batches, self.batch_size), generator=self.generator)

    def share(self, n_batches, rank, world_size):
        """One rank's share of a step's n_batches micro-batches: every world_size-th row of offsets,
        from row rank. Every rank draws the same rows (the generator is seeded alike), so the ranks'
        shares are disjoint and together are what one process would train on."""
        return self.offsets(n_batches)[rank::world_size]

    def load(self, offsets):
        """Inputs x and next-token targets y, each (batch_size, block_size), read in one gather."""
        # each row: block_size + 1 tokens from its offset, the inputs and, one further along, the targets
        positions = offsets.numpy()[:, None] + np.arange(self.block_size + 1)  # (batch_size, block_size + 1)
        tokens = self.data[positions]  # (batch_size, block_size + 1)
        # open_split checked the files against meta.json's record of them, not every token since: a byte damaged
        # later is found here, before the model (on a GPU, an id past the embedding is an unrecoverable fault)
        if self.vocab_size is not None and tokens.max() >= self.vocab_size:
            where = getattr(self.data, "filename", None) or "the token file"
            raise DamagedTokens(f"{where} holds token id {tokens.max()}, outside the model's vocabulary of "
                                f"{self.vocab_size}: it changed since it was prepared; prepare the data again")
        rows = torch.from_numpy(tokens.astype(np.int64))
        x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        if self.device.startswith("cuda"):  # pinned memory lets the copy overlap with compute
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)
