"""End-to-end tests of train.py and sample.py on a tiny model and a tiny corpus the test writes
itself, exact resumption, and the typed configuration (configurator.py, train.TrainConfig).

The end-to-end test runs `python train.py` and `python sample.py` as plain subprocesses; the other
runs go through conftest's `launch` (a process forked from a server that has already imported torch;
REAL_SUBPROCESS=1 makes those plain subprocesses too). All run with OMP_NUM_THREADS=1: a tiny model
gains nothing from threads, and on a busy 2-core machine OpenMP's spinning threads make each step
~100x slower."""
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, make_dataclass, replace
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import pytest
import torch

from checkpoint import OPTIONAL_RESUME_FIELDS, RESUME_FIELDS, RNG_KEYS, model_from_checkpoint, save_checkpoint
from configurator import ConfigError, help_text, load_config
from data.tokenizer import tokenizer_from_meta
from helpers import ENV, ROOT, TEXT, check_ok
from model import GPT, GPTConfig
TINY = ["--device=cpu", "--max_seconds=0", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=16",
        "--block_size=8", "--batch_size=2", "--eval_iters=2", "--warmup_iters=2", "--seed=1337"]
SEPARATOR = "\n---------------\n"
LOG_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+)\b.*?([0-9.,]+) ms/iter.*?([0-9.,]+) tokens/s", re.M)


def run(script, *args, timeout=120):
    return subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def metrics(out_dir):
    with open(Path(out_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


# ---- A. end to end ------------------------------------------------------------------------------

def test_train_then_sample_end_to_end(tmp_path, data_dir, launch):
    out = tmp_path / "out"
    proc = check_ok(run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=6",
                        "--eval_interval=3", "--log_interval=1"))
    # a log line per iteration with iteration, loss, ms/iter and tokens/s
    logged = LOG_LINE.findall(proc.stdout)
    assert [int(m[0]) for m in logged] == [1, 2, 3, 4, 5, 6], proc.stdout
    for _, loss, ms, tok_s in logged:
        assert 0 < float(loss) < 10 and float(ms) > 0 and float(tok_s.replace(",", "")) > 0
    # a final summary, after the last log line
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("done: 6 iterations"), proc.stdout
    assert str(out / "ckpt.pt") in summary and "sample.py" in summary
    # the checkpoint holds the last weights, whose val loss need not be the best (it had read as if it were)
    assert f"checkpoint {out / 'ckpt.pt'}, the last weights (best val loss on the way " in summary, summary

    ckpt = load(out / "ckpt.pt")
    assert ckpt["iter_num"] == 6
    records = metrics(out)
    assert [r["iter"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in records if "val_loss" in r]
    assert [r["iter"] for r in evals] == [3, 6]
    assert all(r["train_loss"] > 0 and r["val_loss"] > 0 for r in evals)
    assert ckpt["best_val_loss"] == pytest.approx(min(r["val_loss"] for r in evals))

    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("All:\nSpeak", encoding="utf-8")
    # on the CPU, as the check against model.generate below: a GPU's generators draw other numbers
    common = [f"--out_dir={out}", "--max_new_tokens=20", "--num_samples=2", "--device=cpu"]
    with ThreadPoolExecutor(max_workers=1) as pool:  # a plain `python sample.py`, while the other two run
        first = pool.submit(run, "sample.py", *common, "--seed=1")
        again = launch("sample.py", *common, "--seed=1")
        from_file = launch("sample.py", *common, "--seed=1", f"--start=FILE:{prompt_file}")
        first = first.result()
    vocab = set(TEXT)
    for proc, prompt in ((first, "\n"), (from_file, "All:\nSpeak")):
        check_ok(proc)
        samples = proc.stdout.split(SEPARATOR)
        assert len(samples) == 3 and samples[-1] == "", proc.stdout  # two samples, each closed by the separator
        for text in samples[:2]:
            assert text.startswith(prompt), (prompt, text)
            assert len(text) == len(prompt) + 20  # char-level: one character per new token
            assert set(text) <= vocab
        assert samples[0] != samples[1], "the two samples should differ: sampling, not greedy decoding"
    assert again.stdout == first.stdout, "the same seed must give the same samples"
    # the samples are one batch: the rows of model.generate over two copies of the prompt, a generator per row
    from sample import sample_generators
    model = model_from_checkpoint(load(out / "ckpt.pt"), out / "ckpt.pt").eval()
    tokenizer = tokenizer_from_meta(ckpt["tokenizer"])
    rows = model.generate(torch.tensor([tokenizer.encode("\n")] * 2), 20, temperature=0.8, top_k=200,
                          generator=sample_generators(1, 2, "cpu"), vocab_size=tokenizer.vocab_size)
    assert first.stdout.split(SEPARATOR)[:2] == [tokenizer.decode(row) for row in rows.tolist()]


# ---- C. exact resumption ------------------------------------------------------------------------

def assert_identical(a, b, where="checkpoint"):
    """Recursively: same keys, same structure, bit-identical tensors."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_resume_is_exact(tmp_path, data_dir, launch):
    # dropout > 0 makes the torch RNG matter; lr_decay_iters is fixed so the schedule does not depend
    # on max_iters (by default it decays over max_iters, which differs between the two halves)
    common = [*TINY, f"--data_dir={data_dir}", "--dropout=0.1", "--eval_interval=4", "--log_interval=1",
              "--lr_decay_iters=8"]
    a, b = tmp_path / "A", tmp_path / "B"
    check_ok(launch("train.py", *common, f"--out_dir={a}", "--max_iters=8"))
    check_ok(launch("train.py", *common, f"--out_dir={b}", "--max_iters=4"))
    half = load(b / "ckpt.pt")
    assert half["iter_num"] == 4
    assert set(half) == {*RESUME_FIELDS, *OPTIONAL_RESUME_FIELDS}, "what train.py saves and resume checks are one list"
    assert set(half["rng"]) == set(RNG_KEYS), "and so are the generators it saves and checks for"
    assert half["tokenizer"]["tokenizer"] == "char" and half["tokenizer"]["chars"] == "".join(sorted(set(TEXT)))
    assert half["model_config"]["n_embd"] == 16 and half["config"]["max_iters"] == 4

    second_half = check_ok(launch("train.py", *common, f"--out_dir={b}", "--init_from=resume", "--max_iters=8"))
    assert re.search(r"resum\w+ from .*ckpt\.pt at iteration 4\b", second_half.stdout), second_half.stdout
    assert [int(m[0]) for m in LOG_LINE.findall(second_half.stdout)] == [5, 6, 7, 8]
    assert "note:" not in second_half.stdout  # a later stop alone: this run matches an uninterrupted one

    ca, cb = load(a / "ckpt.pt"), load(b / "ckpt.pt")
    assert ca["iter_num"] == cb["iter_num"] == 8
    assert ca["model"].keys() == cb["model"].keys()
    for name in ca["model"]:
        assert torch.equal(ca["model"][name], cb["model"][name]), f"parameter {name} differs after resume"
    # and the second half trained: every parameter moved, Muon's matrices and AdamW's vectors alike (equal
    # weights would otherwise say nothing if an optimizer never stepped)
    unmoved = [name for name in ca["model"] if torch.equal(half["model"][name], ca["model"][name])]
    assert not unmoved, f"iterations 5-8 left {unmoved} unchanged"
    assert_identical(ca["optimizer"], cb["optimizer"], "optimizer")
    assert_identical(ca["scaler"], cb["scaler"], "scaler")
    assert_identical(ca["rng"], cb["rng"], "rng")
    assert ca["best_val_loss"] == cb["best_val_loss"]

    la = {r["iter"]: r["loss"] for r in metrics(a) if "loss" in r}
    lb = {r["iter"]: r["loss"] for r in metrics(b) if "loss" in r}
    assert sorted(lb) == list(range(1, 9))
    assert [la[i] for i in range(5, 9)] == [lb[i] for i in range(5, 9)]
    va = [(r["iter"], r["train_loss"], r["val_loss"]) for r in metrics(a) if "val_loss" in r]
    vb = [(r["iter"], r["train_loss"], r["val_loss"]) for r in metrics(b) if "val_loss" in r]
    assert va == vb


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_parameter_that_never_had_a_gradient_resumes(tmp_path, data_dir, launch, optimizer):
    """A fork's layer that the forward does not use gets no gradient, so its optimizers keep no state for it:
    the checkpoint is sound, and resumes (as if ln_f had been such a layer)."""
    common = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", f"--optimizer={optimizer}"]
    check_ok(launch("train.py", *common, "--max_iters=2"))
    checkpoint = load(tmp_path / "ckpt.pt")
    del checkpoint["optimizer"]["state"]["transformer.ln_f.weight"]
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    scored = check_ok(launch("train.py", *common, "--init_from=resume", "--eval_only=true"))
    assert "val loss" in scored.stdout and "note:" not in scored.stdout, scored.stdout  # an evaluation needs none
    resumed = check_ok(launch("train.py", *common, "--max_iters=4", "--init_from=resume"))
    assert load(tmp_path / "ckpt.pt")["iter_num"] == 4
    # said, since a file that lost the state is the other way there can be none: not silently a different run
    assert "holds no optimizer state for transformer.ln_f.weight (no gradient reached them" in resumed.stdout


def test_a_checkpoint_from_before_the_optimizer_setting_resumes_as_the_adamw_run_it_was(tmp_path, data_dir, launch):
    """A checkpoint whose config names no optimizer was trained with AdamW, the only one its code had: it was
    read as Muon, today's default, so a plain resume trained on under Muon (its AdamW state for the matrices
    dropped) and --optimizer=adamw was refused as not the run's; taken, it is no change to note."""
    common = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--max_iters=4", "--init_from=resume"]
    check_ok(launch("train.py", *common[:-2], "--max_iters=2", "--optimizer=adamw"))
    checkpoint = load(tmp_path / "ckpt.pt")
    del checkpoint["config"]["optimizer"]
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    plain = launch("train.py", *common)
    assert plain.returncode == 2 and "was trained with optimizer=adamw (now muon)" in plain.stderr, plain.stderr
    note = check_ok(launch("train.py", *common, "--optimizer=adamw")).stdout
    assert "max_iters 2 -> 4" in note and "optimizer" not in note, note
    resumed = load(tmp_path / "ckpt.pt")
    assert resumed["iter_num"] == 4 and resumed["config"]["optimizer"] == "adamw"
    assert all("exp_avg" in s and "momentum_buffer" not in s for s in resumed["optimizer"]["state"].values())


def test_an_optimizer_state_named_by_position_is_one_line_and_the_checkpoint_still_evaluates(tmp_path, data_dir,
                                                                                             launch):
    """This code's first version saved torch's Optimizer.state_dict, which names the parameters by position:
    resume found state for none of them in it and trained on (its note blaming gradients that never came), or
    crashed inside torch as it loaded the state, or called the file damaged and offered to overwrite it. One line
    now, before anything is written, and at once: that version's config names no optimizer, and the line that
    asks for --optimizer=adamw came first. --eval_only=true, which needs no optimizer state, scores it."""
    common = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--init_from=resume"]
    check_ok(launch("train.py", *common[:-1], "--max_iters=2", "--optimizer=adamw"))
    checkpoint = load(tmp_path / "ckpt.pt")
    del checkpoint["config"]["optimizer"]
    optimizer = checkpoint["optimizer"]
    position = {name: i for i, name in enumerate(n for group in optimizer["param_groups"] for n in group["params"])}
    optimizer["state"] = {position[name]: state for name, state in optimizer["state"].items()}
    for group in optimizer["param_groups"]:
        group["params"] = [position[name] for name in group["params"]]
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    refused = launch("train.py", *common, "--max_iters=4")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "names the parameters in its optimizer state by position" in refused.stderr, refused.stderr
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert "val loss" in check_ok(launch("train.py", *common, "--eval_only=true")).stdout


def test_a_resumed_run_trains_with_its_own_rates_decay_and_betas(tmp_path, data_dir, launch):
    """Loading the optimizers' state puts back the first run's settings with it; a resumed run that
    changes them trains with the new ones, as its note says."""
    common = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--eval_interval=2"]
    check_ok(launch("train.py", *common, "--max_iters=2"))
    new = {"learning_rate": 1e-4, "muon_lr": 1e-3, "weight_decay": 0.05, "beta1": 0.8, "beta2": 0.9}
    resumed = check_ok(launch("train.py", *common, "--max_iters=4", "--init_from=resume",
                              *[f"--{k}={v}" for k, v in new.items()]))
    assert "muon_lr 0.02 -> 0.001" in resumed.stdout and "training follows the new values" in resumed.stdout
    assert "max_iters 2 -> 4" in resumed.stdout  # here the rates decay over max_iters: a change of schedule
    groups = load(tmp_path / "ckpt.pt")["optimizer"]["param_groups"]
    adamw = [g for g in groups if "betas" in g]
    muon = [g for g in groups if "betas" not in g]
    assert adamw and muon
    assert [(g["initial_lr"], tuple(g["betas"])) for g in adamw] == [(1e-4, (0.8, 0.9))] * len(adamw)
    assert sorted(g["weight_decay"] for g in adamw) == [0.0, 0.05]  # none on biases and norms
    assert [(g["initial_lr"], g["weight_decay"]) for g in muon] == [(1e-3, 0.05)] * len(muon)


def test_resuming_in_fp16_what_trained_without_loss_scaling_names_the_dtype_to_use(tmp_path, data_dir, launch):
    """On a GPU, --dtype=float16 turns on the grad scaler, whose state a bf16 or fp32 run never saved:
    the checkpoint is not damaged, the dtype is wrong, and the message says which to use."""
    import numpy as np
    import train
    check_ok(launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}", "--max_iters=2"))
    checkpoint = load(tmp_path / "ckpt.pt")
    cfg = load_config(train.TrainConfig, [*TINY, f"--data_dir={data_dir}"])
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float16)
    state = train.new_train_state(cfg, setup, model_from_checkpoint(checkpoint, "ckpt.pt"), np.zeros(64, np.uint16))
    with pytest.raises(ValueError, match=r"resume in the dtype it was trained in \(--dtype=bfloat16 or"):
        train.resume_state(state, checkpoint, "ckpt.pt", setup, cfg)


def test_resume_restores_the_clock_the_best_val_loss_and_the_grad_scaler(tmp_path, data_dir):
    """What the other resume tests cannot see (they run in fp32, with the schedule in iterations, and
    their last val loss is their best): the seconds trained, which the clock schedule and max_seconds
    go by, the best val loss so far, and fp16's loss scale."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=1))
    checkpoint = load(tmp_path / "ckpt.pt")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    checkpoint.update(trained_seconds=5.0, best_val_loss=0.5, scaler=scaler.state_dict())
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float16)
    cfg = tiny_config(data_dir, tmp_path)
    state = train.new_train_state(cfg, setup, model_from_checkpoint(checkpoint, "ckpt.pt"), np.zeros(64, np.uint16))
    train.resume_state(state, checkpoint, "ckpt.pt", setup, cfg)
    assert state.clock.seconds() == 5.0 and state.best_val_loss == 0.5
    assert state.scaler.state_dict() == scaler.state_dict()


def interrupted_run(cfg, monkeypatch, at):
    """train.main(cfg), sent SIGINT during its step to iteration `at` (as a Ctrl-C then would be): it
    finishes the step, saves and exits with 128 + SIGINT."""
    import signal
    import train
    real = train.train_step

    def step(state, *args):
        if state.iter_num + 1 == at:
            os.kill(os.getpid(), signal.SIGINT)
        return real(state, *args)
    monkeypatch.setattr(train, "train_step", step)
    with pytest.raises(SystemExit) as stopped:
        train.main(cfg)
    monkeypatch.setattr(train, "train_step", real)
    assert stopped.value.code == 128 + signal.SIGINT and load(Path(cfg.out_dir) / "ckpt.pt")["iter_num"] == at


def test_a_stop_is_named_by_its_first_signal(tmp_path, data_dir, monkeypatch, capsys):
    """torchrun follows a Ctrl-C with a SIGTERM to its workers: the run was saved as "stopped by SIGTERM" and
    exited 143, as if the machine had been shut down. The first signal names the stop."""
    import signal
    import train
    real = train.train_step

    def step(state, *args):
        if state.iter_num + 1 == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(state, *args)
    monkeypatch.setattr(train, "train_step", step)
    with pytest.raises(SystemExit) as stopped:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=5, eval_interval=100))
    assert stopped.value.code == 128 + signal.SIGINT
    assert "(stopped by SIGINT after iteration 2)" in capsys.readouterr().out


@pytest.mark.parametrize("stop", ["evaluation", "Ctrl-C"])
def test_weights_blown_up_by_a_step_whose_loss_was_finite_never_replace_the_checkpoint(tmp_path, data_dir, monkeypatch,
                                                                                       capsys, stop):
    """The step before an evaluation (or a stop) can make the weights NaN while its own loss was finite: the save
    then wrote them over the last good checkpoint, and the error that followed called that file the last good
    one. Now the save refuses, in one line, and the checkpoint stays as it was."""
    import signal
    import train
    cfg = tiny_config(data_dir, tmp_path, compile=False, max_iters=4, eval_interval=2)
    train.main(cfg)
    good = (tmp_path / "ckpt.pt").read_bytes()
    real = train.train_step

    def step(state, *args):
        loss = real(state, *args)
        if state.iter_num + 1 == 6:  # the step to iteration 6, before its evaluation
            with torch.no_grad():
                next(state.model.parameters()).fill_(float("nan"))
            if stop == "Ctrl-C":
                os.kill(os.getpid(), signal.SIGINT)
        return loss
    monkeypatch.setattr(train, "train_step", step)
    capsys.readouterr()
    with pytest.raises(SystemExit) as failed:
        train.main(replace(cfg, init_from="resume", max_iters=8, eval_interval=6 if stop == "evaluation" else 100))
    err = capsys.readouterr().err
    assert failed.value.code == 1 and err.count("\n") == 1 and err.startswith(
        "error: the weights are not finite (NaN or inf, in transformer.wte.weight) at iteration 6, though every loss "
        f"logged was: not saved, {tmp_path / 'ckpt.pt'} is kept"), err
    assert (tmp_path / "ckpt.pt").read_bytes() == good


def test_a_stop_asked_for_during_an_evaluation_stops_at_it(tmp_path, data_dir, monkeypatch, capsys):
    """Ctrl-C while the run evaluates (and saves): it trained one more step and saved a second time, a
    second write of a large checkpoint inside a preemption's grace period. It now stops at what it saved."""
    import signal
    import train
    real = train.evaluate_and_save

    def evaluate_and_save(state, *args, **kwargs):
        if state.iter_num == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return real(state, *args, **kwargs)
    monkeypatch.setattr(train, "evaluate_and_save", evaluate_and_save)
    with pytest.raises(SystemExit) as stopped:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=10, eval_interval=4))
    out = capsys.readouterr().out
    assert stopped.value.code == 128 + signal.SIGINT and load(tmp_path / "ckpt.pt")["iter_num"] == 4
    assert out.count("saved ") == 1 and "iter 5:" not in out and "resume with: " in out, out


