"""Data-parallel training through torchrun on CPU (gloo), two processes: DDP keeps the ranks
identical, 2 ranks x 1 micro-step equal 1 rank x 2 micro-steps, and FSDP2 trains and writes a
checkpoint that loads into a plain model; both evaluate as one process does. Ranks read disjoint
batches."""
import collections
import os
import re
import shutil
import sys
from dataclasses import asdict, replace

import pytest
import torch

from checkpoint import clean_state_dict, load_checkpoint
from data.loader import Batches
from distributed import AGREE_SECONDS, AgreementSchedule
from helpers import rank_weights, torchrun
from model import GPT, GPTConfig

# 3 evaluation batches, which do not divide among 2 ranks
TINY = ["--device=cpu", "--max_seconds=0", "--optimizer=adamw", "--dtype=float32", "--n_layer=2", "--n_head=2",
        "--n_embd=16", "--block_size=16", "--batch_size=4", "--max_iters=4", "--eval_interval=4",
        "--eval_iters=3", "--warmup_iters=1", "--log_interval=1", "--dropout=0.0"]


def final_weights(out_dir):
    return clean_state_dict(load_checkpoint(os.path.join(out_dir, "ckpt.pt"))["model"])


def evaluation(stdout):
    """(train loss, val loss) of a run's one evaluation, at iteration 4."""
    found = re.findall(r"^iter 4: train loss ([\d.]+), val loss ([\d.]+)", stdout, re.M)
    assert len(found) == 1, stdout
    return tuple(map(float, found[0]))


def logged_losses(stdout):
    """{iteration: the training loss its log line says}."""
    return {int(it): float(loss) for it, loss in re.findall(r"^iter (\d+): loss ([\d.]+)", stdout, re.M)}


Run = collections.namedtuple("Run", "weights evaluation losses")


@pytest.fixture(scope="module")
def single(data_dir, tmp_path_factory, launch):
    """One process with 2 micro-batches a step: what 2 ranks must reproduce."""
    out = str(tmp_path_factory.mktemp("single"))
    proc = launch("train.py", *TINY, "--gradient_accumulation_steps=2", f"--data_dir={data_dir}", f"--out_dir={out}")
    assert proc.returncode == 0, proc.stderr
    return Run(final_weights(out), evaluation(proc.stdout), logged_losses(proc.stdout))


def assert_evaluates_as_one_process(out, single):
    """3 evaluation batches on 2 ranks: FSDP gathers weights in every forward, so both ranks must run
    as many (a hang otherwise); the losses are those of one process over the same 3 batches."""
    assert evaluation(out) == pytest.approx(single.evaluation, abs=1e-4, rel=0)


def test_ddp_ranks_stay_identical_and_match_accumulation(data_dir, single, tmp_path):
    """With gradient_accumulation_steps at its default, each of the 2 ranks runs one micro-batch: the
    same 2 x 4 sequences per step as 1 process with gradient_accumulation_steps=2."""
    out = torchrun("tests/distributed_worker.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path}")
    assert "| 128 tokens/iter |" in out, out  # 2 micro-batches x 4 sequences x 16 tokens
    rank0, rank1 = rank_weights(tmp_path)
    assert torch.equal(rank0, rank1), "DDP replicas drifted apart"
    assert "| 2 process(es) ddp | " in out
    assert out.count("saved ") == 1, "only rank 0 writes checkpoints"
    ddp = final_weights(tmp_path)
    for name, w in single.weights.items():  # 2 ranks x 1 micro-step == 1 rank x 2 micro-steps
        assert torch.allclose(ddp[name], w, atol=1e-5, rtol=0), name
    assert any(not torch.equal(w, GPT(GPTConfig(**load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))["model_config"]))
                               .state_dict()[n]) for n, w in ddp.items()), "training changed nothing"
    assert_evaluates_as_one_process(out, single)
    # each line's loss is the whole batch's, both ranks' shares: as one process logs it, not rank 0's share
    assert len(single.losses) == 4 and logged_losses(out) == pytest.approx(single.losses, abs=2e-4)


