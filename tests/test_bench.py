"""The benchmark scripts run end to end at toy sizes and write the JSON the README's tables come
from. Nothing here is timed: these only keep the scripts working as the code under them changes."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ENV, ROOT, check_ok

SCRIPTS = ("attention", "train", "sample", "recipe", "attention_page")


def run_bench(launch, script, out, *args):
    check_ok(launch(script, "--device=cpu", f"--out={out}", *args))
    with open(out) as f:
        return json.load(f)


def test_every_variant_of_a_dtype_is_scored_against_one_peak(monkeypatch):
    """A variant faster than the cached matmul peak raises it (MFU stays <= 100 %); the table's other variants
    of that dtype, before it and after, are then scored against the raised peak too, so that their MFUs compare
    as their tokens/s do."""
    import bench.train as bench_train

    class Steps:  # a variant whose step takes `seconds`
        def __init__(self, seconds):
            self.seconds, self.dtype = seconds, torch.float32

        def step(self):
            time.sleep(self.seconds)

    monkeypatch.setattr(bench_train, "peak_flops", lambda device_type, dtype, reached: (reached, "raised"))
    recs = [{"status": "ok", "flops_per_token": 1e6, "peak_flops": 1e6 * 1000 / 0.03} for _ in range(3)]
    cfg = bench_train.TrainBench(repeats=3, loop=0, steps_per_sample=1)
    bench_train.time_variants(cfg, list(zip([Steps(0.04), Steps(0.01), Steps(0.04)], recs)), "cpu", 1000)
    assert recs[0]["peak_flops"] == recs[1]["peak_flops"] == recs[2]["peak_flops"] > 1e6 * 1000 / 0.03
    assert recs[1]["mfu"] == 1.0 and all(r["mfu"] / recs[1]["mfu"] == pytest.approx(
        r["tokens_per_s"] / recs[1]["tokens_per_s"]) for r in recs)


def test_a_config_s_weights_and_micro_steps_that_the_step_bench_does_not_use_are_named():
    """bench/train.py with the fine-tuning config timed random weights of this repo's blocks, batch x 1, and
    said nothing of the config's init_from=gpt2 and gradient_accumulation_steps=4."""
    import bench.train as bench_train
    from configurator import load_config
    from train import TrainConfig
    tcfg = load_config(TrainConfig, [os.path.join(ROOT, "configs", "finetune_gpt2_shakespeare.toml")])
    assert bench_train.unused_note(tcfg) == ("note: not used here: init_from=gpt2, gradient_accumulation_steps=4 "
                                             "(random weights of the shape above; --grad_accum sets the micro-steps)\n")
    assert bench_train.unused_note(TrainConfig()) == ""


def test_a_failure_in_a_result_is_one_line_that_never_repeats_its_type():
    """Inductor's bare asserts say nothing: a result's message read "AssertionError: AssertionError"."""
    from bench.benchutil import failure
    assert failure(AssertionError()) == "AssertionError"
    assert failure(AssertionError(), " while timing") == "AssertionError while timing"
    assert failure(RuntimeError("no C++ compiler\nmore"), " while timing") == \
        "RuntimeError while timing: no C++ compiler"


@pytest.mark.parametrize("device, waited_for", [("cuda:0", "cuda"), ("mps", "mps"), ("cpu", None)])
def test_timers_wait_for_the_gpu_they_time(monkeypatch, device, waited_for):
    """A GPU queues work and returns: timed without a wait, an Apple GPU's step measured its launches."""
    from bench import benchutil
    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append("cuda"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waits.append("mps"))
    benchutil.sync(device)
    assert waits == ([waited_for] if waited_for else [])


@pytest.mark.parametrize("name, noted", [("auto", True), ("cuda", False), ("cpu", False)])
def test_a_benchmark_says_when_device_auto_took_a_gpu(monkeypatch, capsys, name, noted):
    """A benchmark meant for the CPU of a machine that has a GPU would otherwise time the GPU unsaid."""
    from bench import benchutil
    monkeypatch.setattr(benchutil, "pick_device", lambda name: "cpu" if name == "cpu" else "cuda")
    monkeypatch.setattr(benchutil, "make_current", lambda device: None)
    benchutil.resolve_device(name)
    err = capsys.readouterr().err
    assert (err == "note: device=auto took cuda; --device=cpu measures this machine's CPU\n") == noted, err
    assert noted or err == ""


def test_attention_bench_times_every_backend(launch, tmp_path):
    result = run_bench(launch, "bench/attention.py", tmp_path / "a.json", "--seq_lens=32,64", "--n_embd=32",
                       "--n_head=2", "--repeats=1", "--min_sample_s=0", "--dtype=bfloat16", "--memory=false")
    assert result["flash_kernel"] == "pytorch"
    assert set(result["results"]) == {"manual", "sdpa", "flash"}
    assert result["requirement"]["applies"] is False, "the memory goal is stated at the default shape, not this one"
    for backend, by_t in result["results"].items():
        assert set(by_t) == {"32", "64"}, backend
        for t, point in by_t.items():
            assert point["status"] == "ok" and point["time"]["median"] > 0, (backend, t)


def test_a_dry_run_of_gpu_sh_leaves_the_kept_gpu_results_alone(tmp_path):
    """GPU_SH_DRY_RUN=1 (toy sizes on a CPU) wrote its log and toy numbers over bench/results/gpu/'s, the GPU's
    own: without a folder given it now writes into a new temporary one. A copy of the script runs here, with a
    budget too short for any step."""
    (tmp_path / "bench" / "results" / "gpu").mkdir(parents=True)
    shutil.copy(Path(ROOT, "bench", "gpu.sh"), tmp_path / "bench")
    (tmp_path / "bench" / "results" / "gpu" / "gpu.log").write_text("the GPU's log")
    proc = subprocess.run(["bash", str(tmp_path / "bench" / "gpu.sh")], capture_output=True, text=True, timeout=60,
                          env={**ENV, "TMPDIR": str(tmp_path), "GPU_SH_BUDGET": "1", "GPU_SH_DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bench" / "results" / "gpu" / "gpu.log").read_text() == "the GPU's log"
    assert [p.name for p in tmp_path.glob("gpu-dry.*/gpu.log")] == ["gpu.log"]


def test_attention_bench_that_measures_nothing_writes_nothing(launch, tmp_path):
    """A backend named that cannot run here (fa2 on a CPU) is one line before any timing (it had printed a row
    of "skipped" for every length first), and a kept result is not replaced."""
    kept = tmp_path / "a.json"
    kept.write_text("a kept result")
    proc = launch("bench/attention.py", "--backends=fa2", "--device=cpu", "--seq_lens=32", "--n_embd=32",
                  "--n_head=2", "--repeats=1", f"--out={kept}")
    said = re.fullmatch(r"error: --backends=fa2: attention='fa2' [^\n]*\n", proc.stderr)
    assert proc.returncode == 2 and proc.stdout == "" and said, proc
    assert kept.read_text() == "a kept result"


def test_attention_bench_measures_the_peak_memory_of_one_call(launch):
    """The child process the bench starts per (backend, T) to read the peak resident memory on CPU."""
    peaks = {}
    for backend in ("manual", "flash"):
        proc = launch("bench/attention.py", f"--single={backend}:2048", "--device=cpu", "--n_embd=32", "--n_head=2")
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.split("RESULT ", 1)[1])
        assert result["status"] == "ok", result
        peaks[backend] = result["peak_bytes"]
    # manual holds 2 heads x 2048 x 2048 fp32 scores (32 MiB) and their softmax; flash never makes them. At
    # T=1024 flash's fixed ~14 MiB came to 1/4 of manual's peak under torch 2.11: T=2048 keeps them apart
    assert peaks["manual"] > 32 * 2**20 and peaks["flash"] < peaks["manual"] / 4, peaks


def test_attention_bench_child_keeps_the_malloc_limits_it_was_started_with(monkeypatch, capsys):
    """The memory child runs with MALLOC_* limits that hand a freed tensor back at once; setting its threads
    must not also switch on train.py's keep-freed-memory policy, which would count freed tensors as peak."""
    import hardware
    from bench.attention import AttentionBench, single
    from configurator import load_config
    kept = []
    monkeypatch.setattr(hardware, "keep_freed_memory", lambda: kept.append(True))
    threads = torch.get_num_threads()
    try:
        single(load_config(AttentionBench, ["--single=manual:16", "--device=cpu", "--n_embd=32", "--n_head=2",
                                            "--threads=1"]))
    finally:
        torch.set_num_threads(threads)
    assert json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])["status"] == "ok" and kept == []


