"""Robustness: checkpoints that survive a kill mid-save and never run code, exact restarts after
SIGINT/SIGTERM, a non-finite loss, an unwritable out_dir, and a table of bad inputs that must each
give exit status 2 and one clear line on stderr, no traceback, and leave the disk as it was.

train.py and sample.py run as separate processes with OMP_NUM_THREADS=1. The processes that get
signalled or killed are plain `python train.py` / `python -c ...`; the others (the run after a signal,
the non-finite loss, the unwritable out_dir, the bad-input table) go through conftest's `launch`: forked
from a server that has already imported torch, ten times cheaper (REAL_SUBPROCESS=1: plain processes).

About temporary files: save_checkpoint writes `.ckpt.pt.tmp<pid>` beside ckpt.pt and renames it
over ckpt.pt. A process killed with SIGKILL mid-save cannot clean up, so that temp file stays
behind (ckpt.pt itself is intact) until the next save removes it; nothing else may be left."""
import collections
import errno
import importlib.util
import json
import os
import pickle
import platform
import queue
import re
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from checkpoint import clean_state_dict, load_checkpoint, save_checkpoint
from helpers import ENV, ROOT, TEXT, TORCHRUN_ENV, check_ok, mount_tmpfs
from model import GPT, GPTConfig
from data.prepare import prepare_char
from train import TrainConfig

TINY = ["--device=cpu", "--max_seconds=0", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=16",
        "--block_size=8", "--batch_size=2", "--eval_iters=2", "--warmup_iters=2"]
TMP_NAME = re.compile(r"^\.ckpt\.pt\.tmp\d+$")  # save_checkpoint's temp file, left only by a SIGKILL
LOG_LINE = re.compile(r"^iter (\d+): loss ", re.M)


def describe(proc):
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def single_error_line(proc):
    """The one line a script must print on stderr for bad input."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), describe(proc)
    return lines[0]


def snapshot(*roots):
    """Every file and directory under roots: path -> (size, mtime_ns); None for a missing root."""
    state = {}
    for root in map(Path, roots):
        if not root.exists():
            state[str(root)] = None
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                st = os.stat(p)
                state[p] = (st.st_size if name in filenames else -1, st.st_mtime_ns)
        state[str(root)] = "dir"
    return state


class Lines:
    """Read a subprocess's stdout and stderr in background threads, so a test can wait for a line
    with a timeout and the pipes never fill up."""

    def __init__(self, proc):
        self.proc, self.queue, self.out, self.err = proc, queue.Queue(), [], []
        self.threads = [threading.Thread(target=self._pump, args=(proc.stdout, self.out, True), daemon=True),
                        threading.Thread(target=self._pump, args=(proc.stderr, self.err, False), daemon=True)]
        for t in self.threads:
            t.start()

    def _pump(self, stream, sink, to_queue):
        for line in stream:
            sink.append(line)
            if to_queue:
                self.queue.put(line)
        if to_queue:
            self.queue.put(None)

    def wait_for(self, pattern, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"exited ({self.proc.wait()}) before printing {pattern!r}:\n"
                                     f"{''.join(self.out)[-3000:]}\n{''.join(self.err)[-3000:]}")
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{''.join(self.out)[-3000:]}")

    def finish(self, timeout=60):
        rc = self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=10)
        return rc, "".join(self.out), "".join(self.err)


def kill_quietly(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def start_long_run(args):
    """A plain `python train.py ARGS --max_iters=100000` process, once it has logged its first step."""
    proc = subprocess.Popen([sys.executable, "train.py", *args, "--max_iters=100000"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Lines(proc)
    try:
        lines.wait_for(r"^iter \d+: loss ")
    except BaseException:
        kill_quietly(proc)
        raise
    return proc, lines


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir, launch):
    """out_dir of a 2-iteration training run: ckpt.pt, metrics.jsonl."""
    out = tmp_path_factory.mktemp("trained")
    proc = launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")
    assert proc.returncode == 0, describe(proc)
    return out


# ---- D. checkpoint safety -----------------------------------------------------------------------

WRITER = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from checkpoint import save_checkpoint
i = 0
while True:  # ~200 MB per save: long enough to be killed in the middle of one
    i += 1
    state = {"w": torch.full((50_000_000,), float(i)), "iter_num": i}
    print("saving", i, flush=True)
    save_checkpoint(state, sys.argv[2])
    print("saved", i, flush=True)
"""