def test_ranks_draw_their_own_dropout_and_resume_exactly(data_dir, tmp_path):
    """With dropout, each rank draws its masks from a generator of its own, and the checkpoint keeps
    every rank's: 2 + 2 iterations, resumed, end where 4 in one go do."""
    common = [*TINY, "--dropout=0.2", "--eval_interval=2", f"--data_dir={data_dir}"]
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    torchrun("train.py", *common, f"--out_dir={straight}")
    torchrun("train.py", *common, f"--out_dir={halves}", "--max_iters=2")
    rng = load_checkpoint(os.path.join(halves, "ckpt.pt"))["rng"]
    assert len(rng["torch"]) == 2 and not torch.equal(*rng["torch"]), "the ranks' generators are not their own"
    torchrun("train.py", *common, f"--out_dir={halves}", "--init_from=resume")
    resumed, whole = final_weights(halves), final_weights(straight)
    for name, w in whole.items():
        assert torch.equal(resumed[name], w), name


def test_fsdp_trains_and_its_checkpoint_loads_into_a_plain_model(data_dir, single, tmp_path):
    out = torchrun("tests/distributed_worker.py", *TINY, "--parallelism=fsdp", f"--data_dir={data_dir}",
                   f"--out_dir={tmp_path}")
    assert "| 2 process(es) fsdp | " in out
    total = GPT(GPTConfig(**load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))["model_config"])).num_params(False)
    shard0, shard1 = rank_weights(tmp_path)
    assert shard0.numel() + shard1.numel() == total and 0 < shard0.numel() < total, "each rank holds a shard"
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    model = GPT(GPTConfig(**checkpoint["model_config"]))
    model.load_state_dict(clean_state_dict(checkpoint["model"]))  # strict: every tensor whole and present
    for name, w in model.state_dict().items():  # sharded training computes the same function
        assert torch.allclose(w, single.weights[name], atol=1e-5, rtol=0), name
    assert_evaluates_as_one_process(out, single)


def test_an_evaluation_under_fsdp_takes_the_weights_of_a_run_that_muon_trained(data_dir, tmp_path, launch):
    """--eval_only steps no optimizer: under FSDP it evaluates a Muon run's checkpoint as one process does
    (Muon on FSDP's shards was refused, and with --optimizer=adamw its optimizer state was read as damage)."""
    args = [*TINY, "--optimizer=muon", f"--data_dir={data_dir}", f"--out_dir={tmp_path}"]
    proc = launch("train.py", *args)
    assert proc.returncode == 0, proc.stderr
    out = torchrun("train.py", *args, "--parallelism=fsdp", "--init_from=resume", "--eval_only=true")
    assert "| 2 process(es) fsdp | " in out and evaluation(out) == pytest.approx(evaluation(proc.stdout), abs=1e-4)


def test_fsdp_shards_over_the_training_device_whatever_accelerator_the_machine_has(monkeypatch):
    """fully_shard's own default mesh is the machine's accelerator's: on a GPU machine,
    --device=cpu --parallelism=fsdp under torchrun put rank 1 on a GPU it lacked ("invalid device
    ordinal"). The mesh is the training device's, here a CPU one on a machine that reports a GPU."""
    import train
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        cfg = train.TrainConfig(optimizer="adamw", n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)
        setup = train.Setup(0, 0, 1, distributed=True, fsdp=True, accumulation_steps=1, device="cpu",
                            dtype=torch.float32)
        state = train.new_train_state(cfg, setup, GPT(train.model_config(cfg, 32)), torch.arange(100).numpy())
        meshes = {p.device_mesh.device_type for p in state.model.parameters()}
    finally:
        torch.distributed.destroy_process_group()
    assert meshes == {"cpu"}