def test_attention_bench_child_measures_without_proc(monkeypatch, capsys):
    """A Mac has no /proc: the child had failed every point ("No such file or directory: '/proc/self/status'")
    and nothing was measured; it falls back to getrusage's peak."""
    import bench.attention
    from configurator import load_config
    monkeypatch.setattr(bench.attention, "PROC_STATUS", "/nonexistent/status")
    monkeypatch.setattr(bench.attention, "CLEAR_REFS", "/nonexistent/clear_refs")
    threads = torch.get_num_threads()
    try:
        flags = ["--single=manual:512", "--device=cpu", "--n_embd=32", "--n_head=2", "--threads=1"]
        bench.attention.single(load_config(bench.attention.AttentionBench, flags))
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])
    assert result["status"] == "ok" and result["method"].startswith("ru_maxrss growth") and result["peak_bytes"] >= 0


@pytest.mark.parametrize("variants,names", [
    ("attention", {"manual", "sdpa", "flash"}),
    ("optimizer", {"adamw", "muon"}),
    ("execution", {"nanogpt", "default"}),  # each name goes on with what it runs, e.g. "nanogpt: eager float32 sdpa"
    ("activation", {"gelu_tanh", "gelu", "relu2"}),
])
def test_train_bench_runs_each_variant(launch, tmp_path, variants, names):
    result = run_bench(launch, "bench/train.py", tmp_path / "t.json", "--n_layer=1", "--n_head=2", "--n_embd=32",
                       "--block_size=16", "--batch_size=2", "--vocab_size=64", "--repeats=1", "--warmup=0",
                       f"--variants={variants}", "--profile=1",
                       *(() if variants == "execution" else ("--dtype=float32",)))  # execution runs its own dtypes
    rows = result["variants"]
    assert {row["name"].split(":")[0] for row in rows} == names
    for row in rows:
        assert row["status"] == "ok" and row["tokens_per_s"] > 0 and row["flops_per_token"] > 0, row
        assert 0 < row["mfu"] <= 1, row  # a run that beats the CPU probe raises it
        phases = row["profile"]["phases_ms"]
        assert {"forward", "backward", "clip", "optimizer AdamW"} <= set(phases), phases
        assert ("optimizer Muon" in phases) == (row["optimizer"] == "muon")
        assert sum(phases.values()) <= row["profile"]["step_ms"] * 1.05, row["profile"]
        assert row["profile"]["page_faults_per_step"] >= 0 and row["profile"]["kernel_cpu_ms_per_step"] >= 0


def test_train_bench_refuses_steps_per_sample_that_loop_would_replace():
    """--loop times the steps alone over as many iterations as the loop: a --steps_per_sample beside it was
    dropped without a word."""
    from bench.train import TrainBench
    with pytest.raises(ValueError, match=r"^loop=2 times the steps alone over as many iterations as the loop: "
                                         r"steps_per_sample=7 would not be used; give one of the two$"):
        TrainBench(loop=2, steps_per_sample=7)
    assert TrainBench(loop=2).steps_per_sample == 1 and TrainBench(steps_per_sample=7).loop == 0


def test_train_bench_compares_with_the_first_variant_that_ran_and_refuses_a_run_where_none_could(launch, tmp_path):
    """float16 cannot train on a CPU: with it first, 'vs first' is float32's (the table says so), and with it
    alone nothing was measured, which had exited 0 and written an empty result over the file."""
    tiny = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--vocab_size=64",
            "--repeats=1", "--warmup=0", "--variants=dtype", "--compile=false", "--attention=manual"]
    proc = launch("bench/train.py", "--device=cpu", f"--out={tmp_path / 'two.json'}", *tiny, "--dtypes=float16,float32")
    check_ok(proc)
    assert "'vs first' = tokens/s over float32's, the first variant that ran" in proc.stdout
    out = tmp_path / "none.json"
    out.write_text("a kept result")
    proc = launch("bench/train.py", "--device=cpu", f"--out={out}", *tiny, "--dtypes=float16")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("error: none of the variants could run here (the notes above say "
                                                     "why); nothing was measured or written"), proc.stderr
    assert "float16: unsupported: float16 is not supported on CPU" in proc.stderr
    assert out.read_text() == "a kept result"


def test_train_bench_times_train_pys_loop_against_the_step_round_by_round(launch, tmp_path):
    """--loop: train.py's own loop and the step alone in every round; the overhead pairs them by round,
    so that a machine whose speed drifts between rounds does not read as the loop's cost."""
    result = run_bench(launch, "bench/train.py", tmp_path / "t.json", "--n_layer=1", "--n_head=2", "--n_embd=32",
                       "--block_size=16", "--batch_size=2", "--vocab_size=64", "--repeats=4", "--warmup=0",
                       "--variants=none", "--dtype=float32", "--compile=false", "--loop=3")
    row = result["variants"][0]
    loops, steps = row["loop_time"]["samples"], row["step_time"]["samples"]
    assert len(loops) == len(steps) == 4 and min(loops) > 0, row
    ratios = sorted(loop / step for loop, step in zip(loops, steps))
    assert row["loop_overhead"] == pytest.approx((ratios[1] + ratios[2]) / 2 - 1), row


def test_train_bench_replays_every_matrix_multiply_of_a_step(launch, tmp_path):
    """--matmuls: the step's matrix multiplies, found by the profiler and replayed alone, are the ones
    the model and Muon make: their count and FLOPs, worked out here from the shapes. Their time inside
    the step is a part of the step's time, not every op's."""
    L, C, T, B, V, H = 2, 32, 16, 2, 64, 2
    result = run_bench(launch, "bench/train.py", tmp_path / "t.json", f"--n_layer={L}", f"--n_head={H}",
                       f"--n_embd={C}", f"--block_size={T}", f"--batch_size={B}", f"--vocab_size={V}", "--repeats=2",
                       "--warmup=0", "--variants=none", "--dtype=float32", "--compile=false", "--optimizer=muon",
                       "--matmuls=true")
    m = result["variants"][0]["matmuls"]
    from train import TrainConfig
    R = TrainConfig().mlp_ratio  # the MLP's hidden width, in multiples of C
    # c_attn 3C x C, c_proj C x C, the MLP's two RC x C; the head
    linear = 2 * B * T * (L * (4 + 2 * R) * C * C + V * C)
    attention = L * 4 * B * T * T * C  # scores q·kᵀ and weights·v, every head
    r, ks = C, (3 * C, C, R * C, R * C)  # Muon: each shape's L matrices as (r, k), r <= k
    newton_schulz = 5 * sum(L * (4 * r * r * k + 2 * r ** 3) for k in ks)  # 5 steps: x xᵀ, its square, times x
    assert m["gflop"] * 1e9 == pytest.approx(3 * (linear + attention) + newton_schulz, rel=1e-9), m
    # forward: the linears and the head; backward: two products each (inputs', weights' gradients); attention 2 + 4
    assert m["calls"] == (4 * L + 1) + 2 * (4 * L + 1) + 6 * L + 4 * 5 * 3, m
    assert 0 < m["in_step_ms"] < m["profiled_step_ms"] and m["alone_ms"] > 0 and m["step_ms"] > 0, m


def test_os_costs_counts_the_pages_a_step_faults_in():
    from bench.benchutil import os_costs
    faults, kernel_s = os_costs(lambda: bytearray(b"\x01") * (64 << 20))  # 64 MiB, every page written
    assert faults >= (64 << 20) // (2 << 20) and kernel_s >= 0  # one a page, or one per 2 MiB huge page
    assert os_costs(lambda: None)[0] < faults / 10


def test_the_profilers_own_lines_stay_out_of_the_output(capfd):
    """torch's profiler library writes a line of its own to stderr as each profile starts and stops ("USDT:"),
    which landed between a bench's tables; a line the profiled code writes meanwhile still reaches stderr."""
    from bench.benchutil import profiled

    def step():
        os.write(2, b"a line of the step's own\n")
        return torch.ones(8) @ torch.ones(8)

    profiled(step, "cpu")
    err = capfd.readouterr().err
    assert "a line of the step's own" in err
    assert not [line for line in err.splitlines() if line.startswith(("USDT:", "STAGE:"))], err