def test_a_stop_during_an_evaluation_whose_save_failed_saves_again(tmp_path, data_dir, monkeypatch, capsys):
    """The evaluation's save failed (a full disk, say: training would go on and try again) and a stop came
    meanwhile: the stop's own save tries once more, as any stop's does, rather than leave the work unsaved."""
    import signal
    import train
    real, failures = train.write_checkpoint, []

    def write_checkpoint(checkpoint, path, cfg, state):
        if state.iter_num == 4 and not failures:
            failures.append(4)
            os.kill(os.getpid(), signal.SIGINT)
            return f"could not write {path} at iteration 4: No space left on device", "free some space"
        return real(checkpoint, path, cfg, state)
    monkeypatch.setattr(train, "write_checkpoint", write_checkpoint)
    with pytest.raises(SystemExit) as stopped:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=10, eval_interval=4))
    out = capsys.readouterr().out
    assert stopped.value.code == 128 + signal.SIGINT and load(tmp_path / "ckpt.pt")["iter_num"] == 4
    assert f"saved {tmp_path / 'ckpt.pt'} (stopped by SIGINT after iteration 4)" in out and "iter 5:" not in out, out


def test_a_stop_right_before_an_evaluation_keeps_it(tmp_path, data_dir, monkeypatch):
    """Stopped in the step that ends at an evaluation's iteration, a run evaluates before it saves, as an
    uninterrupted one would, and the resumed run's record and checkpoint match the uninterrupted run's."""
    import dataclasses
    import train
    cfg = tiny_config(data_dir, tmp_path / "A", compile=False, max_iters=4, eval_interval=2, dropout=0.1)
    train.main(cfg)
    stopped = dataclasses.replace(cfg, out_dir=str(tmp_path / "B"))
    interrupted_run(stopped, monkeypatch, at=2)
    assert load(tmp_path / "B" / "ckpt.pt")["best_val_loss"] < float("inf"), "the evaluation at 2 was made"
    train.main(dataclasses.replace(stopped, init_from="resume"))
    evaluations = [[(r["iter"], r["train_loss"], r["val_loss"]) for r in metrics(tmp_path / d) if "val_loss" in r]
                   for d in "AB"]
    assert evaluations[0] == evaluations[1] and [e[0] for e in evaluations[0]] == [2, 4], evaluations
    a, b = (load(tmp_path / d / "ckpt.pt") for d in "AB")
    assert a["best_val_loss"] == b["best_val_loss"]
    assert all(torch.equal(a["model"][name], b["model"][name]) for name in a["model"])


def test_the_sample_command_at_the_end_runs_from_where_the_run_started(tmp_path, data_dir, capsys, monkeypatch):
    """`python sample.py` in the repository; from another folder the path to it (pasted there, `python sample.py`
    found no such file)."""
    import train
    for where, script in ((ROOT, "sample.py"), (tmp_path, os.path.relpath(os.path.join(ROOT, "sample.py"), tmp_path))):
        monkeypatch.chdir(where)
        train.main(tiny_config(data_dir, tmp_path / "out", compile=False, max_iters=1, overwrite=True))
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.endswith(f"; sample with: python {script} --out_dir={tmp_path / 'out'}"), last
        assert os.path.isfile(script)


def test_commands_name_python3_where_no_python_is_on_the_path(monkeypatch):
    """Debian's and Ubuntu's own Python is python3 alone: a pasted `python sample.py` said "command not found"."""
    import configurator
    import distributed
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(configurator.shutil, "which", lambda name: None if name == "python" else f"/usr/bin/{name}")
    monkeypatch.setattr(configurator.sys, "executable", "/usr/bin/python3")
    assert configurator.run_command("sample.py") == "python3 sample.py"
    assert distributed.relaunch_command(["--init_from=resume"]).startswith("python3 ")
    # a venv's python, not activated: PATH finds no python, and its python3.11 is another one
    monkeypatch.setattr(configurator.sys, "executable", "/home/me/venv/bin/python3.11")
    assert configurator.run_command("sample.py") == "/home/me/venv/bin/python3.11 sample.py"
    monkeypatch.setattr(configurator.shutil, "which", lambda name: f"/venv/bin/{name}")  # a venv's, say
    assert configurator.run_command("sample.py") == "python sample.py"


def test_resuming_in_a_read_only_out_dir_says_to_copy_it(tmp_path, data_dir, capsys, monkeypatch):
    """train.py's resume asks claim_out_dir for the resume's remedy: another --out_dir holds no checkpoint."""
    import dataclasses
    import files
    import train
    cfg = tiny_config(data_dir, tmp_path, compile=False, max_iters=2)
    train.main(cfg)

    def read_only(path, room=0):
        raise OSError(errno.EROFS, "Read-only file system", path)

    monkeypatch.setattr(files, "write_probe", read_only)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train.main(dataclasses.replace(cfg, init_from="resume", max_iters=4))
    assert "Read-only file system; copy it to a folder that can be written" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["max_iters", "max_seconds"])
def test_resuming_a_finished_run_is_one_line_and_writes_nothing(tmp_path, data_dir, capsys, limit):
    """A run that reached max_iters or max_seconds, resumed with the same settings, has nothing to train:
    one line before anything is written (it evaluated and saved again, and its record held that
    evaluation twice); --eval_only=true still evaluates it, and a higher limit trains on."""
    import dataclasses
    import train
    cfg = tiny_config(data_dir, tmp_path, compile=False, eval_interval=10**9,
                      **(dict(max_iters=3) if limit == "max_iters" else dict(max_seconds=0.5, max_iters=10**9)))
    train.main(cfg)
    files, done = ({name: (tmp_path / name).read_bytes() for name in ("ckpt.pt", "metrics.jsonl")},
                   load(tmp_path / "ckpt.pt"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        train.main(dataclasses.replace(cfg, init_from="resume"))
    err = capsys.readouterr().err
    value = getattr(cfg, limit)  # the limit it reached, named alone (max_seconds=0 is none: no time limit)
    assert refused.value.code == 2 and err.count("\n") == 1 and f"as far as {limit}={value} goes: nothing is " \
        f"left to train; raise --{limit} to train on, or evaluate it with --eval_only=true\n" in err, err
    assert {name: (tmp_path / name).read_bytes() for name in files} == files
    # an evaluation is told of what changes its losses (its batches' shape), not of training's settings
    train.main(dataclasses.replace(cfg, init_from="resume", eval_only=True, batch_size=2 * cfg.batch_size,
                                   eval_iters=cfg.eval_iters + 1, learning_rate=cfg.learning_rate / 2))
    out = capsys.readouterr().out
    assert "val loss" in out and f"note: batch_size {cfg.batch_size} -> {2 * cfg.batch_size}, eval_iters " \
        f"{cfg.eval_iters} -> {cfg.eval_iters + 1} since the checkpoint; the evaluation follows the new values\n" \
        in out, out
    assert "learning_rate" not in out and out.count("note:") == 1, out  # nor of the warm-up max_iters=3 ends in
    # nothing trains: the optimizer is the one whose state the checkpoint holds (Muon's), whatever the flag says
    train.main(dataclasses.replace(cfg, init_from="resume", eval_only=True, optimizer="adamw"))
    out = capsys.readouterr().out
    assert "val loss" in out and "note:" not in out and "not " + str(tmp_path / "ckpt.pt") not in out, out
    # without init_from=resume it evaluates a new model, as nanoGPT does: said, lest its losses pass for the run's
    train.main(dataclasses.replace(cfg, eval_only=True))
    assert f"evaluating the model of init_from=scratch, not {tmp_path / 'ckpt.pt'}: --init_from=resume evaluates " \
        "that\n" in capsys.readouterr().out
    more = dict(max_iters=4) if limit == "max_iters" else dict(max_seconds=1.0)
    train.main(dataclasses.replace(cfg, init_from="resume", **more))
    assert load(tmp_path / "ckpt.pt")["iter_num"] > done["iter_num"]


def test_a_resumed_run_names_every_setting_that_changes_its_training(tmp_path, data_dir, capsys, monkeypatch):
    """Every setting but the model's (which must stay) and checkpoint.NEUTRAL_SETTINGS (where the run
    writes, what it shows, how its arithmetic is spread) changes what a run trains: a resumed run names
    each one that changed. Settings whose 0 or auto means something (gradient_accumulation_steps, dtype)
    are compared as the run resolved them."""
    import dataclasses
    import train
    from checkpoint import NEUTRAL_SETTINGS
    cfg = dict(compile=False, max_iters=4, eval_interval=2, warmup_iters=2)  # past warm-up: no note of it
    interrupted_run(tiny_config(data_dir, tmp_path, **cfg), monkeypatch, at=2)
    capsys.readouterr()
    same = dataclasses.replace(tiny_config(data_dir, tmp_path, **cfg, init_from="resume",
                                           gradient_accumulation_steps=1),
                               data_dir=f"{data_dir}{os.sep}")  # the same directory, spelt another way
    interrupted_run(same, monkeypatch, at=3)
    assert "note:" not in capsys.readouterr().out, "gradient_accumulation_steps=0 meant 1 in the first run"
    neutral = dict(seed=7, log_interval=1, eval_iters=2, threads=1, eval_interval=3)
    assert set(neutral) <= set(NEUTRAL_SETTINGS)
    changes = dict(grad_clip=0.5, batch_size=3, gradient_accumulation_steps=2, dropout=0.1, dtype="bfloat16",
                   learning_rate=1e-3, muon_lr=0.01, max_iters=5, weight_decay=0.05, beta1=0.8, beta2=0.95,
                   warmup_iters=1, min_lr=1e-4)
    # other tokens, an optimizer's state, and where the decay ends (here at max_iters): the tests below
    elsewhere = ("data_dir", "optimizer", "max_seconds", "lr_decay_iters")
    model_settings = {f.name for f in dataclasses.fields(GPTConfig)}  # a fork's new one is no edit here
    assert (set(changes) | set(elsewhere)) - model_settings == {f.name for f in dataclasses.fields(
        train.TrainConfig)} - model_settings - set(NEUTRAL_SETTINGS), "a training setting this test leaves out"
    first = {**dataclasses.asdict(tiny_config(data_dir, tmp_path, **cfg)), "gradient_accumulation_steps": 1}
    train.main(tiny_config(data_dir, tmp_path, **{**cfg, **neutral, **changes}, init_from="resume"))
    note = next(line for line in capsys.readouterr().out.splitlines() if "since the checkpoint" in line)
    for name, value in changes.items():
        assert f"{name} {first[name]} -> {value}" in note, (name, note)
    assert not any(f"{name} " in note for name in neutral), note


def test_a_checkpoint_of_older_code_resumes_without_naming_changes_that_did_not_happen(tmp_path, data_dir, capsys,
                                                                                      monkeypatch):
    """Before runs recorded what dtype="auto" and gradient_accumulation_steps=0 resolved to, checkpoints
    held the auto and the 0; and a setting newer than a checkpoint is missing from it (here grad_clip,
    read as its default), as is a generator it did not keep yet (Apple's GPU's). The same command line
    resumes such a checkpoint with no note."""
    import train
    from checkpoint import save_checkpoint
    cfg = dict(compile=False, max_iters=4, eval_interval=2, warmup_iters=2)  # past warm-up: no note of it
    interrupted_run(tiny_config(data_dir, tmp_path, **cfg), monkeypatch, at=2)
    checkpoint = load(tmp_path / "ckpt.pt")
    checkpoint["config"].update(dtype="auto", gradient_accumulation_steps=0)
    del checkpoint["config"]["grad_clip"], checkpoint["rng"]["mps"]
    save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    capsys.readouterr()
    train.main(tiny_config(data_dir, tmp_path, **cfg, init_from="resume"))
    assert "note:" not in capsys.readouterr().out


def test_the_default_width_resumes_at_the_checkpoints_on_another_cpu(tmp_path, data_dir, monkeypatch):
    """n_embd=0 trains 128 wide on a CPU with bf16 instructions; the same command line resumes that run on a
    CPU without them (where n_embd=0 means 96), at the checkpoint's width."""
    import train
    wide, narrow = train.MACHINE_WIDTHS
    monkeypatch.setattr(train, "cpu_has_bf16", lambda: True)
    train.main(tiny_config(data_dir, tmp_path, compile=False, n_embd=0, max_iters=2))
    monkeypatch.setattr(train, "cpu_has_bf16", lambda: False)
    resumed = train.main(tiny_config(data_dir, tmp_path, compile=False, n_embd=0, max_iters=3, init_from="resume"))
    assert resumed.config.n_embd == wide and load(tmp_path / "ckpt.pt")["iter_num"] == 3
    assert train.main(tiny_config(data_dir, tmp_path / "new", compile=False, n_embd=0)).config.n_embd == narrow


def test_a_run_of_an_earlier_default_resumes_with_its_command_line(tmp_path, data_dir, capsys):
    """A model setting left at its default is the checkpoint's on resume: a run trained when the default had
    biases and LayerNorm resumes with the same command line after the default changed, and the checkpoint
    keeps saying so; a setting given otherwise is refused."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, bias=True, norm="layernorm", max_iters=2))
    resumed = train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=3, init_from="resume"))
    saved = load(tmp_path / "ckpt.pt")
    assert (resumed.config.bias, resumed.config.norm) == (True, "layernorm") and saved["iter_num"] == 3
    assert (saved["config"]["bias"], saved["config"]["norm"]) == (True, "layernorm")
    with pytest.raises(SystemExit) as refused:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=4, init_from="resume", activation="gelu"))
    assert refused.value.code == 2 and "activation=relu2 (now gelu)" in capsys.readouterr().err


def test_a_training_setting_whose_default_changed_says_how_to_keep_it(tmp_path, data_dir, capsys):
    """A run trained when min_lr's default was 2e-4 resumes at today's default (training settings follow the
    command line), and the note says so and names the flag that keeps the checkpoint's value; a value given
    on the command line gets no such advice."""
    import train
    from checkpoint import save_checkpoint
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2, warmup_iters=0))
    checkpoint = load(tmp_path / "ckpt.pt")
    checkpoint["config"]["min_lr"] = 2e-4  # the default then
    save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    capsys.readouterr()
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=3, warmup_iters=0, init_from="resume",
                           learning_rate=1e-3))
    out = capsys.readouterr().out
    assert "note: learning_rate 0.002 -> 0.001, max_iters 2 -> 3, min_lr 0.0002 -> 0.0 (the default; " \
        "--min_lr=0.0002 keeps the checkpoint's) since the checkpoint;" in out, out
    # a limit the checkpoint has reached is not offered: kept, it would leave nothing to train (resume refuses)
    checkpoint = load(tmp_path / "ckpt.pt")
    checkpoint["config"].update(max_seconds=0.5, max_iters=10**9)  # a run that stopped at its clock's limit
    checkpoint["trained_seconds"] = 0.5
    save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=4, max_seconds=190.0, warmup_iters=0,
                           init_from="resume"))
    out = capsys.readouterr().out
    assert "max_seconds 0.5 -> 190.0 since" in out or "max_seconds 0.5 -> 190.0," in out, out
    assert "--max_seconds=0.5 keeps" not in out, out


def test_a_resume_says_how_to_keep_what_auto_chose_for_the_checkpoint(tmp_path, data_dir, capsys):
    """dtype=auto and gradient_accumulation_steps=0 are chosen on each machine: resumed with them after a run
    that trained in the other dtype with two micro-batches, the note names the flags that keep the
    checkpoint's values, as it does for a setting left at its default; values given on the command line get
    no such advice."""
    import train
    auto = train.dtype_name(train.pick_dtype("auto", "cpu"))
    other = "float32" if auto == "bfloat16" else "bfloat16"
    cfg = dict(compile=False, max_iters=2, warmup_iters=0)
    train.main(tiny_config(data_dir, tmp_path / "a", **cfg, dtype=other, gradient_accumulation_steps=2))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    capsys.readouterr()
    for out_dir, given in (("a", dict(dtype="auto", gradient_accumulation_steps=0)),
                           ("b", dict(dtype=auto, gradient_accumulation_steps=1))):
        train.main(tiny_config(data_dir, tmp_path / out_dir, **{**cfg, "max_iters": 3}, init_from="resume", **given))
        note = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("note:"))
        hints = [f"dtype {other} -> {auto} (the default; --dtype={other} keeps the checkpoint's)",
                 "gradient_accumulation_steps 2 -> 1 (the default; --gradient_accumulation_steps=2 keeps the "
                 "checkpoint's)"]
        assert all((hint in note) == (out_dir == "a") for hint in hints), note
        assert f"dtype {other} -> {auto}" in note and "gradient_accumulation_steps 2 -> 1" in note, note
    # a value that would not run here gets no flag: fp16 on a CPU, micro-batches that two ranks cannot share
    checkpoint = load(tmp_path / "a" / "ckpt.pt")
    checkpoint["config"]["dtype"] = "float16"  # as a GPU run saves it
    save_checkpoint(checkpoint, tmp_path / "a" / "ckpt.pt")
    train.main(tiny_config(data_dir, tmp_path / "a", **{**cfg, "max_iters": 4}, init_from="resume", dtype="auto"))
    note = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("note:"))
    assert f"dtype float16 -> {auto} since" in note or f"dtype float16 -> {auto}," in note, note
    setup = train.Setup(0, 0, 2, True, False, 2, "cpu", torch.float32, chosen_here=train.RESOLVED_SETTINGS)
    assert train.keepable_here(setup, {"dtype": "float32", "gradient_accumulation_steps": 1}) == ("dtype",)
    assert train.keepable_here(setup, {"dtype": "float32", "gradient_accumulation_steps": 4}) == train.RESOLVED_SETTINGS


def test_an_evaluation_records_the_clocks_seconds_not_the_last_agreed_ones(tmp_path, data_dir, monkeypatch):
    """Under torchrun the ranks agree on the clock only every few seconds; evaluations recorded that agreed
    time, so two of them could say the same second, and loss.png's time axis went back. Here no agreement
    ever moves the time past 0 (as between a torchrun job's agreements), and the records still count it."""
    import train
    real = train.agree_on_stop
    monkeypatch.setattr(train, "agree_on_stop",
                        lambda signum, seconds, failed, device: real(signum, 0.0, failed, device))
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=6, eval_interval=2))
    seconds = [r["seconds"] for r in metrics(tmp_path) if "val_loss" in r]
    assert len(seconds) == 3 and 0 < seconds[0] < seconds[1] < seconds[2], seconds


def test_a_checkpoint_from_before_a_model_setting_existed_resumes_and_samples_as_it_was_trained(tmp_path, data_dir,
                                                                                                capsys):
    """mlp_ratio came after checkpoints that lack it, whose MLPs are GPT-2's 4 wide: the missing setting
    reads as GPTConfig's default, which must stay GPT-2's, and the same command line resumes it without a
    word of it; sample.py's loader builds it too."""
    import train
    from checkpoint import model_from_checkpoint, save_checkpoint
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2))
    checkpoint = load(tmp_path / "ckpt.pt")
    del checkpoint["config"]["mlp_ratio"], checkpoint["model_config"]["mlp_ratio"]
    save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    assert model_from_checkpoint(load(tmp_path / "ckpt.pt"), "ckpt.pt").config.mlp_ratio == 4
    capsys.readouterr()
    resumed = train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=3, init_from="resume"))
    assert resumed.config.mlp_ratio == 4 and load(tmp_path / "ckpt.pt")["iter_num"] == 3
    assert "mlp_ratio" not in capsys.readouterr().out  # nothing changed: no note of it