def test_save_survives_sigkill_mid_save(tmp_path):
    path = tmp_path / "ckpt.pt"
    original = {"model": {"w": torch.arange(1000, dtype=torch.float32)}, "iter_num": 7}
    save_checkpoint(original, str(path))
    before = snapshot(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(path)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(writer)
        lines.wait_for(r"^saving 1$", timeout=60)
        # kill as soon as any file in the directory has started to change: mid-save
        deadline = time.time() + 30
        while time.time() < deadline:
            changed = {p: s for p, s in snapshot(tmp_path).items() if s != before.get(p)}
            if any(isinstance(s, tuple) and s[0] > 0 for s in changed.values()):
                break
            time.sleep(0.001)
        else:
            pytest.fail("the writer never started writing")
        writer.send_signal(signal.SIGKILL)
        rc, out, err = lines.finish()
    finally:
        kill_quietly(writer)
    assert rc == -signal.SIGKILL, err
    assert "saved 1" not in out, "the kill came after the first save had finished; the test did not hit a save"

    loaded = load_checkpoint(str(path))  # still loads ...
    assert loaded["iter_num"] == 7 and torch.equal(loaded["model"]["w"], original["model"]["w"])  # ... unchanged
    leftovers = sorted(os.listdir(tmp_path))
    assert "ckpt.pt" in leftovers
    assert all(TMP_NAME.match(name) for name in leftovers if name != "ckpt.pt"), leftovers
    # and the next save still works, and clears the stale temp file away
    save_checkpoint({"iter_num": 8}, str(path))
    assert load_checkpoint(str(path))["iter_num"] == 8
    assert os.listdir(tmp_path) == ["ckpt.pt"]


# A lambda cannot be pickled: pickle looks it up by name, `<lambda>`, in this module, and fails with
# PicklingError. Kept at module level: a local lambda fails with AttributeError up to Python 3.13
# ("Can't pickle local object") and with PicklingError from 3.14 on.
UNPICKLABLE = lambda: None  # noqa: E731


def test_failed_save_keeps_previous_and_cleans_up(tmp_path):
    """A save that fails while pickling raises pickle's own error (not some other bug's) and leaves the
    previous checkpoint, and nothing else, behind."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 1, "w": torch.ones(3)}, str(path))
    with pytest.raises(pickle.PicklingError, match="Can't pickle <function <lambda>"):
        save_checkpoint({"iter_num": 2, "bad": UNPICKLABLE}, str(path))
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    assert load_checkpoint(str(path))["iter_num"] == 1


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def test_pickle_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.ones(2)}, "iter_num": 1, "extra": Payload(marker)}, path)
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert re.fullmatch(f"{re.escape(str(path))} contains a Python object that is not plain data or tensors, "
                        r"posix\.system, so it was not loaded \(weights_only=True keeps a checkpoint "
                        r"from running code\)", str(e.value)), e.value
    assert not marker.exists(), "loading the checkpoint ran its pickled code"
    # the payload is real: an unsafe load does run it
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "text", "one byte"])
def test_damaged_checkpoint_is_a_value_error_naming_the_file(tmp_path, damage):
    path = tmp_path / "ckpt.pt"
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    save_checkpoint({"model": model.state_dict(), "iter_num": 3}, str(path))
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 2], "empty": b"", "garbage": b"not a checkpoint\n" * 100,
                      "text": b"hello world\n", "one byte": b"x"}[damage])
    with pytest.raises(ValueError) as e:  # not KeyError: 101, as torch.load's unpickler said of the text
        load_checkpoint(str(path))
    assert str(e.value).startswith(f"{path} is not a checkpoint: truncated, or a file of another kind"), e.value
    assert "train again (--overwrite=true replaces it)" in str(e.value)  # a new run there is refused without it


@pytest.mark.parametrize("offset", [20, 40], ids=["an unknown opcode", "a string that is not UTF-8"])
def test_corrupt_bytes_inside_a_checkpoint_are_called_corrupt_not_unsafe(tmp_path, offset):
    """Bytes flipped in the pickled part: torch's unpickler meets an opcode it does not know, or a string
    it cannot decode. Not "Python objects that are not plain data", which would send the user to
    weights_only=False, and not a traceback."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"iter_num": 3, "config": {"n_layer": 1, "notes": "x" * 200}}, str(path))
    data = bytearray(path.read_bytes())
    start = data.index(b"data.pkl") + offset  # into the pickle's own bytes, past the zip entry's name
    data[start:start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert str(e.value).startswith(f"{path} is ") and "corrupt" in str(e.value), e.value
    assert "Python objects" not in str(e.value) and "\n" not in str(e.value), e.value


def test_bytes_damaged_inside_a_checkpoint_s_tensor_are_refused_not_trained_on(tmp_path):
    """torch.load reads a tensor's bytes without checking their CRC-32: a checkpoint damaged inside its
    weights loaded, and a resume trained on from the damaged values without a word."""
    path = tmp_path / "ckpt.pt"
    weights = torch.arange(4096, dtype=torch.float32)
    save_checkpoint({"model": {"w": weights}, "iter_num": 3}, str(path))
    assert torch.equal(load_checkpoint(str(path))["model"]["w"], weights)
    data = bytearray(path.read_bytes())
    start = data.index(weights[1000:1004].numpy().tobytes())  # inside the tensor's own record
    data[start:start + 16] = bytes(16)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert re.fullmatch(rf"{re.escape(str(path))} is truncated or corrupt and cannot be loaded \(BadZipFile: its "
                        r"record \S+/data/0 fails its CRC-32 check: the file was damaged after it was written\)",
                        str(e.value)), e.value


def test_a_flipped_bit_in_a_checkpoint_s_zip_directory_is_refused_not_a_traceback(tmp_path):
    """A record's compression method flipped from stored to deflate in the archive's directory: its bytes
    were read as compressed ones, and zlib's error came out of the CRC-32 check as a traceback."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"model": {"w": torch.arange(4096, dtype=torch.float32)}, "iter_num": 3}, str(path))
    data = bytearray(path.read_bytes())
    entry = data.index(b"PK\x01\x02")  # the first record's entry in the central directory
    assert data[entry + 10:entry + 12] == b"\x00\x00"  # stored: torch.save compresses nothing
    data[entry + 10] = 8  # deflate
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        load_checkpoint(str(path))
    assert re.fullmatch(rf"{re.escape(str(path))} is truncated or corrupt and cannot be loaded \(BadZipFile: a "
                        r"record cannot be read \(Error -3 while decompressing data: .*\): the file was damaged after "
                        r"it was written\)", str(e.value)), e.value


def test_a_token_file_damaged_since_it_was_prepared_is_one_line_not_a_traceback(tmp_path, launch):
    """train.bin rewritten with ids past the vocabulary, its length and meta.json as prepared: the checks at
    start pass (they read meta.json's record), and the model's embedding failed on a batch, a traceback on
    every rank (on a GPU, an unrecoverable device fault). The batch is checked before the model gets it: here
    with the first id past the vocabulary, vocab_size itself."""
    import numpy as np
    prepare_char(TEXT, str(tmp_path / "data"))
    path = tmp_path / "data" / "train.bin"
    vocab = json.loads((tmp_path / "data" / "meta.json").read_text())["vocab_size"]
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[::5] = vocab
    tokens.tofile(path)
    proc = launch("train.py", *TINY, f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                  "--max_iters=3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [f"error: {path} holds token id {vocab}, outside the model's "
                                        f"vocabulary of {vocab}: "
                                        "it changed since it was prepared; prepare the data again (`python data/"
                                        f"prepare.py --input=FILE --tokenizer=char --out_dir={tmp_path / 'data'}`); "
                                        "nothing was saved"], proc.stderr


def test_no_byte_flipped_in_a_checkpoint_s_pickle_makes_a_traceback_or_a_warning(tmp_path):
    """Each byte of the pickled part flipped in turn: torch's unpickler, derailed, raised KeyError, IndexError,
    TypeError or AttributeError (tracebacks from sample.py and a resume), warned of TypedStorage on the way,
    or gave "(Please file an issue ... WeightsUnpickler error:)" for its reason, which was on the next line.
    Every flip now loads (a byte the pickle does not read) or is one line naming the file and a reason."""
    import warnings
    path = tmp_path / "ckpt.pt"
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    save_checkpoint({"model": model.state_dict(), "iter_num": 3, "config": {"n_layer": 1}}, str(path))
    data = path.read_bytes()
    start = data.index(b"data.pkl") + len(b"data.pkl")
    end = data.index(b"PK", start)  # the next entry's header: the pickle ends before it
    refused, flips = 0, [(offset, mask) for offset in range(start, end) for mask in (0x01, 0xA5, 0xFF)]
    for offset, mask in flips:
        damaged = bytearray(data)
        damaged[offset] ^= mask
        path.write_bytes(bytes(damaged))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning is a second line on stderr
            try:
                load_checkpoint(str(path))
            except ValueError as e:
                refused += 1
                assert str(e).startswith(f"{path} ") and "\n" not in str(e) and "Please" not in str(e), e
                assert not str(e).endswith("()"), e
    assert refused > len(flips) // 2, (refused, len(flips))  # most of the pickle's bytes are read


def test_the_same_characters_numbered_differently_are_named_so():
    from checkpoint import tokenizer_difference
    assert tokenizer_difference({"tokenizer": "char", "chars": "ab"}, {"tokenizer": "char", "chars": "ba"}) == \
        "the same characters, numbered differently"
    # data with more characters: no "only the checkpoint's has ''"
    assert tokenizer_difference({"tokenizer": "char", "chars": "ab"}, {"tokenizer": "char", "chars": "abc"}) == \
        "character vocabularies: only the data's has 'c'"
    # a CJK text's thousands of characters: their count and the first few, not a line of 9 KB
    cjk = "".join(map(chr, range(0x4E00, 0x4E00 + 3000)))
    assert tokenizer_difference({"tokenizer": "char", "chars": "ab"}, {"tokenizer": "char", "chars": "ab" + cjk}) == \
        f"character vocabularies: only the data's has 3,000 characters, {cjk[:20]!r} and 2,980 more"


def test_missing_checkpoint_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    (tmp_path / "dir" / "ckpt.pt").mkdir(parents=True)  # not "train one first": there is something in the way
    with pytest.raises(ValueError, match=r"ckpt.pt is a directory, not a checkpoint; move it away"):
        load_checkpoint(str(tmp_path / "dir" / "ckpt.pt"))
    (tmp_path / "link.pt").symlink_to(tmp_path / "nowhere.pt")
    with pytest.raises(ValueError, match=r"link.pt is a link to .*nowhere.pt, which does not exist"):
        load_checkpoint(str(tmp_path / "link.pt"))


def test_clean_state_dict_strips_prefixes():
    one = torch.ones(1)
    sd = {"_orig_mod.a.weight": one, "module.b.weight": one, "module._orig_mod.c.weight": one,
          "_orig_mod.module.d.weight": one, "e.weight": one, "e.module.f": one, "g._orig_mod.h": one}
    assert list(clean_state_dict(sd)) == ["a.weight", "b.weight", "c.weight", "d.weight", "e.weight", "e.module.f",
                                          "g._orig_mod.h"]
    assert clean_state_dict(sd)["a.weight"] is one


@pytest.mark.parametrize("wrapper", ["compile", "ddp", "ddp+compile"])
def test_wrapped_checkpoint_loads_into_plain_gpt(tmp_path, wrapper):
    cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    trained = GPT(cfg)
    # the keys torch.compile's wrapper (_orig_mod.) and DDP (module.) give; building them by hand
    # spares the test torch.compile's import (~2 s)
    prefix = {"compile": "_orig_mod.", "ddp": "module.", "ddp+compile": "module._orig_mod."}[wrapper]
    state = {prefix + k: v for k, v in trained.state_dict().items()}
    save_checkpoint({"model": state, "model_config": asdict(cfg)}, str(tmp_path / "ckpt.pt"))
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    torch.manual_seed(1)
    plain = GPT(GPTConfig(**ckpt["model_config"]))
    plain.load_state_dict(clean_state_dict(ckpt["model"]))  # strict
    for (name, a), b in zip(trained.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name


def test_sample_loads_a_wrapped_checkpoint(tmp_path):
    from sample import SampleConfig, load_model
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(TEXT)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16)
    trained = GPT(cfg)
    state = {"module._orig_mod." + k: v for k, v in trained.state_dict().items()}
    save_checkpoint({"model": state, "model_config": asdict(cfg), "tokenizer": tok.meta()}, str(tmp_path / "ckpt.pt"))
    model, tokenizer = load_model(SampleConfig(out_dir=str(tmp_path), device="cpu"))
    assert tokenizer.encode("All:") == tok.encode("All:")
    for name, value in trained.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


# ---- E. signals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_saves_and_resumes(tmp_path, data_dir, launch, signum):
    out = tmp_path / "out"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--log_interval=1", "--eval_interval=100000"]
    proc, lines = start_long_run([*args, "--overwrite=true"])  # which the resume line leaves out: a resume reads none
    try:
        proc.send_signal(signum)
        rc, stdout, stderr = lines.finish()
    finally:
        kill_quietly(proc)
    text = stdout + stderr
    assert rc == 128 + signum, f"exit {rc}\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    ckpt_path = out / "ckpt.pt"
    assert str(ckpt_path) in text, "it should say where the checkpoint is"
    assert "--init_from=resume" in text, "it should say how to resume"
    assert re.search(r"^resume with: python train\.py .*--init_from=resume$", stdout, re.M), stdout[-2000:]
    assert "--overwrite" not in next(line for line in stdout.splitlines() if line.startswith("resume with: "))
    assert sorted(os.listdir(out)) == ["ckpt.pt", "loss.png", "metrics.jsonl"]
    stopped_at = load_checkpoint(str(ckpt_path))["iter_num"]
    assert stopped_at > 0
    assert stopped_at >= max(int(n) for n in LOG_LINE.findall(stdout))  # nothing logged was lost

    resumed = launch("train.py", *args, "--init_from=resume", f"--max_iters={stopped_at + 2}")
    assert resumed.returncode == 0, describe(resumed)
    assert "Traceback" not in resumed.stdout + resumed.stderr
    assert [int(n) for n in LOG_LINE.findall(resumed.stdout)] == [stopped_at + 1, stopped_at + 2]
    assert load_checkpoint(str(ckpt_path))["iter_num"] == stopped_at + 2
    if signum == signal.SIGTERM:  # a resumed run stopped in its turn: its resume command says resume once
        proc, lines = start_long_run([*args, "--init_from=resume"])
        try:
            proc.send_signal(signum)
            _, stdout, _ = lines.finish()
        finally:
            kill_quietly(proc)
        resume = next(line for line in stdout.splitlines() if line.startswith("resume with: "))
        assert resume.count("--init_from=resume") == 1 and resume.endswith(" --init_from=resume"), resume


@pytest.mark.parametrize("nohup", [False, True], ids=["hang-up", "under-nohup"])
def test_a_hang_up_stops_the_run_as_sigterm_does_unless_nohup_ignores_it(tmp_path, data_dir, nohup):
    """The ssh session that started a run drops: SIGHUP had ended it at once, losing what it trained since its last
    save, and leaving its lock. Now it saves and stops, as on SIGTERM (whose resume test_signal_saves_and_resumes
    covers). nohup starts a run with SIGHUP ignored, so that it outlives the terminal: that stays so."""
    ignore = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None  # as nohup does
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}",
                             "--log_interval=1", "--eval_interval=100000", f"--max_iters={40 if nohup else 100000}"],
                            cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore)
    lines = Lines(proc)
    try:
        lines.wait_for(r"^iter \d+: loss ")
        proc.send_signal(signal.SIGHUP)
        rc, stdout, stderr = lines.finish()
    finally:
        kill_quietly(proc)
    stopped = load_checkpoint(str(tmp_path / "ckpt.pt"))["iter_num"]
    if nohup:
        assert rc == 0 and "stopped by" not in stdout and stopped == 40, stdout[-2000:] + stderr[-2000:]
    else:
        assert rc == 128 + signal.SIGHUP and f"(stopped by SIGHUP after iteration {stopped})" in stdout, \
            stdout[-2000:] + stderr[-2000:]
        assert "--init_from=resume" in stdout and not (tmp_path / ".lock").exists() and stopped > 0


@pytest.mark.parametrize("script", ["train.py", "sample.py"])
def test_ctrl_c_while_torch_loads_ends_the_run_without_a_traceback(tmp_path, script):
    """Ctrl-C in the second or two the script spends importing torch: the process ends by the signal, as any Unix
    tool does, not with a traceback from deep inside torch's import (nothing has been read or written yet)."""
    proc = subprocess.Popen([sys.executable, "-X", "importtime", script, f"--out_dir={tmp_path / 'out'}"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # Python's own Ctrl-C handling, also where the suite ignores it:
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background job
    try:
        imported = ""
        while " torch" not in imported:  # -X importtime writes a line as each module finishes loading
            line = proc.stderr.readline()
            assert line, f"torch was never imported: exit {proc.wait()}\n{imported[-3000:]}"
            imported += line
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches its foreground job
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        kill_quietly(proc)
    errors = [line for line in stderr.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in stdout + stderr and errors == [], "\n".join(errors[-40:])
    assert proc.returncode == -signal.SIGINT, f"exit {proc.returncode}: the signal came after the imports"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["train.py", "sample.py", "data/prepare.py"])
def test_after_its_imports_ctrl_c_is_a_keyboard_interrupt_again(script):
    """What the test above relies on ends with the imports: from there on a Ctrl-C raises KeyboardInterrupt,
    which the scripts turn into their one line (a checkpoint saved, a data dir left as it was)."""
    at_exit = ("import atexit, runpy, signal, sys\n"
               "atexit.register(lambda: print('handler:', signal.getsignal(signal.SIGINT).__name__))\n"
               f"sys.argv = [{script!r}, '--help']\nrunpy.run_path({script!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", at_exit], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines()[-1] == "handler: default_int_handler", describe(proc)


SIGNAL_DURING_AGREEMENT = """
import os, signal, sys
import torch
import torch.distributed as dist
from configurator import load_config
from train import TrainConfig, main

real_all_reduce = dist.all_reduce


def all_reduce(tensor, *args, **kwargs):  # rank 1 gets SIGTERM while the ranks agree on clock and signal
    done = real_all_reduce(tensor, *args, **kwargs)
    if dist.get_rank() == 1 and tensor.dtype == torch.float64 and not all_reduce.signalled:
        all_reduce.signalled = True
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the agreed values are read
    return done


all_reduce.signalled = False
dist.all_reduce = all_reduce
main(load_config(TrainConfig, sys.argv[1:]))
"""


def test_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, data_dir):
    """torchrun, 2 ranks (gloo): SIGTERM reaches rank 1 only, during the ranks' first agreement
    (after iteration 1), too late for it. It counts at the next agreement (iteration 2: the second
    comes one step after the first, before the pace is known): both ranks stop after the same step,
    rank 0 saves, and both exit 128 + SIGTERM."""
    out, logs, worker = tmp_path / "out", tmp_path / "logs", tmp_path / "worker.py"
    worker.write_text(SIGNAL_DURING_AGREEMENT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
           "--redirects=3", str(worker), *TINY, "--optimizer=adamw", "--gradient_accumulation_steps=2",
           f"--data_dir={data_dir}", f"--out_dir={out}", "--log_interval=3", "--eval_interval=100000", "--max_iters=30"]
    proc = subprocess.run(cmd, cwd=ROOT, env=TORCHRUN_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, "torchrun reports that its workers stopped"
    assert f"exitcode: {128 + signal.SIGTERM}" in proc.stderr, proc.stderr[-3000:]
    ranks = {rank: {name: next(logs.rglob(f"{rank}/{name}.log")).read_text() for name in ("stdout", "stderr")}
             for rank in (0, 1)}  # each rank's own output, apart from torchrun's report
    for rank, output in ranks.items():
        assert "Traceback" not in output["stdout"] + output["stderr"], (rank, output["stderr"][-3000:])
    assert re.findall(r"saved \S+ \((.*?)\)", ranks[0]["stdout"]) == ["stopped by SIGTERM after iteration 2"], \
        ranks[0]["stdout"][-3000:]
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2
    assert "--init_from=resume" in ranks[0]["stdout"] and ranks[1]["stdout"] == ""  # only rank 0 speaks
    resume = next(line for line in ranks[0]["stdout"].splitlines() if line.startswith("resume with: "))
    assert resume.startswith(f"resume with: torchrun --standalone --nproc_per_node=2 --log-dir={logs} --redirects=3 "
                             f"{os.path.relpath(worker, ROOT)} "), resume  # torchrun's own options, then the script


def torchrun_train(tmp_path, data_dir, *args, script="train.py"):
    """A torchrun job of 2 ranks (gloo) training with script, started (not waited for); its logs dir. Eager:
    what these tests time is the stop, not a compile."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
           "--redirects=3", str(script), *TINY, "--optimizer=adamw", "--compile=false", f"--data_dir={data_dir}",
           f"--out_dir={tmp_path / 'out'}", "--eval_interval=100000", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=TORCHRUN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), logs


def rank_logs(logs, name):
    return [next(logs.rglob(f"{rank}/{name}.log")).read_text() for rank in (0, 1)]


def test_under_torchrun_the_clock_stops_the_ranks_whatever_log_interval_is(tmp_path, data_dir):
    """No log line in the run at all: the ranks still agree on the clock every few seconds (and more
    often as max_seconds nears), so the run stops at 3 s of training, not at its last iteration."""
    proc, logs = torchrun_train(tmp_path, data_dir, "--max_seconds=3", "--max_iters=1000000", "--log_interval=1000000")
    proc.communicate(timeout=120)
    assert proc.returncode == 0, rank_logs(logs, "stderr")
    done = re.search(r"done: (\d+) iterations in ([\d.]+) s of training", rank_logs(logs, "stdout")[0])
    # within two seconds of it: the schedule's own arithmetic near the end is test_distributed's; here a step
    # slowed by the other tests on a 2-core machine carried one run to 3.6 s (a machine's minute can halve its
    # speed). The ranks stop on the largest of their clocks, and rank 0's own, which its line reports, may be
    # behind it (2.9 s, with the other tests)
    assert done and 2.5 <= float(done.group(2)) < 5 and int(done.group(1)) < 1000000, rank_logs(logs, "stdout")[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc to know that the workers train")
def test_sigterm_to_torchrun_saves_says_how_to_resume_and_frees_the_out_dir(tmp_path, data_dir):
    """A SIGTERM to torchrun itself (which passes it to its workers), with no log line due: within
    seconds rank 0 saves, prints a resume command that starts with torchrun, and releases the lock."""
    proc, logs = torchrun_train(tmp_path, data_dir, "--max_iters=1000000", "--log_interval=1000000")
    try:
        deadline = time.time() + 60
        workers = []
        while not (len(workers) == 2 and all(catches(w, signal.SIGTERM) for w in workers)) and time.time() < deadline:
            time.sleep(0.2)  # until both workers train: train.py's handler is in
            workers = children(proc.pid)
        assert len(workers) == 2 and all(catches(w, signal.SIGTERM) for w in workers), "the workers never trained"
        time.sleep(1)  # past the first agreements
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)  # torchrun's own grace before it SIGKILLs its workers
        except subprocess.TimeoutExpired:
            pytest.fail(f"the workers did not stop within 30 s of SIGTERM: {rank_logs(logs, 'stderr')}")
    finally:
        kill_quietly(proc)
    stdout = rank_logs(logs, "stdout")[0]
    assert re.search(r"^saved \S+ \(stopped by SIGTERM after iteration \d+\)$", stdout, re.M), stdout[-2000:]
    assert re.search(r"^resume with: torchrun --standalone --nproc_per_node=2 .*train\.py .*--init_from=resume$",
                     stdout, re.M), stdout[-2000:]
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt", "loss.png", "metrics.jsonl"], "the lock is released"
    assert all("Traceback" not in text for text in rank_logs(logs, "stderr"))


NAN_ON_RANK_1 = """
import os, sys
sys.path.insert(0, os.getcwd())
import model, train
from configurator import config_from_argv
forward, steps = model.GPT.forward, []

def nan_on_rank_1(self, idx, targets=None):  # the third step's loss, on rank 1's share alone: an overflow there
    logits, loss = forward(self, idx, targets)
    if self.training:
        steps.append(1)
        if os.environ["RANK"] == "1" and len(steps) == 3:
            loss = loss * float("nan")
    return logits, loss

model.GPT.forward = nan_on_rank_1
train.main(config_from_argv(train.TrainConfig))
"""


@pytest.mark.parametrize("where", ["every rank", "rank 1 alone"])
def test_under_torchrun_a_non_finite_loss_stops_every_rank_with_one_line(tmp_path, data_dir, where):
    """Each rank checks its own share's losses: one that became NaN on rank 1 alone was logged as the mean
    (rank 0 checked its own) and the run went on, to fail later on a false word."""
    if where == "every rank":
        proc, logs = torchrun_train(tmp_path, data_dir, "--learning_rate=1e9", "--warmup_iters=0", "--max_iters=1000",
                                    "--log_interval=1000000")
    else:
        (tmp_path / "nan_on_rank_1.py").write_text(NAN_ON_RANK_1)
        proc, logs = torchrun_train(tmp_path, data_dir, "--max_iters=6", "--log_interval=1",
                                    script=tmp_path / "nan_on_rank_1.py")
    _, launcher_stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    said, quiet = ([line for line in stderr.splitlines() if line.strip()] for stderr in rank_logs(logs, "stderr"))
    assert len(said) == 1 and re.match(r"error: the loss became (nan|inf) at iteration \d+", said[0]), said
    assert quiet == []  # rank 1 reached the same verdict; the machine's first process says it for both
    assert "exitcode: 1" in launcher_stderr  # a fault, not bad input
    if where == "rank 1 alone":
        assert said[0].startswith("error: the loss became nan at iteration 3;") and "(found by rank 1, on " in said[0]
        assert "iter 3:" not in rank_logs(logs, "stdout")[0]  # the NaN is not logged, as if it were a loss
        assert "NaN" not in (tmp_path / "out" / "metrics.jsonl").read_text()


def test_a_local_rank_left_in_the_environment_does_not_silence_errors(monkeypatch, capsys):
    """Only torchrun's workers past each machine's first stay quiet; a LOCAL_RANK left in a shell by another
    launcher is not one of them."""
    from configurator import fail
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit):
        fail("bad input")
    assert capsys.readouterr().err == "error: bad input\n"


@pytest.mark.parametrize("options, note", [
    (["--nproc_per_node=2"], ""),
    (["--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.1", "--nproc_per_node=1"],
     "  # on every machine, each with its own --node_rank"),
    (["--nnodes", "2", "--node-rank", "0"], "  # on every machine, each with its own --node_rank"),
    (["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400"], "  # on every machine"),
    (["--nnodes=1:4", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400"], "  # on every machine"),
    (["--nnodes=1", "--nproc_per_node=2"], ""),
    (["--nnodes=1", "--node_rank=0", "--nproc_per_node=2"], ""),  # a launch template's, on one machine
    (["--nnodes=1:1", "--nproc_per_node=2"], "")])
def test_the_resume_command_of_a_job_on_several_machines_says_it_runs_on_each(monkeypatch, options, note):
    """The command rank 0 prints copied its machine's --node_rank=0: run as printed on the others, each
    waited as a second node 0 (or failed with EADDRINUSE). It says that every machine runs it, with its own
    --node_rank where the launch gave one; a shell reads the note as a comment."""
    import distributed
    monkeypatch.setenv("RANK", "0")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "train.py"), "--init_from=resume"])
    monkeypatch.setattr(distributed, "torchrun_options", lambda: options)
    command = distributed.relaunch_command(["--init_from=resume"])
    assert command == shlex.join(["torchrun", *options, "train.py", "--init_from=resume"]) + note, command


def test_fail_and_the_resume_hint_take_torchrun_s_workers_by_the_sign_train_py_joins_a_group_on(monkeypatch, capsys):
    """RANK, which set_up reads: a launcher that gave RANK and LOCAL_RANK but not torchrun's other variables
    had train.py join a group while every worker printed each error line and the resume hint said
    `python train.py` (three checks, three variables)."""
    from configurator import fail
    from distributed import relaunch_command
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit):
        fail("bad input")
    assert capsys.readouterr().err == ""  # the machine's first worker says it
    assert relaunch_command(["--max_iters=5"]).startswith("torchrun --nproc_per_node=1 ")


def test_under_torchrun_bad_input_is_said_once(tmp_path, data_dir):
    """Every rank finds --batch_size=0 bad; the terminal shows the line once, not once per rank (torchrun's
    own report of a failed worker follows it: the launcher's, not train.py's)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--log-dir={tmp_path / 'logs'}", "train.py", *TINY, f"--data_dir={data_dir}",
           f"--out_dir={tmp_path / 'out'}", "--batch_size=0"]
    proc = subprocess.run(cmd, cwd=ROOT, env=TORCHRUN_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "exitcode: 2" in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "error: " in line] == [
        "error: batch_size must be at least 1, got 0"], proc.stderr
    assert not (tmp_path / "out").exists()


FAULT_ON_RANK_1 = """
import torch.distributed as dist
import train
real_step = train.train_step


def step(state, *args, **kwargs):  # a bug that only rank 1 meets
    if dist.get_rank() == 1 and state.iter_num == 3:
        raise RuntimeError("a fault on rank 1")
    return real_step(state, *args, **kwargs)


train.train_step = step
train.main(train.config_from_argv(train.TrainConfig))
"""


def test_ranks_started_with_different_settings_stop_with_one_line_before_training(tmp_path, data_dir):
    """One machine's command said --eval_interval=5 where the other's said 100000: the ranks evaluated at
    different iterations, each waiting in a collective the other never called, with no line at all; another
    --learning_rate had trained them apart in silence. Every rank now stops with one line that says what
    differs, before anything is written."""
    worker = tmp_path / "worker.py"
    worker.write_text(f"import os, runpy, sys\nsys.path.insert(0, {ROOT!r})\n"
                      "if os.environ['RANK'] == '1':  # as another machine's command line would say\n"
                      "    sys.argv.append('--eval_interval=5')\n"
                      f"runpy.run_path({str(Path(ROOT, 'train.py'))!r}, run_name='__main__')\n")
    proc, logs = torchrun_train(tmp_path, data_dir, "--max_iters=20", script=worker)
    try:
        proc.communicate(timeout=120)
    finally:  # a hang (as before) must not outlive the test
        proc.kill()
        proc.wait()
    said = [[line for line in log.splitlines() if line.strip()] for log in rank_logs(logs, "stderr")]
    host = socket.gethostname()
    assert proc.returncode != 0 and said[0] == [
        f"error: the processes of this torchrun job differ in --eval_interval: 100000 on rank 0 (on {host}), 5 on "
        f"rank 1 (on {host}); give every machine the same command (with values where auto or 0 lets each machine "
        "choose) and the same files: the data, and the checkpoint or GPT-2 weights it starts from (each machine reads "
        "its own copies)"] and said[1] == [], said
    assert not (tmp_path / "out").exists()


def test_when_a_rank_dies_of_a_fault_the_other_stops_at_once_with_one_line(tmp_path, data_dir):
    worker = tmp_path / "worker.py"
    worker.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + FAULT_ON_RANK_1)
    started = time.time()
    proc, logs = torchrun_train(tmp_path, data_dir, "--max_iters=1000000", "--log_interval=1000000", script=worker)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.time() - started < 60
    survivor, faulty = rank_logs(logs, "stderr")
    assert "RuntimeError: a fault on rank 1" in faulty  # a fault: its traceback is the bug report
    lines = [line for line in survivor.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: another process of this torchrun job stopped"), survivor
    assert lines[0].endswith("that process's log says why; nothing was saved"), survivor  # before the first save


def children(pid):
    """The processes whose parent is pid (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def catches(pid, signum):
    """Process pid has a handler of its own for signum (Linux's /proc: the SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(mask >> (signum - 1) & 1)


def running(pid):
    """pid is a process that has not ended (a zombie has: it waits only to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_never_outlive_a_killed_torchrun(tmp_path, data_dir):
    proc, logs = torchrun_train(tmp_path, data_dir, "--max_iters=1000000", "--log_interval=1000000")
    try:
        deadline = time.time() + 60
        while not (tmp_path / "out" / ".lock").exists() and time.time() < deadline:
            time.sleep(0.2)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        proc.kill()  # SIGKILL: torchrun cannot pass anything on
        proc.communicate(timeout=30)
        deadline = time.time() + 10
        while any(map(running, workers)) and time.time() < deadline:
            time.sleep(0.1)
        alive = [w for w in workers if running(w)]
    finally:
        kill_quietly(proc)
    for w in alive:
        os.kill(w, signal.SIGKILL)
    assert not alive, "workers outlived torchrun"


def test_under_torchrun_a_check_only_rank_0_makes_stops_every_rank_with_one_line(tmp_path, data_dir):
    """out_dir is rank 0's to check and write; when it cannot be written, every rank stops with exit
    status 2, rather than the others dying in a collective, and the machine's first process says why."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
           "--redirects=3", "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={blocker / 'out'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=TORCHRUN_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    said, quiet = ([line for line in next(logs.rglob(f"{rank}/stderr.log")).read_text().splitlines() if line.strip()]
                   for rank in (0, 1))
    assert len(said) == 1 and said[0].startswith("error: cannot write to out_dir") and quiet == [], (said, quiet)
    assert "exitcode: 2" in proc.stderr, proc.stderr[-2000:]  # torchrun's report of the failed workers


# ---- F. non-finite loss -------------------------------------------------------------------------

def test_non_finite_loss_stops_naming_the_iteration(tmp_path, data_dir, launch):
    out = tmp_path / "out"
    proc = launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--learning_rate=1e9",
                  "--warmup_iters=0", "--log_interval=1", "--eval_interval=1000", "--max_iters=50")
    assert proc.returncode > 0, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, describe(proc)
    line = single_error_line(proc)
    assert re.search(r"\b(nan|inf)\b", line), line  # lr 1e9 really does blow the loss up
    named = int(re.search(r"iteration (\d+)", line).group(1))
    finite = [int(n) for n in LOG_LINE.findall(proc.stdout)]  # iterations logged (log_interval=1) before it
    assert named == max(finite, default=0) + 1, f"named iteration {named}, but iterations {finite} were logged " \
                                                f"with finite losses\n{proc.stdout}"
    assert "done:" not in proc.stdout and named < 50


# ---- G. unwritable out_dir ----------------------------------------------------------------------

def test_unwritable_out_dir_is_reported_before_training(tmp_path, data_dir, launch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "out"
    before = snapshot(tmp_path, data_dir)
    proc = launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=5")
    assert proc.returncode == 2, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    line = single_error_line(proc)  # not "or free some space", which a full disk gets
    assert line == f"error: cannot write to out_dir='{out}': {blocker} is not a directory; pick another --out_dir", line
    assert not LOG_LINE.search(proc.stdout), "training started"
    assert snapshot(tmp_path, data_dir) == before


def test_full_disk_at_save_time_keeps_the_previous_checkpoint(tmp_path, data_dir):
    """Where no tmpfs can be mounted (not root), a file-size limit (RLIMIT_FSIZE) stands in for a full
    disk: the 1 MiB write probe passes, the ~20 MB checkpoint does not. Saving fails cleanly and the
    old checkpoint stays loadable. Where one can, the test with a real full disk below runs instead."""
    import resource
    (tmp_path / "probe").mkdir()
    if not mount_tmpfs(tmp_path / "probe", "1m"):
        subprocess.run(["umount", str(tmp_path / "probe")], check=True)
        pytest.skip("a tmpfs can be mounted here: test_a_full_disk_keeps_the_last_checkpoint... runs on a real one")
    out = tmp_path / "out"
    wide = [*TINY, "--n_embd=256", "--n_head=4", "--n_layer=2", "--optimizer=adamw", f"--data_dir={data_dir}",
            f"--out_dir={out}", "--eval_interval=2", "--log_interval=1"]
    first = subprocess.run([sys.executable, "train.py", *wide, "--max_iters=2"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, describe(first)
    before = (out / "ckpt.pt").read_bytes()
    assert len(before) > 8 << 20

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    full = subprocess.run([sys.executable, "train.py", *wide, "--init_from=resume", "--max_iters=6"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert full.returncode == 1, describe(full)
    assert "Traceback" not in full.stdout + full.stderr, describe(full)
    assert full.stdout.count("warning: could not write") == 1  # the evaluation at iteration 4: training went on
    assert re.search(r"^iter 6: loss", full.stdout, re.M), "training did not go on after the failed save"
    line = single_error_line(full)  # the final save at iteration 6
    assert "could not write" in line and "iteration 6" in line and "previous checkpoint" in line, line
    assert (out / "ckpt.pt").read_bytes() == before
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2
    assert [name for name in os.listdir(out) if name.startswith(".ckpt.pt.tmp")] == []


def test_a_resume_whose_metrics_cannot_be_read_warns_once_and_trains(tmp_path, data_dir, launch, trained):
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").mkdir()  # neither read back nor written
    proc = launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--init_from=resume",
                  "--max_iters=4", "--log_interval=1")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, describe(proc)
    assert proc.stdout.count("warning: could not record the metrics") == 1, proc.stdout
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 4


def test_the_log_goes_down_a_pipe_line_by_line(tmp_path, data_dir):
    """python train.py | tee run.log, in a user's shell (no PYTHONUNBUFFERED): each log line reaches the
    reader as it is printed. A pipe's block buffer had held them until 8 KB of log, minutes of a run."""
    shell_env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}",
                             "--max_iters=1000000", "--max_seconds=30", "--log_interval=200",
                             "--eval_interval=1000000"],
                            cwd=ROOT, env=shell_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started, lines = time.time(), []
        while not (lines and lines[-1].startswith("iter 200:")) and proc.poll() is None:
            lines.append(proc.stdout.readline())
        # 200 steps take a few seconds; a block buffer held the line until the run's 30 s were over
        assert time.time() - started < 20, f"the first log line came only as the run ended: {lines}"
    finally:
        kill_quietly(proc)


def test_a_character_stdout_cannot_encode_is_written_as_an_escape(tmp_path, launch, monkeypatch, capsys):
    """A character of a sample that stdout's encoding lacks (cp1252, a file's on Windows; ASCII under a C
    locale): an escape and one note saying how to write it as it is, not a traceback mid-sample."""
    import io

    import sample
    data, out = tmp_path / "data", tmp_path / "out"
    prepare_char(TEXT + "\u03bb", str(data))
    assert launch("train.py", *TINY, f"--data_dir={data}", f"--out_dir={out}", "--max_iters=2",
                  "--eval_interval=2").returncode == 0
    written = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written, encoding="cp1252", write_through=True))
    sample.main(sample.SampleConfig(out_dir=str(out), start="Speak \u03bb", max_new_tokens=20, device="cpu"))
    samples = written.getvalue().decode("cp1252").split("---------------\n")
    assert [s[:len("Speak \\u03bb")] for s in samples] == ["Speak \\u03bb"] * 2 + [""], samples
    assert capsys.readouterr().err == ("note: stdout's encoding, cp1252, lacks characters written here: they are "
                                       "written as escapes (\\u2019); PYTHONIOENCODING=utf-8 writes them as they "
                                       "are\n")


def test_a_reader_of_stdout_that_leaves_stops_the_run_after_a_save(tmp_path, data_dir):
    """python train.py | head -1: once the reader has gone, the run stops as on a signal (SIGPIPE),
    saves, and exits 128 + SIGPIPE, as a Unix tool does; no BrokenPipeError."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}",
                             "--max_iters=100000", "--log_interval=1", "--eval_interval=100000"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # as head -1 does
        proc.wait(timeout=60)
        stderr = proc.stderr.read()
    finally:
        kill_quietly(proc)
    assert "parameters" in first
    assert proc.returncode == 128 + signal.SIGPIPE and "Traceback" not in stderr and "Broken" not in stderr, stderr
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] >= 1 and not (out / ".lock").exists()


@pytest.mark.parametrize("script", ["train.py", "data/prepare.py"])  # both through configurator.load_config
def test_help_to_a_reader_that_has_left_ends_quietly(script):
    """python train.py --help | head -1, with head gone before the help is written: exit 128 + SIGPIPE
    and nothing on stderr, not a BrokenPipeError's traceback."""
    reader, writer = os.pipe()
    os.close(reader)  # a pipe nobody reads: the first write fails
    try:
        proc = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=ENV, stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 128 + signal.SIGPIPE and proc.stderr == "", proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full: a file that is always full")
@pytest.mark.parametrize("script", ["sample.py", "data/prepare.py"])
def test_help_to_a_full_disk_is_one_line(script):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=ENV, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr == "error: could not write the help to stdout: No space left on " \
        "device\n", proc.stderr


def sample_py_streaming(out_dir, *python):
    """`python sample.py` from out_dir/ckpt.pt writing a million tokens, run by python (the arguments
    before the script), once it has streamed its first ten bytes: (the process, those bytes)."""
    proc = subprocess.Popen([sys.executable, *python, "sample.py", f"--out_dir={out_dir}", "--device=cpu",
                             "--num_samples=1", "--max_new_tokens=1000000"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        return proc, proc.stdout.read(10)
    except BaseException:
        kill_quietly(proc)
        raise


def test_a_reader_of_sample_py_that_leaves_stops_it_quietly(trained):
    """python sample.py | head -c 10: once the reader has gone, sampling stops at once and exits
    128 + SIGPIPE, as a Unix tool does; no BrokenPipeError, nothing on stderr."""
    proc, first = sample_py_streaming(trained)
    try:
        proc.stdout.close()  # as head does
        proc.wait(timeout=60)  # the million tokens would take far longer
        stderr = proc.stderr.read().decode()
    finally:
        kill_quietly(proc)
    assert len(first) == 10
    assert proc.returncode == 128 + signal.SIGPIPE and stderr == "", stderr


@pytest.mark.parametrize("script", ["train.py", "sample.py"])
def test_a_closed_stdout_is_one_line_before_anything_is_written(tmp_path, data_dir, trained, script):
    """python train.py 1>&- (or sample.py): the first print was a traceback, after the run had set up
    (sample.py's attention picture already written)."""
    out = tmp_path / "out" if script == "train.py" else trained
    args = [*TINY, f"--data_dir={data_dir}"] if script == "train.py" else ["--device=cpu"]
    proc = subprocess.run([sys.executable, script, *args, f"--out_dir={out}"], cwd=ROOT, env=ENV,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2 and proc.stderr == "error: stdout is closed (1>&-); send it to a file, or to " \
                                                   "/dev/null\n", proc.stderr
    assert script == "sample.py" or not out.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full: a file that is always full")
@pytest.mark.parametrize("script", ["train.py", "eval_only", "sample.py"])
def test_a_full_stdout_before_training_is_one_line(tmp_path, data_dir, trained, script):
    """python train.py > file on a full disk (sample.py, or an evaluation alone): an OSError's traceback;
    before training there is nothing to save, so the run ends in one line, not 0 (eval_only's was 0), and
    leaves no empty out_dir behind."""
    args = {"train.py": ["train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}"],
            "eval_only": ["train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={trained}", "--init_from=resume",
                          "--eval_only=true"],
            "sample.py": ["sample.py", f"--out_dir={trained}", "--device=cpu"]}[script]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    what = "the samples " if script == "sample.py" else ""
    assert proc.returncode == 1 and proc.stderr == f"error: could not write {what}to stdout: No space left on " \
                                                   "device\n", proc.stderr
    assert script != "train.py" or not (tmp_path / "out").exists()


def test_a_stdout_that_fills_up_while_training_stops_the_run_after_a_save(tmp_path, data_dir):
    """The disk under `python train.py > run.log` fills up mid-run: the OSError's traceback lost the work since
    the last evaluation. Now the run stops as on a signal, saving first, and says the rest (where it saved,
    how to resume) on stderr."""
    (tmp_path / "small").mkdir()
    cannot = mount_tmpfs(tmp_path / "small", "64k")
    if cannot:
        pytest.skip(cannot)
    out = tmp_path / "out"
    try:
        with open(tmp_path / "small" / "run.log", "w") as log:
            train = subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}",
                                    "--max_iters=1000000", "--eval_interval=1000000", "--log_interval=1"], cwd=ROOT,
                                   env=ENV, stdout=log, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        subprocess.run(["umount", str(tmp_path / "small")])
    assert train.returncode == 128 + signal.SIGPIPE and train.stderr.startswith(
        "warning: the log cannot be written to stdout (No space left on device); the run stops as on a signal, "
        "after a save, and says the rest here\n"), train.stderr
    assert f"saved {out / 'ckpt.pt'} (stopped by SIGPIPE" in train.stderr and "\nresume with: " in train.stderr
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] > 100 and not (out / ".lock").exists()


def test_an_attention_page_whose_maps_a_browser_leaves_blank_is_refused():
    """Each small map is a canvas as wide as the text is long: past the browser's limit it is blank, and the page
    said nothing (a 20,020-token page of the default model: 84 MB, under the byte limit, every map empty)."""
    import sample
    from attention_map import PAGE_MAX_TOKENS
    config = GPTConfig(vocab_size=65, block_size=8, n_layer=1, n_head=1, n_embd=8)
    sample.check_page_size(config, PAGE_MAX_TOKENS - 10, 10)
    with pytest.raises(ValueError, match=rf"^an attention page over {PAGE_MAX_TOKENS + 1:,} tokens \(16,000 of the "
                                         r"prompt\) would draw each map .* which a browser leaves blank"):
        sample.check_page_size(config, 16_000, PAGE_MAX_TOKENS + 1 - 16_000)


def test_an_attention_page_too_large_to_open_is_one_line_before_the_work(trained, tmp_path, monkeypatch, capsys):
    """A long --start=FILE: prompt made a page of hundreds of MB (3 GB of memory, a minute) that no browser
    opens well: refused at once, with its size. Here the limit is lowered to what the default prompt's
    page takes, and the prompt made longer."""
    import attention_map
    import sample
    config = load_checkpoint(str(trained / "ckpt.pt"))["model_config"]
    monkeypatch.setattr(sample, "PAGE_MAX_BYTES", attention_map.page_bytes(GPTConfig(**config), 1 + 20))
    cfg = dict(out_dir=str(trained), device="cpu", max_new_tokens=20, attention_map=str(tmp_path / "a.html"))
    sample.main(sample.SampleConfig(**cfg))  # the default prompt: one token
    assert (tmp_path / "a.html").exists()
    with pytest.raises(SystemExit) as exit:
        sample.main(sample.SampleConfig(**{**cfg, "attention_map": str(tmp_path / "b.html")}, start="\n\n"))
    err = capsys.readouterr().err
    assert exit.value.code == 2 and re.fullmatch(r"error: an attention page over 22 tokens \(2 of the prompt\) would "
                                                 r"be ~[\d.,]+ MiB, more than a browser opens well "
                                                 r".*or draw a picture \(\.png\) of the prompt's last window, which "
                                                 r"continues nothing\n", err), err  # a picture draws no new tokens
    assert not (tmp_path / "b.html").exists()


def test_ctrl_c_while_sample_py_loads_its_model_is_one_line(trained, monkeypatch, capsys):
    """Ctrl-C while the weights or the tokenizer load (seconds for GPT-2's): one line, exit 128 + SIGINT."""
    import sample

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(sample, "load_model", interrupted)
    with pytest.raises(SystemExit) as stopped:
        sample.main(sample.SampleConfig(out_dir=str(trained), device="cpu"))
    assert stopped.value.code == 128 + signal.SIGINT and capsys.readouterr().err == "error: stopped by Ctrl-C\n"


def test_sample_py_out_of_memory_is_one_line(trained, monkeypatch, capsys):
    """sample.py's size check reads the machine's memory; under a lower limit (ulimit -v, a container) the
    sampling itself can fail to allocate: one line naming what to lower, exit 1, not torch's traceback."""
    import sample
    from model import GPT

    def forward_that_runs_out(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 768000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(GPT, "forward", forward_that_runs_out)
    with pytest.raises(SystemExit) as stopped:
        sample.main(sample.SampleConfig(out_dir=str(trained), device="cpu", num_samples=3, max_new_tokens=7,
                                        start="All:"))
    out, err = capsys.readouterr()
    assert stopped.value.code == 1 and err == ("error: out of memory with 3 sample(s) of 11 tokens on cpu; ask for "
                                               "fewer --num_samples or --max_new_tokens\n"), err
    assert out.endswith("\n"), out  # the prompt echoed before it, ended: on a terminal the error has its own line


@pytest.mark.parametrize("name", ["attn.png", "attn.html"])
@pytest.mark.parametrize("error, there", [("ENOSPC", True), ("EPERM", False)], ids=["full-disk", "not-permitted"])
def test_an_attention_map_that_cannot_be_written_keeps_the_old_one(trained, tmp_path, monkeypatch, capsys, name,
                                                                   error, there):
    """A full disk while the map is written: the file that was there stays whole, no temporary file is
    left, and the run says so in one line (the picture had been written in place: a 0-byte attn.png).
    A file it may not write where none was: no word of a kept file, or of space."""
    import errno
    import os

    import files
    import sample
    path = tmp_path / name
    if there:
        path.write_text("the map of an earlier run")
    real_fsync = os.fsync
    code = getattr(errno, error)

    def cannot(fd):
        real_fsync(fd)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(files.os, "fsync", cannot)
    with pytest.raises(SystemExit) as stopped:
        written = {"max_new_tokens": 3} if name.endswith(".html") else {}  # a picture writes none
        sample.main(sample.SampleConfig(out_dir=str(trained), device="cpu", attention_map=str(path), **written))
    err = capsys.readouterr().err
    said = (f"error: could not write {path}: No space left on device; the file that was there is kept; free some "
            "space or pick another place\n" if there else
            f"error: could not write {path}: Operation not permitted; pick another place\n")
    assert stopped.value.code == 1 and err == said, err
    assert os.listdir(tmp_path) == ([name] if there else [])
    assert not there or path.read_text() == "the map of an earlier run"


def test_ran_out_of_memory_knows_every_allocators_error_and_nothing_else():
    from hardware import ran_out_of_memory
    assert all(ran_out_of_memory(e) for e in [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 65536000000 bytes"),
        RuntimeError("MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 1.00 GB)")])
    assert not any(ran_out_of_memory(e) for e in [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("out of memory is not said this way")])


def test_ctrl_c_while_sample_py_streams_is_one_line(trained):
    """Ctrl-C while sample.py writes: the line being written ends, then one line on stderr, exit 128 + SIGINT."""
    # Ctrl-C as a terminal delivers it, even where the shell that started the tests ignores SIGINT
    proc, _ = sample_py_streaming(trained, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, "
                                  "signal.default_int_handler); sys.argv = sys.argv[1:]; "
                                  "runpy.run_path(sys.argv[0], run_name='__main__')")
    try:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc)
    assert proc.returncode == 128 + signal.SIGINT and stdout.endswith(b"\n"), (proc.returncode, stderr)
    assert stderr.decode().splitlines() == ["error: stopped by Ctrl-C"]


# A preparation that works in short slices, as a real one runs Python: the kernel may hand a Ctrl-C to
# any of the process's threads (torch's included), and then one long sleep in the main thread never
# sees it; a Python loop does, at its next instruction.
SLOW_PREPARATION = """
import signal, sys, time
import data.shakespeare, train
# Ctrl-C as a terminal delivers it, even where the shell that started the tests ignores SIGINT (a
# background job does), which the child would otherwise inherit
signal.signal(signal.SIGINT, signal.default_int_handler)
train.prepare_default_corpus = lambda out_dir: (print("preparing", flush=True),
                                                [time.sleep(0.05) for _ in range(1200)])
train.main(train.config_from_argv(train.TrainConfig))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_stop_while_the_default_corpus_is_prepared_is_one_line(tmp_path, sig):
    """Ctrl-C, or SIGTERM (a scheduler's, `timeout`'s), during the first run's preparation: one line, and
    the exit status names the signal that came (128 + it), as a shell or a scheduler reads it."""
    (tmp_path / "worker.py").write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + SLOW_PREPARATION)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), "--device=cpu"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Lines(proc)
    try:
        lines.wait_for(r"^preparing$")
        proc.send_signal(sig)
        rc, _, stderr = lines.finish()
    finally:
        kill_quietly(proc)
    assert rc == 128 + sig and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == [
        "error: interrupted while preparing data/shakespeare_char; it holds no data yet: run again to prepare it"]


# Ctrl-C landing while building the model first imports torch's compiler (torch._dynamo, torch._inductor), as
# a finder that raises KeyboardInterrupt there makes it land every time
CTRL_C_AMID_LAZY_IMPORTS = """
import runpy, sys
sys.path.insert(0, ".")  # the repository, as `python train.py` there has it
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("torch._inductor."):
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_ctrl_c_amid_torchs_lazy_imports_is_one_line(tmp_path, data_dir):
    """The half-imported compiler made the cleanup's own call fail: after the right line, a traceback ending in
    an ImportError, exit status 1, and the out_dir's lock never given back."""
    (tmp_path / "worker.py").write_text(CTRL_C_AMID_LAZY_IMPORTS)
    out = tmp_path / "runs" / "out"
    proc = subprocess.run([sys.executable, str(tmp_path / "worker.py"), *TINY, f"--data_dir={data_dir}",
                           f"--out_dir={out}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGINT and proc.stderr == (
        "error: interrupted before training started; nothing was trained\n"), describe(proc)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_while_the_model_compiles_is_one_line_and_leaves_no_out_dir(tmp_path, data_dir, signum):
    """SIGTERM (a job scheduler's, `timeout`'s) or a hang-up before training starts, here while torch.compile works
    for half a minute: nothing to save, so one line, 128 + the signal, and the out_dir made for this run and its
    lock taken away. It ended the process at once: no word, and an out_dir holding a .lock."""
    slow_compile = ("import sys, time\nimport train\n"
                    "def compile_model(model, cfg, setup, optimizers):\n    print('compiling', flush=True)\n"
                    "    for _ in range(1200):\n        time.sleep(0.05)\n"
                    "train.compile_model = compile_model\ntrain.main(train.config_from_argv(train.TrainConfig))\n")
    (tmp_path / "worker.py").write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + slow_compile)
    out = tmp_path / "runs" / "out"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), *TINY, f"--data_dir={data_dir}",
                             f"--out_dir={out}", "--compile=true"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Lines(proc)
    try:
        lines.wait_for(r"^compiling$")
        assert (out / ".lock").exists()
        proc.send_signal(signum)
        rc, _, stderr = lines.finish()
    finally:
        kill_quietly(proc)
    assert rc == 128 + signum and stderr == "error: interrupted before training started; nothing was trained\n"
    assert not (tmp_path / "runs").exists()


def test_under_torchrun_sigterm_before_training_still_ends_the_rank_at_once(monkeypatch):
    """A rank that took torchrun's SIGTERM as an interrupt went on to the group's last barrier, where its peers,
    compiling or in DDP's set-up, never came: the job hung until torchrun's SIGKILL. Under torchrun SIGTERM
    keeps its default until training starts (where the ranks agree on it)."""
    import train
    before = signal.getsignal(signal.SIGTERM)
    for torchrun, interrupts in ((False, True), (True, False)):
        if torchrun:
            monkeypatch.setenv("RANK", "1")
        stop = train.StopRequest()
        stop.watch()
        try:
            assert (signal.getsignal(signal.SIGTERM) is not before) == interrupts, torchrun
        finally:
            stop.release()
        assert signal.getsignal(signal.SIGTERM) == before


def test_the_default_corpus_is_prepared_however_its_folder_is_spelled(tmp_path):
    """--data_dir=data/shakespeare_char/ (a shell's completion adds the slash) is the default corpus's folder,
    prepared on a first run as the default is, not an own-data folder that was never prepared."""
    worker = (f"import sys\nsys.path.insert(0, {ROOT!r})\nimport train\n"
              "def stub(out_dir):\n    print('preparing', out_dir, flush=True)\n    raise ValueError('stub')\n"
              "train.prepare_default_corpus = stub\ntrain.main(train.config_from_argv(train.TrainConfig))\n")
    (tmp_path / "worker.py").write_text(worker)
    proc = subprocess.run([sys.executable, str(tmp_path / "worker.py"), "--device=cpu",
                           "--data_dir=data/shakespeare_char/"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert "preparing data/shakespeare_char/" in proc.stdout and proc.stderr == "error: stub\n", proc.stderr


def test_a_default_corpus_folder_that_cannot_be_made_is_one_line_naming_data_dir(tmp_path):
    """train.py prepares the default corpus itself on a first run: where a file stands in the folder's place,
    that was Python's "[Errno 17] File exists", and a full disk's line told train.py's user to pick another
    --out_dir (prepare.py's flag, train.py's checkpoint folder)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shakespeare_char").write_text("not a folder")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--device=cpu"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == (
        "error: cannot write to data_dir='data/shakespeare_char': data/shakespeare_char is not a directory; pick "
        "another --data_dir\n"), proc.stderr


@pytest.mark.parametrize("unwritable", [("metrics.jsonl", "loss.png"), ("loss.png",)], ids=["both", "picture"])
def test_unwritable_metrics_and_picture_warn_once_and_training_goes_on(tmp_path, data_dir, launch, unwritable):
    out = tmp_path / "out"
    out.mkdir()
    for name in unwritable:  # a folder in the way: the side output cannot be written
        (out / name).mkdir()
    proc = launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=4",
                  "--eval_interval=2", "--log_interval=1")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.count("warning: could not record the metrics") == 1, proc.stdout
    assert re.search(r"^iter 4: loss", proc.stdout, re.M) and load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 4


def test_a_lock_left_by_a_killed_run_names_the_run_that_holds_it_now(tmp_path):
    """A SIGKILLed run leaves its .lock (the kernel drops the flock, not the file); the next run takes it and
    writes its own host and pid over it: a longer one left behind ran into the message ("process 26145onger-")."""
    import socket

    from checkpoint import lock_out_dir, unlock_out_dir
    (tmp_path / ".lock").write_text("a-much-longer-hostname-of-a-killed-run 4194301")
    lock_out_dir(str(tmp_path))
    try:
        with pytest.raises(ValueError) as refused:
            lock_out_dir(str(tmp_path))  # a second run's try: flock refuses another open file, this process's too
    finally:
        unlock_out_dir(str(tmp_path))
    assert str(refused.value).startswith(f"{tmp_path} is in use by process {os.getpid()} on {socket.gethostname()} "
                                         f"(see {tmp_path / '.lock'});"), refused.value
    # once it has ended, its checkpoint refuses a new run there: the line says how to go on from it
    assert "wait for that run to end (then continue it with --init_from=resume)" in str(refused.value)


def test_an_out_dir_belongs_to_one_run_at_a_time(tmp_path, data_dir, launch):
    """A second run on an out_dir in use stops with one line naming the first; once the first has
    ended the out_dir is free again, and a lock left by a killed run is taken over."""
    out = tmp_path / "out"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--log_interval=1", "--eval_interval=100000"]
    first, lines = start_long_run(args)
    try:
        second = launch("train.py", *args, "--max_iters=5")  # the first has no checkpoint yet
        first.send_signal(signal.SIGINT)
        rc, _, _ = lines.finish()
    finally:
        kill_quietly(first)
    assert second.returncode == 2 and "Traceback" not in second.stderr, describe(second)
    line = single_error_line(second)
    assert f"in use by process {first.pid} on {socket.gethostname()}" in line, line
    assert rc == 128 + signal.SIGINT and not (out / ".lock").exists(), "the first run gave its out_dir back"
    stopped_at = load_checkpoint(str(out / "ckpt.pt"))["iter_num"]
    (out / ".lock").write_text(f"{socket.gethostname()} {first.pid}")  # as if it had been killed mid-run
    resumed = launch("train.py", *args, "--init_from=resume", f"--max_iters={stopped_at + 1}")
    assert resumed.returncode == 0, describe(resumed)
    assert not (out / ".lock").exists()


@pytest.mark.parametrize("blocker", ["a directory", "a dangling link"])
def test_something_in_the_way_of_the_lock_is_one_line(tmp_path, blocker):
    """Where out_dir/.lock cannot be a file, the refusal says so and what to do, not Python's "[Errno 21]"."""
    import checkpoint
    lock = tmp_path / ".lock"
    lock.mkdir() if blocker == "a directory" else lock.symlink_to(tmp_path / "gone" / "lock")
    with pytest.raises(ValueError, match=rf"^cannot lock out_dir='{tmp_path}': {lock} cannot be opened as a file "
                                         r"\((Is a directory|No such file or directory)\); remove it, or pick another "
                                         r"--out_dir$"):
        checkpoint.lock_out_dir(str(tmp_path))


@pytest.mark.parametrize("refusal", [errno.ENOLCK, errno.ENOSYS])
def test_a_filesystem_without_locks_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, refusal):
    """exFAT, FAT and some network filesystems take no flock (Lustre without -o flock: ENOSYS): "[Errno 37] No locks
    available" had named no file and no fix, and left out_dir with an empty .lock behind."""
    import checkpoint

    def no_locks(fd, operation):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    out = tmp_path / "usb" / "out"
    refused = rf"^cannot lock out_dir='{out}', which keeps a second run out of it: its filesystem takes no locks " \
              rf"\({os.strerror(refusal)}\); "
    with pytest.raises(ValueError, match=refused + "pick an --out_dir on a disk that takes them$"):
        checkpoint.claim_out_dir(str(out), 1000)
    assert os.listdir(tmp_path) == [], "the folders made for the run went again"
    out.mkdir(parents=True)  # a resume there: another --out_dir holds no checkpoint, a copy of this one does
    elsewhere = re.escape(f"copy it to a disk that takes them (cp -r {out} NEW) and resume there with --out_dir=NEW, "
                          "or evaluate it where it is with --eval_only=true") + "$"
    with pytest.raises(ValueError, match=refused + elsewhere):
        checkpoint.claim_out_dir(str(out), 1000, resuming=True)
    assert os.listdir(out) == [], "no .lock left behind"


def contend_for(out, index, barrier, results):
    """One of several processes that start on out together: try to lock it, say whether it could.
    Process i pauses 0.1 * (i + 1) s after reading the lock (as a busy machine can make a process
    pause), so a read-then-remove lock would let every one of them in, one after another."""
    import checkpoint
    real_read = checkpoint.read_lock
    checkpoint.read_lock = lambda path: (real_read(path), time.sleep(0.1 * (index + 1)))[0]
    barrier.wait()
    try:
        checkpoint.lock_out_dir(str(out))
        results.put("held")
        time.sleep(0.5)  # hold it while the others try
    except ValueError:
        results.put("refused")


def test_runs_that_find_a_stale_lock_at_once_never_both_take_it(tmp_path):
    """The lock is taken in one atomic step, never read-then-remove: of three processes that start
    together on an out_dir holding a killed run's .lock, exactly one holds it."""
    import multiprocessing
    context = multiprocessing.get_context("fork")
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        (out / ".lock").write_text(f"{socket.gethostname()} {2**22 + 12345}")  # a process that is not there
        barrier, results = context.Barrier(3), context.Queue()
        workers = [context.Process(target=contend_for, args=(out, i, barrier, results)) for i in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=30)
        assert sorted(results.get(timeout=5) for _ in workers) == ["held", "refused", "refused"], attempt


@pytest.fixture
def small_disk(tmp_path):
    """A 30 MB tmpfs: a real full disk. Mounting needs root (CI runs as root); elsewhere the test skips."""
    disk = tmp_path / "disk"
    disk.mkdir()
    why_not = mount_tmpfs(disk, "30m")
    if why_not:
        pytest.skip(why_not)
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_an_out_dir_on_a_full_disk_is_refused_and_not_left_behind(small_disk):
    """The write probe finds the disk full before training: one line, and the directories the check made
    for out_dir are gone again (an empty out_dir had been left on the full disk)."""
    from checkpoint import claim_out_dir
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=1M", "count=40"], capture_output=True)
    with pytest.raises(ValueError, match=r"cannot write to out_dir=.*: No space left on device; free some space or "
                                         r"pick another --out_dir$"):
        claim_out_dir(str(small_disk / "runs" / "first"), 0)
    assert os.listdir(small_disk) == ["filler"]


def test_an_out_dir_without_room_for_one_checkpoint_is_refused_before_training(small_disk):
    """A disk with room for the probe but not for one checkpoint: refused at the start, not after a whole
    run whose every save failed; a killed save's temporary file, holding the room, is cleared first (a
    resume had been refused for want of the space its own leftover took)."""
    from checkpoint import claim_out_dir, unlock_out_dir
    from files import temporary_path
    out = small_disk / "out"
    out.mkdir()
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=1M", "count=20"], capture_output=True)
    with pytest.raises(ValueError, match=r"^out_dir='.*' has [\d.]+ MB free, and a checkpoint of this model takes at "
                                         r"least 15\.0 MB \(its weights and optimizer state\); free some space, or "
                                         r"pick another --out_dir$"):
        claim_out_dir(str(out / "new"), 15_000_000)
    assert os.listdir(out) == []
    killed = temporary_path(str(out / "ckpt.pt"), 2**22 + 12345)  # a process that is not there
    os.rename(small_disk / "filler", killed)
    claim_out_dir(str(out), 15_000_000)
    unlock_out_dir(str(out))
    assert os.listdir(out) == []


def test_a_killed_save_s_file_is_cleared_first_whatever_pid_it_names(small_disk):
    """A killed save's temporary file that took the disk's last room: the write probe, before it was cleared,
    refused a resume for want of the space the leftover took; and one whose name gives a live process's pid
    (pids are reused: a container that starts again gives out its first ones again) was kept for ever. The
    lock's holder alone writes ckpt.pt, so every such file is stale."""
    from checkpoint import claim_out_dir, unlock_out_dir
    from files import temporary_path
    out = small_disk / "out"
    out.mkdir()
    killed = temporary_path(str(out / "ckpt.pt"), os.getpid())  # a live process's pid: this one's
    subprocess.run(["dd", "if=/dev/zero", f"of={killed}", "bs=1M", "count=40"], capture_output=True)
    assert os.path.getsize(killed) > 29_000_000  # the disk is full
    claim_out_dir(str(out), 1_000_000)
    unlock_out_dir(str(out))
    assert os.listdir(out) == []


def test_train_py_refuses_an_out_dir_without_room_for_its_checkpoint_before_training(small_disk, data_dir, launch):
    """The room train.py asks for is its model's: weights and one optimizer slot each (smallest_checkpoint),
    here ~12.9 MB where 6 MB are free. It trained to the end, each save failing, and lost the run."""
    from checkpoint import smallest_checkpoint
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    assert smallest_checkpoint(model) == 2 * 4 * sum(p.numel() for p in model.parameters())
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=1M", "count=24"], capture_output=True)
    proc = launch("train.py", *TINY, "--n_embd=256", "--n_head=4", "--n_layer=2", f"--data_dir={data_dir}",
                  f"--out_dir={small_disk / 'out'}", "--max_iters=4", "--eval_interval=2")
    assert proc.returncode == 2 and not LOG_LINE.search(proc.stdout), describe(proc)
    assert re.fullmatch(r"error: out_dir='.*' has [\d.]+ MB free, and a checkpoint of this model takes at least "
                        r"1\d\.\d MB \(its weights and optimizer state\); free some space, or pick another --out_dir",
                        single_error_line(proc)), describe(proc)
    assert os.listdir(small_disk) == ["filler"]


def test_a_stale_temporary_file_that_cannot_be_removed_is_left(tmp_path, monkeypatch):
    """Another user's killed save (no permission to remove it): left where it is, not a refused run."""
    import files
    stale = files.temporary_path(str(tmp_path / "ckpt.pt"), 2**22 + 12345)  # a process that is not there
    Path(stale).write_bytes(b"x")

    def refused(path):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(files.os, "remove", refused)
    files.clear_stale_temporaries(str(tmp_path / "ckpt.pt"))
    assert os.path.exists(stale)


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.EIO])
def test_a_folder_that_refuses_fsync_still_gets_the_file(tmp_path, monkeypatch, refusal):
    """SMB, sshfs and a VM's shared folders refuse a folder's fsync (EINVAL): the file, written, flushed and renamed,
    is whole, and a save there had been reported failed, "ckpt.pt still holds an earlier run's checkpoint". A disk's
    own failure (EIO) is still an error."""
    import stat

    import files
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(refusal, os.strerror(refusal))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    path = tmp_path / "ckpt.pt"
    if refusal == errno.EIO:
        with pytest.raises(OSError):
            files.atomic_write(str(path), lambda f: f.write(b"new"))
    else:
        files.atomic_write(str(path), lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_an_out_dir_in_the_data_folder_it_trains_on_is_its_own_however_spelt(tmp_path, monkeypatch):
    """A prepared folder may be the run's out_dir where the run trains on it, given through a link or as ./x/: the
    refusal of another corpus's folder had taken a link to the same folder for another."""
    from checkpoint import check_out_dir
    from files import same_folder
    prepare_char(TEXT, str(tmp_path / "data"))
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert same_folder("link", "data") and same_folder("./data/", str(tmp_path / "data"))
    assert not same_folder("data", str(tmp_path))
    check_out_dir("data/", resuming=False, overwrite=False, data_dir="link")
    with pytest.raises(ValueError, match="^out_dir='data/' holds prepared data"):
        check_out_dir("data/", resuming=False, overwrite=False, data_dir=str(tmp_path))


def test_a_checkpoint_saved_through_a_link_updates_its_target_and_keeps_the_link(tmp_path):
    """out_dir/ckpt.pt as a link to a file elsewhere (a larger disk): the save went onto the link itself, a
    regular file in its place on out_dir's disk, and the link's target kept the old iteration without a word."""
    from checkpoint import load_checkpoint, save_checkpoint
    (tmp_path / "big").mkdir()
    (tmp_path / "out").mkdir()
    save_checkpoint({"iter_num": 1}, str(tmp_path / "big" / "ckpt.pt"))
    os.symlink(tmp_path / "big" / "ckpt.pt", tmp_path / "out" / "ckpt.pt")
    save_checkpoint({"iter_num": 2}, str(tmp_path / "out" / "ckpt.pt"))
    assert os.path.islink(tmp_path / "out" / "ckpt.pt")
    assert load_checkpoint(str(tmp_path / "big" / "ckpt.pt"))["iter_num"] == 2
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.pt"] and sorted(os.listdir(tmp_path / "big")) == ["ckpt.pt"]


def test_a_run_refused_an_out_dir_in_use_leaves_the_other_runs_save_alone(tmp_path):
    """A temporary file whose pid is not alive here may be another machine's (or container's) save in
    progress: only the lock's holder clears one, and a run refused the lock touches none."""
    import checkpoint
    from files import temporary_path
    checkpoint.lock_out_dir(str(tmp_path))  # the other run's
    try:
        saving = temporary_path(str(tmp_path / "ckpt.pt"), 2**22 + 12345)  # no such process here
        Path(saving).write_bytes(b"half a checkpoint")
        with pytest.raises(ValueError, match="is in use by process"):
            checkpoint.claim_out_dir(str(tmp_path), 0)
        assert os.path.exists(saving)
    finally:
        checkpoint.unlock_out_dir(str(tmp_path))


def test_a_read_only_out_dir_to_resume_says_to_copy_it_not_to_pick_another(tmp_path, monkeypatch):
    """Another out_dir holds no checkpoint to resume: the fix for a read-only one is to copy it (or evaluate it
    where it is, which writes nothing); a new run's is still another folder."""
    import checkpoint
    import files

    def read_only(path, room=0):
        raise OSError(errno.EROFS, "Read-only file system", path)

    monkeypatch.setattr(files, "write_probe", read_only)
    with pytest.raises(ValueError, match=r"Read-only file system; copy it to a folder that can be written \(cp -r "
                                         r"'\S+/a run' NEW\) and resume there with --out_dir=NEW, or evaluate it "
                                         r"where it is with --eval_only=true$"):
        checkpoint.claim_out_dir(str(tmp_path / "a run"), 0, resuming=True)
    with pytest.raises(ValueError, match=r"Read-only file system; pick another --out_dir$"):
        checkpoint.claim_out_dir(str(tmp_path / "a run"), 0)


def test_an_out_dir_made_read_only_under_the_run_is_given_back_without_a_traceback(tmp_path, monkeypatch):
    """Its .lock cannot be removed: it stays, and the lock (the flock) goes with the file descriptor."""
    import checkpoint
    checkpoint.lock_out_dir(str(tmp_path))

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system", path)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint.os, "remove", read_only)
        checkpoint.unlock_out_dir(str(tmp_path))
    assert str(tmp_path) not in checkpoint.HELD_LOCKS
    checkpoint.lock_out_dir(str(tmp_path))  # free to take again
    checkpoint.unlock_out_dir(str(tmp_path))


def test_a_full_disk_keeps_the_last_checkpoint_and_training_goes_on(small_disk, data_dir, launch):
    """Each ~19 MB checkpoint fits once in 30 MB, not twice: the save at iteration 2 works, the one at
    4 fails with a warning while training goes on, the last one (6) fails the run with one line."""
    out = small_disk / "out"
    proc = launch("train.py", *TINY, "--n_embd=256", "--n_head=4", "--n_layer=2", "--optimizer=adamw",
                  f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=2",
                  "--log_interval=1")
    assert proc.returncode == 1, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.count("warning: could not write") == 1 and re.search(r"^iter 6: loss", proc.stdout, re.M)
    line = single_error_line(proc)
    assert "iteration 6" in line and "No space left on device" in line and "previous checkpoint" in line, line
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2
    assert sorted(os.listdir(out)) == ["ckpt.pt", "loss.png", "metrics.jsonl"]


# ---- H. bad input: exit 2, one line, no traceback, nothing written -------------------------------

@dataclass
class Ctx:
    dir: Path  # this case's own directory (out dirs, data dirs, files it needs)
    data: Path  # a good data dir, shared
    trained: Path  # a good out_dir with ckpt.pt, shared

    def ckpt_with(self, change):
        """A copy of the trained checkpoint, changed by change(ckpt), in a new out dir."""
        ckpt = torch.load(self.trained / "ckpt.pt", weights_only=True)
        change(ckpt)
        out = self.dir / "out"
        out.mkdir()
        torch.save(ckpt, out / "ckpt.pt")
        return out

    def gpt2_dir(self, files, config=None):
        """A local GPT-2 directory: config.json (a tiny GPT-2's, or config), and files: name -> bytes."""
        d = self.dir / "gpt2"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config or TINY_GPT2))
        for name, content in files.items():
            (d / name).write_bytes(content)
        return d

    def saved_gpt2(self, **config):
        """A local GPT-2 directory as transformers' save_pretrained writes it: a tiny GPT-2's, with config."""
        from transformers import GPT2Config, GPT2LMHeadModel
        d = self.dir / "gpt2"
        GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, **config})).save_pretrained(d)
        return d

    def broken_data(self, change):
        d = self.dir / "data"
        prepare_char(TEXT, str(d))
        change(d)
        return d