def test_muon_under_fsdp_is_refused_with_both_ways_out(monkeypatch):
    """Muon needs whole matrices. The advice was --optimizer=adamw alone, which a run trained with Muon
    cannot resume with (its optimizer state is Muon's): resume's own check then sent the user back. A resume
    is told the one way out it has, a new run both."""
    import train
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)  # as torchrun starts its first worker
    with pytest.raises(ValueError) as refused:
        train.set_up(train.TrainConfig(parallelism="fsdp", device="cpu", threads=1, init_from="resume"))
    assert str(refused.value) == ("optimizer='muon' needs whole matrices and does not run on FSDP's shards; resume a "
                                  "run trained with Muon with --parallelism=ddp (a resumed run keeps its optimizer), "
                                  "one trained with AdamW with --optimizer=adamw")
    with pytest.raises(ValueError) as refused:
        train.set_up(train.TrainConfig(parallelism="fsdp", device="cpu", threads=1))
    assert str(refused.value) == ("optimizer='muon' needs whole matrices and does not run on FSDP's shards; use "
                                  "--optimizer=adamw with --parallelism=fsdp, or --parallelism=ddp")


def test_ranks_read_disjoint_batches_that_add_up_to_one_rank():
    data = torch.arange(1_000_000).numpy()
    one, *ranks = (Batches(data, 8, 4, seed=0, device="cpu") for _ in range(3))  # one process; two ranks
    for _ in range(3):  # three optimizer steps of 4 micro-batches over 2 ranks
        single = one.share(4, 0, 1)
        rank0, rank1 = (batches.share(4, r, 2) for r, batches in enumerate(ranks))
        assert rank0.shape == rank1.shape == (2, 4)
        assert not set(rank0.flatten().tolist()) & set(rank1.flatten().tolist())
        assert sorted(map(tuple, torch.cat([rank0, rank1]).tolist())) == sorted(map(tuple, single.tolist()))


def agreements(schedule, seconds_per_iter, until_seconds):
    """The (iteration, training seconds) of each agreement of a loop whose i-th step takes
    seconds_per_iter(i), run until the first agreement at or past until_seconds."""
    found, iter_num, elapsed = [], 0, 0.0
    while not found or found[-1][1] < until_seconds:
        elapsed += seconds_per_iter(iter_num)
        iter_num += 1
        if schedule.due(iter_num):
            schedule.agreed(iter_num, elapsed)
            found.append((iter_num, elapsed))
    return found


def test_ranks_agree_about_every_agree_seconds_and_at_the_end_of_max_seconds():
    """At a steady 1 ms a step the gap between agreements doubles from one step to AGREE_SECONDS'
    worth; a step that turns 10x slower stretches one gap, and the next is short again; with
    max_seconds the last agreement lands just past it, and, when the pace turns 4x slower a second before
    it, less than a second past it (gaps of the whole time left, not half, ended 2.5 s past)."""
    found = agreements(AgreementSchedule(0), lambda i: 1e-3 if i < 5000 else 1e-2, until_seconds=40)
    gaps = [b[0] - a[0] for a, b in zip(found, found[1:])]
    steady = int(AGREE_SECONDS / 1e-3)
    assert gaps[:6] == [1, 2, 4, 8, 16, 32] and steady in gaps
    assert max(gaps) == steady  # never longer than AGREE_SECONDS at the pace last measured
    assert gaps[-1] == pytest.approx(AGREE_SECONDS / 1e-2, abs=1)  # the slower pace, measured
    seconds = [b[1] - a[1] for a, b in zip(found, found[1:])]
    stretched = seconds.index(max(seconds))  # the one gap the slow-down stretched, by at most its 10x
    assert 2 * AGREE_SECONDS < seconds[stretched] <= 10 * AGREE_SECONDS + 1e-9
    assert max(seconds[stretched + 1:]) <= AGREE_SECONDS * 1.01
    last = agreements(AgreementSchedule(max_seconds=7.0), lambda i: 1e-3, until_seconds=7.0)[-1]
    assert 7.0 <= last[1] < 7.0 + 0.01
    last = agreements(AgreementSchedule(max_seconds=7.0), lambda i: 1e-3 if i < 6000 else 4e-3, until_seconds=7.0)[-1]
    assert 7.0 <= last[1] < 8.0