def test_a_resumed_runs_data_is_checked_against_its_own_block_size(tmp_path, capsys):
    """Left at its default, block_size is the checkpoint's (8) on resume, and so is the check of the data: a
    val split of 30 tokens serves it, though not the default's 64; the run says which settings it took."""
    import train
    from data.prepare import prepare_char
    prepare_char(TEXT, str(tmp_path / "data"), val_text=TEXT[:30])
    train.main(tiny_config(tmp_path / "data", tmp_path / "out", compile=False, max_iters=2))
    resumed = train.main(tiny_config(tmp_path / "data", tmp_path / "out", compile=False, max_iters=3,
                                     init_from="resume", block_size=train.TrainConfig().block_size))
    assert resumed.config.block_size == 8 and load(tmp_path / "out" / "ckpt.pt")["iter_num"] == 3
    assert "note: the model's settings as the checkpoint has them, where this run left them at (or set them to) " \
        "their defaults: block_size=8\n" in capsys.readouterr().out


def test_weights_whose_vocabulary_the_data_overflows_are_refused_before_anything_is_written(tmp_path, launch):
    """GPT-2's weights of 1000 tokens on data in GPT-2's 50257: the first batch had stopped the run (an empty
    out_dir left) saying the data "changed since it was prepared", which preparing again could not mend."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from data.loader import load_meta
    from data.prepare import prepare_bpe
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=1000)).save_pretrained(
        tmp_path / "small-vocab")
    prepare_bpe(str(tmp_path / "bpe"), texts=[TEXT])
    largest = max(load_meta(str(tmp_path / "bpe"))["splits"][split]["largest_id"] for split in ("train", "val"))
    proc = launch("train.py", f"--init_from={tmp_path / 'small-vocab'}", f"--data_dir={tmp_path / 'bpe'}",
                  f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--compile=false", "--block_size=16",
                  "--max_iters=2")
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc
    assert re.search(rf"holds token id {largest}, past the 1000 tokens of the vocabulary of {tmp_path}/small-vocab's "
                     r"weights: fine-tune weights of GPT-2's vocabulary \(50257\)", proc.stderr), proc.stderr
    assert not (tmp_path / "out").exists()


def test_fine_tune_gpt2_weights_then_resume_and_sample(tmp_path, launch):
    """configs/finetune_gpt2_shakespeare.toml with init_from=<a Hugging Face GPT-2 directory>: the
    model's shape comes from the weights, not from the flags (a vocab_size too), and the run resumes from
    its checkpoint with the same command line."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from data.prepare import prepare_bpe

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=50257))
    weights = tmp_path / "gpt2-tiny"
    hf.save_pretrained(weights)
    data, out = tmp_path / "bpe", tmp_path / "out"
    prepare_bpe(str(data), texts=[TEXT])
    common = ["configs/finetune_gpt2_shakespeare.toml", "--device=cpu", "--dtype=float32", "--block_size=16",
              "--batch_size=2", "--gradient_accumulation_steps=1", "--eval_iters=2", f"--data_dir={data}",
              f"--out_dir={out}", "--n_layer=6", "--vocab_size=50304"]
    (tmp_path / "a_file").write_text("")  # an out_dir it cannot make: one line, and the weights' line not before it
    unmade = tmp_path / "a_file" / "out"
    refused = launch("train.py", *common, f"--init_from={weights}", "--max_iters=0", f"--out_dir={unmade}")
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1, refused
    first = check_ok(launch("train.py", *common, f"--init_from={weights}", "--max_iters=0"))
    assert "settings come from the weights (1 layers, 2 heads, n_embd 16" in first.stdout, first.stdout
    # the one model setting given, not train.py's own defaults for a model from scratch
    assert re.search(r"; not used: vocab_size=50304, n_layer=6$", first.stdout, re.M), first.stdout
    ckpt = load(out / "ckpt.pt")
    c = ckpt["model_config"]
    assert (c["n_layer"], c["n_head"], c["n_embd"], c["block_size"], c["pos_embedding"]) == (1, 2, 16, 16, "learned")
    sd = hf.state_dict()
    assert torch.equal(ckpt["model"]["transformer.wte.weight"], sd["transformer.wte.weight"])
    assert torch.equal(ckpt["model"]["transformer.wpe.weight"], sd["transformer.wpe.weight"][:16])  # cropped
    assert torch.equal(ckpt["model"]["transformer.h.0.mlp.c_fc.weight"], sd["transformer.h.0.mlp.c_fc.weight"].t())

    occupied = launch("train.py", *common, f"--init_from={weights}", "--max_iters=0")  # before the weights are read
    assert occupied.returncode == 2 and "holds a trained run" in occupied.stderr and not occupied.stdout, occupied

    evaluation = re.compile(r"^iter \d+: train loss [0-9.]+, val loss [0-9.]+$", re.M)
    scored = check_ok(launch("train.py", *common, f"--init_from={weights}", "--eval_only=true",
                             f"--out_dir={tmp_path / 'eval'}"))
    assert evaluation.findall(scored.stdout) == evaluation.findall(first.stdout)[:1], scored.stdout  # same batches
    assert not (tmp_path / "eval").exists(), "eval_only writes nothing"

    resumed = check_ok(launch("train.py", *common, f"--init_from={weights}", "--init_from=resume", "--max_iters=3"))
    assert [int(m[0]) for m in LOG_LINE.findall(resumed.stdout)] == [1, 2, 3], resumed.stdout
    # the model's shape, as the weights gave it: not train.py's defaults for a model from scratch, which this run's
    # settings kept (so that its command line resumes it)
    assert "note: the model's settings as the checkpoint has them, where this run left them at (or set them to) " \
        "their defaults: n_head=2, n_embd=16, bias=True, pos_embedding=learned, norm=layernorm, " \
        "activation=gelu_tanh\n" in resumed.stdout, resumed.stdout
    rescored = check_ok(launch("train.py", *common, "--init_from=resume", "--eval_only=true", "--learning_rate=1e-3"))
    assert f"evaluating {out / 'ckpt.pt'} at iteration 3" in rescored.stdout, rescored.stdout
    assert "resuming" not in rescored.stdout and "training follows" not in rescored.stdout, rescored.stdout
    assert evaluation.findall(rescored.stdout) == evaluation.findall(resumed.stdout)[-1:], rescored.stdout
    assert load(out / "ckpt.pt")["iter_num"] == 3
    # vocab_size=0, the default, takes the first run's setting, which stays the checkpoint's; another is refused
    check_ok(launch("train.py", *common, "--init_from=resume", "--vocab_size=0", "--max_iters=4"))
    check_ok(launch("train.py", *common, "--init_from=resume", "--max_iters=5"))
    other = launch("train.py", *common, "--init_from=resume", "--vocab_size=50400", "--max_iters=6")
    assert other.returncode == 2 and "a vocabulary of 50257 tokens (now 50400)" in other.stderr, other.stderr
    # another shape is refused naming the weights' value, not the flags' n_layer=6; the weights' own resumes
    changed = launch("train.py", *common, "--init_from=resume", "--n_layer=2", "--max_iters=6")
    assert changed.returncode == 2 and "trained with n_layer=1 (now 2); resume with the same model settings " \
        "(--n_layer=1) and data" in changed.stderr, changed.stderr
    check_ok(launch("train.py", *common, "--init_from=resume", "--n_layer=1", "--n_head=2", "--n_embd=16",
                    "--max_iters=6"))
    too_long = launch("train.py", *common, f"--init_from={weights}", "--block_size=80", f"--out_dir={tmp_path / 'x'}")
    assert too_long.returncode == 2 and "block_size=80 is larger than the model's 64" in too_long.stderr, \
        too_long.stderr
    assert "Traceback" not in too_long.stderr and not (tmp_path / "x").exists()
    sample = check_ok(launch("sample.py", f"--out_dir={out}", "--device=cpu", "--max_new_tokens=5", "--start=Speak"))
    assert sample.stdout.startswith("Speak"), sample.stdout


def test_a_new_run_starts_its_metrics_afresh_and_a_resumed_one_keeps_its_own(tmp_path, data_dir, launch):
    out = tmp_path / "out"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--eval_interval=2", "--log_interval=1"]
    check_ok(launch("train.py", *args, "--max_iters=2"))
    with open(out / "metrics.jsonl", "a") as f:  # what a crash after the checkpoint leaves: a later record, a torn line
        f.write(json.dumps({"iter": 3, "loss": 1.0}) + '\n{"iter": 4, "lo')
    check_ok(launch("train.py", *args, "--max_iters=4", "--init_from=resume"))
    assert [r["iter"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]
    assert all(r.get("loss") != 1.0 for r in metrics(out)), "the record past the checkpoint was kept"
    first_run = load(out / "ckpt.pt")["run_id"]
    assert {r["run"] for r in metrics(out)} == {first_run}, "a resumed run is the same run"
    check_ok(launch("train.py", *args, "--max_iters=1", "--overwrite=true"))
    assert [r["iter"] for r in metrics(out)] == [1, 1], "a new run's metrics mixed with the old run's"
    assert load(out / "ckpt.pt")["iter_num"] == 1
    assert {r["run"] for r in metrics(out)} == {load(out / "ckpt.pt")["run_id"]} != {first_run}


def test_an_overwriting_run_that_saved_nothing_does_not_take_the_earlier_runs_checkpoint_for_its_own(
        tmp_path, data_dir, launch):
    """--overwrite=true leaves the earlier run's ckpt.pt, and its records, until the new run's first save. A
    new run that fails before it does not offer that file as its own "last good checkpoint", and a resume,
    which continues the earlier run, keeps that run's records and none of the failed run's."""
    out = tmp_path / "out"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--log_interval=1"]
    check_ok(launch("train.py", *args, "--max_iters=2", "--eval_interval=2"))
    earlier = load(out / "ckpt.pt")["run_id"]
    blown = launch("train.py", *args, "--overwrite=true", "--learning_rate=1e9", "--warmup_iters=0",
                   "--max_iters=50", "--eval_interval=1000")
    assert blown.returncode == 1 and re.search(r"error: the loss became (nan|inf) at iteration (\d+); lower "
                                               r"--learning_rate and --muon_lr\n$", blown.stderr), blown.stderr
    blown_at = int(re.search(r"iteration (\d+)", blown.stderr).group(1))
    assert blown_at >= 2, "the failed run logged no record that a resume at iteration 2 could take for its own"
    assert load(out / "ckpt.pt")["run_id"] == earlier
    assert [r["iter"] for r in metrics(out) if "loss" in r and r["run"] == earlier] == [1, 2]
    check_ok(launch("train.py", *args, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    assert [r["iter"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]
    assert {r["run"] for r in metrics(out)} == {earlier}


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_an_fp16_overflow_in_one_optimizers_gradients_skips_every_optimizers_step(tmp_path, grad_clip):
    """fp16's GradScaler skips the step of an optimizer whose own gradients overflowed. An inf in the tied
    embedding's gradient (AdamW's; its fp16 weight-gradient matmul sums over every token) skipped AdamW,
    while Muon, its gradients finite (or zeroed by clipping an infinite norm), stepped on momentum alone."""
    import train
    cfg = tiny_config(tmp_path, tmp_path, grad_clip=grad_clip)
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float16)  # the scaler, as on a GPU
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16))
    state = train.new_train_state(cfg, setup, model, np.random.default_rng(0).integers(64, size=500).astype(np.uint16))
    train.train_step(state, model, cfg, setup, 1.0)  # a step without overflow: Muon has momentum
    before, scale = {n: p.detach().clone() for n, p in model.named_parameters()}, state.scaler.get_scale()

    def overflowed(grad):
        grad = grad.clone()
        grad[0, 0] = float("inf")
        return grad

    model.transformer.wte.weight.register_hook(overflowed)
    train.train_step(state, model, cfg, setup, 1.0)
    assert state.scaler.get_scale() == scale / 2, "the scaler did not see the overflow"
    assert [n for n, p in model.named_parameters() if not torch.equal(p, before[n])] == []


def test_another_rank_takes_out_dirs_checkpoint_for_its_runs_only_where_rank_0_wrote_it(tmp_path, data_dir,
                                                                                         monkeypatch):
    """Rank 0 alone writes ckpt.pt. Rank 1 (of two: here rank 0's side of each gather is stood in) calls
    it this run's only once rank 0 has written it, so that its out-of-memory line does not offer an
    earlier run's checkpoint (--overwrite=true) as its own while rank 0's says nothing was saved."""
    import train
    cfg = tiny_config(data_dir, tmp_path, compile=False, overwrite=True)
    (tmp_path / "ckpt.pt").write_bytes(b"an earlier run's checkpoint")
    setup = train.Setup(rank=1, local_rank=1, world_size=2, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    data = train.load_data(cfg, setup)
    state = train.new_train_state(cfg, setup, GPT(train.model_config(cfg, data.meta["vocab_size"])), data.train)
    for rank_0_wrote in (False, True):
        monkeypatch.setattr(train, "gather", lambda mine: [rank_0_wrote, mine])
        assert train.save(state, cfg, data, setup, "evaluation") == rank_0_wrote
        assert train.has_checkpoint(cfg, state) == rank_0_wrote


def test_a_stop_before_the_first_evaluation_leaves_out_dir_to_the_new_run(tmp_path, data_dir, monkeypatch):
    """--overwrite=true, then Ctrl-C before the first evaluation: the stop's save makes out_dir's checkpoint
    the new run's, and its records and loss.png follow (the earlier run's picture had stayed)."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2, eval_interval=2, log_interval=1))
    earlier_picture = (tmp_path / "loss.png").read_bytes()
    step, steps = train.train_step, []

    def interrupted_in_the_third(*args):
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # StopRequest's handler: the step finishes, then the stop
        return step(*args)

    monkeypatch.setattr(train, "train_step", interrupted_in_the_third)
    with pytest.raises(SystemExit) as exit:
        train.main(tiny_config(data_dir, tmp_path, compile=False, overwrite=True, max_iters=100, eval_interval=100,
                               log_interval=1))
    assert exit.value.code == 128 + signal.SIGINT
    new = load(tmp_path / "ckpt.pt")
    assert new["iter_num"] == 3
    assert [(r["iter"], r["run"]) for r in metrics(tmp_path)] == [(i, new["run_id"]) for i in (1, 2, 3)]
    assert (tmp_path / "loss.png").read_bytes() != earlier_picture


def test_a_resume_names_token_files_prepared_again_since_the_checkpoint(tmp_path, launch):
    """Its data folder prepared again from other text of the same characters (the nine plays where it had every
    play, say): the resume went on without a word, where the README says it names what changed since."""
    from data.prepare import prepare_char
    data = tmp_path / "data"
    prepare_char(TEXT, str(data))
    args = [*TINY, f"--data_dir={data}", f"--out_dir={tmp_path / 'out'}", "--lr_decay_iters=8"]
    check_ok(launch("train.py", *args, "--max_iters=2"))
    same = check_ok(launch("train.py", *args, "--max_iters=3", "--init_from=resume"))
    assert "note" not in same.stdout, same.stdout
    prepare_char(TEXT * 2, str(data))  # the same characters, twice the text
    again = check_ok(launch("train.py", *args, "--max_iters=4", "--init_from=resume"))
    assert re.search(rf"^note: {re.escape(str(data))}'s train.bin [\d,]+ -> [\d,]+ tokens, {re.escape(str(data))}'s "
                     r"val.bin [\d,]+ -> [\d,]+ tokens since the checkpoint", again.stdout, re.M), again.stdout
    prepare_char(TEXT[::-1] * 2, str(data))  # the same characters, as many of them, in another order
    other = check_ok(launch("train.py", *args, "--max_iters=5", "--init_from=resume"))
    train_count, val_count = (f"{n:,}" for n in (len(TEXT) * 2 * 9 // 10, len(TEXT) * 2 - len(TEXT) * 2 * 9 // 10))
    assert f"note: {data}'s train.bin {train_count} -> {train_count} other tokens, {data}'s val.bin {val_count} -> " \
        f"{val_count} other tokens since the checkpoint" in other.stdout, other.stdout
    # data an older prepare.py wrote records no token files: their lengths are compared
    prepare_char(TEXT, str(data))
    meta = json.loads((data / "meta.json").read_text())
    del meta["splits"]
    (data / "meta.json").write_text(json.dumps(meta))
    older_data = check_ok(launch("train.py", *args, "--max_iters=6", "--init_from=resume"))
    assert re.search(rf"^note: {re.escape(str(data))}'s train.bin [\d,]+ -> [\d,]+ tokens", older_data.stdout,
                     re.M), older_data.stdout
    # a checkpoint older than the record: what cannot be checked is said
    from checkpoint import save_checkpoint
    checkpoint = load(tmp_path / "out" / "ckpt.pt")
    del checkpoint["splits"]
    save_checkpoint(checkpoint, tmp_path / "out" / "ckpt.pt")
    older_run = check_ok(launch("train.py", *args, "--max_iters=7", "--init_from=resume"))
    assert f"note: {tmp_path / 'out' / 'ckpt.pt'} is older than the record of the token files a run trained on: " \
        f"that {data} still holds them cannot be checked" in older_run.stdout, older_run.stdout


def test_a_resume_notes_no_change_where_the_run_trains_as_an_uninterrupted_one(tmp_path, data_dir, capsys):
    """The data folder spelled another way, or a copy of its files; lr_decay_iters where the clock decays the
    rate: each said "training follows the new values, so this run will not match an uninterrupted one",
    and the weights matched. A folder of other tokens is still named."""
    import dataclasses
    import train
    from checkpoint import check_resumable
    from data.loader import load_meta, tokenizer_meta
    from data.prepare import prepare_char
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2, eval_interval=2))
    checkpoint, meta = load(tmp_path / "ckpt.pt"), load_meta(str(data_dir))
    splits, meta = meta["splits"], tokenizer_meta(meta)
    resumed = train.TrainConfig(**{**checkpoint["config"], "init_from": "resume"})
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    for data in (os.path.abspath(data_dir) + os.sep, str(copy)):
        note = check_resumable(checkpoint, "ckpt.pt", dataclasses.replace(resumed, data_dir=data), meta, splits)
        assert note == "", (data, note)
    older = {k: v for k, v in checkpoint.items() if k != "splits"}  # no record of its files: the folder decides
    spelled = dataclasses.replace(resumed, data_dir=os.path.abspath(data_dir) + os.sep)
    assert "data_dir" not in check_resumable(older, "ckpt.pt", spelled, meta, splits)
    assert "data_dir" in check_resumable(older, "ckpt.pt", dataclasses.replace(resumed, data_dir=str(copy)), meta,
                                         splits)
    prepare_char(TEXT[::-1], str(copy))  # the same characters in another order: other tokens
    assert check_resumable(checkpoint, "ckpt.pt", dataclasses.replace(resumed, data_dir=str(copy)), meta,
                           load_meta(str(copy))["splits"]).startswith(f"note: data_dir {data_dir} -> {copy}, {copy}'s "
                                                                      "train.bin")
    clock = dataclasses.replace(resumed, max_seconds=60.0, lr_decay_iters=5000)
    clocked = {**checkpoint, "config": {**checkpoint["config"], "max_seconds": 60.0}}
    assert check_resumable(clocked, "ckpt.pt", clock, meta, splits) == ""
    by_iterations = dataclasses.replace(resumed, lr_decay_iters=500)  # read there: a change the run follows
    assert "lr_decay_iters 0 -> 500" in check_resumable(checkpoint, "ckpt.pt", by_iterations, meta, splits)
    # records without checksums (data an older prepare.py wrote) in another folder: other tokens, maybe
    unsummed = {name: {k: v for k, v in record.items() if k != "crc32"} for name, record in splits.items()}
    assert "data_dir" in check_resumable({**checkpoint, "splits": unsummed}, "ckpt.pt",
                                         dataclasses.replace(resumed, data_dir=str(copy)), meta, unsummed)


def test_a_failed_save_says_what_would_fix_it_where_that_is_known(tmp_path, monkeypatch):
    """Full: free some space; read-only, no permission, immutable: make out_dir writable; else nothing."""
    import types
    import train
    cfg, state = train.TrainConfig(out_dir=str(tmp_path)), types.SimpleNamespace(iter_num=5, saved=False)
    for code, fix in ((errno.ENOSPC, "free some space"), (errno.EDQUOT, "free some space"),
                      (errno.EROFS, "make out_dir writable"), (errno.EACCES, "make out_dir writable"),
                      (errno.EPERM, "make out_dir writable"), (errno.ENOENT, ""), (errno.EISDIR, "")):
        def refused(checkpoint, path, code=code):
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(train, "save_checkpoint", refused)
        problem, said = train.write_checkpoint({}, str(tmp_path / "ckpt.pt"), cfg, state)
        assert problem == f"could not write {tmp_path / 'ckpt.pt'} at iteration 5: {os.strerror(code)}"
        assert said == fix, (code, said)


def test_token_files_compare_by_what_both_records_say():
    """A checkpoint of data prepared before the checksum was recorded, resumed on the same data prepared again
    (now with one): the same files, not other ones."""
    from checkpoint import other_tokens
    old, new = {"tokens": 5, "largest_id": 3}, {"tokens": 5, "largest_id": 3, "crc32": 9}
    assert not other_tokens(old, new) and not other_tokens(new, old) and not other_tokens(new, dict(new))
    assert other_tokens(new, {**new, "crc32": 8}) and other_tokens(old, {**new, "tokens": 6})
    assert other_tokens({"tokens": 5}, {"tokens": 6}) and not other_tokens({"tokens": 5}, new)  # a run's own record


def tiny_config(data_dir, out_dir, **overrides):
    from train import TrainConfig
    return TrainConfig(**{**dict(device="cpu", dtype="float32", max_seconds=0, max_iters=3, n_layer=1, n_head=2,
                                 n_embd=16, block_size=8, batch_size=2, eval_iters=1, data_dir=str(data_dir),
                                 out_dir=str(out_dir)), **overrides})


def test_a_resumed_run_on_the_clock_steps_at_the_rate_of_the_seconds_it_has_trained(tmp_path, data_dir, monkeypatch):
    """Under max_seconds the rates follow the seconds trained: a resumed run's first step takes the rate of
    the checkpoint's seconds, not of 0 s (the peak: ~13x too high, 90 s into 100)."""
    import train
    from checkpoint import save_checkpoint
    cfg = dict(compile=False, warmup_iters=2, max_seconds=100.0, eval_interval=1000)
    train.main(tiny_config(data_dir, tmp_path, **cfg, max_iters=4))
    checkpoint = load(tmp_path / "ckpt.pt")
    checkpoint["trained_seconds"] = 90.0  # as if 90 s of the 100 were trained
    save_checkpoint(checkpoint, str(tmp_path / "ckpt.pt"))
    seen, real = [], train.lr_multiplier
    monkeypatch.setattr(train, "lr_multiplier", lambda cfg, it, elapsed: seen.append(elapsed) or real(cfg, it, elapsed))
    train.main(tiny_config(data_dir, tmp_path, **cfg, max_iters=5, init_from="resume"))
    assert len(seen) == 1 and 90.0 <= seen[0] < 95.0, seen


def test_evaluations_and_saves_are_not_training_time(tmp_path, data_dir, monkeypatch):
    """The clock stops while a run evaluates and saves: under max_seconds they neither eat the budget nor
    move the decay (here each evaluation takes a second; the four steps, milliseconds)."""
    import train
    real = train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *args: time.sleep(1.0) or real(*args))
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=4, eval_interval=2))
    assert load(tmp_path / "ckpt.pt")["trained_seconds"] < 1.0