def train_args(c, *extra, data=None, out=None):
    return ["train.py", *TINY, f"--data_dir={data or c.data}", f"--out_dir={out or c.dir / 'out'}", "--max_iters=2",
            *extra]


def sample_args(c, *extra, out=None):
    return ["sample.py", f"--out_dir={out or c.trained}", "--device=cpu", "--max_new_tokens=5", *extra]


def _set(d, k, v):
    d[k] = v


@dataclass
class Case:
    id: str
    command: Callable  # Ctx -> [script, *args]
    fragments: Callable  # Ctx -> strings that must appear on stderr
    skip: str = ""
    extra: Callable = field(default=lambda c: None)  # Ctx -> None, more checks


FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
CUDA = torch.cuda.is_available()
OUTSIDE = "Zq7€"  # characters that are not in TEXT
TINY_GPT2 = {"vocab_size": 50257, "n_positions": 64, "n_layer": 1, "n_head": 2, "n_embd": 16}  # a config.json
assert not set(OUTSIDE) & set(TEXT)

CASES = [
    Case("unknown-key", lambda c: train_args(c, "--n_layr=2"), lambda c: ["'n_layr'", "n_layer"]),
    Case("wrong-type", lambda c: train_args(c, "--n_layer=two"), lambda c: ["n_layer", "'two'"]),
    Case("config-missing", lambda c: [*train_args(c), str(c.dir / "missing.toml")],
         lambda c: [str(c.dir / "missing.toml"), "not found"]),
    Case("config-a-directory", lambda c: [*train_args(c), str(c.dir)],
         lambda c: [f"config file '{c.dir}' is a directory; give a TOML file"]),
    Case("config-not-toml", lambda c: [*train_args(c), str(c.dir / "bad.toml")],
         lambda c: [str(c.dir / "bad.toml"), "TOML"]),
    Case("n_embd-not-divisible", lambda c: train_args(c, "--n_embd=30", "--n_head=4"),
         lambda c: ["n_embd=30", "n_head=4", "divisible"]),
    Case("unknown-attention", lambda c: train_args(c, "--attention=nope"), lambda c: ["attention", "'nope'"]),
    Case("data-dir-empty", lambda c: train_args(c, "--data_dir="),
         lambda c: ["data_dir is empty; give a folder (the default is --data_dir=data/shakespeare_char)"]),
    Case("out-dir-empty", lambda c: train_args(c, "--out_dir="), lambda c: ["out_dir is empty", "--out_dir=out"]),
    Case("sample-out-dir-empty", lambda c: sample_args(c, "--out_dir="), lambda c: ["out_dir is empty"]),
    Case("attention-fa2-unavailable", lambda c: train_args(c, "--attention=fa2"), lambda c: ["fa2", "flash-attn"],
         skip="flash-attn is installed" if FLASH_ATTN else ""),
    Case("device-cuda-unavailable", lambda c: train_args(c, "--device=cuda"), lambda c: ["cuda", "not available"],
         skip="CUDA is available" if CUDA else ""),
    Case("dtype-float16-on-cpu", lambda c: train_args(c, "--dtype=float16"), lambda c: ["float16", "CPU"]),
    Case("data-no-train-bin", lambda c: train_args(c, data=c.broken_data(lambda d: (d / "train.bin").unlink())),
         lambda c: ["train.bin", str(c.dir / "data")]),
    Case("data-odd-byte-count",
         lambda c: train_args(c, data=c.broken_data(lambda d: open(d / "train.bin", "ab").write(b"\0"))),
         lambda c: [str(c.dir / "data" / "train.bin"), "whole number"]),
    Case("vocab-size-smaller-than-data", lambda c: train_args(c, "--vocab_size=5"),
         lambda c: ["vocab_size=5", str(c.data), "--vocab_size=0"]),
    Case("block-size-larger-than-data", lambda c: train_args(c, "--block_size=100000"),
         lambda c: ["block_size=100000", "train.bin"]),
    Case("new-run-over-a-trained-checkpoint", lambda c: train_args(c, out=c.ckpt_with(lambda ck: None)),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "--init_from=resume", "--out_dir", "--overwrite=true"]),
    Case("resume-without-checkpoint", lambda c: (c.dir / "out").mkdir() or train_args(c, "--init_from=resume"),
         lambda c: ["no checkpoint", str(c.dir / "out" / "ckpt.pt")]),
    Case("resume-other-model-shape",
         lambda c: train_args(c, "--init_from=resume", "--n_embd=32", out=c.ckpt_with(lambda ck: None)),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "n_embd=16", "32"]),
    Case("resume-another-optimizer",
         lambda c: train_args(c, "--init_from=resume", "--optimizer=adamw", out=c.ckpt_with(lambda ck: None)),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "optimizer=muon (now adamw)", "resume with --optimizer=muon"]),
    Case("gpt2-weights-on-char-data", lambda c: train_args(c, "--init_from=gpt2"),
         lambda c: ["init_from='gpt2'", "BPE", "char"]),
    Case("meta-not-json", lambda c: train_args(c, data=c.broken_data(lambda d: (d / "meta.json").write_text("{no"))),
         lambda c: [str(c.dir / "data" / "meta.json"), "damaged"]),
    # nested deeper than Python's recursion limit: json raises RecursionError, not a ValueError
    Case("meta-nested-too-deep", lambda c: train_args(
        c, data=c.broken_data(lambda d: (d / "meta.json").write_text("[" * 100_000))),
         lambda c: [str(c.dir / "data" / "meta.json"), "damaged", "nested too deep"]),
    Case("meta-vocab_size-a-bool", lambda c: train_args(c, data=c.broken_data(lambda d: (d / "meta.json").write_text(
        json.dumps({**json.loads((d / "meta.json").read_text()), "vocab_size": True})))),
         lambda c: [str(c.dir / "data" / "meta.json"), "damaged", "integer vocab_size"]),
    Case("meta-unknown-tokenizer", lambda c: train_args(c, data=c.broken_data(lambda d: (d / "meta.json").write_text(
        '{"tokenizer": "sentencepiece", "vocab_size": 100}'))), lambda c: [str(c.dir / "data" / "meta.json"),
                                                                           "sentencepiece"]),
    Case("data-files-from-different-preparations", lambda c: train_args(c, data=c.broken_data(
        lambda d: open(d / "train.bin", "ab").write(b"\x60\xea"))),
         lambda c: [str(c.dir / "data" / "train.bin"), "meta.json says", "different preparations"]),
    # prepared before meta.json recorded the files: the one pass over them still finds the stray id
    # (the first id past the vocabulary: vocab_size itself)
    Case("tokens-outside-the-vocabulary-in-older-data", lambda c: train_args(c, data=c.broken_data(lambda d: (
        open(d / "train.bin", "ab").write(struct.pack("<H", json.loads((d / "meta.json").read_text())["vocab_size"])),
        (d / "meta.json").write_text(json.dumps(
            {k: v for k, v in json.loads((d / "meta.json").read_text()).items() if k != "splits"}))))),
         lambda c: [str(c.dir / "data" / "train.bin"), f"holds token id {len(set(TEXT))}, outside meta.json's "
                    f"vocabulary of {len(set(TEXT))}"]),
    Case("meta-splits-damaged", lambda c: train_args(c, data=c.broken_data(lambda d: (d / "meta.json").write_text(
        json.dumps({**json.loads((d / "meta.json").read_text()), "splits": {"train": {"tokens": "many"}}})))),
         lambda c: [str(c.dir / "data" / "meta.json"), "splits"]),
    Case("init_from-misspelled", lambda c: train_args(c, "--init_from=resum"),
         lambda c: ["init_from='resum'", "scratch, resume"]),
    Case("out_dir-is-a-file", lambda c: [(c.dir / "out").write_text("notes\n")] and train_args(c),
         lambda c: [f"out_dir='{c.dir / 'out'}' is a file, not a folder"]),
    Case("checkpoint-path-is-a-directory", lambda c: (c.dir / "out" / "ckpt.pt").mkdir(parents=True) or train_args(
        c, "--overwrite=true"), lambda c: [str(c.dir / "out" / "ckpt.pt"), "is a directory, not a checkpoint"]),
    Case("resume-rng-without-batches", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: ck["rng"].pop("batches"))), lambda c: [str(c.dir / "out" / "ckpt.pt"), "rng lacks batches"]),
    Case("resume-vocab_size-a-bool", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["model_config"], "vocab_size", True))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "model_config lacks vocab_size"]),
    Case("resume-empty-optimizer-state", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "optimizer", {}))), lambda c: ["the optimizer state lacks state"]),
    Case("resume-optimizer-state-of-another-model", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "optimizer", {"state": {}, "param_groups": []}))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged", "start a new run (--overwrite=true replaces it)"]),
    Case("resume-optimizer-this-code-lacks", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["config"], "optimizer", "lion"))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "optimizer='lion', which this code does not have",
                    "resume it with the code that wrote it"]),
    Case("resume-optimizer-groups-params-none", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: [_set(group, "params", None) for group in ck["optimizer"]["param_groups"]])),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged"]),
    Case("resume-config-a-list", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "config", []))), lambda c: ["config is list"]),
    Case("resume-model_config-without-vocab_size", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: ck["model_config"].pop("vocab_size"))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged", "model_config lacks vocab_size"]),
    Case("resume-iter_num-a-string", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "iter_num", "5"))), lambda c: ["iter_num is str"]),
    Case("resume-iter_num-negative", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "iter_num", -5))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged (iter_num is -5)"]),
    Case("resume-run_id-a-number", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "run_id", 7))), lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged (run_id is int)"]),
    Case("resume-trained_seconds-nan", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck, "trained_seconds", float("nan")))), lambda c: ["is damaged (trained_seconds is nan)"]),
    Case("resume-tokenizer-chars-a-number", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["tokenizer"], "chars", 5))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged (its tokenizer record: TypeError"]),
    Case("sample-tokenizer-unknown", lambda c: sample_args(c, out=c.ckpt_with(
        lambda ck: _set(ck["tokenizer"], "tokenizer", None))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged (its tokenizer record: ValueError: unknown tokenizer"]),
    Case("resume-on-its-own-data-dir-prepared-again", lambda c: train_args(
        c, "--init_from=resume", data=(prepare_char(TEXT.replace("a", "Z"), str(c.dir / "other")), c.dir / "other")[1],
        out=c.ckpt_with(lambda ck: _set(ck["config"], "data_dir", str(c.dir / "other") + "/"))),
         lambda c: [f"{c.dir / 'other'} was prepared again since: prepare it from the text the run was trained on",
                    f"--input=FILE --tokenizer=char --out_dir={c.dir / 'other'}`), or start a new run"]),
    Case("resume-rng-torch-empty", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["rng"], "torch", []))), lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged"]),
    Case("resume-rng-numpy-not-a-state", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["rng"], "numpy", [1, 2, 3]))), lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged"]),
    Case("sample-checkpoint-a-text-file", lambda c: [(c.dir / "out").mkdir(), (c.dir / "out" / "ckpt.pt").write_text(
        "hello world\n")] and sample_args(c, out=c.dir / "out"),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is not a checkpoint"]),
    Case("learning-rate-zero", lambda c: train_args(c, "--learning_rate=0"), lambda c: ["learning_rate", "positive"]),
    Case("resume-a-foreign-checkpoint", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: [ck.pop(k) for k in ("rng", "scaler", "trained_seconds")])), lambda c: ["lacks", "rng", "scaler"]),
    # as many distinct characters, other ones: the size of the vocabulary matches, the vocabulary does not
    Case("resume-on-other-data-of-the-same-vocabulary-size", lambda c: train_args(
        c, "--init_from=resume", data=(prepare_char(TEXT.replace("a", "Z"), str(c.dir / "other")), c.dir / "other")[1],
        out=c.ckpt_with(lambda ck: None)),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), str(c.dir / "other"), "only the checkpoint's has 'a'",
                    "only the data's has 'Z'", f"--data_dir={c.data}"]),
    Case("resume-with-another-optimizer", lambda c: train_args(c, "--init_from=resume", "--optimizer=adamw",
                                                               out=c.ckpt_with(lambda ck: None)),
         lambda c: ["optimizer=muon", "now adamw"]),
    # a value this code does not take (one a later version dropped, say) names the checkpoint, not a flag
    Case("resume-a-setting-this-code-does-not-take", lambda c: train_args(c, "--init_from=resume", out=c.ckpt_with(
        lambda ck: _set(ck["config"], "activation", "swish"))),
         lambda c: ["was trained with a setting this code does not take (unknown activation 'swish'"]),
    # GPT-2's weights on characters: how to prepare GPT-2's tokens, and to train on them (not over data_dir's)
    Case("init-from-gpt2-weights-on-character-data", lambda c: [
        (c.dir / "hf").mkdir(), (c.dir / "hf" / "config.json").write_text("{}"),
        *train_args(c, f"--init_from={c.dir}/hf")][2:],
         lambda c: ["holds char tokens; prepare such data with `python data/prepare.py --input=FILE --tokenizer=gpt2 "
                    "--out_dir=DIR` and give --data_dir=DIR"]),
    # a checkpoint's file as init_from: it had been asked of the hub as a model named out/ckpt.pt
    Case("init-from-a-checkpoint-file", lambda c: train_args(c, f"--init_from={c.trained / 'ckpt.pt'}"),
         lambda c: [f"init_from='{c.trained / 'ckpt.pt'}' is a file; GPT-2's weights are given as the folder that "
                    f"holds config.json and model.safetensors, and a checkpoint of train.py's as --init_from=resume "
                    f"--out_dir={c.trained}"]),
    Case("sample-init-from-a-text-file", lambda c: sample_args(c, f"--init_from={c.data / 'meta.json'}"),
         lambda c: [f"init_from='{c.data / 'meta.json'}' is a file; GPT-2's weights are given as the folder that "
                    "holds config.json and model.safetensors"]),
    Case("init-from-a-train-py-out-dir", lambda c: train_args(c, f"--init_from={c.trained}"),
         lambda c: ["is not GPT-2's weights: it holds train.py's ckpt.pt: give --init_from=resume "
                    f"--out_dir={c.trained}"]),
    Case("sample-init-from-a-train-py-out-dir", lambda c: sample_args(c, f"--init_from={c.trained}"),
         lambda c: ["is not GPT-2's weights: it holds train.py's ckpt.pt: give --init_from=resume "
                    f"--out_dir={c.trained}"]),
    # written before the code had `activation`: that model was GPT-2's tanh GELU, and another one given is refused
    Case("resume-a-checkpoint-older-than-a-model-setting", lambda c: train_args(
        c, "--init_from=resume", "--activation=gelu", out=c.ckpt_with(
            lambda ck: [ck["config"].pop("activation"), ck["model_config"].pop("activation")])),
         lambda c: ["activation=gelu_tanh (now gelu); resume with the same model settings (--activation=gelu_tanh) "
                    "and data"]),
    Case("sample-non-finite-checkpoint", lambda c: sample_args(c, out=c.ckpt_with(
        lambda ck: ck["model"]["lm_head.weight"].fill_(float("nan")))), lambda c: ["non-finite"]),
    Case("sample-attention-map-without-its-directory", lambda c: sample_args(c, f"--attention_map={c.dir}/no/a.png"),
         lambda c: [f"{c.dir}/no does not exist; make the folder, or pick another path"]),
    Case("sample-attention-map-under-a-file", lambda c: (c.dir / "plain").write_text("x") and sample_args(
        c, f"--attention_map={c.dir}/plain/a.png"), lambda c: [f"{c.dir}/plain is not a directory"]),
    Case("sample-attention-map-unknown-format", lambda c: sample_args(c, f"--attention_map={c.dir}/a"),
         lambda c: ["extension", ".png"]),
    # the checkpoint's own backend, not only --attention, is checked before the prompt is printed
    Case("sample-fa2-checkpoint-on-a-cpu", lambda c: sample_args(c, out=c.ckpt_with(
        lambda ck: _set(ck["model_config"], "attention", "fa2"))), lambda c: ["attention='fa2'"]),
    Case("sample-float16-on-a-cpu", lambda c: sample_args(c, "--dtype=float16"),
         lambda c: ["float16 is not supported on CPU", "--dtype=bfloat16"]),
    Case("sample-init_from-misspelled", lambda c: sample_args(c, "--init_from=gtp2"),
         lambda c: ["init_from='gtp2'", "gpt2-medium", "owner/model"]),
    Case("sample-gpt2-dir-with-torn-safetensors", lambda c: sample_args(
        c, f"--init_from={c.gpt2_dir({'model.safetensors': b'not weights'})}"),
         lambda c: [str(c.dir / "gpt2" / "model.safetensors"), "cannot be read as weights"]),
    Case("sample-gpt2-dir-with-a-bin-that-is-no-pickle", lambda c: sample_args(
        c, f"--init_from={c.gpt2_dir({'pytorch_model.bin': b'PK not a zip'})}"),
         lambda c: [str(c.dir / "gpt2" / "pytorch_model.bin"), "cannot be read as weights"]),
    Case("sample-gpt2-config-with-strings", lambda c: sample_args(
        c, f"--init_from={c.gpt2_dir({}, config={**TINY_GPT2, 'n_layer': 'twelve'})}"),
         lambda c: [str(c.dir / "gpt2" / "config.json"), "n_layer='twelve'"]),
    Case("sample-attention-map-a-directory", lambda c: (c.dir / "attn.html").mkdir() or sample_args(
        c, f"--attention_map={c.dir / 'attn.html'}"), lambda c: [f"{c.dir / 'attn.html'} is a directory; name a file "
                                                                  f"in it, e.g. {c.dir / 'attn.html' / 'attn.html'}"]),
    Case("sample-attention-map-where-nothing-can-be-written",
         lambda c: sample_args(c, "--attention_map=/proc/attn.html"),
         lambda c: ["cannot write /proc/attn.html"]),
    Case("sample-prompt-file-not-text", lambda c: (c.dir / "x.bin").write_bytes(bytes(range(128, 256))) and sample_args(
        c, f"--start=FILE:{c.dir / 'x.bin'}"), lambda c: [f"--start=FILE:{c.dir / 'x.bin'} is not UTF-8 text",
                                                           "give a text file saved as UTF-8"]),
    # bytes a terminal of another encoding sends: Python keeps them as lone surrogates, which GPT-2's tokenizer
    # turned into U+FFFD, sampling from a prompt other than the one echoed
    Case("sample-out-dir-a-file", lambda c: sample_args(c, out=c.dir / "notes.txt") if (
        c.dir / "notes.txt").write_text("x") else None, lambda c: [f"out_dir='{c.dir / 'notes.txt'}' is a file"]),
    Case("sample-out-dir-of-hugging-face-weights", lambda c: sample_args(c, out=c.dir) if (
        c.dir / "config.json").write_text("{}") else None,
         lambda c: [f"{c.dir} holds a config.json, not train.py's ckpt.pt: for Hugging Face weights give "
                    f"--init_from={c.dir}"]),
    Case("sample-prompt-not-utf8", lambda c: sample_args(c, "--start=caf\udce9"),
         lambda c: ["--start is not UTF-8 text (the terminal's encoding?)"]),
    # the folder above a prepared one (data/ for data/shakespeare_char): preparing into it, as the message had
    # said, wrote token files beside data/'s code
    Case("data-dir-holds-prepared-folders", lambda c: [c.broken_data(lambda d: None), *train_args(c, data=c.dir)][1:],
         lambda c: [f"no meta.json in {c.dir}, which holds prepared data folders (data): give one of them, e.g. "
                    f"--data_dir={c.dir / 'data'}"]),
    # --out_dir given for --data_dir: the run would train on data_dir's corpus and write among the other's token files
    Case("out-dir-holds-another-corpus", lambda c: train_args(c, out=c.broken_data(lambda d: None)),
         lambda c: [f"out_dir='{c.dir / 'data'}' holds prepared data (meta.json), and this run trains on {c.data}: "
                    f"to train on it, give --data_dir={c.dir / 'data'} and another --out_dir"]),
    Case("sample-out-dir-holds-prepared-data", lambda c: sample_args(c, out=c.broken_data(lambda d: None)),
         lambda c: [f"{c.dir / 'data'} holds prepared data (meta.json), not a checkpoint: train on it with "
                    f"`python train.py --data_dir={c.dir / 'data'}`, then sample its checkpoint with "
                    "`python sample.py`"]),
    Case("sample-attention-map-a-directory-named-without-an-extension",
         lambda c: sample_args(c, f"--attention_map={c.dir}"),
         lambda c: [f"{c.dir} is a directory; name a file in it, e.g. {c.dir / 'attn.html'}"]),
    Case("sample-prompt-file-a-directory", lambda c: sample_args(c, f"--start=FILE:{c.dir}"),
         lambda c: [f"--start=FILE:{c.dir} is a directory; give a text file in it"]),
    Case("sample-prompt-file-missing", lambda c: sample_args(c, f"--start=FILE:{c.dir / 'prompt.txt'}"),
         lambda c: [f"--start=FILE:{c.dir / 'prompt.txt'}: no such file; check the path"]),
    # sample.py reads Hugging Face weights with GPT-2's tokenizer, whose ids would index past this embedding
    Case("sample-gpt2-dir-with-a-smaller-vocabulary", lambda c: sample_args(
        c, f"--init_from={c.saved_gpt2(vocab_size=100)}"),
         lambda c: [f"--init_from={c.dir / 'gpt2'}", "50257 tokens but the model only 100", "give GPT-2 weights"]),
    Case("sample-more-samples-than-memory", lambda c: sample_args(c, "--num_samples=1000000000000"),
         lambda c: ["num_samples=1000000000000", "GiB", "fewer --num_samples"]),
    Case("sample-more-tokens-than-memory", lambda c: sample_args(c, "--max_new_tokens=10000000000000"),
         lambda c: ["10,000,000,000,001 tokens", "GiB"]),
    Case("sample-temperature-nan", lambda c: sample_args(c, "--temperature=nan"), lambda c: ["temperature", "finite"]),
    Case("sample-no-checkpoint", lambda c: sample_args(c, out=c.dir / "out"),  # the command trains into that folder
         lambda c: ["no checkpoint", str(c.dir / "out" / "ckpt.pt"), f"`python train.py --out_dir={c.dir / 'out'}`"]),
    Case("sample-unknown-model-key",
         lambda c: sample_args(c, out=c.ckpt_with(lambda ck: _set(ck["model_config"], "n_expert", 4))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "n_expert"]),
    Case("sample-pickle-payload",
         lambda c: sample_args(c, out=c.ckpt_with(lambda ck: _set(ck, "extra", Payload(c.dir / "payload-ran")))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "not loaded"],
         extra=lambda c: not (c.dir / "payload-ran").exists() or pytest.fail("the pickled payload ran")),
    Case("sample-prompt-outside-vocab", lambda c: sample_args(c, f"--start=All{OUTSIDE}"),
         lambda c: ["vocabulary", *(repr(ch) for ch in OUTSIDE), "(--start); give --start=... with characters"]),
    Case("sample-top_p-0", lambda c: sample_args(c, "--top_p=0"), lambda c: ["top_p"]),
    Case("sample-top_p-1.5", lambda c: sample_args(c, "--top_p=1.5"), lambda c: ["top_p", "1.5"]),
    Case("sample-temperature-negative", lambda c: sample_args(c, "--temperature=-1"), lambda c: ["temperature"]),
    Case("sample-max_new_tokens-negative", lambda c: sample_args(c, "--max_new_tokens=-1"),
         lambda c: ["max_new_tokens"]),
    Case("sample-checkpoint-a-bare-tensor", lambda c: (c.dir / "out").mkdir() or torch.save(
        torch.zeros(3), c.dir / "out" / "ckpt.pt") or sample_args(c, out=c.dir / "out"),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "a Tensor, not a dict of fields", "train.py wrote"]),
    Case("sample-checkpoint-model-a-list", lambda c: sample_args(c, out=c.ckpt_with(lambda ck: _set(ck, "model", []))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "is damaged", "model is list"]),
    Case("sample-checkpoint-tokenizer-a-list", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: _set(ck, "tokenizer", []))), lambda c: ["tokenizer is list"]),
    # the weights of one model, the config of another: the line says which weights do not fit, not only
    # load_state_dict's header, and that the file is to blame, not this code's settings
    Case("sample-checkpoint-whose-weights-do-not-fit-its-config", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: _set(ck["model_config"], "n_embd", 32))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "does not match this code's model: its weights do not fit the "
                    "model its model_config describes (transformer.wte.weight is", "where that model has",
                    "the file is damaged, or was written by other code"]),
    Case("sample-checkpoint-without-a-weight-its-model-has", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: ck["model"].pop("transformer.h.0.mlp.c_fc.weight"))),
         lambda c: ["its weights do not fit the model its model_config describes (no "
                    "transformer.h.0.mlp.c_fc.weight)"]),
    Case("sample-checkpoint-with-weights-its-model-lacks", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: _set(ck["model"], "extra.weight", torch.zeros(2)))),
         lambda c: ["(extra.weight, which that model does not have)"]),
    Case("sample-checkpoint-with-a-setting-this-code-lacks", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: _set(ck["model_config"], "n_kv_head", 2))),
         lambda c: ["model_config has settings this code's GPTConfig does not know (n_kv_head)",
                    "written by other (forked or newer) code"]),
    Case("sample-checkpoint-without-model_config", lambda c: sample_args(
        c, out=c.ckpt_with(lambda ck: ck.pop("model_config"))), lambda c: ["no model_config"]),
    # written by forked code with an activation this code lacks: refused, not run as another activation
    Case("sample-checkpoint-with-an-unknown-activation", lambda c: sample_args(c, out=c.ckpt_with(
        lambda ck: _set(ck["model_config"], "activation", "silu"))),
         lambda c: [str(c.dir / "out" / "ckpt.pt"), "unknown activation 'silu'; choose one of gelu_tanh"]),
    # trained on a GPU with flash-attn's kernel, sampled where there is none: the fix is a flag the user never gave
    Case("sample-checkpoint-trained-with-fa2", lambda c: sample_args(c, out=c.ckpt_with(
        lambda ck: _set(ck["model_config"], "attention", "fa2"))),
         lambda c: ["attention='fa2'",
                    "(attention='fa2' is the model's own: --attention=manual samples it on any device)"]),
    Case("sample-device-index-not-a-number", lambda c: ["sample.py", f"--out_dir={c.trained}", "--device=cpu:abc"],
         lambda c: ["unknown device 'cpu:abc'", "cuda:N"]),
    Case("sample-prompt-file-a-pipe", lambda c: os.mkfifo(c.dir / "prompt") or sample_args(
        c, f"--start=FILE:{c.dir / 'prompt'}"), lambda c: [f"--start=FILE:{c.dir / 'prompt'} is not a regular file",
                                                           "save the text in a file"]),
]