def test_sample_bench_compares_cache_no_cache_and_nanogpt(launch, tmp_path):
    result = run_bench(launch, "bench/sample.py", tmp_path / "s.json", "--n_layer=1", "--n_embd=32", "--n_head=2",
                       "--block_size=32", "--max_new_tokens=40", "--repeats=1", "--warmup_tokens=2", "--profile=8")
    assert set(result["results"]) == {"kv_cache", "no_cache", "nanogpt"}
    assert set(result["ratios"]) == {"kv_cache_vs_no_cache", "kv_cache_vs_nanogpt"}
    assert all(r > 0 for r in result["ratios"].values()) and result["greedy_identical"] is True
    assert result["dtype"] == "float32"  # a model this small fits in any CPU's cache
    assert set(result["profile"]) == set(result["results"])
    for path, p in result["profile"].items():
        assert p["ops_per_token"] >= 5, (path, p)  # at least the layer's four matmuls and the head's
        # ops called inside other ops are counted once, in their caller's time: never more than the wall
        assert 0 < p["in_ops_ms"] <= p["token_ms"], (path, p)
        assert p["top_ops_us"] and all(op.startswith("aten::") for op in p["top_ops_us"]), (path, p)


def test_sample_bench_of_a_checkpoint_names_it_without_the_machine_s_directories(launch, tmp_path, data_dir):
    """Its "source" had been "checkpoint /the/machine's/path/ckpt.pt", which the results' path rule missed."""
    out = tmp_path / "run"
    check_ok(launch("train.py", *tiny_run(data_dir).split(), "--max_seconds=0", "--max_iters=2", f"--out_dir={out}"))
    result = run_bench(launch, "bench/sample.py", tmp_path / "s.json", f"--out_dir={out}", "--max_new_tokens=8",
                       "--repeats=1", "--warmup_tokens=2")
    assert result["source"] == "ckpt.pt" and str(tmp_path) not in json.dumps(result), result["source"]


def test_sample_bench_goals_apply_only_where_they_are_stated(capsys):
    """Against nanoGPT's loop the goal is stated sampling at temperature 1 from a one-token prompt: at 0
    generate takes the argmax while nanoGPT's loop still samples, so a verdict there would not compare."""
    from types import SimpleNamespace

    from bench.sample import SampleBench, check_requirements
    c = SimpleNamespace(n_layer=4, n_head=4, n_embd=128, mlp_ratio=4, block_size=64)  # nanoGPT's CPU model
    ratios = {"kv_cache_vs_no_cache": 4.0, "kv_cache_vs_nanogpt": 3.5}
    assert check_requirements(c, SampleBench(), "cpu", ratios)["kv_cache_vs_nanogpt"]["applies"]
    narrow = SimpleNamespace(**{**vars(c), "mlp_ratio": 2})  # half nanoGPT's MLP: another model
    assert not check_requirements(narrow, SampleBench(), "cpu", ratios)["kv_cache_vs_nanogpt"]["applies"]
    for change in (dict(temperature=0.0), dict(prompt_len=60), dict(max_new_tokens=50)):
        assert not check_requirements(c, SampleBench(**change), "cpu", ratios)["kv_cache_vs_nanogpt"]["applies"], change
    capsys.readouterr()
    assert not check_requirements(c, SampleBench(), "cuda", ratios)["kv_cache_vs_nanogpt"]["applies"]
    out = capsys.readouterr().out  # the shape is the stated one: the device is why the goal does not apply
    assert re.search(r"kv_cache_vs_nanogpt >= 3.0x: not applicable to this run \(stated on a CPU for .*; this run "
                     r"is on cuda\)\n", out), out


def test_the_sample_bench_compares_with_nanogpts_choices_at_the_models_size():
    """The nanoGPT baseline has the sampled model's size and nanoGPT's choices, whatever else the model's
    config holds: this repo's options, and a forker's new field (GPTConfig's default, not the model's)."""
    from dataclasses import asdict, dataclass

    from bench.sample import nanogpt_model
    from model import GPTConfig

    @dataclass
    class Forked(GPTConfig):
        logit_softcap: float = 0.0

    ours = Forked(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, mlp_ratio=2, bias=False,
                  pos_embedding="rope", norm="rmsnorm", qk_norm=True, zero_init=True, activation="relu2",
                  logit_softcap=15.0)
    assert asdict(nanogpt_model(ours, seed=0).config) == asdict(GPTConfig(
        vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, mlp_ratio=2, bias=False, attention="sdpa",
        pos_embedding="learned", norm="layernorm", qk_norm=False, zero_init=False, activation="gelu"))


@pytest.mark.parametrize("dtype,paths", [("float32", {"kv_cache", "transformers"}),  # fits in the cache: not packed
                                         ("bfloat16", {"kv_cache", "transformers", "transformers_fp32",
                                                       "kv_cache_unpacked"})])
def test_sample_bench_against_transformers_gives_its_greedy_tokens(launch, tmp_path, dtype, paths):
    """kv_cache decodes as sample.py does: in bf16 its Linears packed, and the unpacked model timed beside it."""
    result = run_bench(launch, "bench/sample.py", tmp_path / "s.json", "--reference=transformers", "--n_layer=1",
                       "--n_embd=32", "--n_head=2", "--block_size=64", "--max_new_tokens=20", "--repeats=1",
                       "--warmup_tokens=2", f"--dtype={dtype}")
    assert set(result["results"]) == paths and result["dtype"] == dtype
    assert result["config"]["temperature"] == 0.0  # greedy, so that the tokens can be compared
    assert result["greedy_compared_with"] == "transformers" and result["greedy_identical"] is True
    assert not result["requirements"]["kv_cache_vs_transformers"]["applies"]  # stated for GPT-2 124M only


def test_sample_bench_times_as_kv_cache_the_model_sample_py_decodes_and_the_plain_one_beside_it():
    """kv_cache is the model as sample.py decodes it, in bf16 on a CPU its Linears packed; kv_cache_unpacked
    keeps nn.Linear (the greedy test above: both write the same tokens). Swapped, bench/README's packing
    ratios would read upside down."""
    from bench.sample import SampleBench, build_paths
    cfg = SampleBench(reference="transformers", n_layer=1, n_embd=32, n_head=2, block_size=64, dtype="bfloat16")
    models, _, dtype = build_paths(cfg, torch.device("cpu"), "cpu")
    linears = {path: {type(m).__name__ for m in models[path].modules() if "Linear" in type(m).__name__}
               for path in ("kv_cache", "kv_cache_unpacked")}
    assert dtype == torch.bfloat16 and linears == {"kv_cache": {"PackedLinear"}, "kv_cache_unpacked": {"Linear"}}


def test_sample_bench_fails_where_the_packed_model_writes_other_tokens_than_the_plain_one(tmp_path, monkeypatch):
    """Against nanoGPT, no_cache runs kv_cache's model, packed alike, so the greedy check compares the packed
    model with the plain one too: a packed Linear that computes otherwise past pack_for_decoding's own check
    of the first one (here: its outputs reversed) fails the run."""
    import bench.sample as bench_sample
    import sample
    pack, forward = sample.pack_for_decoding, sample.PackedLinear.forward

    def pack_then_break(model, dtype):
        packed = pack(model, dtype)
        monkeypatch.setattr(sample.PackedLinear, "forward", lambda self, x: forward(self, x).flip(-1))
        return packed

    monkeypatch.setattr(bench_sample, "pack_for_decoding", pack_then_break)
    with pytest.raises(SystemExit) as exit:
        bench_sample.main(bench_sample.SampleBench(n_layer=1, n_head=2, n_embd=32, max_new_tokens=20, repeats=1,
                                                   warmup_tokens=2, dtype="bfloat16", threads=1, device="cpu",
                                                   out=str(tmp_path / "s.json")))
    result = json.loads((tmp_path / "s.json").read_text())
    assert exit.value.code == 1 and result["greedy_identical"] is False
    assert result["greedy_pairs"] == [["kv_cache", "no_cache"], ["kv_cache", "kv_cache_unpacked"]]


def base_checkout(tmp_path, says):
    """Another checkout's code: here a copy whose train.py first runs the line `says`."""
    base = tmp_path / "base"
    base.mkdir()
    for module in Path(ROOT).glob("*.py"):
        shutil.copy(module, base)
    shutil.copytree(Path(ROOT) / "data", base / "data", ignore=lambda d, names: [n for n in names if ".py" not in n])
    (base / "train.py").write_text((base / "train.py").read_text().replace(
        'if __name__ == "__main__":\n', f'if __name__ == "__main__":\n    {says}\n'))
    return base