def test_a_non_finite_loss_between_log_lines_stops_the_run_at_an_evaluation_before_it_saves(tmp_path, data_dir,
                                                                                          monkeypatch, capsys):
    """A NaN loss with no log line since (log_interval 50) and an evaluation next: the run stops there, naming
    the iteration, rather than saving the diverged weights and training on."""
    import train
    real = train.train_step

    def nan_at_the_second_step(state, *args):
        loss = real(state, *args)
        return torch.full_like(loss, float("nan")) if state.iter_num == 1 else loss

    monkeypatch.setattr(train, "train_step", nan_at_the_second_step)
    with pytest.raises(SystemExit) as exit:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=4, eval_interval=2, log_interval=50))
    assert exit.value.code == 1 and "error: the loss became nan at iteration 2;" in capsys.readouterr().err
    assert not (tmp_path / "ckpt.pt").exists()


def test_a_stop_whose_evaluation_cannot_save_says_so_once_and_does_not_promise_another_try(tmp_path, data_dir,
                                                                                           monkeypatch, capsys):
    """Ctrl-C during the step that ends at an evaluation, on a full disk: that evaluation's save is the stop's
    own, the last; one error line, not first a warning that training goes on and tries again."""
    import signal

    import train
    real, writes = train.train_step, []

    def step(state, *args):
        if state.iter_num == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real(state, *args)

    def disk_full(checkpoint, path):
        writes.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train, "train_step", step)
    monkeypatch.setattr(train, "save_checkpoint", disk_full)
    with pytest.raises(SystemExit) as exit:
        train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=6, eval_interval=2))
    out = capsys.readouterr()
    assert exit.value.code == 1 and len(writes) == 1 and "tries again" not in out.out, out.out
    assert out.err == (f"error: could not write {tmp_path / 'ckpt.pt'} at iteration 2: No space left on device; free "
                       "some space, or pick another --out_dir, and run again\n"), out.err


@pytest.mark.parametrize("errno_, fix", [(errno.ENOSPC, "free some space and resume (--init_from=resume), or "),
                                         (errno.ENOENT, "")], ids=["disk-full", "out_dir-gone"])
def test_a_resumed_run_whose_last_save_fails_says_how_to_go_on_from_its_checkpoint(tmp_path, data_dir, monkeypatch,
                                                                                   capsys, errno_, fix):
    """A resumed run keeps the checkpoint it started from: "pick another --out_dir, and run again" found no
    checkpoint to resume there, and without --init_from=resume trained from scratch."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2, eval_interval=2))
    capsys.readouterr()

    def cannot_write(checkpoint, path):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(train, "save_checkpoint", cannot_write)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, max_iters=4, eval_interval=100,
                                                init_from="resume"), capsys)
    ckpt = tmp_path / "ckpt.pt"
    assert status == 1 and out.err == (f"error: could not write {ckpt} at iteration 4: {os.strerror(errno_)}; {ckpt} "
                                       f"still holds the previous checkpoint; {fix}copy it to a folder that can be "
                                       f"written (cp -r {tmp_path} NEW) and resume there with --out_dir=NEW\n"), out.err
    assert load(ckpt)["iter_num"] == 2


def test_the_schedule_reaches_the_optimizers_and_decays_over_max_iters_by_default(tmp_path, data_dir, monkeypatch):
    """Every group of both optimizers steps at its peak rate times the schedule: a linear warm-up, then a
    cosine from the peak down to min_lr/learning_rate at max_iters (lr_decay_iters=0)."""
    import math
    import train
    real, multipliers = train.train_step, []

    def train_step(state, *args):
        loss = real(state, *args)
        multipliers.append({round(g["lr"] / g["initial_lr"], 12) for opt in state.optimizers for g in opt.param_groups})
        return loss

    monkeypatch.setattr(train, "train_step", train_step)
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=6, warmup_iters=2, learning_rate=1e-3,
                           min_lr=1e-4, lr_decay_iters=0))
    floor = 0.1  # min_lr / learning_rate
    cosine = [floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (it - 2) / (6 - 2))) for it in range(2, 6)]
    assert multipliers == [{round(m, 12)} for m in [1 / 3, 2 / 3, *cosine]]


def gradient_at_the_update(cfg, accumulation_steps, model, tokens, monkeypatch, dtype=torch.float32):
    """Every gradient, flattened, as the optimizers get it in train.py's first step of model on tokens
    (in fp16, through the loss scaler, as on a GPU)."""
    import train
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False,
                        accumulation_steps=accumulation_steps, device="cpu", dtype=dtype)
    state = train.new_train_state(cfg, setup, model, tokens)
    seen, real_step = [], state.optimizers[0].step

    def step(*args, **kwargs):  # the first optimizer to step: every gradient as the step left it
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(state.optimizers[0], "step", step)
    train.train_step(state, model, cfg, setup, 1.0)
    return seen[0]


def test_the_best_val_loss_is_the_lowest_on_the_way_not_the_last(tmp_path, data_dir, monkeypatch, capsys):
    """A run whose val loss rises after its first evaluation: its checkpoint and its last line keep the lowest."""
    import train
    said = iter([2.0, 3.0, 2.5])
    monkeypatch.setattr(train, "evaluate", lambda *args, **kwargs: {"train": 1.0, "val": next(said)})
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=6, eval_interval=2))
    assert load(tmp_path / "ckpt.pt")["best_val_loss"] == 2.0
    assert "(best val loss on the way 2.0000)" in capsys.readouterr().out


def test_clipping_reaches_the_optimizers(tmp_path, data_dir, monkeypatch):
    """What the optimizers step on has a norm of at most grad_clip, where the raw gradient's is larger; in
    fp16 too, where the gradients are clipped once the loss scaler has divided its scale back out (clipped
    before, at 65,536 times their size, they would step at a norm 65,536 times too small)."""
    import train
    tokens = np.random.default_rng(0).integers(40, size=500).astype(np.uint16)

    def norm(grad_clip, dtype=torch.float32):
        cfg = tiny_config(data_dir, tmp_path, compile=False, grad_clip=grad_clip)
        torch.manual_seed(0)
        model = GPT(train.model_config(cfg, 40))
        return gradient_at_the_update(cfg, 1, model, tokens, monkeypatch, dtype).norm().item()

    assert norm(0.0) > 0.05
    assert norm(0.05) == pytest.approx(0.05, rel=1e-4)
    assert norm(0.05, torch.float16) == pytest.approx(0.05, rel=1e-4)


def test_a_step_over_micro_batches_steps_on_their_mean_gradient(tmp_path, data_dir, monkeypatch):
    """Two micro-batches of 2 sequences give the gradient of one batch of all 4: the mean, not the sum."""
    import copy
    import train
    from data.loader import Batches
    tokens = np.random.default_rng(0).integers(40, size=500).astype(np.uint16)
    cfg = tiny_config(data_dir, tmp_path, compile=False, grad_clip=0.0)
    torch.manual_seed(0)
    model = GPT(train.model_config(cfg, 40))
    whole = copy.deepcopy(model)
    batches = Batches(tokens, cfg.block_size, cfg.batch_size, cfg.seed, "cpu")  # as the step's own draws them
    whole(*batches.load(batches.offsets(2).flatten()))[1].backward()
    expected = torch.cat([p.grad.flatten() for p in whole.parameters() if p.grad is not None])
    torch.testing.assert_close(gradient_at_the_update(cfg, 2, model, tokens, monkeypatch), expected,
                               atol=1e-6, rtol=1e-5)


def test_evaluation_reads_each_split_and_the_same_batches_whatever_the_seed(tmp_path, data_dir):
    import train
    rng = np.random.default_rng(0)
    a, b = (rng.integers(n, size=2000).astype(np.uint16) for n in (10, 40))  # two unlike streams
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    torch.manual_seed(0)
    model = GPT(train.model_config(tiny_config(data_dir, tmp_path), 40))
    meta = {"tokenizer": "random", "vocab_size": 40}
    losses = {seed: train.evaluate(model, train.Data(a, b, meta), tiny_config(data_dir, tmp_path, seed=seed), setup)
              for seed in (1, 2)}
    swapped = train.evaluate(model, train.Data(b, a, meta), tiny_config(data_dir, tmp_path, seed=1), setup)
    assert losses[1]["val"] != losses[1]["train"]
    assert (swapped["val"], swapped["train"]) == (losses[1]["train"], losses[1]["val"])
    assert losses[1] == losses[2], "the evaluation batches depend on the run's seed"


def test_evaluation_is_the_mean_loss_of_its_batches(tmp_path, data_dir):
    """evaluate's number for each split is the mean of the model's loss over the eval_iters batches
    drawn with EVAL_SEED, recomputed here one batch at a time: not their sum, nor one batch's loss."""
    import train
    from data.loader import Batches
    rng = np.random.default_rng(0)
    a, b = (rng.integers(n, size=2000).astype(np.uint16) for n in (10, 40))
    setup = train.Setup(rank=0, local_rank=0, world_size=1, distributed=False, fsdp=False, accumulation_steps=1,
                        device="cpu", dtype=torch.float32)
    cfg = tiny_config(data_dir, tmp_path, eval_iters=3)
    torch.manual_seed(0)
    model = GPT(train.model_config(cfg, 40))
    losses = train.evaluate(model, train.Data(a, b, {"tokenizer": "random", "vocab_size": 40}), cfg, setup)
    model.eval()
    for split, tokens in (("train", a), ("val", b)):
        batches = Batches(tokens, cfg.block_size, cfg.batch_size, seed=train.EVAL_SEED, device="cpu")
        with torch.no_grad():
            each = [model(*batches.load(offsets))[1].item() for offsets in batches.offsets(3)]
        assert max(each) - min(each) > 0.01, "the batches are too alike to tell a mean from one of them"
        assert losses[split] == pytest.approx(sum(each) / 3, rel=0, abs=1e-6), (split, each)


def test_evaluations_build_no_autograd_graph(tmp_path, data_dir, monkeypatch):
    """Every forward in eval mode (evaluations, and timing one under a budget) runs without autograd."""
    import train
    from model import GPT
    seen, forward = set(), GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: seen.add((self.training, torch.is_grad_enabled()))
                        or forward(self, *a, **k))
    train.main(tiny_config(data_dir, tmp_path / "out", compile=False, max_seconds=1, max_iters=4, eval_interval=2))
    assert seen == {(True, True), (False, False)}, seen


def test_a_run_inside_the_tests_leaves_this_worker_on_one_thread(tmp_path, data_dir):
    """train.main sets torch's threads (threads=0: OMP_NUM_THREADS, else every CPU); conftest's one_thread
    keeps that at 1, or every later test here would spin threads beside the other workers' (5 min, not 3)."""
    import train
    train.main(tiny_config(data_dir, tmp_path / "out", compile=False))
    assert torch.get_num_threads() == 1


def test_under_a_time_budget_an_evaluation_takes_at_most_a_tenth_of_it(tmp_path, data_dir, capsys, monkeypatch):
    """eval_iters=100000 batches would take minutes; under max_seconds=2 each evaluation is cut to what
    runs in 0.2 s at the speed of a batch timed before the clock starts, with a note that says so."""
    import train
    evaluate, seconds = train.evaluate, []

    def timed_evaluate(*args, **kwargs):
        started = time.perf_counter()
        losses = evaluate(*args, **kwargs)
        seconds.append(time.perf_counter() - started)
        return losses
    monkeypatch.setattr(train, "evaluate", timed_evaluate)
    train.main(tiny_config(data_dir, tmp_path / "out", compile=False, max_seconds=2, max_iters=10**9,
                           eval_iters=100000, eval_interval=10**9))
    out = capsys.readouterr().out
    note = re.search(r"^note: an evaluation of 2 x 100000 batches would take ~(\d+) s, .*each evaluation takes "
                     r"2 x (\d+) ", out, re.M)
    assert note, out
    # not "--max_seconds=0" alone, which drops the budget and trains to max_iters' million
    assert "(--eval_iters asks for fewer; a run counted in iterations, --max_seconds=0 --max_iters=N, takes all)" in out
    whole, cut = map(int, note.groups())
    batch_seconds = whole / (2 * 100000)  # the note's estimate: 2 splits x 100000 batches
    # the cut: per split, the batches that fit in half of a tenth of the 2 s at that speed
    assert cut == pytest.approx(train.EVAL_SHARE * 2 / (2 * batch_seconds), rel=0.02, abs=1), (whole, cut)
    # so the evaluation itself takes ~0.2 s; other tests running beside it may slow it several times
    assert seconds and max(seconds) < 10 * train.EVAL_SHARE * 2, seconds


@pytest.mark.compiles
def test_the_default_compiles_before_the_clock_starts(tmp_path, data_dir, monkeypatch, capsys):
    """Compiling, however long it takes, is not training time: the model's and Muon's compiles, 1 s
    each, leave a 3-step run's clock well under 2 s. The compiled model is the one that trains."""
    import optim
    import train
    calls = []

    def slow_compile(fn, **options):
        time.sleep(1.0)
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", slow_compile)
    train.main(tiny_config(data_dir, tmp_path / "out"))
    assert isinstance(calls[0], GPT) and calls[1:] == [optim.muon_update], calls
    assert "compiled in 2." in capsys.readouterr().out
    assert load(tmp_path / "out" / "ckpt.pt")["trained_seconds"] < 1.5