def run_case(launch, case, ctx):
    (ctx.dir / "bad.toml").write_text("n_layer = = 2\n")
    command = case.command(ctx)  # builds what the case needs on disk
    before = snapshot(ctx.dir, ctx.data, ctx.trained)
    proc = launch(*command)
    return ctx, command, proc, before, snapshot(ctx.dir, ctx.data, ctx.trained)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, tmp_path, data_dir, trained, launch):
    if case.skip:
        pytest.skip(case.skip)
    ctx, command, proc, before, after = run_case(launch, case, Ctx(tmp_path, data_dir, trained))
    where = f"{' '.join(command)}\n{describe(proc)}"
    assert proc.returncode == 2, where
    assert "Traceback" not in proc.stdout + proc.stderr, where
    line = single_error_line(proc)
    for fragment in case.fragments(ctx):
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert after == before, "files changed on disk: " + ", ".join(
        sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)))
    case.extra(ctx)


def test_wandb_that_cannot_start_warns_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    import wandb

    from log import MetricsLog

    def refuse(**kwargs):
        raise RuntimeError("wandb.init timed out (no network)")

    monkeypatch.setattr(wandb, "init", refuse)
    log = MetricsLog(str(tmp_path), "r1", wandb=("gpt", "run", {}))
    log.write({"iter": 1, "loss": 2.0})
    log.close()
    out = capsys.readouterr().out
    assert out == "warning: wandb cannot log this run: wandb.init timed out (no network); training goes on\n", out
    written = (tmp_path / "metrics.jsonl").read_text()
    assert written == '{"iter": 1, "loss": 2.0, "run": "r1"}\n', "the metrics were still written"