def test_an_error_that_not_every_rank_found_names_the_rank_and_machine_that_did(monkeypatch, capsys):
    """A resume on two machines where one lacks out_dir/ckpt.pt: every rank says which machine that is,
    rather than the one that holds the file blaming itself. An error every rank found is said as it is."""
    import socket

    import distributed
    found = ValueError("no checkpoint at out/ckpt.pt; train one first")
    fine = (None, "b", None)  # another rank's report: no error, on machine b
    for gathered, said in (
            (lambda mine: [fine, mine], f"no checkpoint at out/ckpt.pt; train one first (found by rank 1, on "
                                        f"{socket.gethostname()})"),
            (lambda mine: [mine, mine], "no checkpoint at out/ckpt.pt; train one first")):
        monkeypatch.setattr(distributed, "gather", gathered)  # as torchrun's 2 ranks would have gathered them
        with pytest.raises(SystemExit) as exit:
            distributed.fail_together(found)
        assert exit.value.code == 2 and capsys.readouterr().err == f"error: {said}\n"
    monkeypatch.setattr(distributed, "gather", lambda mine: [mine, fine])  # a check rank 0 alone makes
    with pytest.raises(SystemExit):
        distributed.fail_together(ValueError("the loss became nan at iteration 3"), status=1, rank_0_checks=True)
    assert capsys.readouterr().err == "error: the loss became nan at iteration 3\n"  # not "found by rank 0"
    monkeypatch.setattr(distributed, "gather", lambda mine: [fine, fine])
    distributed.fail_together(None)  # no rank found one: on it goes


def two_machines(rank):
    """train.Setup of a rank of a torchrun job on two machines, one process on each (LOCAL_WORLD_SIZE=1)."""
    import train
    return train.Setup(rank, 0, 2, distributed=True, fsdp=False, accumulation_steps=2, device="cpu",
                       dtype=torch.float32)


def test_what_ranks_must_share_leaves_out_each_machines_own_paths_device_and_threads(tmp_path):
    """run_identity, which every rank compares: a copy of out_dir, the data or GPT-2's weights at another path
    on another machine is the same run (the checkpoint was named by its path, and a resume from an identical
    copy was refused); a setting that changes the training, the data's tokens, the model's shape or the
    weights it starts from are not."""
    from types import SimpleNamespace

    import train
    cfg = train.TrainConfig(init_from="resume", device="cpu", dtype="float32", n_embd=16, n_head=2)
    data = SimpleNamespace(meta={"tokenizer": "char", "vocab_size": 65},
                           splits={"train": {"tokens": 900, "crc32": 0xabcd}, "val": {"tokens": 100, "crc32": 0x1234}})
    state = SimpleNamespace(model=GPT(GPTConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=16)), iter_num=20,
                            run_id="1a2b3c4d")
    start = "ckpt.pt at iteration 20 of run 1a2b3c4d"
    ours = train.run_identity(cfg, data, state, start)
    for name, value in (("out_dir", "elsewhere/out"), ("data_dir", "elsewhere/data"), ("init_from", "elsewhere/gpt2"),
                        ("device", "cuda:1"), ("threads", 3)):
        assert train.run_identity(replace(cfg, **{name: value}), data, state, start) == ours, name
    assert train.run_identity(replace(cfg, learning_rate=1e-2), data, state, start)["--learning_rate"] == "0.01"
    other_data = SimpleNamespace(meta=data.meta, splits={**data.splits, "val": {"tokens": 100, "crc32": 0x4321}})
    assert train.run_identity(cfg, other_data, state, start)["the data"] != ours["the data"]
    wider = SimpleNamespace(model=GPT(GPTConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32)))
    assert train.run_identity(cfg, data, wider, start)["the model"] != ours["the model"]