def test_the_checkpoint_records_the_device_and_dtype_that_auto_became(tmp_path, data_dir):
    """A result read from a checkpoint (bench/recipe.py's JSON, say) can tell a GPU run from a CPU run."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, device="auto", dtype="auto"))
    saved = load(tmp_path / "ckpt.pt")["config"]
    assert saved["device"] == "cpu" and saved["dtype"] in ("float32", "bfloat16"), saved


def test_the_default_width_is_the_machines_and_the_checkpoint_records_it(tmp_path, data_dir, monkeypatch):
    """n_embd=0 trains 128 wide where the CPU has bf16 instructions and 96 wide where it has not (whatever
    --dtype says); the checkpoint's settings hold the width, so the same flags resume it; a set n_embd
    stays, and GPUs take the wide one. A width n_head does not divide fails on every machine alike."""
    import train
    wide, narrow = train.MACHINE_WIDTHS
    for bf16, width in ((True, wide), (False, narrow)):
        monkeypatch.setattr(train, "cpu_has_bf16", lambda: bf16)
        out = tmp_path / str(width)
        assert train.main(tiny_config(data_dir, out, compile=False, n_embd=0)).config.n_embd == width
        checkpoint = load(out / "ckpt.pt")
        assert checkpoint["config"]["n_embd"] == checkpoint["model_config"]["n_embd"] == width
        resumed = train.main(tiny_config(data_dir, out, compile=False, n_embd=0, init_from="resume", max_iters=5))
        assert resumed.config.n_embd == width and load(out / "ckpt.pt")["iter_num"] == 5
        assert train.with_machine_width(tiny_config(data_dir, out, n_embd=32), "cpu").n_embd == 32
        assert train.with_machine_width(tiny_config(data_dir, out, n_embd=0), "cuda").n_embd == wide
    with pytest.raises(ValueError, match=r"^n_head must be at least 1, got 0$"):  # no width's doing
        tiny_config(data_dir, tmp_path, n_embd=0, n_head=0)
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1.5$"):  # no n_head fits: dropout's error
        tiny_config(data_dir, tmp_path, n_embd=0, n_head=3, dropout=1.5)
    with pytest.raises(ValueError, match=f"at {wide}, n_embd={wide} must be divisible by n_head=3") as refused:
        tiny_config(data_dir, tmp_path, n_embd=0, n_head=3)  # 96 would fit, 128 does not
    # the n_head it lists are those that n_embd=0 takes (with rope: an even head size at both widths)
    listed = [int(n) for n in re.search(r"n_head can be one of ([\d, ]+) \(or set --n_embd\)", str(refused.value))
              .group(1).split(", ")]
    taken = []
    for n_head in range(1, wide + 1):
        try:
            taken.append(tiny_config(data_dir, tmp_path, n_embd=0, n_head=n_head).n_head)
        except ValueError:
            pass
    assert listed == taken and 32 not in listed  # 128 / 32 = 4, but 96 / 32 = 3: odd, no rope
    with pytest.raises(ValueError, match="n_embd must be at least 0,"):  # not "positive": 0 is a choice
        tiny_config(data_dir, tmp_path, n_embd=-1)
    assert f"0: {wide}, or {narrow} on a CPU without bf16" in help_text(train.TrainConfig)


@pytest.mark.parametrize("slow", ["evaluate", "draw"])
def test_the_log_line_after_an_evaluation_does_not_count_it(tmp_path, data_dir, monkeypatch, slow):
    """ms/iter, tokens/s and MFU are training speed: a 3 s evaluation between two log lines stays out,
    and so does drawing loss.png after it."""
    import log
    import train
    owner = train if slow == "evaluate" else log.MetricsLog
    real, slept = getattr(owner, slow), []

    def slowed(*args):
        if not slept:  # the evaluation at iteration 2, between the log lines at 2 and 4
            time.sleep(3.0)
            slept.append(True)
        return real(*args)

    monkeypatch.setattr(owner, slow, slowed)
    train.main(tiny_config(data_dir, tmp_path / "out", compile=False, max_iters=4, eval_interval=2, log_interval=2))
    logged = {r["iter"]: r["ms_per_iter"] for r in metrics(tmp_path / "out") if "ms_per_iter" in r}
    # counted, the evaluation would add 1,500 ms an iteration; a step of this model takes ~50 ms, and
    # a few hundred with other tests running beside it
    assert sorted(logged) == [2, 4] and logged[4] < 1000, logged


@pytest.mark.compiles
def test_a_model_that_cannot_compile_trains_uncompiled_with_a_note(tmp_path, data_dir, monkeypatch, capsys):
    import train

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", lambda model: broken)
    model = train.main(tiny_config(data_dir, tmp_path / "out"))
    out = capsys.readouterr().out
    assert "note: torch.compile failed (RuntimeError: no C++ compiler found); training uncompiled" in out
    assert "more detail" not in out and "done: 3 iterations" in out
    assert all(p.grad is None for p in model.parameters()), "the compile attempt left gradients behind"


def test_a_compilers_error_names_what_went_wrong():
    """A C++ compiler's failure said only "C++ compile error": the line of its output that names the missing
    header (Python.h without a distribution's python3-dev, omp.h on a Mac) comes with it."""
    from hardware import compile_failure
    error = RuntimeError("CppCompileError: C++ compile error\n\nCommand:\ng++ /tmp/x/main.cpp -O3 -o x.so\n\nOutput:\n"
                         "/tmp/x/main.cpp:1:10: fatal error: Python.h: No such file or directory\n"
                         "compilation terminated.\n")
    assert compile_failure(error) == ("RuntimeError: CppCompileError: C++ compile error: fatal error: Python.h: No "
                                      "such file or directory")
    assert compile_failure(RuntimeError("no C++ compiler found\nmore detail")) == \
        "RuntimeError: no C++ compiler found"  # nothing there names an error: the first line alone


def test_main_gives_torch_s_deterministic_mode_back_as_it_found_it(tmp_path, data_dir, monkeypatch):
    """compile_model switches deterministic mode on for a CPU run (one seed, one set of weights); a caller
    of train.main (a notebook, a test) then found it on, process-wide, after the run."""
    import train
    during, real_step = [], train.train_step

    def step(*args, **kwargs):
        during.append(torch.are_deterministic_algorithms_enabled())
        return real_step(*args, **kwargs)
    monkeypatch.setattr(torch, "compile", lambda fn, *args, **kwargs: fn)  # the mode, not inductor, is tested
    monkeypatch.setattr(train, "train_step", step)
    try:
        train.main(tiny_config(data_dir, tmp_path / "out"))
        assert during and all(during) and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("where", ["compiling", "loading the data"])
def test_ctrl_c_before_training_is_one_line_and_nothing_is_written(tmp_path, data_dir, monkeypatch, capsys, where):
    """Before train() takes Ctrl-C as a stop request (set-up: a GPT-2 download, a checkpoint or the data
    loading; then compiling), it stops the run in one line. A SIGTERM during the clean-up after it (torchrun
    sends one after a Ctrl-C) breaks nothing, and the caller's handler is back afterwards."""
    import train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "compiling":
        monkeypatch.setattr(torch, "compile", lambda model: interrupted)
    else:
        monkeypatch.setattr(train, "load_data", interrupted)
    unlock = train.unlock_out_dir
    monkeypatch.setattr(train, "unlock_out_dir",
                        lambda out_dir: (os.kill(os.getpid(), signal.SIGTERM), unlock(out_dir)))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit:
        train.main(tiny_config(data_dir, tmp_path / "out"))
    assert exit.value.code == 130 and signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err == "error: interrupted before training started; nothing was trained\n"
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def run_out_of_memory(cfg, capsys):
    """train.main(cfg)'s exit status and its stderr, for a run that is to run out of memory."""
    import train
    with pytest.raises(SystemExit) as exit:
        train.main(cfg)
    return exit.value.code, capsys.readouterr()


CUDA_OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
# what torch raises, as a plain RuntimeError, where a CPU's allocator fails
CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 65536000000 bytes. Error code 12 (Cannot allocate memory)")


@pytest.mark.parametrize("error, said", [(torch.OutOfMemoryError(CUDA_OOM), "CUDA out of memory"),
                                         (RuntimeError(CPU_OOM), "out of memory")])
def test_a_batch_that_does_not_fit_in_memory_is_one_line_naming_what_to_lower(tmp_path, data_dir, monkeypatch, capsys,
                                                                              error, said):
    """An out-of-memory error in training (here the 4th step's forward), on a GPU or a CPU, stops the run in
    one line that names the micro-batch, what to lower, and the checkpoint that is kept."""
    forward, steps = GPT.forward, []

    def forward_that_runs_out(self, *args, **kwargs):
        if self.training:
            steps.append(1)
            if len(steps) == 4:
                raise error
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward_that_runs_out)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, max_iters=6, eval_interval=2),
                                    capsys)
    assert status == 1
    assert out.err == (f"error: {said} with micro-batches of batch_size=2 x block_size=8 tokens; halve "
                       "--batch_size and double --gradient_accumulation_steps (now 1) to keep the batch, or lower "
                       f"--block_size; the last checkpoint, {tmp_path / 'ckpt.pt'}, is kept\n")
    assert load(tmp_path / "ckpt.pt")["iter_num"] == 2
    import train  # a resume keeps the model's block_size: it is told of the batch alone
    resumed = train.out_of_memory(tiny_config(data_dir, tmp_path, init_from="resume"), error, checkpointed=True)
    kept = f"to keep the batch; the last checkpoint, {tmp_path / 'ckpt.pt'}, is kept"
    assert "block_size" in resumed and "--block_size" not in resumed and resumed.endswith(kept), resumed


def test_a_run_that_overwrites_names_no_earlier_runs_checkpoint_as_its_own(tmp_path, data_dir, monkeypatch, capsys):
    """--overwrite=true leaves the earlier run's ckpt.pt until the new run's first save: out of memory before
    that, the new run saved nothing; saves that fail leave the earlier run's checkpoint, said so, and its
    picture (the evaluation between them redrew loss.png from the new run's records)."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=2, eval_interval=2))
    earlier, earlier_picture = load(tmp_path / "ckpt.pt")["run_id"], (tmp_path / "loss.png").read_bytes()
    capsys.readouterr()
    forward = GPT.forward

    def forward_that_runs_out(self, *args, **kwargs):
        if self.training:
            raise RuntimeError(CPU_OOM)
        return forward(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(GPT, "forward", forward_that_runs_out)
        status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, overwrite=True), capsys)
    assert status == 1 and out.err.endswith("--block_size; nothing was saved\n"), out.err

    def disk_full(checkpoint, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train, "save_checkpoint", disk_full)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, overwrite=True, max_iters=4,
                                                eval_interval=2), capsys)
    assert "warning: could not write" in out.out and (tmp_path / "loss.png").read_bytes() == earlier_picture
    assert status == 1 and out.err == (f"error: could not write {tmp_path / 'ckpt.pt'} at iteration 4: No space left "
                                       f"on device; {tmp_path / 'ckpt.pt'} still holds an earlier run's checkpoint; "
                                       "free some space, or pick another --out_dir, and run again\n"), out.err
    assert ("free some space: training goes on and tries again at the next evaluation\n") in out.out

    def read_only(checkpoint, path):  # out_dir remounted read-only, or made immutable, under the run
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(train, "save_checkpoint", read_only)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, overwrite=True, max_iters=2,
                                                eval_interval=2), capsys)
    assert status == 1 and out.err.endswith(": Read-only file system; "
                                            f"{tmp_path / 'ckpt.pt'} still holds an earlier run's checkpoint; make "
                                            "out_dir writable, or pick another --out_dir, and run again\n"), out.err

    def out_dir_gone(checkpoint, path):  # removed under the run: neither space nor permissions would help
        raise OSError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(train, "save_checkpoint", out_dir_gone)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, compile=False, overwrite=True, max_iters=4,
                                                eval_interval=2), capsys)
    assert "earlier run's checkpoint; training goes on and tries again at the next evaluation\n" in out.out
    assert status == 1 and out.err.endswith(": No such file or directory; "
                                            f"{tmp_path / 'ckpt.pt'} still holds an earlier run's checkpoint; pick "
                                            "another --out_dir, and run again\n"), out.err
    assert load(tmp_path / "ckpt.pt")["run_id"] == earlier


@pytest.mark.parametrize("error, said", [(torch.OutOfMemoryError(CUDA_OOM), "CUDA out of memory"),
                                         (RuntimeError(CPU_OOM), "out of memory")])
def test_running_out_of_memory_while_compiling_is_not_a_compile_failure(tmp_path, data_dir, monkeypatch, capsys,
                                                                        error, said):
    """Compiling runs a forward and backward of the real batch: out of memory there, training uncompiled
    would need more, so the run stops in the same line rather than fall back to eager."""
    def compiled(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "compile", lambda model: compiled)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path), capsys)
    assert status == 1 and "torch.compile failed" not in out.out
    assert out.err.startswith(f"error: {said} with micro-batches of batch_size=2 x block_size=8 tokens; ")
    assert out.err.endswith("; nothing was saved\n") and not (tmp_path / "ckpt.pt").exists()


def test_running_out_of_memory_while_building_the_model_says_so(tmp_path, data_dir, monkeypatch, capsys):
    """Before any batch exists, halving the batch cannot help: the line is about the model."""
    import train

    def too_large(*args, **kwargs):
        raise RuntimeError(CPU_OOM)

    monkeypatch.setattr(train, "GPT", too_large)
    status, out = run_out_of_memory(tiny_config(data_dir, tmp_path, n_embd=16), capsys)
    assert status == 1 and out.err == ("error: out of memory while building the model (n_layer=1, n_embd=16, or the "
                                       "weights of init_from=scratch): it does not fit in this machine's memory; "
                                       "make it smaller; nothing was saved\n"), out.err


def test_a_model_larger_than_the_machine_is_refused_before_it_is_built(tmp_path, data_dir, launch):
    """A mistyped n_layer (a billion blocks of 16 channels: ~12 TiB of weights) is one line at once, naming
    its size and the machine's, where building it would run for minutes before memory ran out."""
    out = tmp_path / "out"
    started = time.time()
    refused = launch("train.py", *TINY, "--n_layer=1000000000", f"--data_dir={data_dir}", f"--out_dir={out}")
    assert refused.returncode == 2 and time.time() - started < 60, refused.stderr
    assert re.fullmatch(r"error: n_layer=1000000000, n_embd=16, mlp_ratio=4 and vocab_size=\d+ make a model of "
                        r"3,\d{3},\d{3},\d{3},\d{3} parameters, [\d,]+ GiB to train \(fp32 weights, gradients, "
                        r"optimizer state\), and this process may use [\d,.]+ GiB: make it smaller \(--n_layer, "
                        r"--n_embd, --mlp_ratio\)\n", refused.stderr), refused.stderr
    assert not out.exists()
    huge_vocabulary = launch("train.py", *TINY, "--vocab_size=10000000000", f"--data_dir={data_dir}",
                             f"--out_dir={out}")
    assert huge_vocabulary.returncode == 2 and huge_vocabulary.stderr.endswith(
        "make it smaller (--vocab_size, --n_embd)\n"), huge_vocabulary.stderr


def test_a_model_whose_weights_fit_but_whose_training_does_not_is_refused(monkeypatch):
    """A mistyped mlp_ratio (18,000: ~149 M parameters in a block of 64 channels) whose fp32 weights fit in 1 GiB, but
    not with their gradients and optimizer state: training it is refused, evaluating it is not."""
    import train
    monkeypatch.setattr(train, "memory_bytes", lambda device_type: 1 << 30)
    config = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=64, mlp_ratio=18_000)
    with pytest.raises(ValueError, match=r"mlp_ratio=18000 and vocab_size=64 make a model of 148,629,696 parameters,"
                                         r" 2 GiB to train .*make it smaller \(--n_layer, --n_embd, --mlp_ratio\)$"):
        train.check_model_fits(config, training=True)
    train.check_model_fits(config, training=False)


def test_an_os_error_in_the_set_up_is_one_line(tmp_path, monkeypatch, capsys):
    """Run where `data` is a file: the default corpus cannot be prepared in data/shakespeare_char."""
    import train
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").write_text("a file where the corpus's directory would go")
    with pytest.raises(SystemExit) as exit:
        train.main(train.TrainConfig(device="cpu", compile=False))
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err == ("error: cannot write to data_dir='data/shakespeare_char': data is not a directory; pick another "
                   "--data_dir\n"), err


def as_torchrun_rank_of_two(monkeypatch, local_rank, gpus):
    """The environment torchrun --nproc_per_node=2 gives one of its processes, on a machine with gpus GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    for name, value in dict(RANK=local_rank, LOCAL_RANK=local_rank, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2).items():
        monkeypatch.setenv(name, str(value))


def test_the_head_size_check_reads_the_model_the_run_trains(tmp_path, data_dir, monkeypatch, capsys):
    """attention's head-size check (flash on CUDA) gets the heads of the model the run trains: n_embd/n_head
    where the settings shape it; for weights, theirs whatever --n_embd says, when a resume of them too,
    and a size the backend refuses is one line before anything is written (here a check that takes heads
    of at most 16 stands in for CUDA's limit)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import train
    from data.prepare import prepare_bpe
    seen = []

    def check(backend, device_type, dtype, dropout, head_size=None):
        seen.append(head_size)
        if (head_size or 0) > 16:
            raise ValueError(f"heads of {head_size} are too large")
    monkeypatch.setattr(train, "check_backend", check)
    train.main(tiny_config(data_dir, tmp_path / "scratch", n_embd=24, n_head=2, max_iters=1, compile=False))
    assert seen == [None, 12]
    weights, data = tmp_path / "hf", tmp_path / "bpe"
    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=32, n_positions=16, vocab_size=50257))
    hf.save_pretrained(weights)
    prepare_bpe(str(data), texts=[TEXT])
    cfg = tiny_config(data, tmp_path / "tuned", n_embd=24, n_head=2, max_iters=1, compile=False, init_from=str(weights))
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        train.main(cfg)
    assert refused.value.code == 2 and capsys.readouterr().err == "error: heads of 32 are too large\n"
    assert not (tmp_path / "tuned").exists()
    monkeypatch.setattr(train, "check_backend", lambda *args: None)
    train.main(cfg)  # a checkpoint to resume, whose first run's settings say heads of 12
    monkeypatch.setattr(train, "check_backend", check)
    saved = (tmp_path / "tuned" / "ckpt.pt").read_bytes()
    with pytest.raises(SystemExit) as refused:
        train.main(replace(cfg, init_from="resume", max_iters=2))
    assert refused.value.code == 2 and capsys.readouterr().err == "error: heads of 32 are too large\n"
    assert (tmp_path / "tuned" / "ckpt.pt").read_bytes() == saved