def test_recipe_bench_refuses_settings_the_base_checkouts_train_py_lacks_before_any_run(launch, tmp_path):
    """A setting newer than the base (e3eff70 has no mlp_ratio): every base run failed at its start while this
    checkout's trained their whole budget. The base's train.py --help names its settings (this one's: out_dir)."""
    base = base_checkout(tmp_path, 'print("  --out_dir=out  where it writes"); sys.exit(0)')
    proc = launch("bench/recipe.py", "--device=cpu", f"--base_repo={base}", "--configs=default", "--seeds=1337",
                  "--max_seconds=1", "--train_args=--mlp_ratio=2", f"--work_dir={tmp_path / 'runs'}",
                  f"--out={tmp_path / 'r.json'}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: base_repo='{base}': its train.py has no setting device, eval_interval, "
                                  "eval_iters, max_iters, max_seconds, mlp_ratio, seed, which the default config with "
                                  "--train_args='--mlp_ratio=2' gives it;"), proc.stderr
    assert "train:" not in proc.stdout and not (tmp_path / "runs").exists()


def tiny_run(data_dir):
    return f"--data_dir={data_dir} --n_layer=1 --n_head=2 --n_embd=16 --block_size=16 --batch_size=4 --dtype=float32"


def test_recipe_bench_runs_a_base_checkouts_train_py_beside_this_one_and_scores_each_by_its_own_code(
        launch, tmp_path, data_dir):
    """--base_repo: each config runs with the other checkout's train.py too; --iterations=N: every run
    trains exactly N iterations on the iteration schedule, whatever the machine's speed. A base whose
    forward differs with no setting to say so (here its loss, plus 100: the same gradients, so the same
    weights) is scored by its own model code; this checkout's had scored it, or failed to load it (a
    scratch change of the MLP's width: a traceback after every run had trained)."""
    base = base_checkout(tmp_path, 'print("the base checkout")')
    model_py = (base / "model.py").read_text()
    assert model_py.count("ignore_index=-1)\n") == 1
    (base / "model.py").write_text(model_py.replace("ignore_index=-1)\n", "ignore_index=-1) + 100\n"))
    result = run_bench(launch, "bench/recipe.py", tmp_path / "r.json", "--configs=default", f"--base_repo={base}",
                       "--iterations=3", "--seeds=1", "--eval_batches=2", "--eval_batch_size=2", "--threads=2",
                       "--train_eval_iters=1", f"--train_args={tiny_run(data_dir)}", f"--work_dir={tmp_path / 'runs'}")
    runs = [(run["label"], run["returncode"], run["iterations"]) for run in result["runs"]]
    assert runs == [("base-default", 0, 3), ("default", 0, 3)]
    assert result["machine"]["torch_threads"] == 2  # the runs' threads, not this (one-thread) process's
    assert all(run["train_config"]["max_seconds"] == 0 for run in result["runs"]), "the schedule counts iterations"
    logs = {label: (tmp_path / "runs" / f"{label}-seed1" / "train.log").read_text()
            for label in ("base-default", "default")}
    assert "the base checkout" in logs["base-default"] and "the base checkout" not in logs["default"]
    for label, summary in result["summary"].items():
        assert summary["ms_per_iter"]["mean"] > 0 and summary["val_loss"]["n"] == 1, label
    assert result["paired"]["a"] == "base-default" and result["paired"]["n"] == 1
    losses = {run["label"]: (run["val_loss"], run["train_loss"]) for run in result["runs"]}
    assert losses["base-default"] == pytest.approx((losses["default"][0] + 100, losses["default"][1] + 100)), losses


def test_recipe_bench_runs_in_parallel_each_run_on_cores_of_its_own(launch, tmp_path, data_dir):
    """--parallel=2 --threads=1: the base's run and this checkout's train at once, each pinned to one core
    (where Linux's taskset and two cores are there; else the two run one after the other). A base whose code
    cannot score its checkpoints is a note per run, not the end of the benchmark."""
    from hardware import separate_cores
    parallel = hasattr(os, "sched_getaffinity") and shutil.which("taskset") and len(separate_cores()) >= 2
    # the base's run, which starts first, waits up to 30 s for the other run's train.py to print its first line
    base = base_checkout(tmp_path, """print("runs on CPUs", sorted(os.sched_getaffinity(0)))
    import pathlib
    other = pathlib.Path(sys.argv[1].split("=", 1)[1].replace("base-default", "default")) / "train.log"
    for _ in range(300):
        if other.exists() and "parameters |" in other.read_text():
            print("the other run had started")
            break
        time.sleep(0.1)""" if parallel else "pass")
    loader = "def model_from_checkpoint(checkpoint, path, **overrides):\n"
    (base / "checkpoint.py").write_text((base / "checkpoint.py").read_text().replace(
        loader, loader + '    raise RuntimeError("no loader here")\n'))  # train.py never calls it on a new run
    proc = check_ok(launch("bench/recipe.py", "--device=cpu", f"--out={tmp_path / 'r.json'}", "--configs=default",
                           f"--base_repo={base}", "--iterations=3", "--seeds=1", "--eval_batches=2",
                           "--eval_batch_size=2", "--train_eval_iters=1", *(["--parallel=2"] if parallel else []),
                           "--threads=1", f"--train_args={tiny_run(data_dir)}", f"--work_dir={tmp_path / 'runs'}"))
    runs = {run["label"]: run for run in json.loads((tmp_path / "r.json").read_text())["runs"]}
    assert [(run["returncode"], run["iterations"]) for run in runs.values()] == [("not evaluated", 3), (0, 3)], runs
    assert "val_loss" in runs["default"] and "val_loss" not in runs["base-default"], runs
    assert runs["base-default"]["error"] == f"the evaluation by {base}'s code failed: RuntimeError: no loader here", \
        runs
    assert f"note: base-default seed 1: the evaluation by {base}'s code failed" in proc.stdout, proc.stdout
    if parallel:
        cpus = {label: run["cpus"] for label, run in runs.items()}
        assert len(cpus["base-default"]) == len(cpus["default"]) == 1 and cpus["base-default"] != cpus["default"], cpus
        log = (tmp_path / "runs" / "base-default-seed1" / "train.log").read_text()
        assert f"runs on CPUs {cpus['base-default']}" in log, log  # train.py itself may run on that CPU only
        assert "the other run had started" in log, log  # the two ran at once


def test_recipe_bench_in_parallel_refuses_a_gpu_and_cores_a_quota_does_not_give(monkeypatch, capsys):
    """Pinned CPUs say nothing of runs that share a GPU; a container's CPU quota caps the cores as it caps
    train.py's threads."""
    import bench.recipe as recipe
    with pytest.raises(SystemExit):
        recipe.cpu_sets(recipe.RecipeBench(parallel=2, threads=1), "cuda")
    assert "device=auto is cuda here; add --device=cpu" in capsys.readouterr().err
    monkeypatch.setattr(recipe, "separate_cores", lambda: [0, 1, 2, 3])  # a 4-core machine
    monkeypatch.setattr(recipe, "usable_cpus", lambda: 4)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert recipe.cpu_sets(recipe.RecipeBench(parallel=2, threads=2), "cpu") == [[0, 1], [2, 3]]
    monkeypatch.setattr(recipe, "usable_cpus", lambda: 3)  # its container may use 3 CPUs' time
    with pytest.raises(SystemExit):
        recipe.cpu_sets(recipe.RecipeBench(parallel=2, threads=2), "cpu")
    assert "needs 4 cores; this process may use 3" in capsys.readouterr().err


def test_recipe_bench_gives_its_runs_its_device(tmp_path):
    """--device places the runs as well as the evaluation (--train_args may still name another)."""
    from bench.recipe import RecipeBench, train_args
    assert "--device=cpu" in train_args(RecipeBench(device="cpu"), "default", 1, str(tmp_path))
    args = train_args(RecipeBench(device="cpu", train_args="--device=auto"), "default", 1, str(tmp_path))
    assert args.index("--device=cpu") < args.index("--device=auto"), args  # the later flag wins in train.py


# runs the script given after it with Ctrl-C as a terminal delivers it, even where the shell that started the
# tests ignores SIGINT (a background job does), which the script, and the processes it starts, would inherit
AS_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def children(pid):
    """The process ids of a process's children (Linux)."""
    return [int(c) for f in Path(f"/proc/{pid}/task").glob("*/children") for c in f.read_text().split()]