def a_training_log(tmp_path, monkeypatch, peak=None):
    """log.TrainingLog of a tiny single-process CPU run writing into tmp_path, against a peak of peak FLOP/s."""
    import log
    import train
    monkeypatch.setattr(log, "peak_flops", lambda device_type, dtype, reached=0: (peak, "a peak for the test"))
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16))
    return log.TrainingLog(TrainConfig(out_dir=str(tmp_path), batch_size=2, block_size=8), setup, model)


def test_a_log_line_gives_the_speed_and_mfu_of_the_steps_since_the_last_one(tmp_path, monkeypatch, capsys):
    """ms/iter: the time since the last line over the iterations since it (10 iterations in 0.5 s after
    iteration 100: 50 ms, not 0.5 s over 110); tokens/s and MFU from it; a step faster than the peak (a probe
    made in a busy moment) raises the peak, so MFU never passes 100 %. Under torchrun a rank's MFU counts its
    share of an iteration's FLOPs: two ranks of one micro-batch each count what one process of one does."""
    import log
    import train
    training_log = a_training_log(tmp_path, monkeypatch)
    flops_per_s = training_log.flops_per_iter / 0.05  # at 50 ms an iteration
    training_log.peak = 4 * flops_per_s
    monkeypatch.setattr(log, "peak_flops", lambda device_type, dtype, reached=0: (max(reached, 4 * flops_per_s), ""))
    now = [1000.0]
    monkeypatch.setattr(log.time, "time", lambda: now[0])
    training_log.open(100, "r1")
    for seconds in (0.5, 0.0625):  # 50 ms an iteration, then 6.25: twice the peak's speed
        for _ in range(10):
            training_log.add_loss(torch.tensor(2.0))
        now[0] += seconds
        training_log.print_progress(110 if seconds == 0.5 else 120, 1e-3, 1.0)
    training_log.close()
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "iter 110: loss 2.0000, lr 1.00e-03, 50.0 ms/iter, 320 tokens/s, MFU 25.0%",
        "iter 120: loss 2.0000, lr 1.00e-03, 6.2 ms/iter, 2,560 tokens/s, MFU 100.0%"]
    two_ranks = train.Setup(rank=1, local_rank=1, world_size=2, distributed=True, fsdp=False, accumulation_steps=2,
                            device="cpu", dtype=torch.float32)
    rank = log.TrainingLog(TrainConfig(out_dir=str(tmp_path), batch_size=2, block_size=8), two_ranks,
                           GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16)))
    assert rank.tokens_per_iter == 2 * training_log.tokens_per_iter
    assert rank.flops_per_iter == training_log.flops_per_iter