def test_an_evaluation_takes_a_backend_without_dropout_whatever_dropout_says(tmp_path, data_dir, capsys):
    """PyTorch's flash kernel on a CPU has no dropout, and a model in eval mode drops nothing: --eval_only
    runs with a dropout the training refuses beside that kernel."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, eval_only=True, attention="flash", dropout=0.1))
    assert "val loss" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        train.main(tiny_config(data_dir, tmp_path, compile=False, attention="flash", dropout=0.1))
    assert refused.value.code == 2 and "has no dropout" in capsys.readouterr().err


def test_a_train_py_out_dir_given_as_weights_is_named_whatever_the_data(tmp_path, data_dir):
    """--init_from=OUT_DIR of train.py: on GPT-2 tokens too (where init_from is at home), one line saying
    how to resume it, not that it lacks a config.json; with the folder quoted where a shell would read it
    otherwise (pasted, `--out_dir=runs & more` ran `--out_dir=runs` in the background)."""
    import numpy as np

    import train
    tokens = np.zeros(100, dtype=np.uint16)
    data = train.Data(tokens, tokens, {"tokenizer": "gpt2", "vocab_size": 50257})
    for out_dir in (tmp_path, tmp_path / "runs & more"):
        out_dir.mkdir(exist_ok=True)
        (out_dir / "ckpt.pt").write_bytes(b"")
        with pytest.raises(ValueError, match=r"is not GPT-2's weights: it holds train.py's ckpt.pt: give ") as refused:
            train.check_data(train.TrainConfig(init_from=str(out_dir), block_size=8), data)
        command = str(refused.value).split(": give ")[-1]
        assert shlex.split(command) == ["--init_from=resume", f"--out_dir={out_dir}"], command
        assert command.endswith(f"--out_dir={out_dir}") == (out_dir == tmp_path)  # quoted only where needed


def test_a_gpu_is_always_named_with_its_index(monkeypatch):
    """torch.cuda.set_device takes cuda:N, not cuda (ValueError: "Expected a torch.device with a specified
    index"): device=auto and device=cuda on a GPU machine trained nowhere. Without torchrun they mean the
    current GPU; under it, the local rank's."""
    import train
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # as CUDA_VISIBLE_DEVICES or a set_device left it
    for name in ("auto", "cuda"):
        assert train.process_device(name, distributed=False, local_rank=0, processes_here=1) == "cuda:1"
        assert train.process_device(name, distributed=True, local_rank=0, processes_here=2) == "cuda:0"
    assert train.process_device("cuda:0", distributed=False, local_rank=0, processes_here=1) == "cuda:0"
    assert train.process_device("cpu", distributed=True, local_rank=1, processes_here=2) == "cpu"


def test_dtype_auto_asks_the_gpu_the_run_trains_on(monkeypatch):
    """torch.cuda.is_bf16_supported asks the current GPU: dtype=auto was picked before set_device, so on
    a machine whose GPU 0 is a V100 and GPU 1 an A100, --device=cuda:1 trained in fp16 with a scaler."""
    import train
    current = [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.__setitem__(0, torch.device(device).index))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: current[0] == 1)
    assert train.set_up(train.TrainConfig(device="cuda:1")).dtype == torch.bfloat16
    assert train.set_up(train.TrainConfig(device="cuda:0")).dtype == torch.float16
    from bench.benchutil import resolve_device  # the benchmarks' --device=cuda:1 too (sample.py's is the same call)
    assert resolve_device("cuda:1") == "cuda:1" and current[0] == 1


def test_an_fp16_runs_mfu_names_its_peak_fp16(monkeypatch):
    """A T4 or a V100 trains in fp16 (dtype=auto there): its MFU was labelled against a "bf16" peak, which such a
    GPU has none of; the number is its fp16 tensor cores' either way."""
    from hardware import peak_flops
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert peak_flops("cuda", torch.float16) == (65e12, "Tesla T4 datasheet, fp16")
    assert peak_flops("cuda", torch.bfloat16) == (65e12, "Tesla T4 datasheet, bf16")


def test_an_apple_gpu_under_torchrun_is_refused_in_one_line(monkeypatch):
    """gloo, torchrun's backend off CUDA, carries no MPS tensors: DDP's first exchange was a traceback."""
    import train
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert train.process_device("auto", distributed=False, local_rank=0, processes_here=1) == "mps"
    for name in ("auto", "mps"):
        with pytest.raises(ValueError, match=r"under torchrun this machine's GPU \(mps\) cannot exchange gradients; "
                                             r"train on its CPUs with --device=cpu"):
            train.process_device(name, distributed=True, local_rank=0, processes_here=2)
    assert train.process_device("cpu", distributed=True, local_rank=0, processes_here=2) == "cpu"


def test_a_timed_run_makes_no_float64_tensor_which_apple_gpus_lack(tmp_path, data_dir, monkeypatch):
    """Under max_seconds, the evaluation's timing made a float64 tensor on the training device: on MPS,
    which has no float64, every default `python train.py` ended in a traceback before training."""
    import train
    tensor = torch.tensor

    def as_mps(*args, **kwargs):
        if kwargs.get("dtype") == torch.float64:
            raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64")
        return tensor(*args, **kwargs)
    monkeypatch.setattr(torch, "tensor", as_mps)
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_seconds=30))
    assert load(tmp_path / "ckpt.pt")["iter_num"] == 3


@pytest.mark.parametrize("local_rank", [0, 1])
def test_torchrun_with_more_processes_than_gpus_is_one_line_on_every_rank(monkeypatch, local_rank):
    """As on a machine with one GPU, torchrun --nproc_per_node=2: every rank says so, before any of them
    reaches for a GPU that is not there."""
    import train
    as_torchrun_rank_of_two(monkeypatch, local_rank, gpus=1)
    with pytest.raises(ValueError, match=r"torchrun started 2 processes on this machine, which has 1 GPU\(s\): "
                                         r"one each; use --nproc_per_node=1$"):
        train.set_up(train.TrainConfig(device="cuda"))