@pytest.mark.parametrize("to", ["group", "run", "recipe"])
def test_recipe_bench_stops_on_ctrl_c_and_starts_no_more_runs(tmp_path, data_dir, to):
    """Ctrl-C (SIGINT to the terminal's process group): the run in flight saves and stops, the queued ones
    never start, and the script ends with one line. The same where the run's train.py is the first to see
    it (here: the only one), as on a busy machine, where it may save and exit before this script's own
    thread is scheduled to hear of it. SIGTERM to the script alone (`timeout`, a scheduler) had ended it at
    once and left its run training, orphaned: it is passed on, and the run stops as on Ctrl-C."""
    if to == "run" and not list(Path("/proc/self/task").glob("*/children")):
        pytest.skip("needs Linux's /proc/PID/task/TID/children")
    proc = subprocess.Popen([sys.executable, "-c", AS_A_TERMINAL, "bench/recipe.py", "--configs=default", "--seeds=1,2",
                             "--iterations=100000", "--device=cpu",
                             f"--train_args={tiny_run(data_dir)} --compile=false --threads=1",
                             f"--work_dir={tmp_path / 'runs'}", f"--out={tmp_path / 'r.json'}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = tmp_path / "runs" / "default-seed1" / "train.log"
    training = re.compile(r"^iter \d+:", re.M)  # a log line of training ("tokens/iter | " heads the run before it)
    for _ in range(1200):  # until the first run trains
        if log.exists() and training.search(log.read_text()):
            break
        time.sleep(0.1)
    try:
        assert log.exists() and training.search(log.read_text()), "the first run did not start training within 120 s"
        if to == "group":
            os.killpg(proc.pid, signal.SIGINT)
        elif to == "run":
            for child in children(proc.pid):
                os.kill(child, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert "stopped by" in log.read_text(), log.read_text()  # the run heard of it before the script ended
    finally:  # whatever happened: runs of 100,000 iterations must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stopped_by = signal.SIGTERM if to == "recipe" else signal.SIGINT
    assert proc.returncode == 128 + stopped_by and err.count("\n") == 1, (proc.returncode, err)
    assert "interrupted: 1 of 2 runs not started" in err, err
    assert not (tmp_path / "runs" / "default-seed2").exists() and not (tmp_path / "r.json").exists()
    assert (tmp_path / "runs" / "default-seed1" / "ckpt.pt").exists(), log.read_text()  # the run saved its work


def test_a_failed_runs_error_in_the_recipes_json_names_no_folder_of_the_machine(tmp_path):
    """A run's last line, kept as its error, named its out_dir (a temporary folder) and the interpreter's path."""
    from bench.recipe import without_paths
    out_dir = str(tmp_path / "runs" / "default-seed1")
    record = without_paths({"label": "default", "out_dir": out_dir, "returncode": 2,
                            "error": f"error: no checkpoint at {out_dir}/ckpt.pt; train one first with `python "
                                     f"train.py --out_dir={out_dir}`; {sys.executable} train.py"})
    assert record == {"label": "default", "returncode": 2,
                      "error": "error: no checkpoint at <out_dir>/ckpt.pt; train one first with `python train.py "
                               "--out_dir=<out_dir>`; python train.py"}


def test_the_base_worktree_interrupted_while_its_data_is_prepared_is_removed(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM while bench/goals.py prepared the base's data left the worktree registered in the
    repository (`git worktree list`: prunable) after its temporary folder was gone."""
    import bench.goals as goals
    run = subprocess.run

    def interrupted_in_prepare(argv, *args, **kwargs):
        if "data/prepare.py" in argv:
            raise KeyboardInterrupt
        return run(argv, *args, **kwargs)

    monkeypatch.setattr(goals.subprocess, "run", interrupted_in_prepare)
    with pytest.raises(KeyboardInterrupt):
        goals.base_worktree("HEAD", str(tmp_path))
    listed = run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert str(tmp_path) not in listed and not (tmp_path / "base").exists(), listed


def test_the_goal_script_stopped_by_ctrl_c_says_what_it_kept(tmp_path):
    """Ctrl-C during a goal: one line, exit 130, saying that the goals before it kept their results (not every
    bench script's "no results were written"), and no column."""
    proc = subprocess.Popen([sys.executable, "-c", AS_A_TERMINAL, "bench/goals.py", "--smoke=true",
                             "--goals=determinism,loop", f"--results={tmp_path}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stdout:  # until the first goal runs
            if line.startswith("=== "):
                break
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130 and err == (f"error: interrupted: the goals that finished kept their JSON and log in "
                                              f"{tmp_path}; no column was written\n"), (proc.returncode, err)
    assert not (tmp_path / "goals.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
@pytest.mark.parametrize("script, args", [
    ("bench/train.py", ["--variants=none", "--compile=false", "--repeats=100000", "--loop=50", "--warmup=0"]),
    ("bench/sample.py", ["--max_new_tokens=100000", "--repeats=1"])], ids=["train", "sample"])
def test_a_benchmark_stopped_by_ctrl_c_ends_in_one_line_and_leaves_nothing(tmp_path, script, args, signum):
    """Ctrl-C had ended each benchmark in a traceback, and bench/train.py's left the checkpoints of its --loop
    (train.py's own loop saves) in a temporary folder; SIGTERM (`timeout`) ended it at once, the folder left."""
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", AS_A_TERMINAL, script, *args, "--threads=1",
                             f"--out={tmp_path / 'x.json'}"], cwd=ROOT, env={**ENV, "TMPDIR": str(tmp_path / "tmp")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # until it measures
            if line.startswith(("ready:", "model:")):
                break
        time.sleep(2)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # whatever happened: a benchmark of 100,000 rounds must not outlive its test
        proc.wait()
    assert proc.returncode == 128 + signum and err == "error: interrupted; no results were written\n", \
        (proc.returncode, err)
    assert not (tmp_path / "x.json").exists() and not list((tmp_path / "tmp").glob("bench-train-*"))


@pytest.mark.compiles
def test_sample_bench_where_torch_compile_cannot_build_is_one_line(tmp_path):
    """No C++ compiler: inductor fails in the compiled path's warm-up, which had no try (a 90-line traceback)."""
    proc = subprocess.run([sys.executable, "bench/sample.py", "--compile=true", "--max_new_tokens=8", "--repeats=1",
                           "--threads=1", "--n_layer=1", "--n_head=1", "--n_embd=16",  # less to trace before it fails
                           f"--out={tmp_path / 'x.json'}"], cwd=ROOT, capture_output=True, text=True,
                          env={**{k: v for k, v in ENV.items() if k != "TORCHDYNAMO_DISABLE"},
                               "CXX": "/nonexistent/g++",
                               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")},
                          timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: --compile=true: torch.compile failed here (") and \
        proc.stderr.endswith("; run with --compile=false\n") and not (tmp_path / "x.json").exists(), proc.stderr


def test_separate_cores_takes_one_cpu_of_each_core(monkeypatch, tmp_path):
    """Two threads of a core (SMT) count once; a CPU whose topology Linux does not show counts as a core."""
    from hardware import separate_cores
    for cpu, package, core in ((0, 0, 0), (1, 0, 0), (2, 0, 1), (3, 1, 0)):  # CPUs 0 and 1: one core's two threads
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)  # CPU 4: no topology
    assert separate_cores(str(tmp_path)) == [0, 2, 3, 4]
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS has no affinity: every CPU
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert separate_cores(str(tmp_path)) == [0, 2, 3, 4]


def test_attention_page_bench_writes_pages_and_weighs_them(launch, tmp_path):
    check_ok(launch("bench/attention_page.py", "--cases=default", "--default_tokens=100",
                    f"--out={tmp_path / 'p.json'}"))
    result = json.loads((tmp_path / "p.json").read_text())
    page = result["results"]["default"]
    assert page["tokens"] == 100 and page["block_size"] == 64 and 0 < page["mb"] < 5, page
    assert page["applies"] is False and page["holds"] is None  # the goal is stated over 1,000 tokens


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_help_describes_every_setting(launch, script, flag):
    out = check_ok(launch(f"bench/{script}.py", flag)).stdout
    assert "  --out=" in out, out  # its own settings: bench/train.py read -h as a config file, and showed train.py's
    settings = [line for line in out.splitlines() if line.startswith("  --")]
    assert settings, out
    undescribed = [line for line in settings if re.fullmatch(r"\s+--\S+\s+\[.*\]", line)]  # no comment before the type
    assert not undescribed, undescribed
    if script == "train":  # its file is train.py's config, not a file of these settings
        assert "[train_config.toml] [--key=value ...]" in out.splitlines()[0] and "A TOML file" not in out, out


def test_the_checkpoint_scorer_says_what_it_takes(tmp_path):
    """bench/checkpoint_losses.py, which recipe.py runs inside another checkout: --help is its docstring, and a
    wrong command line or a missing batches file one line, not a traceback (a TypeError from main's arguments, or,
    run outside a checkout, the checkout's modules not found), wherever it runs."""
    def scorer(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "checkpoint_losses.py"), *args],
                              cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)

    assert check_ok(scorer("--help")).stdout.startswith("The mean loss of trained")
    for args in ([], ["out.json", "batches.pt", "two", "cpu", "ckpt.pt"]):
        wrong = scorer(*args)
        assert wrong.returncode == 2 and wrong.stderr == (
            "error: bench/checkpoint_losses.py takes OUT.json BATCHES.pt THREADS DEVICE CKPT.pt ..., THREADS a whole "
            "number (0: torch's own); bench/recipe.py runs it\n"), wrong.stderr
    missing = subprocess.run([sys.executable, os.path.join("bench", "checkpoint_losses.py"), "out.json", "none.pt", "1",
                              "cpu", "ckpt.pt"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr == "error: none.pt: No such file or directory\n", missing.stderr


@pytest.mark.parametrize("script, flag, says", [
    ("bench/train.py", "--seed=-1", "seed must be in [0, 2**32), got -1"),
    ("bench/train.py", "--optimizers=sgd", "optimizers: 'sgd' is not one of adamw, muon"),  # an axis not compared too
    ("bench/train.py", "--variants=execution --activations=y", "activations: 'y' is not one of gelu_tanh, gelu, relu2"),
    ("bench/train.py", "--compile=maybe", "compile must be true, false or none, got 'maybe'"),
    ("bench/train.py", "--variants=execution --compile=false --dtype=float32",  # were silently not used
     "variants=execution runs nanoGPT's execution and this repo's defaults as they are: --compile, --dtype would "
     "not be used; drop them"),
    ("bench/sample.py", "--out_dir=nowhere", "error: no checkpoint at nowhere/ckpt.pt; train one first"),  # named once
    # an axis compared and a value given for it, a checkpoint and a shape: the table and the JSON had disagreed
    ("bench/train.py", "--variants=dtype --dtype=float16", "variants=dtype compares dtype here: --dtype=float16 would "
                                                           "not be used; name the values to compare (--dtypes=...)"),
    ("bench/attention.py", "--backends=manual,fa2 --device=cpu", "error: --backends=manual,fa2: attention='fa2' "),
    ("bench/attention.py", "--min_sample_s=-1", "min_sample_s must be at least 0 (0: one call per sample), got -1.0"),
    ("bench/sample.py", "--out_dir=out --n_layer=3 --n_embd=256",
     "--out_dir's checkpoint sets the model's shape: --n_layer=3, --n_embd=256 would not be used; drop them"),
    ("bench/sample.py", "--out_dir=out --vocab_size=100",
     "--out_dir's checkpoint sets the model's shape: --vocab_size=100 would not be used; drop it"),
    ("bench/train.py", "--USAGE=x", "unknown setting 'USAGE'"),  # a ClassVar of its config, not a setting
    ("bench/train.py", "--config=a.toml configs/gpt2_124m.toml", "give at most one train.py config file, got"),
    ("bench/recipe.py", "--train_args=--help", "train_args cannot ask for --help"),
    ("bench/recipe.py", "--device=gpu", "error: unknown device 'gpu'"),  # not blamed on a config file
    ("bench/train.py", "--seed=4294967296", "seed must be in [0, 2**32)"),
    ("bench/train.py", "--vocab_size=-3", "vocab_size must be at least 0 (0: the config's)"),
    ("bench/recipe.py", "--train_args='oops", "train_args=\"'oops\" cannot be split into flags"),
    ("bench/recipe.py", "--run_timeout=-1", "run_timeout must be at least 0"),
    ("bench/recipe.py", "--seeds=1,1", "seeds=1,1 repeats a seed"),
    ("bench/recipe.py", "--seeds=1,-1", "seeds=1,-1: seed must be in [0, 2**32), got -1"),
    ("bench/recipe.py", "--threads=-4", "threads must be at least 0"),
    ("bench/recipe.py", "--parallel=0", "parallel must be at least 1, got 0"),
    # train.py takes a flag's last value: these had trained every "seed" with seed 7, or each run in one out_dir
    ("bench/recipe.py", "--train_args=--seed=7",
     "train_args sets seed, which recipe.py sets for each run; use --seeds"),
    ("bench/recipe.py", "--train_args=--out_dir=x", "train_args sets out_dir, which recipe.py sets for each run; use "
                                                    "--work_dir"),
    # known from the settings: refused before minutes of training, not after
    ("bench/recipe.py", "--configs=default --eval_block_size=65",
     "eval_block_size=65 exceeds the block_size of default"),
    ("bench/recipe.py", "--configs=default,configs/finetune_gpt2_shakespeare.toml",
     "the configs train on different data"),
    ("bench/recipe.py", "--parallel=2", "parallel=2 needs --threads=N, the cores each run gets"),
    ("bench/recipe.py", "--configs=configs/shakespeare_char_gpu.toml",  # flash with dropout, on --device=cpu
     "configs/shakespeare_char_gpu.toml: PyTorch's FlashAttention kernel on CPU has no dropout"),
    ("bench/recipe.py", "--parallel=100000 --threads=1",
     "parallel=100000 x threads=1 needs 100000 cores; this process"),
    ("bench/recipe.py", "--threads=100000", "threads=100000 is far more than the"),  # every run's train.py's refusal
    ("bench/recipe.py", "--work_dir=bench/README.md", "work_dir='bench/README.md' is a file, not a folder"),
    ("bench/recipe.py", "--work_dir=/proc/no_such_folder", "work_dir='/proc/no_such_folder' cannot be made"),
    # train.py's settings are checked before the first run trains, not when a run meets them minutes later
    ("bench/recipe.py", "--configs=default --train_args=--bogus=1",
     "the default config with --train_args='--bogus=1': unknown setting"),
    ("bench/recipe.py", "--configs=configs/gpt2_124m.toml,default --train_args=--n_layer=x",
     "configs/gpt2_124m.toml with --train_args='--n_layer=x': "),
    ("bench/sample.py", "--warmup_tokens=-5", "warmup_tokens must be at least 0, got -5"),
    ("bench/sample.py", "--reference=transformers --temperature=1", "reference=transformers compares greedy decoding"),
    ("bench/sample.py", "--attention=fa2", "attention='fa2' needs the flash-attn package"),  # had been a traceback
    ("bench/attention.py", "--single=manual", "single='manual': give BACKEND:T"),
    ("bench/attention.py", "--single=manual:16 --threads=-1", "threads must be at least 0"),
])
def test_bench_bad_input_is_one_line(launch, tmp_path, script, flag, says):
    proc = launch(script, *flag.split(), f"--out={tmp_path / 'x.json'}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("where, says", [("folder", "is a directory"), ("under_a_file", "is a file, not a folder")])
def test_bench_out_that_cannot_be_written_is_one_line_before_anything_runs(launch, tmp_path, script, where, says):
    (tmp_path / "notes.txt").write_text("")
    out = tmp_path if where == "folder" else tmp_path / "notes.txt" / "x.json"
    proc = launch(f"bench/{script}.py", *(() if script == "attention_page" else ("--device=cpu",)), f"--out={out}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert proc.stdout == ""  # nothing measured, not even the machine printed
    if where == "folder":  # the file named in it is the script's own JSON, not an attention page
        assert re.search(rf"; name a file in it, e\.g\. {re.escape(str(tmp_path))}/{script.replace('_', '-')}[\w-]*-cpu"
                         r"\.json$", proc.stderr.strip()), proc.stderr


def test_bench_out_may_name_folders_not_made_yet(tmp_path):
    from bench.benchutil import out_path, write_json
    path = str(tmp_path / "new" / "deeper" / "x.json")
    assert out_path(path, "train", "cpu") == path
    write_json(path, {"a": 1})
    assert json.loads(Path(path).read_text()) == {"a": 1}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no one creates folders")
def test_bench_out_under_folders_that_cannot_be_made_names_the_folder(capsys):
    from bench.benchutil import out_path
    with pytest.raises(SystemExit):
        out_path("/proc/no_such_folder/x.json", "train", "cpu")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot make the folder /proc/no_such_folder:" in err and " in /proc;" in err, err


def test_recipe_bench_checks_the_settings_each_run_will_get(tmp_path, monkeypatch, capsys):
    """The check before any run trains sees the budget's flags too: with a budget in iterations a decay that ends
    before warm-up is refused at once, and under a time budget, which reads neither, the same config passes;
    a relative --init_from is looked up where the runs start, the repository root."""
    from bench.recipe import RecipeBench, check_configs
    decay = tmp_path / "decay.toml"
    decay.write_text("max_seconds = 0\nwarmup_iters = 100\nlr_decay_iters = 50\n")  # a recipe in iterations
    assert check_configs(RecipeBench(configs=str(decay), max_seconds=1)) == [str(decay)]
    with pytest.raises(SystemExit):
        check_configs(RecipeBench(configs=str(decay), iterations=3))
    assert "lr_decay_iters=50 would end the decay before warm-up ends" in capsys.readouterr().err
    for bad, says in ((dict(train_args="--device=cuda:99"), "the default config: "),  # no such device: not one run
                      (dict(base_repo=ROOT), "is this checkout: the base is another one")):
        with pytest.raises(SystemExit):
            check_configs(RecipeBench(configs="default", **bad))
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    monkeypatch.chdir(tmp_path)  # data/ is a directory in the repository root, not here
    assert check_configs(RecipeBench(configs="default", train_args="--init_from=data")) == ["default"]


def test_recipe_bench_runs_a_config_given_relative_to_where_it_was_started(tmp_path, data_dir):
    """train.py runs in its checkout; a config path and work_dir given relative to the caller's directory
    still name the same files there."""
    (tmp_path / "tiny.toml").write_text(f"n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nbatch_size = 2\n"
                                        f"dtype = 'float32'\ncompile = false\ndata_dir = '{data_dir}'\n")
    proc = subprocess.run([sys.executable, str(Path(ROOT, "bench/recipe.py")), "--configs=tiny.toml", "--device=cpu",
                           "--iterations=2", "--seeds=1", "--eval_batches=2", "--work_dir=work", "--out=r.json"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert [r["returncode"] for r in runs] == [0], runs
    # one line each
    assert re.search(r"^train: tiny seed 1 -> \S+ \.\.\. ok \([\d.]+ s\)$", proc.stdout, re.M), proc.stdout
    assert (tmp_path / "work").is_dir() and not Path(ROOT, "work").exists()
    log = (tmp_path / "work" / "tiny-seed1" / "train.log").read_text()
    again = subprocess.run(proc.args, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and again.stderr.endswith("holds runs of an earlier recipe (tiny-seed1); give another "
                                                           "--work_dir, or remove those folders\n"), again.stderr
    assert (tmp_path / "work" / "tiny-seed1" / "train.log").read_text() == log  # the earlier run's log is kept


def test_top_ops_names_compiled_kernels_by_the_ops_they_fuse():
    """bench/*.py --profile: inductor's kernels are listed beside PyTorch's ops (the same kernel in two
    graphs is one row); profiler labels and Python frames are not ops."""
    from types import SimpleNamespace
    from bench.benchutil import top_ops
    events = [("aten::mm", 5.0), ("graph_0_cpp_fused_add_relu_1", 7.0), ("graph_1_cpp_fused_add_relu_1", 1.0),
              ("ProfilerStep#1", 100.0), ("forward", 50.0), ("aten::add", 2.0)]
    prof = SimpleNamespace(key_averages=lambda: [SimpleNamespace(key=k, self_cpu_time_total=t) for k, t in events])
    assert top_ops(prof, 2) == {"inductor:add_relu_1": 8.0, "aten::mm": 5.0}
    assert list(top_ops(prof, 5)) == ["inductor:add_relu_1", "aten::mm", "aten::add"]


def test_each_train_bench_variant_steps_under_its_own_deterministic_mode(monkeypatch, tmp_path):
    """compile_model switches the process-wide deterministic mode on, on a CPU; an eager variant built
    beside a compiled one runs as `train.py --compile=false` does, without it."""
    import numpy as np
    import torch
    import train
    from bench.train import Variant

    def compile_model(model, cfg, setup, optimizers):  # what the real one does to the process, without compiling
        torch.use_deterministic_algorithms(True)
        return model

    modes = []
    monkeypatch.setattr(train, "compile_model", compile_model)
    monkeypatch.setattr(train, "train_step", lambda *args: modes.append(torch.are_deterministic_algorithms_enabled()))
    tcfg = train.TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2, dtype="float32")
    tokens = np.zeros(1000, dtype=np.uint16)
    try:
        compiled, eager = (Variant({"compile": c, "dtype": "float32", "attention": "manual", "optimizer": "adamw",
                                    "activation": "relu2"}, tcfg, 65, "cpu", tokens, 1, 0, str(tmp_path))
                           for c in (True, False))
        eager.step(), compiled.step(), eager.step()
    finally:
        torch.use_deterministic_algorithms(False)
    assert modes == [False, True, False]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_ctrl_c_inside_train_py_s_loop_reaches_the_benchmark_as_one(monkeypatch, tmp_path, signum):
    """bench/train.py --loop runs train.py's own loop, whose stop request saves and exits 130 with its words
    in the log this script hides: that exit now reaches run() as a Ctrl-C (or SIGTERM, 143), which says one line.
    Any other exit of the loop passes through as it is."""
    from interrupts import Terminated

    import numpy as np
    import train
    from bench.train import Variant
    tcfg = train.TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=2, dtype="float32", compile=False)
    variant = Variant({"compile": False, "dtype": "float32", "attention": "manual", "optimizer": "adamw",
                       "activation": "relu2"}, tcfg, 65, "cpu", np.zeros(1000, dtype=np.uint16), 1, 0, str(tmp_path))

    def stopped(cfg, setup, data, state, model, logger, stop):
        stop.signum = signum  # what its handler records, before the save and the exit
        raise SystemExit(128 + signum)
    monkeypatch.setattr(train, "train", stopped)
    with pytest.raises(KeyboardInterrupt) as e:
        variant.time_loop(5)
    assert isinstance(e.value, Terminated) == (signum == signal.SIGTERM)

    def heard_in_its_last_save(cfg, setup, data, state, model, logger, stop):
        stop.signum = signum  # the loop's end was due: it saved and returned, the request noted and not acted on
    monkeypatch.setattr(train, "train", heard_in_its_last_save)
    with pytest.raises(KeyboardInterrupt) as e:
        variant.time_loop(5)
    assert isinstance(e.value, Terminated) == (signum == signal.SIGTERM)

    def failed(*args):
        raise SystemExit(2)
    monkeypatch.setattr(train, "train", failed)
    with pytest.raises(SystemExit):
        variant.time_loop(5)


def test_results_files_name_no_directory_of_the_machine(tmp_path):
    """bench/results/*.json travel with the repository: a path in the repository is written relative to
    it, any other absolute path as its last part (a worktree, a scratch TOML, --out)."""
    import os
    from bench.benchutil import write_json
    out = tmp_path / "r.json"
    write_json(str(out), {"config": {"base_repo": str(tmp_path / "base"), "out": str(out),
                                     "configs": f"default,{os.path.join(ROOT, 'configs', 'x.toml')},"
                                                f"{tmp_path / 'y.toml'}",
                                     "seeds": "1,2"},
                          "runs": [{"out_dir": str(tmp_path / "runs" / "a")}]})
    text = out.read_text()
    assert str(tmp_path) not in text and ROOT not in text, text
    assert json.loads(text) == {"config": {"base_repo": "base", "out": "r.json",
                                           "configs": "default,configs/x.toml,y.toml", "seeds": "1,2"},
                                "runs": [{"out_dir": "a"}]}


def test_the_goal_column_holds_exactly_at_each_goals_bound(tmp_path, monkeypatch):
    """bench/goals.py's verdicts from each script's JSON: every goal holds at its bound and not past it; the val
    bound is 1.47 with bf16 instructions and 1.52 without; only this checkout's recipe runs count for the busy
    check; the cache-against-none ratio (not in the goal table) and a figure not measured as stated give no
    verdict."""
    import bench.goals as goals

    def recipe(iterations, val, below):
        summary = {"iterations": {"n": 3, "mean": iterations}, "val_loss": {"n": 3, "mean": val}}
        base = {"iterations": {"n": 3, "mean": 3500}, "val_loss": {"n": 3, "mean": 1.55}}
        return {"summary": {"default": summary, "base-default": base}, "paired": {"n": 3, "mean": below}}

    def verdicts(goal, report):
        return [holds for *_, holds in goals.rows_from(goal, report, str(tmp_path))]

    monkeypatch.setattr(goals, "cpu_has_bf16", lambda: True)
    assert verdicts("recipe", recipe(7000, 1.47, 0.05)) == [True, True, True, True]
    assert verdicts("recipe", recipe(6999, 1.4701, 0.0499)) == [False, False, False, True]
    no_base = recipe(7000, 1.4, 0.1)
    no_base["summary"]["base-default"] = {"iterations": {"n": 0}, "val_loss": {"n": 0}}
    no_base["paired"] = {"n": 0}
    assert goals.rows_from("recipe", no_base, str(tmp_path)) == [
        ("the recipe against the base", "failed: no run of the base finished (recipe.log)", None)]
    monkeypatch.setattr(goals, "cpu_has_bf16", lambda: False)
    assert verdicts("recipe", recipe(7000, 1.52, 0.05))[1] is True
    assert verdicts("recipe", recipe(7000, 1.5201, 0.05))[1] is False
    for run, busy in (("base-default-seed1337", True), ("default-seed1337", False)):  # the base's warning is its own
        log = tmp_path / run / "train.log"
        log.parent.mkdir(parents=True)
        log.write_text("warning: ... another process is busy on these CPUs. ...\n")
        assert verdicts("recipe", recipe(7000, 1.4, 0.1))[3] is busy
    assert verdicts("loop", {"variants": [{"loop_overhead": 0.05}]}) == [True]
    assert verdicts("loop", {"variants": [{"loop_overhead": 0.0501}]}) == [False]
    for default, holds in ((150.0, True), (149.9, False)):
        speeds = [{"execution": "nanogpt", "tokens_per_s": 100.0}, {"execution": "default", "tokens_per_s": default}]
        assert verdicts("execution", {"variants": speeds}) == [holds]
    ratio = lambda value, applies: {"min": 3.0, "value": value, "applies": applies, "holds": value >= 3.0}
    report = {"requirements": {"kv_cache_vs_no_cache": ratio(9.0, True), "kv_cache_vs_nanogpt": ratio(2.9, True),
                               "kv_cache_compiled_vs_nanogpt": ratio(4.0, False)}, "greedy_identical": False}
    rows = goals.rows_from("sample", report, str(tmp_path))
    assert [(what, holds) for what, _, holds in rows] == [("kv_cache >= nanogpt x 3", False),
                                                          ("kv_cache_compiled >= nanogpt x 3", None),
                                                          ("the same greedy tokens", False)]


def test_a_goal_keeps_the_rows_its_script_wrote_and_only_those(tmp_path, monkeypatch):
    """A script that wrote its JSON and then exited with an error (sample.py, when the greedy tokens differ) gives
    its rows, the failed check among them; a JSON without a figure the goal needs is a failed row, not a
    traceback that loses the column; an earlier run's JSON never passes for this one's."""
    import bench.goals as goals

    results = tmp_path / "results"
    results.mkdir()
    folders = goals.Folders(str(results), str(tmp_path / "scratch"))
    out = results / "goal.json"

    def measured(goal, report, status):
        script = tmp_path / "script.py"
        write = f"json.dump({report!r}, open({str(out)!r}, 'w'))\n" if report is not None else ""
        script.write_text(f"import json, sys\n{write}sys.exit({status})\n")
        monkeypatch.setattr(goals, "commands", lambda goal, cfg, folders, base: ([str(script)], str(out)))
        return goals.measure(goal, goals.GoalsBench(), folders, None, "")

    nanogpt = {"min": 3.0, "value": 3.5, "applies": True, "holds": True}
    assert measured("sample", {"requirements": {"kv_cache_vs_nanogpt": nanogpt}, "greedy_identical": False}, 1) == [
        ("kv_cache >= nanogpt x 3", "3.50x", True), ("the same greedy tokens", "no", False)]
    speeds = [{"execution": "nanogpt", "tokens_per_s": 1.0}, {"execution": "default", "status": "failed"}]
    [(_, figure, holds)] = measured("execution", {"variants": speeds}, 0)
    assert figure.startswith("failed: execution.json lacks a figure") and holds is None, figure
    assert measured("execution", None, 3) == [("execution", "failed: exit 3 (execution.log)", None)]  # not the last


def test_the_goal_script_names_no_folder_of_the_machine_in_its_logs(tmp_path, monkeypatch):
    import bench.goals as goals

    folders = goals.Folders("/data/r", "/tmp/tmpab12")
    monkeypatch.setenv("HOME", "/home/u")
    assert folders.portable(f"--out=/data/r/x.json {goals.ROOT}/bench/a.py /tmp/tmpab12/b /home/u/c") == \
        "--out=<results>/x.json bench/a.py <scratch>/b ~/c"
    monkeypatch.setenv("HOME", "/")  # a container's user without a home: every path starts with it
    assert folders.portable("a/b /usr/lib") == "a/b /usr/lib"
    monkeypatch.chdir(tmp_path)  # a relative --results is where the user stands, not where the scripts run
    assert goals.results_folder("rel", "cpu") == str(tmp_path / "rel") and (tmp_path / "rel").is_dir()


def test_the_goal_script_says_bad_input_in_one_line(launch, tmp_path):
    (tmp_path / "notes.txt").write_text("")
    for flags, says in ((["--goals=bogus"], "goals: 'bogus' is not one of recipe, loop"),
                        ([f"--results={tmp_path / 'notes.txt'}"], f"results={tmp_path / 'notes.txt'}: is a file, not"),
                        (["--base_commit=nope", f"--results={tmp_path}"], "base_commit='nope' is not a commit")):
        proc = launch("bench/goals.py", *flags)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
        assert proc.stdout == "" and not list(tmp_path.glob("*.log")), proc.stdout  # before anything ran
    out = check_ok(launch("bench/goals.py", "--help")).stdout
    described = [name for name in ("goals", "base_commit", "results", "smoke") if re.search(rf"^  --{name}=.*  \S.*\[",
                                                                                               out, re.M)]
    assert len(described) == 4, out


@pytest.mark.slow  # ~1 min: train.py runs, a base in a git worktree with its own data
def test_the_goal_script_runs_each_goal_at_toy_sizes(tmp_path):
    """bench/goals.py --smoke=true end to end: the recipe against a base checked out in a worktree (HEAD here),
    the loop and the determinism check each give their rows, none of them a failure; the worktree is gone, and
    no checkpoint is left among the results (bench/results/ is kept in the repository)."""
    before = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    proc = subprocess.run([sys.executable, "bench/goals.py", "--smoke=true", "--base_commit=HEAD",
                           "--goals=recipe,loop,determinism", f"--results={tmp_path}"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    check_ok(proc)
    rows = json.loads((tmp_path / "goals.json").read_text())["rows"]
    assert [r["goal"] for r in rows] == ["recipe"] * 4 + ["loop", "determinism"], rows
    assert not [r for r in rows if "fail" in r["figure"] or "not run" in r["figure"]], rows
    assert rows[-1]["figure"] == "identical" and rows[-1]["holds"] is True
    assert not list(tmp_path.rglob("*.pt")), list(tmp_path.rglob("*.pt"))
    logs = {path.name: path.read_text() for path in tmp_path.glob("*.log")}
    assert set(logs) == {"recipe.log", "loop.log", "determinism-1.log", "determinism-2.log"}, logs.keys()
    kept_paths = [name for name, text in logs.items() if ROOT in text or str(tmp_path) in text
                  or re.search(r"/tmp\w*/tmp\w+", text)]
    assert not kept_paths, logs  # the checkout's and the scratch folder's paths left out: logs are kept in the repo
    assert subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout == before


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")), reason="needs a git checkout to make a worktree")
def test_a_base_whose_data_cannot_be_prepared_leaves_no_worktree(tmp_path, monkeypatch):
    """The base is a git worktree with its own data: where its data/prepare.py fails, the worktree is removed at
    once (the recipe is then a row saying why), not left registered in the checkout."""
    import bench.goals as goals

    listed = lambda: subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    before = listed()
    monkeypatch.setattr(goals.sys, "executable", "false")  # `false data/prepare.py`: a preparation that fails
    path, why = goals.base_worktree("HEAD", str(tmp_path))
    assert path is None and why == "data/prepare.py at HEAD failed: exit 1", why
    assert listed() == before