def test_without_a_peak_the_log_says_no_mfu_and_records_null(tmp_path, monkeypatch, capsys):
    """A GPU that hardware.GPU_PEAKS does not list: no "MFU nan%" on the line, and null in metrics.jsonl
    (NaN is not JSON: strict readers refused the record)."""
    training_log = a_training_log(tmp_path, monkeypatch, peak=None)
    training_log.open(0, "r1")
    training_log.add_loss(torch.tensor(2.0))
    training_log.print_progress(1, 1e-3, 0.5)
    training_log.close()
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("iter 1: loss 2.0000") and line.endswith("tokens/s") and "MFU" not in line, line
    record = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=pytest.fail)
    assert record["mfu"] is None


def test_the_first_log_line_does_not_count_wandbs_start_as_training(tmp_path, monkeypatch, capsys):
    """wandb.init takes seconds: the first line's ms/iter (and tokens/s, MFU, the busy check) counted it."""
    import log
    metrics_log = log.MetricsLog

    def slow_to_start(*args, **kwargs):
        time.sleep(1.0)  # as wandb.init does
        return metrics_log(*args, **kwargs)

    monkeypatch.setattr(log, "MetricsLog", slow_to_start)
    training_log = a_training_log(tmp_path, monkeypatch, peak=1e12)
    training_log.open(0, "r1")
    for _ in range(2):
        training_log.add_loss(torch.tensor(2.0))
    training_log.print_progress(2, 1e-3, 0.01)
    training_log.close()
    ms_per_iter = float(re.search(r"([\d.]+) ms/iter", capsys.readouterr().out).group(1))
    assert ms_per_iter < 250, ms_per_iter