@pytest.mark.parametrize("local_rank", [0, 1])
def test_torchrun_with_one_named_gpu_is_one_line_on_every_rank(monkeypatch, local_rank):
    """--device=cuda:1 under torchrun: each process takes its local rank's GPU, so a named one was
    silently ignored; every rank now says so."""
    import train
    as_torchrun_rank_of_two(monkeypatch, local_rank, gpus=2)
    with pytest.raises(ValueError, match=r"device=cuda:1 names one GPU, but under torchrun each process takes its "
                                         r"local rank's; give --device=cuda \(and CUDA_VISIBLE_DEVICES"):
        train.set_up(train.TrainConfig(device="cuda:1"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_non_finite_loss_names_both_rates_and_a_dtype_only_where_it_helps(tmp_path, data_dir, capsys, dtype):
    import train
    with pytest.raises(SystemExit) as exit:
        train.main(tiny_config(data_dir, tmp_path, compile=False, dtype=dtype, learning_rate=1e9, warmup_iters=0,
                               log_interval=1, max_iters=50, eval_interval=1000))
    err = capsys.readouterr().err
    assert exit.value.code == 1 and re.match(r"error: the loss became (nan|inf) at iteration \d+; lower "
                                             r"--learning_rate and --muon_lr(.*)\n$", err), err
    assert ("--dtype=float32" in err) == (dtype == "bfloat16"), err


@pytest.mark.compiles
def test_train_py_compiles_by_default_and_trains_the_same_weights_every_time_as_eager_does(tmp_path, data_dir, launch):
    """The real torch.compile on the default path (inductor, a C++ compiler): the run compiles, says so,
    and its loss falls. On two threads a second run of the seed ends with the same bits in every
    weight, as eager does: inductor's own kernel for the embedding's gradient adds into its rows from
    racing threads, and without train.py's deterministic mode no two runs agreed. (The second run
    compiles from inductor's cache on disk, in seconds.) And --compile=false trains the same weights
    but for rounding: the compiled model and Muon's compiled update compute what eager does (fp32, 30
    steps: ~3e-6 apart here; a wrong mask or a Muon rate off by 1 % puts them ~1e-3 apart). The eager run
    comes from the fork server (torch.compile switched off there): a plain process would add nothing to it."""
    env_free = {k: v for k, v in ENV.items() if k != "TORCHDYNAMO_DISABLE"}
    weights = {}
    for run, compile in (("a", "true"), ("b", "true"), ("eager", "false")):
        out = tmp_path / run
        args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=30", "--log_interval=10",
                "--learning_rate=1e-2", "--batch_size=8", "--block_size=16", "--threads=2", f"--compile={compile}"]
        proc = check_ok(launch("train.py", *args) if compile == "false" else subprocess.run(
            [sys.executable, "train.py", *args], cwd=ROOT, env=env_free, capture_output=True, text=True, timeout=300))
        assert bool(re.search(r"^compiled in [0-9.]+ s$", proc.stdout, re.M)) == (compile == "true"), proc.stdout
        losses = [float(m[1]) for m in LOG_LINE.findall(proc.stdout)]
        assert len(losses) == 3 and losses[-1] < losses[0], proc.stdout
        weights[run] = load(out / "ckpt.pt")["model"]
    assert weights["a"].keys() == weights["b"].keys() == weights["eager"].keys()
    assert [name for name in weights["a"] if not torch.equal(weights["a"][name], weights["b"][name])] == []
    for name, tensor in weights["a"].items():
        torch.testing.assert_close(tensor, weights["eager"][name], rtol=0, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
@pytest.mark.compiles
def test_sample_py_compiled_for_decoding_writes_what_it_writes_uncompiled(tmp_path, data_dir, launch):
    """--compile=true compiles every shape decoding meets before the prompt prints, then samples the
    very tokens the uncompiled model samples (same seed), past the window's end (block_size 8).
    Opt-in (slow), as --compile=true is, for its cold compile (~30 s, more on a fresh machine), as is
    test_compile.py's check of compiled decoding's tokens and fused reductions."""
    out = tmp_path / "out"
    check_ok(launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=20"))
    args = ["sample.py", f"--out_dir={out}", "--device=cpu", "--max_new_tokens=30", "--num_samples=2"]
    eager = check_ok(launch(*args))
    env_free = {k: v for k, v in ENV.items() if k != "TORCHDYNAMO_DISABLE"}
    compiled = check_ok(subprocess.run([sys.executable, *args, "--compile=true"], cwd=ROOT, env=env_free,
                                       capture_output=True, text=True, timeout=300))
    assert "compiling the model for decoding" in compiled.stderr
    assert compiled.stdout == eager.stdout and eager.stdout.count("---------------") == 2


# ---- B. configuration -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def TrainConfig():
    from train import TrainConfig  # imported here so a broken module fails these tests, not collection
    return TrainConfig


@pytest.fixture(scope="module")
def SampleConfig():
    from sample import SampleConfig
    return SampleConfig


def toml(tmp_path, text, name="cfg.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_then_toml_then_cli(tmp_path, TrainConfig):
    defaults = TrainConfig()
    path = toml(tmp_path, 'n_layer = 3\nbatch_size = 5\nlearning_rate = 0.01\ndtype = "bfloat16"\nbias = false\n'
                          'out_dir = "from-toml"\n')
    cfg = load_config(TrainConfig, [path, "--batch_size=7", "--out_dir=from-cli"])
    assert cfg.n_layer == 3 and cfg.learning_rate == 0.01 and cfg.dtype == "bfloat16" and cfg.bias is False  # TOML
    assert cfg.batch_size == 7 and cfg.out_dir == "from-cli"  # CLI beats TOML
    assert cfg.block_size == defaults.block_size and cfg.n_embd == defaults.n_embd  # defaults
    # the order on the command line does not matter: flags always beat files
    assert load_config(TrainConfig, ["--batch_size=7", path]).batch_size == 7
    assert load_config(TrainConfig, []) == defaults


def test_a_setting_holding_a_nul_character_is_named(tmp_path, TrainConfig):
    """No path or name holds a NUL: the OS refused it later with "embedded null byte", naming no setting."""
    for argv in ([toml(tmp_path, 'out_dir = "a\\u0000b"\n')], ["--wandb_run_name=a\0b"]):
        with pytest.raises(ConfigError, match=r"(out_dir|wandb_run_name) holds a NUL character"):
            load_config(TrainConfig, argv)


def test_toml_int_is_accepted_for_float(tmp_path, TrainConfig):
    cfg = load_config(TrainConfig, [toml(tmp_path, "learning_rate = 1\n")])
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)


@pytest.mark.parametrize("text, expected", [("true", True), ("false", False), ("True", True), ("FALSE", False),
                                            ("1", True), ("0", False), ("yes", True), ("no", False), ("On", True),
                                            ("off", False)])
def test_bool_flags(TrainConfig, text, expected):
    assert load_config(TrainConfig, [f"--compile={text}"]).compile is expected


def test_optional_none(SampleConfig, tmp_path):
    assert load_config(SampleConfig, ["--top_k=none"]).top_k is None
    assert load_config(SampleConfig, ["--top_k="]).top_k is None  # an empty value, as a shell variable left unset gives
    # TOML has no null: there too "none" is None, and a wrong value says that none is a choice
    assert load_config(SampleConfig, [toml(tmp_path, 'top_k = "none"\nattention = "none"\n')]).top_k is None
    with pytest.raises(ConfigError, match=r"cfg\.toml: top_k must be int or none, got 'many'$"):
        load_config(SampleConfig, [toml(tmp_path, 'top_k = "many"\n')])
    assert load_config(SampleConfig, ["--top_k=5"]).top_k == 5
    assert load_config(SampleConfig, ["--top_p=none"]).top_p is None
    assert load_config(SampleConfig, ["--top_p=0.9"]).top_p == 0.9
    assert load_config(SampleConfig, ["--attention=none"]).attention is None


def test_unknown_key_names_it_suggests_and_lists_valid(tmp_path, TrainConfig, SampleConfig):
    for argv in (["--n_layr=2"], [toml(tmp_path, "n_layr = 2\n")]):
        with pytest.raises(ConfigError) as e:
            load_config(TrainConfig, argv)
        msg = str(e.value)
        assert "'n_layr'" in msg and "did you mean 'n_layer'" in msg
        assert "valid settings" in msg and "learning_rate" in msg and "block_size" in msg
    with pytest.raises(ConfigError, match="xyzzy") as e:
        load_config(TrainConfig, ["--xyzzy=1"])
    assert "did you mean" not in str(e.value)  # no close match, no suggestion
    for typed, meant in (("batch", "batch_size"), ("warmup", "warmup_iters"), ("data", "data_dir"),  # cut short
                         ("lr", "learning_rate"), ("steps", "max_iters")):  # other scripts' names
        with pytest.raises(ConfigError, match=f"did you mean {meant!r}"):
            load_config(TrainConfig, [f"--{typed}=1"])
    with pytest.raises(ConfigError, match="did you mean one of 'eval_only', 'eval_interval', 'eval_iters'\\?"):
        load_config(TrainConfig, ["--eval=1"])  # several begin so: each, not the first
    with pytest.raises(ConfigError, match="did you mean 'temperature'"):
        load_config(SampleConfig, ["--temp=0.5"])
    # another script's setting is not a typo of this one's: train.py's data_dir in sample.py was "out_dir?"
    for cls, key in ((SampleConfig, "data_dir"), (TrainConfig, "max_new_tokens")):
        with pytest.raises(ConfigError, match=rf"^unknown setting '{key}' in the command line; valid settings"):
            load_config(cls, [f"--{key}=1"])


DTYPES = "'auto' | 'float32' | 'bfloat16' | 'float16'"


@pytest.mark.parametrize("argv_or_toml, says", [  # a value as the user wrote it: TOML's true, not Python's True
    ("--n_layer=two", "n_layer must be int, got 'two'"), ("--n_layer=2.5", "n_layer must be int, got '2.5'"),
    ("n_layer = 2.5", "n_layer must be int, got 2.5"),
    ('n_layer = "2"', "n_layer must be int, got the string '2'; write it without quotes"),
    ("n_layer = true", "n_layer must be int, got true"),
    ("--learning_rate=fast", "learning_rate must be float, got 'fast'"),
    ('learning_rate = "1e-3"', "learning_rate must be float, got the string '1e-3'; write it without quotes"),
    ("--compile=maybe", "compile must be true or false (or 1/0, yes/no, on/off), got 'maybe'"),
    ("compile = 1", "compile must be true or false, got 1"),
    ('compile = "true"', "compile must be true or false, got the string 'true'; write it without quotes"),
    ("--dtype=float64", f"dtype='float64' is not a valid choice; choose one of: {DTYPES}"),
    ('dtype = "float64"', f"dtype='float64' is not a valid choice; choose one of: {DTYPES}"),
    ("dtype = true", f"dtype=true is not a valid choice; choose one of: {DTYPES}"),
    ("--attention=foo",
     "attention='foo' is not a valid choice; choose one of: 'manual' | 'sdpa' | 'flash' | 'fa2' | 'fa3'"),
    ("out_dir = 3", "out_dir must be str, got 3"),
])
def test_wrong_type(tmp_path, TrainConfig, argv_or_toml, says):
    """The message names the value as written, and the file it is in (a run may read several)."""
    argv = [argv_or_toml] if argv_or_toml.startswith("--") else [toml(tmp_path, argv_or_toml + "\n")]
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, argv)
    assert str(e.value) == (says if argv_or_toml.startswith("--") else f"{argv[0]}: {says}")


@pytest.mark.parametrize("toml_line, says", [
    ('top_k = "5"', "top_k must be int or none, got the string '5'; write it without quotes"),
    ('use_cache = "true"', "use_cache must be true, false or none, got the string 'true'; write it without quotes"),
    ('top_k = "many"', "top_k must be int or none, got 'many'"), ("top_k = 2.5", "top_k must be int or none, got 2.5")])
def test_an_optional_setting_says_what_a_plain_one_says(tmp_path, toml_line, says):
    """A setting that may be none keeps the advice its type gives: a number in quotes is to lose them."""
    from dataclasses import dataclass

    @dataclass
    class Sampling:
        top_k: Optional[int] = 200
        use_cache: Optional[bool] = None

    path = toml(tmp_path, toml_line + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(Sampling, [path])
    assert str(e.value) == f"{path}: {says}"


def test_a_resume_takes_a_checkpoint_setting_of_any_kind_its_field_holds():
    """train.as_run takes a resumed run's model settings that are of a kind their fields hold: an int where
    a float's default was written 10000, a None or a number for an Optional, any of a Literal's kinds."""
    from configurator import takes_type
    assert takes_type(float, 0) and takes_type(float, 1.5) and not takes_type(float, True)
    assert not takes_type(float, "1.5") and not takes_type(int, 1.5) and not takes_type(bool, 1)
    assert takes_type(Optional[float], None) and takes_type(Optional[float], 2) and takes_type(int | None, None)
    assert not takes_type(Optional[int], 2.5) and not takes_type(Optional[int], "none")
    assert takes_type(Literal[1, 2], 3) and not takes_type(Literal[1, 2], "1")  # the choice: GPTConfig's to check
    assert takes_type(Literal["a", 2], "b") and takes_type(Literal["a", 2], 5) and not takes_type(Literal["a"], None)


def test_a_literal_of_numbers_in_gptconfig_names_its_choices():
    """A forker's `n_groups: Literal[1, 2]` in GPTConfig, given 3 (a checkpoint of code with more choices):
    a ValueError naming the choices, as for a Literal of names."""
    from dataclasses import dataclass
    from typing import Literal

    from model import GPTConfig

    @dataclass
    class Forked(GPTConfig):
        n_groups: Literal[1, 2] = 1

    with pytest.raises(ValueError, match=r"^unknown n_groups 3; choose one of 1, 2$"):
        Forked(n_groups=3)


def test_a_literal_of_numbers_is_set_from_the_command_line():
    """A forker's `mlp_ratio: Literal[2, 4]`: the text "2" is the choice 2, as TOML's 2 is."""
    from dataclasses import dataclass
    from typing import Literal

    @dataclass
    class Forked:
        mlp_ratio: Literal[2, 4] = 4
        scale: Literal[0.5, 1.0] = 1.0

    cfg = load_config(Forked, ["--mlp_ratio=2", "--scale=0.5"])
    assert (cfg.mlp_ratio, cfg.scale) == (2, 0.5) and type(cfg.mlp_ratio) is int
    with pytest.raises(ConfigError, match=r"mlp_ratio='3' is not a valid choice; choose one of: 2 \| 4"):
        load_config(Forked, ["--mlp_ratio=3"])


@pytest.mark.parametrize("argv_or_toml, says", [
    ("--compile=Y", "compile must be true or false (or 1/0, yes/no, on/off), got 'Y'"),
    ('compile = "true"', "compile must be true or false, got the string 'true'; write it without quotes")])
def test_a_bad_boolean_says_how_to_spell_one(tmp_path, TrainConfig, argv_or_toml, says):
    argv = [argv_or_toml] if argv_or_toml.startswith("--") else [toml(tmp_path, argv_or_toml + "\n")]
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, argv)
    assert str(e.value) == (says if argv_or_toml.startswith("--") else f"{argv[0]}: {says}")


@pytest.mark.parametrize("argv_or_toml", ["--batch_size=99999999999999999999", "batch_size = -9223372036854775809"])
def test_an_integer_beyond_64_bits_is_one_line(tmp_path, TrainConfig, SampleConfig, argv_or_toml):
    argv = [argv_or_toml] if argv_or_toml.startswith("--") else [toml(tmp_path, argv_or_toml + "\n")]
    with pytest.raises(ConfigError, match=r"^(\S+\.toml: )?batch_size=-?\d+ does not fit in 64 bits; give a smaller "
                                          r"number$"):
        load_config(TrainConfig, argv)
    with pytest.raises(ConfigError, match=r"^top_k=\d+ does not fit in 64 bits"):  # an optional setting says so too
        load_config(SampleConfig, ["--top_k=99999999999999999999"])


def test_literal_error_lists_choices(TrainConfig):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, ["--dtype=float64"])
    assert all(c in str(e.value) for c in ("float32", "bfloat16", "float16"))


def test_missing_file(tmp_path, TrainConfig, monkeypatch):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not found") as e:
        load_config(TrainConfig, [missing])
    assert missing in str(e.value)
    monkeypatch.chdir(ROOT)  # the files there are named as they are given, not by their names alone
    with pytest.raises(ConfigError, match=r"; the config files here: configs/finetune_gpt2_shakespeare.toml, "
                                          r"configs/gpt2_124m.toml,"):
        load_config(TrainConfig, ["configs/nope.toml"])


def test_invalid_toml(tmp_path, TrainConfig):
    path = toml(tmp_path, "n_layer = = 2\n")
    with pytest.raises(ConfigError, match="not valid TOML") as e:
        load_config(TrainConfig, [path])
    assert path in str(e.value)


def test_toml_that_is_not_utf8(tmp_path, TrainConfig):
    path = tmp_path / "latin1.toml"
    path.write_bytes('out_dir = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not valid TOML: .*; save it as UTF-8$"):
        load_config(TrainConfig, [str(path)])


def test_toml_written_as_python_or_in_sections_says_how_toml_writes_it(tmp_path, TrainConfig):
    """nanoGPT's configs are Python (compile = False), --help writes None as none, and a TOML file may have
    sections: the parser's own "Invalid value (at line 1, column 11)", and [optimizer]'s table taken for a
    value of optimizer, said nothing of the fix. An editor's byte-order mark is read past, as a prompt's is."""
    for text in ("compile = False\n", "top_k = none\n"):
        with pytest.raises(ConfigError, match=r"not valid TOML: Invalid value .*\(TOML writes true and false in lower "
                                              r"case, and text in quotes: top_k = \"none\"\)$"):
            load_config(TrainConfig, [toml(tmp_path, text)])
    for section in ("optimizer", "model"):  # a setting's name, or none
        with pytest.raises(ConfigError, match=rf"cfg.toml: \[{section}\] is a section; write its settings without it, "
                                              r"at the top level$"):
            load_config(TrainConfig, [toml(tmp_path, f"[{section}]\nlearning_rate = 1e-3\n")])
    (tmp_path / "bom.toml").write_bytes("\ufeffn_layer = 3\n".encode("utf-8"))
    assert load_config(TrainConfig, [str(tmp_path / "bom.toml")]).n_layer == 3


def test_a_run_s_folder_or_weights_given_as_a_config_file_names_the_setting_that_takes_them(tmp_path, TrainConfig,
                                                                                           SampleConfig):
    """python sample.py out (without --out_dir=) said "is a directory; give a TOML file", and out/ckpt.pt "is not
    valid TOML: 'utf-8' codec can't decode byte 0x80". data/prepare.py, whose out_dir is the data's, is told no
    more than that."""
    from checkpoint import save_checkpoint
    from data.prepare import PrepareConfig
    (tmp_path / "run").mkdir()
    save_checkpoint({"iter_num": 1}, str(tmp_path / "run" / "ckpt.pt"))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text("{}")
    run, weights = tmp_path / "run", tmp_path / "gpt2"
    shutil.copy(run / "ckpt.pt", tmp_path / "best.pt")  # a copy kept by hand: sample.py reads no other name
    for cls in (TrainConfig, SampleConfig):
        for path, says in ((run, f"is a directory; give a TOML file; for a run's checkpoint, give its folder as "
                                 f"--out_dir={run}"),
                           (run / "ckpt.pt", f"is a zip file (a checkpoint, say), not a config file; for a run's "
                                             f"checkpoint, give its folder as --out_dir={run}"),
                           (tmp_path / "best.pt", "best.pt is a zip file (a checkpoint, say), not a config file"),
                           (tmp_path, "is a directory; give a TOML file"),  # it holds .pt files, and no ckpt.pt
                           (weights, "is a directory; give a TOML file; for GPT-2's weights, give "
                                     f"--init_from={weights}")):
            with pytest.raises(ConfigError) as e:
                load_config(cls, [str(path)])
            assert str(e.value).endswith(says), e.value
    with pytest.raises(ConfigError) as e:
        load_config(PrepareConfig, [str(run)])
    assert str(e.value).endswith("is a directory; give a TOML file"), e.value


def test_a_single_dash_or_a_bare_double_dash_is_named_as_such(tmp_path, TrainConfig, monkeypatch):
    """-n_layer=2 was looked for as a config file ("not found; the config files here: ..."), and -- was told to
    write flags "(e.g. --=...)"."""
    with pytest.raises(ConfigError, match=r"^flags take two dashes: --n_layer=2, got '-n_layer=2'$"):
        load_config(TrainConfig, ["-n_layer=2"])
    with pytest.raises(ConfigError, match=r"^write flags as --key=value, got '--'$"):
        load_config(TrainConfig, ["--", "--n_layer=2"])
    (tmp_path / "-dash.toml").write_text("n_layer = 3\n")  # a file's name that starts with a dash is still one
    monkeypatch.chdir(tmp_path)
    assert load_config(TrainConfig, ["-dash.toml"]).n_layer == 3


def test_help_after_config_files_shows_the_values_they_set(tmp_path, TrainConfig, capsys):
    """python train.py configs/gpt2_124m.toml --help showed --n_layer=4, the default, and did not read the file
    (one that did not exist exited 0); the values it sets are what a reader of that help wants."""
    path = toml(tmp_path, "n_layer = 12\nlearning_rate = 6e-4\n")
    with pytest.raises(SystemExit) as exit:
        load_config(TrainConfig, [path, "--help", "--n_head=3"])
    out = capsys.readouterr().out
    assert exit.value.code == 0 and f"The values below are the defaults as {path} sets them." in out
    assert "  --n_layer=12 " in out and "  --learning_rate=0.0006 " in out and "  --n_head=4 " in out, out
    with pytest.raises(ConfigError, match="config file 'no.toml' not found"):
        load_config(TrainConfig, ["no.toml", "--help"])


def test_help_shows_each_setting_s_declared_default_not_one_filled_in_from_another():
    """bench/sample.py fills its shape from --reference in __post_init__: --help showed nanoGPT's n_layer=4 and
    temperature=1.0 as defaults, and --reference=transformers --temperature=1.0, a shown default, was refused."""
    from bench.sample import SampleBench
    from configurator import help_text
    text = help_text(SampleBench)
    assert "  --n_layer=none " in text and "  --temperature=none " in text, text


def test_a_setting_without_a_default_is_required_and_help_says_so():
    """A forker's config may declare a setting with no default: not given, it was a TypeError's traceback from the
    dataclass, and --help showed `--data_path=<dataclasses._MISSING_TYPE object at 0x...>`."""
    Run = make_dataclass("Run", [("data_path", str), ("steps", int, 5)])
    with pytest.raises(ConfigError, match=r"^--data_path=\.\.\. is required: Run has no default for it$"):
        load_config(Run, ["--steps=3"])
    assert load_config(Run, ["--data_path=x"]) == Run("x", 5)
    lines = help_text(Run).splitlines()  # a class with no source to read: no comments, and no error
    assert [line.split() for line in lines[-2:]] == [["--data_path=<required>", "[str]"], ["--steps=5", "[int]"]], lines


def test_config_file_that_cannot_be_read(tmp_path, TrainConfig, monkeypatch):
    import configurator
    path = toml(tmp_path, "n_layer = 2\n")

    def no_permission(*args, **kwargs):  # as a chmod 000 file is to anyone but root, who runs the tests here
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(configurator, "open", no_permission, raising=False)
    with pytest.raises(ConfigError, match=rf"^cannot read config file '{re.escape(path)}': Permission denied$"):
        load_config(TrainConfig, [path])


def test_flag_without_equals(TrainConfig):
    with pytest.raises(ConfigError, match="--key=value"):
        load_config(TrainConfig, ["--compile"])


@pytest.mark.parametrize("flag, key", [
    ("--batch_size=0", "batch_size"), ("--max_iters=-1", "max_iters"), ("--n_embd=30", "n_embd"),
    ("--dropout=1.0", "dropout"), ("--learning_rate=0", "learning_rate"), ("--learning_rate=-1", "learning_rate"),
    ("--learning_rate=nan", "learning_rate"), ("--muon_lr=0", "muon_lr"), ("--min_lr=-1e-4", "min_lr"),
    ("--min_lr=inf", "min_lr"), ("--beta1=2", "beta1"), ("--beta2=1", "beta2"), ("--weight_decay=-1", "weight_decay"),
    ("--grad_clip=-1", "grad_clip"), ("--seed=-1", "seed"), ("--seed=4294967296", "seed"),
    ("--max_seconds=inf", "max_seconds"), ("--dropout=nan", "dropout"), ("--threads=-1", "threads"),
    ("--lr_decay_iters=-5", "lr_decay_iters"), ("--min_lr=0.01", "min_lr"),
    ("--lr_decay_iters=100 --max_seconds=0", "lr_decay_iters"), ("--threads=100000", "threads"),
    ("--gradient_accumulation_steps=-2", "gradient_accumulation_steps"), ("--max_seconds=-1", "max_seconds"),
    ("--warmup_iters=-5", "warmup_iters"), ("--vocab_size=-1", "vocab_size"), ("--eval_interval=0", "eval_interval"),
    ("--eval_iters=0", "eval_iters"), ("--log_interval=0", "log_interval"),
])
def test_range_checks_are_config_errors(TrainConfig, flag, key):
    with pytest.raises(ConfigError, match=key):
        load_config(TrainConfig, ["--n_head=4", *flag.split()])


def test_the_shared_range_check_names_the_setting_its_floor_and_what_the_floor_means():
    """configurator.check_at_least is every config's "at least" check: the boundary passes, one below it
    fails with the setting's name, and an optional setting left unset (None) passes."""
    from types import SimpleNamespace
    from configurator import check_at_least
    config = SimpleNamespace(repeats=1, loop=0, block_size=None, parallel=0)
    check_at_least(config, 1, "repeats", "block_size")
    check_at_least(config, 0, "loop", "parallel", meaning="0: no loop")
    with pytest.raises(ValueError, match=r"^parallel must be at least 1, got 0$"):
        check_at_least(config, 1, "repeats", "parallel")
    with pytest.raises(ValueError, match=r"^loop must be at least 1 \(0: off\), got 0$"):
        check_at_least(config, 1, "loop", meaning="0: off")


def test_toml_non_finite_numbers_are_refused(tmp_path, TrainConfig):
    with pytest.raises(ConfigError, match="learning_rate must be a finite number"):
        load_config(TrainConfig, [toml(tmp_path, "learning_rate = nan\n")])
    with pytest.raises(ConfigError, match="max_seconds must be a finite number"):  # an integer past float's range
        load_config(TrainConfig, [toml(tmp_path, f"max_seconds = 1{'0' * 400}\n")])


def test_an_iteration_decay_under_a_clock_schedule_is_named_as_unused(tmp_path, data_dir, capsys):
    """--lr_decay_iters with max_seconds > 0 (the default 190): the clock drives the decay, and the setting
    was ignored without a word. A config's iteration schedule run for a time stays allowed, with the note."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_seconds=60, max_iters=2, lr_decay_iters=500))
    assert "note: lr_decay_iters=500 is not used: with max_seconds=60 the learning rate decays by the clock " \
           "(--max_seconds=0 decays it by iterations)\n" in capsys.readouterr().out
    train.main(tiny_config(data_dir, tmp_path / "b", compile=False, max_iters=2, lr_decay_iters=500))
    assert "note" not in capsys.readouterr().out  # max_seconds=0: the decay ends at lr_decay_iters


def test_max_iters_under_a_clock_schedule_says_that_it_only_stops_the_run(tmp_path, data_dir, capsys):
    """nanoGPT's --max_iters=N, typed here where max_seconds (190 s) drives the decay: a run it stopped ended at
    the peak rate (or in its warm-up) without a word. The default max_iters, or a run by iterations: no note."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_seconds=60, max_iters=3))
    assert "note: with max_seconds=60 the learning rate decays by the clock: max_iters=3 only stops the run, " \
           "before the decay ends if it comes first (--max_seconds=0 decays it by iterations, to max_iters)\n" \
           in capsys.readouterr().out
    train.main(tiny_config(data_dir, tmp_path / "b", compile=False, max_iters=3, warmup_iters=1))
    assert "note" not in capsys.readouterr().out


def test_a_run_by_iterations_that_ends_within_its_warm_up_says_so(tmp_path, data_dir, capsys):
    """--max_seconds=0 --max_iters=60, the README's repeatable run, with the warm-up's 100 iterations: the
    rate only rose, and nothing said so (an lr_decay_iters that ends within the warm-up is refused)."""
    import train
    train.main(tiny_config(data_dir, tmp_path, compile=False, max_iters=3))
    assert "note: max_iters=3 ends by the warm-up's end (warmup_iters=100): the learning rate never decays; set " \
           "--warmup_iters below max_iters - 1 for a warm-up and a decay\n" in capsys.readouterr().out
    # the same where the run's last step is the decay's first, at the peak; a run of one step has none to decay
    train.main(tiny_config(data_dir, tmp_path / "peak", compile=False, max_iters=3, warmup_iters=2))
    assert "never decays" in capsys.readouterr().out
    train.main(tiny_config(data_dir, tmp_path / "one", compile=False, max_iters=1, warmup_iters=0))
    assert "never decays" not in capsys.readouterr().out
    # a decay's step; not by iterations; a decay that lr_decay_iters ends, where max_iters only stops the run
    for fine in (dict(warmup_iters=1), dict(max_seconds=60), dict(lr_decay_iters=200)):
        train.main(tiny_config(data_dir, tmp_path / str(fine), compile=False, max_iters=3, **fine))
        assert "never decays" not in capsys.readouterr().out, fine


def test_settings_a_run_never_reads_are_named(tmp_path, data_dir, capsys):
    """A setting given that this run has no use for (Muon's rate beside AdamW, wandb's names without wandb,
    a parallelism with one process) is named once, with why, rather than silently ignored."""
    import train
    train.main(tiny_config(data_dir, tmp_path / "a", compile=False, max_iters=1, optimizer="adamw", muon_lr=0.05,
                           wandb_project="p", parallelism="fsdp"))
    assert "note: not used in this run: muon_lr=0.05 (optimizer=adamw), wandb_project=p (wandb_log=false), " \
           "parallelism=fsdp (one process: it applies under torchrun)\n" in capsys.readouterr().out
    train.main(tiny_config(data_dir, tmp_path / "b", compile=False, max_iters=1, optimizer="adamw"))
    assert "not used" not in capsys.readouterr().out
    # nor does a resume say that training follows a changed rate it does not read
    train.main(tiny_config(data_dir, tmp_path / "a", compile=False, max_iters=2, optimizer="adamw", muon_lr=0.07,
                           init_from="resume"))
    out = capsys.readouterr().out
    assert "note: max_iters 1 -> 2 since the checkpoint" in out and "muon_lr 0.05" not in out, out
    # --overwrite=true, which a damaged checkpoint's error suggests for a new run, does nothing for a resume
    train.main(tiny_config(data_dir, tmp_path / "a", compile=False, max_iters=3, optimizer="adamw", muon_lr=0.07,
                           init_from="resume", overwrite=True))
    assert "note: not used in this run: muon_lr=0.07 (optimizer=adamw), overwrite=true (init_from=resume continues " \
           "the checkpoint)\n" in capsys.readouterr().out


def test_too_little_data_for_a_resumed_run_is_not_told_to_change_block_size(TrainConfig):
    """A resumed run's block_size is its checkpoint's, which the resume refuses to change: the advice to
    use a smaller --block_size led to that refusal."""
    import numpy as np
    import train
    data = train.Data(np.zeros(10, np.uint16), np.zeros(100, np.uint16), {"tokenizer": "char", "vocab_size": 5}, {})
    with pytest.raises(ValueError, match=r"train\.bin has 10 tokens, not more than block_size=16; use a smaller "
                                         r"--block_size or more text$"):
        train.check_data(TrainConfig(block_size=16), data)
    with pytest.raises(ValueError, match=r"train\.bin has 10 tokens, not more than block_size=16; use more text, or "
                                         r"the data it trained on$"):
        train.check_data(TrainConfig(block_size=16, init_from="resume"), data)


def test_a_value_out_of_range_names_the_config_file_that_set_it(tmp_path, TrainConfig):
    """configs/finetune_gpt2_shakespeare.toml sets min_lr=3e-5: with --learning_rate=1e-5 the error named min_lr,
    which the user never typed, and not the file it came from. A value the command line set is the user's own."""
    path = toml(tmp_path, "min_lr = 3e-5\nbeta2 = 0.95\n")
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, [path, "--learning_rate=1e-5"])
    assert str(e.value).endswith(f"it must be at most that (min_lr is set in {path})"), e.value
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, [path, "--beta2=1.0"])
    assert str(e.value) == "beta2 must be in [0, 1), got 1.0", e.value