def test_the_weights_a_run_starts_from_are_compared_by_their_bytes_not_their_path(tmp_path):
    """build_model's start, which run_identity compares: a resume by its checkpoint's run and iteration, GPT-2's
    weights by their bytes. Two folders of other weights of one shape (or scratch on one machine) had trained
    or evaluated a blend of both under FSDP, once init_from's path was no longer compared."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    import train
    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=100))
    hf.save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(20)
    hf.save_pretrained(tmp_path / "other")
    data = SimpleNamespace(meta={"tokenizer": "gpt2", "vocab_size": 100}, splits={"train": {"largest_id": 99}})
    cfg = train.TrainConfig(device="cpu", dtype="float32", block_size=16, n_layer=1, n_head=2, n_embd=16)
    starts = {name: train.build_model(replace(cfg, init_from=str(tmp_path / name)), data, None, two_machines(0))[1]
              for name in ("a", "copy", "other")}
    assert starts["a"] == starts["copy"] != starts["other"] and starts["a"].startswith("GPT-2 weights of crc32 ")
    trained = GPT(GPTConfig(vocab_size=100, n_layer=1, n_head=2, n_embd=16))
    checkpoint = {"model_config": asdict(trained.config), "model": trained.state_dict(), "iter_num": 20,
                  "run_id": "1a2b3c4d"}
    assert train.build_model(replace(cfg, init_from="resume"), data, checkpoint, two_machines(0))[1] == \
        "ckpt.pt at iteration 20 of run 1a2b3c4d"
    assert train.build_model(cfg, data, None, two_machines(0))[1] == "new ones, drawn from --seed"


def test_a_resume_on_a_machine_without_the_checkpoint_says_to_copy_it_there(tmp_path, monkeypatch):
    """Each machine of a torchrun job reads out_dir from its own disk: the one that lacks the checkpoint was told
    to "train one first" (its peer held it). A new run checks rank 0's out_dir alone, the one it writes: a stale
    checkpoint on another machine's disk had stopped it ("continue it with --init_from=resume")."""
    import train
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    cfg = train.TrainConfig(init_from="resume", out_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=f"^no checkpoint at {tmp_path}/out/ckpt.pt on this machine: each machine "
                                         "reads out_dir from its own disk; copy out_dir from the machine that holds "
                                         "it to the same path here"):
        train.load_resume_point(cfg, two_machines(1))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"an earlier run's")
    assert train.load_resume_point(replace(cfg, init_from="scratch"), two_machines(1)) is None
    with pytest.raises(ValueError, match="holds a trained run"):
        train.load_resume_point(replace(cfg, init_from="scratch"), two_machines(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # one machine: every rank finds it, and the line names no rank
    with pytest.raises(ValueError, match="holds a trained run"):
        train.load_resume_point(replace(cfg, init_from="scratch"), two_machines(1))


def test_ranks_that_do_not_share_what_they_must_say_the_first_difference_and_where(monkeypatch, capsys):
    """fail_together(same=...): the ranks' settings, data and checkpoint, compared; the first that differs is said
    with each side's value and machine, by every rank; where all agree, on it goes."""
    import socket

    import distributed
    ours = {"--lr": "0.002", "the data": "char tokens: train.bin 900 tokens (crc32 0000abcd)",
            "the weights": "ckpt.pt at iteration 20 of run 1a2b3c4d"}
    for key, theirs in (("the data", "char tokens: train.bin 900 tokens (crc32 ffff0000)"),
                        ("the weights", "ckpt.pt at iteration 10 of run 5e6f7a8b")):
        monkeypatch.setattr(distributed, "gather", lambda mine: [mine, mine, (None, "b", {**ours, key: theirs})])
        with pytest.raises(SystemExit) as exit:
            distributed.fail_together(None, same=ours)
        assert exit.value.code == 2 and capsys.readouterr().err.startswith(
            f"error: the processes of this torchrun job differ in {key}: {ours[key]} on rank 0 (on "
            f"{socket.gethostname()}), {theirs} on rank 2 (on b); give every machine the same command")
    monkeypatch.setattr(distributed, "gather", lambda mine: [mine, (None, "b", dict(ours))])
    distributed.fail_together(None, same=ours)
    assert capsys.readouterr().err == ""


def test_leaving_after_an_exit_frees_the_ddp_wrapper_before_the_group(monkeypatch):
    """A SIGTERM ends train() with sys.exit, whose frames still hold the DDP wrapper. Left for the
    interpreter's exit, its reducer would free the gloo group last, holding the GIL that a gloo thread
    may be waiting for (torchrun jobs that hung after their save): the wrapper must go first."""
    import weakref

    import distributed
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    wrapper_alive_at_destroy = []
    destroy = torch.distributed.destroy_process_group

    def recording_destroy():
        wrapper_alive_at_destroy.append(wrapper() is not None)
        destroy()

    def train(wrapped_model):  # stops as train.train does on a signal, the wrapper in its frame
        wrapped_model(torch.ones(1, 2)).sum().backward()
        sys.exit(143)

    monkeypatch.setattr(torch.distributed, "destroy_process_group", recording_destroy)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    wrapper = weakref.ref(model)
    try:
        train(model)
    except SystemExit:
        del model
        distributed.leave_process_group()
    finally:
        if torch.distributed.is_initialized():  # left by a failure above: the next test of this worker starts clean
            destroy()
    assert wrapper_alive_at_destroy == [False]


def test_a_peer_gone_is_said_by_gloos_first_sentence(monkeypatch, capsys):
    """The line names what gloo said went wrong, not the last 120 characters of its advice."""
    import distributed
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
    error = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:35751: "
                         "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in "
                         "the application. Check the logs of the remote worker before reporting an error. GLHF!")
    with pytest.raises(SystemExit) as exit:
        distributed.stop_if_a_peer_is_gone(error, "the last checkpoint, out/ckpt.pt, is kept")
    assert exit.value.code == 1 and capsys.readouterr().err == (
        "error: another process of this torchrun job stopped, so this one cannot go on (Read error "
        "[127.0.0.1]:35751: Connection reset by peer); that process's log says why; the last checkpoint, "
        "out/ckpt.pt, is kept\n")


def test_a_last_barrier_that_meets_a_gone_peer_is_one_line(monkeypatch, capsys):
    """Leaving the group after a normal end: a peer that died meanwhile makes gloo's barrier raise; that is
    the one line a gone peer gets, not gloo's traceback."""
    import distributed

    def barrier():
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                           "[127.0.0.1]:21544")

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "barrier", barrier)
    monkeypatch.setattr(distributed.os, "_exit", lambda status: (_ for _ in ()).throw(SystemExit(status)))
    with pytest.raises(SystemExit) as exit:
        distributed.leave_process_group()
    assert exit.value.code == 1 and capsys.readouterr().err == (
        "error: another process of this torchrun job stopped, so this one cannot go on (Connection closed by peer "
        "[127.0.0.1]:21544); that process's log says why\n")


def test_the_group_is_left_with_the_stop_handlers_still_in(tmp_path, data_dir, monkeypatch):
    """Under torchrun the last barrier waits for rank 0's last save: a SIGTERM then (torchrun's, as a job
    ends) killed the rank already waiting, with the default handler back, and rank 0's barrier was a gloo
    traceback. The handlers go back only once the group is left."""
    import signal

    import train
    seen = []
    monkeypatch.setattr(train, "leave_process_group", lambda: seen.append(signal.getsignal(signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    train.main(train.TrainConfig(device="cpu", dtype="float32", max_seconds=0, max_iters=2, n_layer=1, n_head=2,
                                 n_embd=16, block_size=8, batch_size=2, eval_iters=1, compile=False,
                                 data_dir=str(data_dir), out_dir=str(tmp_path)))
    assert len(seen) == 1 and seen[0] not in (before, signal.SIG_DFL) and signal.getsignal(signal.SIGTERM) == before