def test_a_resume_skips_a_damaged_metrics_record(tmp_path):
    """A record whose iteration is not a whole number (a hand edit, a damaged disk) is skipped as a
    half-written line is, not a TypeError traceback at the resume's start."""
    from log import MetricsLog
    (tmp_path / "metrics.jsonl").write_text('{"iter": 4, "loss": 2.0, "run": "r1"}\n{"iter": "7", "run": "r1"}\n'
                                            '{"iter": true, "run": "r1"}\n{"iter": 9, "loss": 1.5, "run": "r1"}\n')
    MetricsLog(str(tmp_path), "r1", resumed_at=8).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"iter": 4, "loss": 2.0, "run": "r1"}\n'


def test_a_failed_wandb_does_not_silence_a_later_metrics_failure(tmp_path, monkeypatch, capsys):
    """Each place records go warns once on its own: wandb that did not start, then a disk that fills up
    under metrics.jsonl (which had gone unsaid after wandb's warning)."""
    from log import MetricsLog
    monkeypatch.setitem(sys.modules, "wandb", None)
    log = MetricsLog(str(tmp_path), "r1", wandb=("gpt", "run", {}))

    class FullDisk:
        def write(self, text):
            raise OSError(28, "No space left on device")

    log.file = FullDisk()
    log.write({"iter": 1, "loss": 2.0})
    log.write({"iter": 2, "loss": 1.0})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["warning", "warning"] and "wandb cannot log" in lines[0], lines
    assert lines[1] == (f"warning: could not record the metrics (metrics.jsonl, loss.png) in {tmp_path}: No space left "
                        "on device; training and checkpoints go on"), lines


@pytest.mark.parametrize("netrc_text, found", [("machine github.com login x password y\n", False),
                                               ("machine api.wandb.ai login user password " + "k" * 40 + "\n", True),
                                               ("this is not a netrc {\n", False)])
def test_wandb_goes_online_only_with_its_own_key(tmp_path, monkeypatch, netrc_text, found):
    """A ~/.netrc of other machines' passwords is no wandb key: wandb would then refuse to start online,
    and the run's metrics would not reach it at all; offline they do."""
    from log import wandb_api_key_found
    (tmp_path / ".netrc").write_text(netrc_text)
    (tmp_path / ".netrc").chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    assert wandb_api_key_found() is found
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_api_key_found()


def test_wandb_key_is_looked_for_where_wandb_looks(tmp_path, monkeypatch):
    """$NETRC names the file, as for wandb; and a netrc others may read (0644) still holds the key wandb
    uses (Python's default netrc refuses such a file, and the run went offline though logged in)."""
    from log import wandb_api_key_found
    key = tmp_path / "elsewhere"
    key.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    key.chmod(0o644)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(key))
    assert wandb_api_key_found()
    monkeypatch.delenv("NETRC")
    (tmp_path / "home").mkdir()
    key.rename(tmp_path / "home" / ".netrc")
    assert wandb_api_key_found()


def test_wandb_with_a_bad_mode_warns_in_one_line(tmp_path, monkeypatch, capsys):
    from log import MetricsLog
    monkeypatch.setenv("WANDB_MODE", "bogus")  # wandb's own settings check: several lines of pydantic's
    log = MetricsLog(str(tmp_path), "r1", wandb=("gpt", "run", {}))
    log.close()
    out = capsys.readouterr().out
    assert out.startswith("warning: wandb cannot log this run: ") and out.count("\n") == 1, out
    assert "'offline'" in out, out


def test_wandb_offline_by_its_mode_does_not_say_the_key_is_missing(tmp_path, monkeypatch, capsys):
    from log import MetricsLog
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    log = MetricsLog(str(tmp_path), "r1", wandb=("gpt", "run", {}))
    log.close()
    out = capsys.readouterr().out
    assert "wandb: WANDB_MODE=offline, logging offline" in out and "no API key" not in out, out


def test_wandb_that_is_not_installed_warns_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from log import MetricsLog
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    log = MetricsLog(str(tmp_path), "r1", wandb=("gpt", "run", {}))
    log.write({"iter": 1, "loss": 2.0})
    log.close()
    out = capsys.readouterr().out
    assert out.count("warning: wandb cannot log this run") == 1 and "import of wandb halted" in out, out
    written = (tmp_path / "metrics.jsonl").read_text()
    assert written == '{"iter": 1, "loss": 2.0, "run": "r1"}\n', "the metrics were still written"


# ---- a busy machine: threads, a slow-run warning, the CPU peak probe ---------------------------------

@pytest.mark.parametrize("capability, auto", [((7, 5), torch.float16), ((8, 0), torch.bfloat16)], ids=["T4", "A100"])
def test_dtype_auto_on_a_gpu_is_bf16_only_where_it_computes_in_bf16(monkeypatch, capability, auto):
    """A T4 or V100 (before Ampere) runs bf16 by emulation, which torch's is_bf16_supported counts as
    support: auto took it over the fp16 tensor cores. An explicit bfloat16 there still runs."""
    from hardware import pick_dtype
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(major=capability[0], minor=capability[1]))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True, raising=False)
    assert pick_dtype("auto", "cuda") == auto
    assert pick_dtype("bfloat16", "cuda") == torch.bfloat16


def test_a_device_torch_cannot_read_is_one_line(monkeypatch):
    """cuda: and cuda:01 passed the check (an index that is digits, or none), and torch.device then raised
    its own RuntimeError, a traceback, where a GPU is there."""
    from hardware import pick_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("cuda:", "cuda:01", "cuda:-1", "gpu", "cpu:"):
        with pytest.raises(ValueError, match=rf"^unknown device '{name}'; choose auto, cpu, cuda, cuda:N or mps$"):
            pick_device(name)
    assert [pick_device(name) for name in ("cuda", "cuda:1", "cpu")] == ["cuda", "cuda:1", "cpu"]
    with pytest.raises(ValueError, match=r"device='cuda:2': this machine has CUDA devices 0 to 1"):
        pick_device("cuda:2")


def with_cgroups(where, monkeypatch, proc_self_cgroup, files):
    """hardware reading a cgroup file system made under where: /proc/self/cgroup's text, and files by path."""
    import hardware
    (where / "sys").mkdir(parents=True)
    (where / "cgroup").write_text(proc_self_cgroup)
    for name, text in files.items():
        (where / "sys" / name).parent.mkdir(parents=True, exist_ok=True)
        (where / "sys" / name).write_bytes((text + "\n").encode("utf-8", "surrogateescape"))
    monkeypatch.setattr(hardware, "CGROUP_ROOT", str(where / "sys"))
    monkeypatch.setattr(hardware, "PROC_CGROUP", str(where / "cgroup"))


@pytest.mark.parametrize("proc_self_cgroup, files, cpus", [
    # cgroup v2 alone: the process's own cgroup allows 3.5 CPUs, the one above it 1.5: the strictest, rounded down
    ("0::/user/job\n", {"cgroup.controllers": "cpu", "user/job/cpu.max": "350000 100000",
                        "user/cpu.max": "150000 100000"}, 1),
    ("0::/user/job\n", {"cgroup.controllers": "cpu", "user/job/cpu.max": "max 100000"}, 4),  # no limit
    # cgroup v1 beside a v2 hierarchy, in a container that shows its cgroup's path on the host (which is not
    # there inside it): the quota is at the root of what it sees (docker --cpus=2)
    ("4:cpu,cpuacct:/docker/0123abcd\n0::/\n", {"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000",
                                                "unified/cgroup.controllers": ""}, 2),
    ("4:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, 4),  # no limit
    # the v1 hierarchy named for its controllers, without the usual "cpu" link to it
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "100000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 1),
    # what is not a setting is no limit: one word, nothing, not text, digits that are not 0-9
    ("0::/\n", {"cgroup.controllers": "cpu", "cpu.max": "max"}, 4),
    ("0::/\n", {"cgroup.controllers": "cpu", "cpu.max": ""}, 4),
    ("0::/\n", {"cgroup.controllers": "cpu", "cpu.max": "\udcff"}, 4),
    ("0::/\n", {"cgroup.controllers": "cpu", "cpu.max": "\u00b200000 100000"}, 4),
    ("", {}, 4)], ids=["v2", "v2-max", "v1-docker", "v1-none", "v1-cpu,cpuacct", "one-word", "empty", "not-text",
                       "superscript", "no-cgroups"])
def test_a_containers_cpu_quota_caps_the_threads(tmp_path, monkeypatch, proc_self_cgroup, files, cpus):
    """docker --cpus=1 on a 2-CPU machine: the default took 2 threads, and a run made 104 iterations where
    one thread made 4,563 (its OpenMP threads waited out each other's quota), blaming "another process"."""
    from hardware import pick_threads, usable_cpus
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    with_cgroups(tmp_path, monkeypatch, proc_self_cgroup, files)
    assert usable_cpus() == cpus and pick_threads(0) == cpus


def test_a_containers_memory_limit_is_the_memory_a_model_must_fit_in(tmp_path, monkeypatch):
    """docker --memory=768m: the model-size check counted the machine's memory, and a model of 2 GiB was
    killed by the kernel without a word; it is one line before it is built."""
    import train
    from hardware import memory_bytes
    with_cgroups(tmp_path / "none", monkeypatch, "5:memory:/\n", {"memory/memory.limit_in_bytes": str(2**63 - 4096)})
    physical = memory_bytes("cpu")
    assert physical == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with_cgroups(tmp_path / "v1", monkeypatch, "5:memory:/\n", {"memory/memory.limit_in_bytes": str(768 << 20)})
    assert memory_bytes("cpu") == min(physical, 768 << 20)
    with pytest.raises(ValueError, match=r"504,419,328 parameters, 2 GiB of fp32 weights, and this process "
                                         r"may use 0\.8 GiB: make it smaller"):
        train.check_model_fits(GPTConfig(vocab_size=64, block_size=8, n_layer=160, n_head=8, n_embd=512),
                               training=False)
    with_cgroups(tmp_path / "v2", monkeypatch, "0::/job\n", {"cgroup.controllers": "memory", "job/memory.max": "max",
                                                             "memory.max": str(1 << 30)})
    assert memory_bytes("cpu") == min(physical, 1 << 30)
    with_cgroups(tmp_path / "empty", monkeypatch, "0::/\n", {"cgroup.controllers": "memory", "memory.max": ""})
    assert memory_bytes("cpu") == physical


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here (macOS)")
@pytest.mark.parametrize("binding", ["OMP_PROC_BIND=true", "OMP_PROC_BIND=spread", "OMP_PLACES=cores",
                                     "GOMP_CPU_AFFINITY=0-1023"])
def test_openmp_told_to_bind_its_threads_still_gets_every_cpu(binding):
    """OpenMP binding its threads pins the first one to one CPU as torch loads: its affinity read 1 CPU, and
    train.py ran on one thread of two, as Intel's tuning advice (OMP_PROC_BIND) has users set."""
    import hardware
    if hardware.usable_cpus() < 2:
        pytest.skip("one CPU: one thread either way")
    name, value = binding.split("=")
    env = {k: v for k, v in ENV.items() if k not in (*hardware.OPENMP_BINDING, "OMP_NUM_THREADS")}
    counted = subprocess.run([sys.executable, "-c", "import os, hardware; print(len(os.sched_getaffinity(0)), "
                              "hardware.pick_threads(0))"], cwd=ROOT, env={**env, name: value},
                             capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert counted == ["1", str(hardware.usable_cpus())], counted  # bound, and every CPU all the same


def test_threads_default_to_the_cpus_this_process_may_use(monkeypatch):
    import hardware
    from hardware import pick_threads
    monkeypatch.setattr(hardware, "cgroup_cpus", lambda: None)  # whatever the machine running the tests has
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)  # 3 of the machine's CPUs
    assert pick_threads(0) == 3
    assert pick_threads(0, processes_here=2) == 1  # torchrun's processes on one machine share them
    assert pick_threads(0, processes_here=8) == 1
    assert pick_threads(5) == 5  # a setting wins
    assert pick_threads(12) == 12  # more than the CPUs, within reason: 4 a CPU
    with pytest.raises(ValueError, match=r"threads=13 is far more than the 3 CPUs this process may use, and threads "
                                         r"beyond those only wait for each other; give 0 for one per CPU, or a number "
                                         r"up to 3 \(at most 12 are accepted\)$"):
        pick_threads(13)  # thousands crash the process
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert pick_threads(0) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1,1")  # OpenMP's nested levels: the outer one is torch's
    assert pick_threads(0) == 1
    for bad in ("abc", "0", "-1", "2.5", ",2"):  # OpenMP would ignore these with a warning, torch take 3
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=rf"^OMP_NUM_THREADS='{re.escape(bad)}' is not a number of threads; "
                                             r"set it to a positive integer"):
            pick_threads(0)
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")  # torch.set_num_threads(100000) segfaults
    with pytest.raises(ValueError, match=r"^OMP_NUM_THREADS=100000 is far more than the 3 CPUs .*; "
                                         r"unset it for one per CPU"):
        pick_threads(0)
    assert pick_threads(4) == 4  # a setting wins over the environment, even a bad one
    with pytest.raises(ValueError, match=r"threads must be at least 0 \(0: OMP_NUM_THREADS, else the CPUs"):
        pick_threads(-1)


# training steps of a small GPT after three that let the heap grow to its size: the page faults of each
TRAINING_STEPS = """
import resource
import torch
from model import GPT, GPTConfig
from train import TrainConfig, set_up
model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=64))
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randint(64, (32, 64))
def step():
    model(x, x)[1].backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for phase in ("malloc's own", "set_up"):  # the same steps, before and after train.py's set_up
    if phase == "set_up":
        set_up(TrainConfig(device="cpu"))
    for _ in range(3):
        step()
    for _ in range(11):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        print(phase, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, sep=":")
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the limits are glibc's malloc's")
def test_train_keeps_freed_memory_so_a_step_faults_no_pages_in_again():
    proc = subprocess.run([sys.executable, "-c", TRAINING_STEPS], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    faults = collections.defaultdict(list)  # page faults of each step, by phase
    for line in proc.stdout.splitlines():
        phase, count = line.split(":")
        faults[phase].append(int(count))
    # malloc's own: the mean, as its threshold for unmapping rises and falls with what was freed, and some
    # runs fault in only every other step; set_up: the median, as now and then a step still touches new
    # pages for the first time, where a fragmented heap grows
    released, kept = statistics.mean(faults["malloc's own"]), statistics.median(faults["set_up"])
    if released < 100:  # hundreds to thousands (fewer with huge pages)
        pytest.skip("this Python's malloc keeps freed memory already (a preloaded jemalloc or tcmalloc?)")
    assert kept < released / 20, faults


def test_train_sets_the_threads_it_is_told(tmp_path, launch):
    data = tmp_path / "data"
    prepare_char(TEXT, str(data))
    proc = launch("train.py", *TINY, f"--data_dir={data}", f"--out_dir={tmp_path / 'out'}", "--max_iters=1",
                  "--threads=3")
    assert proc.returncode == 0, proc.stderr
    from hardware import usable_cpus
    more = f" (more than the {usable_cpus()} CPUs it may use)" if usable_cpus() < 3 else ""  # they wait for each other
    assert f"| 3 threads{more} |" in proc.stdout, proc.stdout


@pytest.mark.parametrize("threads, readings, warned_at", [
    # (tokens/s, CPUs used, CPUs' worth of waiting for a CPU) per window; None: the kernel does not say
    (2, [(1000, 1.9, 0.0), (1000, 2.0, 0.0), (980, 1.8, 0.01)], None),  # its threads busy, none kept waiting: quiet
    (2, [(1000, 1.0, 0.0), (990, 1.0, 0.0)], None),  # a math library on one thread (oneDNN's AMX bf16), alone: quiet
    (2, [(1000, 1.9, 0.0), (100, 1.0, 0.9), (90, 0.9, 0.9)], 1),  # a neighbour arrived: its threads wait for a CPU
    (2, [(60, 1.1, 0.8), (55, 1.0, 0.8)], 0),  # busy from the start: only the waiting tells
    (2, [(1000, 1.9, None), (100, 1.0, None)], 1),  # no schedstat: the share of CPU time decides
    (2, [(60, 1.1, None)], 0),
    (1, [(1000, 1.0, 0.0), (500, 0.5, 0.5)], None),  # one thread shares fairly: slower, but not the spinning trap
    (1, [(1000, 1.0, 0.0), (200, 0.9, 0.1)], 1),  # a fifth of its own best speed, whatever the reason
])
def test_a_run_slowed_by_other_work_says_so_once_with_the_fix(threads, readings, warned_at):
    before = torch.get_num_threads()
    try:
        from hardware import BusyCheck
        torch.set_num_threads(threads)
        busy = BusyCheck(tokens_per_step=2048)
        printed = [busy.judge(*reading) or "" for reading in readings]
    finally:
        torch.set_num_threads(before)
    warnings = [i for i, out in enumerate(printed) if out]
    assert warnings == ([] if warned_at is None else [warned_at]), printed
    if warned_at is not None:
        fix = "Run with --threads=1, or stop the other work" if threads > 1 else "Stop it"
        assert printed[warned_at].startswith("warning: ") and printed[warned_at].endswith(f"these CPUs. {fix}")
        assert "\n" not in printed[warned_at]


def test_a_run_with_more_threads_than_cpus_is_told_that_and_not_of_another_process(monkeypatch):
    """Threads beyond the CPUs it may use (--threads=2 under taskset -c 0) wait for each other as they would
    for a neighbour's work: the warning names that cause and its fix, not another process."""
    import hardware
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        busy = hardware.BusyCheck(tokens_per_step=2048)
        printed = [busy.judge(*reading) for reading in [(1000, 1.0, 0.9), (900, 1.0, 0.9)]]
        assert hardware.threads_text() == "2 threads (more than the 1 CPUs it may use)"
    finally:
        torch.set_num_threads(before)
    assert printed[0].endswith("its 2 threads outnumber the 1 CPUs it may use. Run with --threads=1"), printed
    assert "another process" not in printed[0] and printed[1] is None
    # torchrun's processes on this machine share its CPUs: two of 2 threads each outnumber 2 CPUs, and their
    # fix is their share, one each (told --threads=2, the run that followed it was slower still)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    try:
        torch.set_num_threads(2)
        warning = hardware.BusyCheck(tokens_per_step=2048).judge(1000, 1.0, 0.9)
        assert hardware.threads_text() == "2 threads (x 2 processes here: more than the 2 CPUs it may use)"
        torch.set_num_threads(1)
        assert hardware.threads_text() == "1 thread"
    finally:
        torch.set_num_threads(before)
    assert warning.endswith("its 2 processes' 2 threads each outnumber the 2 CPUs it may use. Run with --threads=1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # more processes than CPUs: one thread each is still too many
    try:
        torch.set_num_threads(1)  # one thread does not wait for another: a window three times slower says it
        busy = hardware.BusyCheck(tokens_per_step=2048)
        warning = busy.judge(1000, 1.0, 0.0) or busy.judge(100, 0.3, None)
    finally:
        torch.set_num_threads(before)
    assert warning.endswith("its 3 processes' 1 thread each outnumber the 2 CPUs it may use. Start at most 2 "
                            "processes here (--nproc_per_node=2), with --threads=1"), warning


WAITS_FOR_A_CPU = r"""
import os, subprocess, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this process and a spinning child share one CPU
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(0.2)
from hardware import CpuMeter
meter = CpuMeter()
end = time.perf_counter() + 1.0
while time.perf_counter() < end:
    pass
wall, used, waiting = meter.read()
child.kill()
asleep = CpuMeter()  # a sleeping process is not runnable, so it waits for no CPU however busy they are
time.sleep(0.5)
print(waiting, asleep.read()[2])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux's schedstat")
def test_the_time_a_process_waits_for_a_cpu_is_measured():
    """Sharing one CPU with a spinning process, a spinning process waits about half the time (more where other
    work, such as another test, lands on that CPU too); asleep, not at all."""
    proc = subprocess.run([sys.executable, "-c", WAITS_FOR_A_CPU], cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    shared, asleep = map(float, proc.stdout.split())
    assert 0.3 < shared < 0.9 and asleep < 0.05, (shared, asleep)


def test_a_gpu_takes_its_own_datasheet_peak_not_one_of_a_name_inside_its_own():
    from hardware import GPU_PEAKS, gpu_datasheet_peaks
    peaks = dict(GPU_PEAKS)
    assert gpu_datasheet_peaks("NVIDIA L40") is peaks["L40"]  # it read the L4's, 1.5x too low
    assert gpu_datasheet_peaks("NVIDIA L40S") is peaks["L40S"] and gpu_datasheet_peaks("NVIDIA L4") is peaks["L4"]
    assert gpu_datasheet_peaks("NVIDIA A10G") is peaks["A10G"] and gpu_datasheet_peaks("NVIDIA A10") is peaks["A10"]
    assert gpu_datasheet_peaks("NVIDIA H100 PCIe") is peaks["H100 PCIe"]
    assert gpu_datasheet_peaks("NVIDIA H100 80GB HBM3") is peaks["H100"]
    assert gpu_datasheet_peaks("NVIDIA A100-SXM4-80GB") is peaks["A100"]
    assert gpu_datasheet_peaks("NVIDIA RTX A6000") is None and gpu_datasheet_peaks("NVIDIA RTX A1000") is None
    assert gpu_datasheet_peaks("NVIDIA GH200 480GB") is peaks["H200"] and \
        gpu_datasheet_peaks("NVIDIA GB200") is peaks["B200"]


@pytest.mark.parametrize("content", ['{"any": "fast"}', '["a list"]', '{"any": -1}', '{"any": true}', '{"any": 1e300}',
                                     "not json", "[" * 200000],
                         ids=["a string", "a list", "negative", "a bool", "no CPU's", "not json",
                              "nested past json's depth"])
def test_a_damaged_cpu_peak_file_costs_a_measurement_not_the_run(tmp_path, monkeypatch, content):
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    (tmp_path / "peak.json").write_text(content.replace('"any"', json.dumps(hardware.cpu_peak_key(torch.float32))))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (5e9, False))
    assert hardware.peak_flops("cpu", torch.float32)[0] == 5e9


def test_a_cpu_peak_measured_under_another_torch_is_measured_again(tmp_path, monkeypatch):
    """torch's matmul kernels set the speed: a peak kept from another version no longer says what this one reaches."""
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    older = hardware.cpu_peak_key(torch.float32).replace(torch.__version__, "2.0.0")
    (tmp_path / "peak.json").write_text(json.dumps({older: 5e12}))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (5e9, False))
    assert hardware.peak_flops("cpu", torch.float32)[0] == 5e9