def test_the_decay_must_end_after_the_warm_up(TrainConfig):
    """In iterations (max_seconds=0); under max_seconds the schedule follows the clock and lr_decay_iters
    is not used, so it is not refused there."""
    by_iterations = ["--max_seconds=0", "--warmup_iters=10"]
    with pytest.raises(ConfigError, match=r"lr_decay_iters=5 would end the decay before warm-up ends "
                                          r"\(warmup_iters=10\); set --lr_decay_iters above 10, or to 0"):
        load_config(TrainConfig, [*by_iterations, "--lr_decay_iters=5"])
    assert load_config(TrainConfig, [*by_iterations, "--lr_decay_iters=11"]).lr_decay_iters == 11
    assert load_config(TrainConfig, [*by_iterations, "--lr_decay_iters=0"]).lr_decay_iters == 0
    assert load_config(TrainConfig, ["--warmup_iters=10", "--lr_decay_iters=5"]).lr_decay_iters == 5
    # where max_iters ends by the warm-up's end, 0 would decay nothing: not offered (nanoGPT's CPU config's 2000)
    with pytest.raises(ConfigError, match=r"set --lr_decay_iters above 3000$"):
        load_config(TrainConfig, [*by_iterations, "--warmup_iters=3000", "--lr_decay_iters=2000", "--max_iters=2000"])


@pytest.mark.parametrize("flag, key", [("--temperature=nan", "temperature"), ("--temperature=-1", "temperature"),
                                       ("--top_k=0", "top_k"), ("--top_p=0", "top_p"), ("--top_p=1.5", "top_p"),
                                       ("--seed=18446744073709551616", "seed"), ("--seed=-1", "seed"),
                                       ("--threads=-1", "threads"), ("--threads=100000", "threads")])
def test_sample_range_checks_are_config_errors(SampleConfig, flag, key):
    with pytest.raises(ConfigError, match=key):
        load_config(SampleConfig, [flag])


def test_sample_takes_every_seed_its_check_allows(SampleConfig):
    """[0, 2**63): the seeds a --key=value integer can be, and each one a torch generator takes."""
    torch.Generator().manual_seed(SampleConfig(seed=2**63 - 1).seed)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63\), got 9223372036854775808"):
        SampleConfig(seed=2**63)


def test_a_setting_without_its_dashes_is_named_as_a_flag(TrainConfig):
    """nanoGPT's configurator reads `n_layer=2`; here that is a file name unless it says --."""
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, ["n_layer=2"])
    assert str(e.value) == "'n_layer=2' is neither a config file nor a flag; did you mean --n_layer=2?"


def test_flag_without_equals_is_named_before_a_file_is_read(TrainConfig):
    with pytest.raises(ConfigError, match=r"--key=value \(e.g. --input=...\)"):
        load_config(TrainConfig, ["--input", "a.txt"])


@pytest.mark.parametrize("script", ["train.py", "sample.py", "data/prepare.py"])
def test_help_says_what_every_setting_means(launch, script):
    """--help: one line per setting, flag=default in one column, its meaning from the dataclass
    comment, its type; the meanings are written once, beside the fields."""
    proc = check_ok(launch(script, "--help"))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  --")]
    assert len(lines) >= 7, proc.stdout
    for line in lines:
        flag, _, rest = line.strip().partition("  ")
        meaning = rest.rpartition("[")[0].strip()  # the type, in brackets, ends the line
        assert "=" in flag and len(meaning) > 5, \
            f"{script}: no meaning for {flag}; write it as a comment at the end of the field's line"
    starts = {len(line) - len(line.lstrip()[len(line.strip().partition("  ")[0]):].lstrip()) for line in lines}
    assert len(starts) == 1, f"{script}: meanings do not start in one column"


def test_a_setting_of_a_type_flags_cannot_set_is_refused_by_name():
    """A forker's field of another type (a tuple for a value per layer) was set from --layer_scales=1.0,0.5 as
    the tuple of its characters, and failed later inside the model with a traceback."""
    from dataclasses import dataclass

    @dataclass
    class Forked:
        n_layer: int = 2  # transformer blocks
        layer_scales: tuple[float, ...] = ()  # each block's residual scale

    with pytest.raises(ConfigError) as e:
        load_config(Forked, ["--layer_scales=1.0,0.5"])
    assert str(e.value) == ("Forked.layer_scales has a type that --key=value and TOML cannot set (tuple[float, ...]); "
                            "give it one of: int, float, bool, str, a Literal of choices, or Optional of one of those")

    @dataclass
    class Settable:
        scale: Optional[float] = None  # each kind that flags set
        kind: Optional[Literal["a", "b"]] = None  # ...
        name: str | None = None  # ...
        on: bool = False  # ...

    assert load_config(Settable, ["--scale=2", "--kind=b", "--name=x", "--on=true"]) == Settable(2.0, "b", "x", True)


def test_a_settings_meaning_may_go_on_below_it():
    """A comment-only line indented past the field carries its meaning on (a line may hold 120 characters); a
    comment at the fields' own indentation starts a section and belongs to no setting."""
    from dataclasses import dataclass

    from configurator import field_comments

    @dataclass
    class Forked:
        width: int = 8  # the residual stream's width,
                        # in channels
        # the optimizer
        rate: float = 0.1  # its peak rate
        # not the rate's: a section's comment
        steps: int = 1

    assert field_comments(Forked) == {"width": "the residual stream's width, in channels", "rate": "its peak rate"}


@pytest.mark.skipif(not shutil.which("bash"), reason="reads the flags back as bash does")
def test_help_shows_defaults_as_a_shell_takes_them_back():
    """--help's flag column is what one would type: bash reads sample.py's --start (a newline) back as the
    default itself, and the same for text with a quote and a space in it, or what bash would read as its own
    (&, $, a glob: a resume note's --data_dir=/data/t&x, pasted, ran the command before the & in the background)."""
    from configurator import as_typed, help_text
    from sample import SampleConfig
    flag = next(line.split()[0] for line in help_text(SampleConfig).splitlines() if line.startswith("  --start="))
    texts = [chr(9) + "it" + chr(39) + "s so", "é" + chr(10), "/data/t&x", "$HOME/a;b", "q(1) *.txt", "it's \\ \"so\"",
             "", "plain/path-1.5"]
    for typed, value in [(flag, "--start=\n"), *((f"--x={as_typed(text)}", f"--x={text}") for text in texts)]:
        read = subprocess.run(["bash", "-c", f"printf %s {typed}"], capture_output=True, text=True, check=True).stdout
        assert read == value, (typed, read)
    assert as_typed("plain/path-1.5") == "plain/path-1.5"  # quoted only where needed


def test_sampling_on_a_cpu_runs_bf16_weights_only_once_they_outgrow_its_cache(monkeypatch):
    import hardware
    monkeypatch.setattr(hardware, "last_level_cache_bytes", lambda: 32 * 2**20)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: True)
    assert hardware.pick_dtype("auto", "cpu", training=False, n_params=8 * 2**20 - 1) == torch.float32  # 32 MiB fp32
    assert hardware.pick_dtype("auto", "cpu", training=False, n_params=8 * 2**20 + 1) == torch.bfloat16
    assert hardware.pick_dtype("auto", "cpu", n_params=1000) == torch.bfloat16  # training: bf16 whatever the size
    assert hardware.pick_dtype("float32", "cpu", training=False, n_params=10**9) == torch.float32  # a setting wins
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)  # an AVX2-only CPU
    assert hardware.pick_dtype("auto", "cpu", training=False, n_params=10**9) == torch.float32
    assert hardware.pick_dtype("auto", "cpu", n_params=10**9) == torch.float32


def test_the_largest_cache_is_read_from_sysfs(tmp_path, monkeypatch):
    import hardware
    for index, (level, size) in enumerate([(1, "48K"), (2, "1024K"), (3, "12M")]):  # as Linux lists them
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    monkeypatch.setattr(hardware.glob, "glob", lambda pattern: sorted(map(str, tmp_path.glob("index*"))))
    assert hardware.last_level_cache_bytes.__wrapped__() == 12 * 2**20
    monkeypatch.setattr(hardware.glob, "glob", lambda pattern: [])  # no sysfs (macOS)
    assert hardware.last_level_cache_bytes.__wrapped__() == 32 * 2**20


CPUINFO = "processor\t: {n}\nmodel name\t: AMD EPYC\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: {flags}\n\n"


@pytest.mark.parametrize("family, model, flags, bf16, name", [
    (25, 1, "fpu sse2 avx avx2 fma", False, "AMD EPYC (family 25 model 1; avx2)"),
    (26, 2, "avx2 avx512f avx512_vnni avx512_bf16", True, "AMD EPYC (family 26 model 2; avx2 avx512f avx512_bf16)"),
    (6, 143, "avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True,
     "AMD EPYC (family 6 model 143; avx2 avx512f avx512_bf16 amx_bf16)"),
    (6, 15, "sse2 ssse3", False, "AMD EPYC (family 6 model 15; no avx2)"),
])
def test_the_cpu_is_told_apart_by_family_model_and_matmul_instructions(monkeypatch, family, model, flags, bf16, name):
    """Benchmarks' headers and the cached peak tell CPUs of one model name apart; bf16 follows the flags."""
    import hardware
    text = CPUINFO.format(n=0, family=family, model=model, flags=flags)
    monkeypatch.setattr(hardware, "cpuinfo", lambda: text + CPUINFO.format(n=1, family=99, model=99, flags=""))
    assert hardware.cpu_class() == name and hardware.cpu_has_bf16() == bf16
    assert hardware.cpu_peak_key(torch.float32).startswith(name + "|")
    monkeypatch.setattr(hardware, "cpuinfo", lambda: "")  # no /proc/cpuinfo (macOS)
    assert hardware.cpu_class() == hardware.cpu_name() and not hardware.cpu_has_bf16()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_sample_py_casts_the_weights_themselves(tmp_path, data_dir, launch, monkeypatch, dtype):
    """sample.py runs the weights in the dtype, not autocast over fp32 weights: a token then reads each
    weight once, in half the bytes in bf16."""
    import sample
    from model import GPT
    out = tmp_path / "out"
    check_ok(launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=1"))
    seen = []
    monkeypatch.setattr(GPT, "stream", lambda self, *a, **k: seen.append(next(self.parameters()).dtype) or iter([]))
    sample.main(load_config(sample.SampleConfig, [f"--out_dir={out}", "--device=cpu", f"--dtype={dtype}",
                                                  "--threads=1"]))
    assert seen == [getattr(torch, dtype)]


@pytest.mark.parametrize("name", ["cuda:1", "cuda:7"])  # a name torch cannot read: test_robustness
def test_a_cuda_device_that_is_not_there(monkeypatch, name):
    from hardware import pick_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a machine with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match="CUDA devices 0 to 0"):
        pick_device(name)


def test_shipped_configs_load(TrainConfig):
    for path in sorted(Path(ROOT, "configs").glob("*.toml")):
        load_config(TrainConfig, [str(path)])


@pytest.mark.parametrize("path, activation", [("configs/gpt2_124m.toml", "gelu_tanh"),
                                              ("configs/shakespeare_char_gpu.toml", "gelu"),
                                              ("configs/nanogpt_cpu_reference.toml", "gelu")])
def test_the_recipe_configs_build_the_model_they_reproduce(TrainConfig, path, activation):
    """GPT-2's and nanoGPT's recipes set every model option in which TrainConfig's CPU defaults leave
    GPT-2's way (GPTConfig's defaults), so they train GPT-2's architecture with the recipe's GELU, and
    without biases, as nanoGPT's train.py does by default."""
    from model import GPTConfig
    cfg, shape = load_config(TrainConfig, [path]), ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
    gpt2_way = {**{f.name: f.default for f in fields(GPTConfig) if f.name not in shape and
                   getattr(TrainConfig(), f.name) != f.default}, "activation": activation, "bias": False}
    assert {name: getattr(cfg, name) for name in gpt2_way} == gpt2_way


def test_vocab_size_pads_the_embedding_and_sampling_takes_it(tmp_path, data_dir, launch):
    out = tmp_path / "out"
    check_ok(launch("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--vocab_size=64",
                    "--max_iters=2", "--eval_interval=2"))
    ckpt = load(out / "ckpt.pt")
    assert ckpt["model_config"]["vocab_size"] == 64 and ckpt["model"]["lm_head.weight"].shape == (64, 16)
    assert ckpt["tokenizer"]["vocab_size"] == len(set(TEXT)) < 64
    sample = check_ok(launch("sample.py", f"--out_dir={out}", "--max_new_tokens=100", "--start=All"))
    assert set(sample.stdout.split(SEPARATOR)[0]) <= set(TEXT), "sampled a padding token"


# ---- D. the forker's test: a new model option is one field -----------------------------------------

NEW_FIELD = '    zero_init: bool = False  # output projections start at zero: every block starts as the identity\n'


GREEDY_BY_ROPE_BASE = """
import json, sys
import torch
from data.tokenizer import tokenizer_from_meta
from files import load_torch_file
from model import GPT, GPTConfig
checkpoint, prompt, n = load_torch_file(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tokenizer, texts = tokenizer_from_meta(checkpoint["tokenizer"]), {}
for rope_base in (checkpoint["model_config"]["rope_base"], 10000.0):
    model = GPT(GPTConfig(**{**checkpoint["model_config"], "rope_base": rope_base}))
    model.load_state_dict(checkpoint["model"])
    ids = model.eval().generate(torch.tensor([tokenizer.encode(prompt)]), n, temperature=0)[0].tolist()
    texts[str(rope_base)] = tokenizer.decode(ids)
print(json.dumps(texts))
"""


def test_a_new_model_option_is_one_field_in_gptconfig(tmp_path, data_dir, launch):
    """Add `rope_base` to GPTConfig and use it in model.py, nothing else: train.py takes the flag and
    documents it, the checkpoint keeps it, resume insists on it, and sample.py builds the same model."""
    repo = tmp_path / "fork"  # the code a forker has: the scripts, the modules, data/'s Python files
    repo.mkdir()
    for module in Path(ROOT).glob("*.py"):
        shutil.copy(module, repo)
    shutil.copytree(Path(ROOT) / "data", repo / "data", ignore=lambda d, names: [n for n in names if ".py" not in n])
    model_py = (repo / "model.py").read_text()
    assert NEW_FIELD in model_py and model_py.count("10000.0 **") == 1
    model_py = model_py.replace(NEW_FIELD,  # a float field with an int default, as a forker may write it
                                NEW_FIELD + "    rope_base: float = 10000  # rotary angles: p / rope_base^(2i/hs)\n")
    (repo / "model.py").write_text(model_py.replace("10000.0 **", "config.rope_base **"))

    out = tmp_path / "out"
    args = [*TINY, "--pos_embedding=rope", f"--data_dir={data_dir}", f"--out_dir={out}", "--eval_interval=2"]
    check_ok(launch(str(repo / "train.py"), *args, "--rope_base=500", "--max_iters=2"))
    assert load(out / "ckpt.pt")["model_config"]["rope_base"] == 500.0
    refused = launch(str(repo / "train.py"), *args, "--rope_base=600", "--init_from=resume", "--max_iters=3")
    assert refused.returncode == 2 and "rope_base=500.0 (now 600.0)" in refused.stderr, refused.stderr
    check_ok(launch(str(repo / "train.py"), *args, "--rope_base=500", "--init_from=resume", "--max_iters=3"))
    assert load(out / "ckpt.pt")["iter_num"] == 3
    resumed = check_ok(launch(str(repo / "train.py"), *args, "--init_from=resume", "--max_iters=4"))  # left out: taken
    assert "rope_base=500.0" in resumed.stdout and load(out / "ckpt.pt")["model_config"]["rope_base"] == 500.0
    # sample.py's greedy text is that of the fork's GPT built from the checkpoint's rope_base=500, not of one
    # left at 10000: the two differ where attention is sharp (its weights scaled up), so that this can fail
    checkpoint = load(out / "ckpt.pt")
    for name in ("c_attn", "c_proj"):
        checkpoint["model"][f"transformer.h.0.attn.{name}.weight"] *= 20
    save_checkpoint(checkpoint, out / "ckpt.pt")
    sample = check_ok(launch(str(repo / "sample.py"), f"--out_dir={out}", "--max_new_tokens=40", "--start=All",
                             "--temperature=0"))
    (repo / "greedy.py").write_text(GREEDY_BY_ROPE_BASE)
    by_base = json.loads(check_ok(launch(str(repo / "greedy.py"), str(out / "ckpt.pt"), "All", "40")).stdout)
    assert sample.stdout.split(SEPARATOR)[0] == by_base["500.0"] != by_base["10000.0"], (sample.stdout, by_base)
    helped = check_ok(launch(str(repo / "train.py"), "--help")).stdout
    assert re.search(r"--rope_base=10000 +rotary angles", helped), helped


def test_sample_py_runs_the_model_with_every_runtime_setting_its_config_has():
    """README: a runtime setting of your own (model.RUNTIME_SETTINGS) is a field in SampleConfig for sample.py
    to take it; dropout stands in for one here. None: as trained."""
    import sample
    with_dropout = make_dataclass("WithDropout", [("dropout", Optional[float], None)],
                                              bases=(sample.SampleConfig,))
    assert sample.runtime_overrides(with_dropout(dropout=0.25, attention="sdpa")) == {"dropout": 0.25,
                                                                                       "attention": "sdpa"}
    assert sample.runtime_overrides(with_dropout()) == {}
    assert sample.runtime_overrides(with_dropout(attention_map="a.png")) == {"attention": "manual"}