def test_without_a_home_the_cache_folder_is_in_the_temporary_folder(monkeypatch):
    """No HOME and a user id that /etc/passwd lacks (a container's): expanduser leaves "~" as it is, and the CPU
    peak went into a folder named ~ in the working directory, one that `rm -rf ~` would be typed to remove."""
    from files import cache_home
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # what it does where no home is known
    assert cache_home() == os.path.join(tempfile.gettempdir(), ".cache")


def test_the_cpu_peak_is_kept_in_the_cache_folder_the_environment_names_and_the_tests_keep_their_own(tmp_path,
                                                                                                     monkeypatch):
    """XDG_CACHE_HOME, where set, is the user's cache folder, ~/.cache where not; the tests give their runs a
    folder of their own, so a peak measured while tests share the cores never reaches the user's runs."""
    import hardware
    from files import cache_home
    assert hardware.CPU_PEAK_CACHE == os.path.join(cache_home(), "gpt-from-scratch", "cpu_peak_flops.json")
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg, folder in ((str(tmp_path / "xdg"), tmp_path / "xdg"), (None, tmp_path / ".cache"),
                        ("relative", tmp_path / ".cache")):  # relative: not a place, ignored
        if xdg is None:
            monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert cache_home() == str(folder), xdg
    prepare_char(TEXT, str(tmp_path / "data"))
    check_ok(subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={tmp_path / 'data'}", "--max_iters=1",
                             f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True,
                            env={**ENV, "HOME": str(tmp_path / "home")}))
    assert not (tmp_path / "home" / ".cache").exists()


def test_a_cpu_peak_that_cannot_be_kept_says_so(tmp_path, monkeypatch):
    """A cache folder that cannot be made (here under a file): every run measures again, and its MFU's source
    says the peak was not cached, and why, as a busy probe's does."""
    import hardware
    (tmp_path / "home").write_text("")
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "home" / "peak.json"))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (5e9, False))
    peak, source = hardware.peak_flops("cpu", torch.float32)
    assert peak == 5e9 and f", not cached ({tmp_path / 'home' / 'peak.json'}: " in source, source  # the OS's why


def test_two_runs_probing_at_once_both_keep_their_peaks(tmp_path, monkeypatch):
    """recipe.py --parallel starts runs together: one probes fp32 while another's bf16 peak is written; the file
    read before the probe would have written the bf16 peak away."""
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    bf16 = hardware.cpu_peak_key(torch.bfloat16)

    def probe_while_another_run_writes(dtype):
        (tmp_path / "peak.json").write_text(json.dumps({bf16: 7e9}))
        return 5e9, False
    monkeypatch.setattr(hardware, "measure_cpu_peak", probe_while_another_run_writes)
    assert hardware.peak_flops("cpu", torch.float32)[0] == 5e9
    assert json.loads((tmp_path / "peak.json").read_text()) == {bf16: 7e9, hardware.cpu_peak_key(torch.float32): 5e9}


def write_peaks(path, keys, barrier):
    """One of several processes that start writing CPU peaks to one cache together."""
    import hardware
    hardware.CPU_PEAK_CACHE = path
    barrier.wait()
    for key in keys:
        hardware.cache_cpu_peak(key, 1e9)


def test_runs_that_write_cpu_peaks_at_once_keep_every_one(tmp_path):
    """Runs started together (recipe.py --parallel, a job array) each read, add and write the cache: without
    the lock one's write put back the file as it read it, and another's new peaks were gone."""
    import multiprocessing
    context = multiprocessing.get_context("fork")
    barrier, path = context.Barrier(3), str(tmp_path / "cache" / "peak.json")
    keys = [[f"cpu {w}|{i}" for i in range(40)] for w in range(3)]
    writers = [context.Process(target=write_peaks, args=(path, k, barrier)) for k in keys]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    assert sorted(json.loads(Path(path).read_text())) == sorted(k for w in keys for k in w)


def test_a_cache_folder_without_locks_still_keeps_the_peak(tmp_path, monkeypatch):
    """A home on NFS without lockd (ENOLCK): the lock is for runs that start together; the peak is kept
    without it, rather than measured again on every start."""
    import hardware

    def no_locks(*args):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    monkeypatch.setattr(hardware.fcntl, "flock", no_locks)
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (5e9, False))
    peak, source = hardware.peak_flops("cpu", torch.float32)
    assert peak == 5e9 and "not cached" not in source, source
    assert json.loads((tmp_path / "peak.json").read_text()) == {hardware.cpu_peak_key(torch.float32): 5e9}


def test_a_probe_whose_threads_outnumber_its_cpus_is_not_said_to_share_them_with_other_work(tmp_path, monkeypatch):
    """--threads=2 where it may use one CPU (taskset -c 0): its threads wait for one another, and the note
    blamed other work, on an idle machine."""
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (1e9, True))  # its threads waited for a CPU
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 1)
    peak, source = hardware.peak_flops("cpu", torch.float32)
    assert source.endswith("(2 threads), its threads outnumber the 1 CPU(s) it may use: not cached"), source
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 2)  # as many: the waiting was other work's
    assert hardware.peak_flops("cpu", torch.float32)[1].endswith("(2 threads), while other work ran: not cached")
    assert not (tmp_path / "peak.json").exists()


def test_a_cpu_peak_probed_while_busy_is_not_kept_and_mfu_cannot_pass_100(tmp_path, monkeypatch):
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (1e9, True))  # other work took the CPUs
    peak, source = hardware.peak_flops("cpu", torch.float32)
    assert peak == 1e9 and "not cached" in source and not (tmp_path / "peak.json").exists()
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: (5e9, False))  # a quiet machine
    assert hardware.peak_flops("cpu", torch.float32) == (5e9, hardware.peak_flops("cpu", torch.float32)[1])
    assert (tmp_path / "peak.json").exists()
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: pytest.fail("the kept peak is measured again"))
    assert hardware.peak_flops("cpu", torch.float32)[0] == 5e9
    assert hardware.peak_flops("cpu", torch.float32, reached=8e9)[0] == 8e9  # a run beat it: the peak is raised
    assert hardware.peak_flops("cpu", torch.float32)[0] == 8e9  # and kept


def test_a_run_that_beats_a_busy_probe_is_not_probed_again_mid_training(tmp_path, monkeypatch):
    import hardware
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    monkeypatch.setattr(hardware, "measure_cpu_peak", lambda dtype: pytest.fail("probed while training"))
    peak, source = hardware.peak_flops("cpu", torch.float32, reached=8e9)
    assert peak == 8e9 and "not cached" in source and not (tmp_path / "peak.json").exists()


def test_the_cpu_peak_probe_leaves_the_seeded_rng_alone():
    """It runs only when no peak is cached: drawing from the global RNG would make dropout's masks,
    and so a seed's weights, depend on what a cache file holds."""
    from hardware import measure_cpu_peak
    before = torch.get_rng_state()
    measure_cpu_peak(torch.float32, size=32, seconds=0.01)
    assert torch.equal(torch.get_rng_state(), before)


# ---- what a review of the library found -------------------------------------------------------------

def test_the_n_head_an_error_suggests_are_all_that_are_accepted():
    """With rope a head needs an even size: the n_head the divisibility error lists must be exactly those
    that build (n_embd=96: not 32 heads of 3 channels; 48 of 2, past the 32 the list once stopped at),
    the rope error itself lists them, and where none fits (an odd n_embd) it says so."""
    def built(**settings):
        try:
            GPTConfig(**settings)
        except ValueError:
            return False
        return True

    for pos_embedding in ("rope", "learned"):
        with pytest.raises(ValueError, match=r"n_head can be one of [\d, ]+$") as refused:
            GPTConfig(n_embd=96, n_head=5, pos_embedding=pos_embedding)
        listed = [int(n) for n in str(refused.value).rsplit("one of ", 1)[1].split(", ")]
        assert listed == [h for h in range(1, 97) if built(n_embd=96, n_head=h, pos_embedding=pos_embedding)]
    assert 48 in listed and 32 in listed  # learned positions take a head of any size
    with pytest.raises(ValueError, match=r"n_embd/n_head = 3; .*one of 1, 2, 3, 4, 6, 8, 12, 16, 24, 48 .*learned"):
        GPTConfig(n_embd=96, n_head=32, pos_embedding="rope")
    with pytest.raises(ValueError, match=r"n_head=2; with this n_embd, no n_head gives the even head size rope needs: "
                                         r"give an even n_embd, or pos_embedding='learned'$"):
        GPTConfig(n_embd=33, n_head=2, pos_embedding="rope")


def test_a_run_resumes_with_its_vocabulary_given_as_a_number(tmp_path, data_dir):
    """vocab_size=0 means the data's vocabulary; resuming with that vocabulary spelt out is the same model."""
    import train
    first = TrainConfig(**{**dict(device="cpu", dtype="float32", max_seconds=0, max_iters=2, n_layer=1, n_head=2,
                                  n_embd=16, block_size=8, batch_size=2, eval_iters=1, compile=False),
                           "data_dir": str(data_dir), "out_dir": str(tmp_path)})
    train.main(first)
    vocab = load_checkpoint(str(tmp_path / "ckpt.pt"))["model_config"]["vocab_size"]
    resumed = train.main(TrainConfig(**{**asdict(first), "init_from": "resume", "max_iters": 3, "vocab_size": vocab}))
    assert resumed.config.vocab_size == vocab and load_checkpoint(str(tmp_path / "ckpt.pt"))["iter_num"] == 3


def test_a_cpu_run_on_a_gpu_machine_leaves_the_gpu_alone(tmp_path, data_dir, monkeypatch):
    """--device=cpu where torch sees a GPU: each save read the GPU's generator and a resume set it, so
    a GPU busy with another job lost the run at its first save in a traceback, and made a resume call
    a sound checkpoint damaged."""
    import train

    def busy(*args, **kwargs):
        raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", busy)
    monkeypatch.setattr(torch.cuda, "set_rng_state", busy)
    first = TrainConfig(device="cpu", dtype="float32", max_seconds=0, max_iters=2, n_layer=1, n_head=2, n_embd=16,
                        block_size=8, batch_size=2, eval_iters=1, compile=False, data_dir=str(data_dir),
                        out_dir=str(tmp_path))
    train.main(first)
    checkpoint = load_checkpoint(str(tmp_path / "ckpt.pt"))  # as if a GPU run had saved it: a GPU generator's state
    checkpoint["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    save_checkpoint(checkpoint, str(tmp_path / "ckpt.pt"))
    train.main(TrainConfig(**{**asdict(first), "init_from": "resume", "max_iters": 3}))
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["iter_num"] == 3


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_a_gpus_generator_is_saved_and_put_back(monkeypatch, kind):
    """Dropout on a GPU draws from that GPU's generator: a resume on an Apple GPU (mps) went on from
    another state than the one saved, so it was not the run it continued. A CPU run saves none."""
    import checkpoint
    module = {"cuda": torch.cuda, "mps": torch.mps}[kind]
    generator = [torch.tensor([1, 2, 3], dtype=torch.uint8)]
    monkeypatch.setattr(module, "get_rng_state", lambda device=kind: generator[0].clone())
    monkeypatch.setattr(module, "set_rng_state", lambda state, device=kind: generator.__setitem__(0, state))
    saved = checkpoint.rng_state(torch.Generator(), [checkpoint.torch_rng_state(kind)])
    generator[0] = torch.tensor([9], dtype=torch.uint8)  # dropout drew on after the save
    checkpoint.set_rng_state(saved, torch.Generator(), 0, kind)
    assert generator[0].tolist() == [1, 2, 3]
    cpu_run = checkpoint.rng_state(torch.Generator(), [checkpoint.torch_rng_state("cpu")])
    assert [cpu_run[k][0].numel() for k in ("cuda", "mps")] == [0, 0]


def test_a_rank_the_run_was_not_saved_from_draws_dropout_of_its_own(tmp_path, data_dir, capsys):
    """A run saved by one process and resumed by two: rank 1 took rank 0's saved generator, so both ranks
    drew the same dropout masks for the rest of the run. It keeps the one it was seeded with; and a resume
    on another number of processes says that dropout does not continue as it would have."""
    import checkpoint
    torch.manual_seed(5)
    saved = checkpoint.rng_state(torch.Generator(), [checkpoint.torch_rng_state("cpu")])  # one process's
    torch.manual_seed(1337 + 1)  # rank 1's seed, as train.py sets it
    checkpoint.set_rng_state(saved, torch.Generator(), 1, "cpu")
    assert not torch.equal(torch.get_rng_state(), saved["torch"][0])
    checkpoint.set_rng_state(saved, torch.Generator(), 0, "cpu")
    assert torch.equal(torch.get_rng_state(), saved["torch"][0])
    import train
    from train import TrainConfig
    cfg = TrainConfig(data_dir=str(data_dir), out_dir=str(tmp_path), device="cpu", compile=False, dtype="float32",
                      n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2, max_seconds=0, max_iters=2,
                      eval_iters=1, dropout=0.1)
    train.main(cfg)
    two = load_checkpoint(str(tmp_path / "ckpt.pt"))
    two["rng"]["torch"] = two["rng"]["torch"] * 2  # as two processes would have saved it
    save_checkpoint(two, str(tmp_path / "ckpt.pt"))
    capsys.readouterr()
    train.main(TrainConfig(**{**asdict(cfg), "init_from": "resume", "max_iters": 3}))
    assert (f"note: {tmp_path / 'ckpt.pt'} was trained by 2 process(es), this run has 1: dropout's masks do not "
            "continue as they would have") in capsys.readouterr().out


def test_eval_only_writes_no_cpu_peak(tmp_path, data_dir, monkeypatch):
    """eval_only writes nothing, not even the measured CPU peak that only training's MFU needs."""
    import hardware
    import train
    monkeypatch.setattr(hardware, "CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    train.main(TrainConfig(device="cpu", dtype="float32", n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2,
                           eval_iters=1, compile=False, eval_only=True, data_dir=str(data_dir),
                           out_dir=str(tmp_path / "out")))
    assert not (tmp_path / "peak.json").exists() and not (tmp_path / "out").exists()
