"""Every backend computes the same function on every device here, in the precisions training uses
there: bf16 on the CPU; bf16 and fp16 on a CUDA GPU, with the flash-attn package's kernels (fa2, fa3)
where it is installed. Then the scripts on a GPU: training in bf16 and fp16, exact resume, DDP over
NCCL, and sampling.

The CUDA cases are skipped on a machine without a GPU (bench/gpu.sh runs them on one). The other
test files check the same properties in fp32 on the CPU, exactly.

Low-precision outputs are compared with an fp32 computation from the same (rounded) weights and
inputs, relative to the largest value: bf16 keeps 8 bits of mantissa, so ~0.5% is its rounding; an
off-by-one mask or a misaligned cache moves the result by 10% or more.
"""
import copy
import re

import pytest
import torch

from attention import HOPPER, KVCache, MultiHeadAttention, fa2_func, fa3_func
from checkpoint import load_checkpoint
from helpers import check_ok, rank_weights, torchrun
from hardware import gpu_datasheet_peaks
from model import GPT, GPTConfig

CUDA = torch.cuda.is_available()
ON_HOPPER = CUDA and torch.cuda.get_device_capability()[0] == HOPPER  # where attention.py lets fa3 run
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # a few times each one's rounding: 2^-8, 2^-11
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU here")


def cases():
    """(device, dtype, backend) for every combination that runs on some machine; skipped here if not."""
    out = [pytest.param("cpu", torch.bfloat16, b, id=f"cpu-bf16-{b}") for b in ("manual", "sdpa", "flash")]
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for backend in ("manual", "sdpa", "flash", "fa2", "fa3"):
            marks = [needs_cuda]
            if backend == "fa2" and fa2_func is None:
                marks.append(pytest.mark.skip(reason="the flash-attn package is not installed"))
            if backend == "fa3" and (fa3_func is None or not ON_HOPPER):
                marks.append(pytest.mark.skip(reason="FA3 needs flash_attn_interface and a Hopper GPU"))
            out.append(pytest.param("cuda", dtype, backend, marks=marks, id=f"cuda-{name}-{backend}"))
    return out


def rel_error(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def rounded(t, dtype):
    """t rounded to dtype and back to fp32: the exact inputs the low-precision run sees."""
    return t.to(dtype).float()


def attention_pair(device, dtype, backend, C=64, n_head=4):
    """An fp32 manual reference and its low-precision twin on `backend`, with identical weights."""
    torch.manual_seed(0)
    reference = MultiHeadAttention(C, n_head, backend="manual").to(device).eval()
    for p in reference.parameters():
        p.data = rounded(p.data, dtype)
    low = copy.deepcopy(reference).to(dtype)
    low.backend = backend
    return reference, low


@pytest.mark.parametrize("device,dtype,backend", cases())
def test_attention_matches_fp32_in_low_precision_with_gradients(device, dtype, backend):
    reference, low = attention_pair(device, dtype, backend)
    x = rounded(torch.randn(2, 24, 64, device=device), dtype)
    x_ref, x_low = x.clone().requires_grad_(), x.to(dtype).requires_grad_()
    y_ref, y_low = reference(x_ref), low(x_low)
    assert y_low.dtype == dtype
    assert rel_error(y_low, y_ref) < TOLERANCE[dtype]
    r = torch.randn_like(y_ref)
    (y_ref * r).sum().backward()
    (y_low.float() * r).sum().backward()
    assert rel_error(x_low.grad, x_ref.grad) < TOLERANCE[dtype]
    for (name, p_ref), p_low in zip(reference.named_parameters(), low.parameters()):
        assert rel_error(p_low.grad, p_ref.grad) < TOLERANCE[dtype], name


@pytest.mark.parametrize("device,dtype,backend", cases())
def test_future_inputs_get_exactly_zero_gradient_in_low_precision(device, dtype, backend):
    _, low = attention_pair(device, dtype, backend)
    x = torch.randn(2, 16, 64, device=device, dtype=dtype, requires_grad=True)
    y = low(x)
    for t in (0, 7, 14):
        (grad,) = torch.autograd.grad(y[:, t].float().sum(), x, retain_graph=True)
        assert torch.all(grad[:, t + 1:] == 0), f"output {t} depends on later inputs"
        assert grad[:, :t + 1].abs().sum() > 0


@pytest.mark.parametrize("device,dtype,backend", cases())
def test_kv_cache_and_cross_attention_match_fp32_in_low_precision(device, dtype, backend):
    reference, low = attention_pair(device, dtype, backend)
    x = rounded(torch.randn(2, 10, 64, device=device), dtype)
    context = rounded(torch.randn(2, 7, 64, device=device), dtype)
    with torch.no_grad():
        cache = KVCache(64)
        low(x[:, :6].to(dtype), kv_cache=cache)  # six positions cached, then four queries after them
        cached = low(x[:, 6:].to(dtype), kv_cache=cache)
        assert rel_error(cached, reference(x)[:, 6:]) < TOLERANCE[dtype]
        crossed = low(x.to(dtype), context=context.to(dtype))
        assert rel_error(crossed, reference(x, context=context)) < TOLERANCE[dtype]


@pytest.mark.parametrize("device,dtype,backend", cases())
@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
def test_gpt_cached_logits_match_full_forward_in_low_precision(device, dtype, backend, pos_embedding):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=64, attention=backend,
                       pos_embedding=pos_embedding)
    model = GPT(config)
    with torch.no_grad():  # far from GPT-2's tiny init, so attention is sharp and positions matter
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    model = model.to(device, dtype).eval()
    idx = torch.randint(0, 50, (2, 20), device=device)
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_kv_cache()
        steps = [model(idx[:, :12], kv_cache=cache)[0]]
        steps += [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(12, 20)]
    assert rel_error(torch.cat(steps, dim=1), full) < TOLERANCE[dtype]


@pytest.mark.parametrize("device,dtype,backend", cases())
@pytest.mark.parametrize("variant", [{}, {"qk_norm": True, "norm": "rmsnorm"}], ids=["gpt2", "qknorm"])
def test_gpt_under_autocast_matches_fp32_loss_and_gradients(device, dtype, backend, variant):
    """As train.py runs it: fp32 weights, autocast picks each op's precision (norms may stay fp32)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=64, pos_embedding="rope", **variant)
    reference = GPT(config).to(device)
    low = GPT(GPTConfig(**{**config.__dict__, "attention": backend})).to(device)
    low.load_state_dict(reference.state_dict())
    idx = torch.randint(0, 50, (2, 32), device=device)
    loss_ref = reference(idx, idx)[1]
    with torch.autocast(device, dtype=dtype):
        loss_low = low(idx, idx)[1]
    assert abs(loss_low.item() - loss_ref.item()) < TOLERANCE[dtype] / 10 * loss_ref.item()  # a mean over 64 tokens
    loss_ref.backward()
    loss_low.backward()
    for (name, p_ref), p_low in zip(reference.named_parameters(), low.parameters()):
        assert rel_error(p_low.grad, p_ref.grad) < 2 * TOLERANCE[dtype], name


# --------------------------------------------------------------------------- the scripts on a GPU

GPU_TINY = ["--device=cuda", "--max_seconds=0", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
            "--batch_size=8", "--eval_iters=2", "--warmup_iters=2", "--log_interval=1", "--eval_interval=10"]
LOG_LOSS = re.compile(r"^iter (\d+): loss ([0-9.]+),.*?(?:MFU (\S+))?$", re.M)  # no MFU where no peak is known


@needs_cuda
@pytest.mark.parametrize("dtype,attention", [("bfloat16", "flash"), ("float16", "sdpa")])
def test_train_on_gpu_learns_and_samples_on_gpu_and_cpu(data_dir, tmp_path, launch, dtype, attention):
    proc = check_ok(launch("train.py", *GPU_TINY, f"--dtype={dtype}", f"--attention={attention}", "--max_iters=80",
                           f"--data_dir={data_dir}", f"--out_dir={tmp_path}"))
    assert f"dtype {dtype}" in proc.stdout and "device cuda" in proc.stdout
    logged = LOG_LOSS.findall(proc.stdout)
    assert len(logged) == 80, proc.stdout
    losses = [float(loss) for _, loss, _ in logged]
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    if gpu_datasheet_peaks(torch.cuda.get_device_name()):
        assert all(mfu.endswith("%") for _, _, mfu in logged), "MFU against the GPU's datasheet peak"
    for device in ("cuda", "cpu"):  # a checkpoint written on the GPU samples on either
        sample = check_ok(launch("sample.py", f"--out_dir={tmp_path}", f"--device={device}", "--max_new_tokens=30",
                                 "--start=All:"))
        assert sample.stdout.startswith("All:") and len(sample.stdout) >= 34


@needs_cuda
def test_resume_on_gpu_is_exact(data_dir, tmp_path, launch):
    """fp32 manual attention: plain matmuls and softmax, deterministic on a GPU, and dropout, so the
    CUDA generator's state must come back with the checkpoint."""
    common = [*GPU_TINY, "--dtype=float32", "--attention=manual", "--dropout=0.1", "--lr_decay_iters=8",
              "--eval_interval=4", f"--data_dir={data_dir}"]
    a, b = tmp_path / "A", tmp_path / "B"
    check_ok(launch("train.py", *common, f"--out_dir={a}", "--max_iters=8"))
    check_ok(launch("train.py", *common, f"--out_dir={b}", "--max_iters=4"))
    assert load_checkpoint(str(b / "ckpt.pt"))["rng"]["cuda"], "the checkpoint holds the CUDA generator"
    check_ok(launch("train.py", *common, f"--out_dir={b}", "--init_from=resume", "--max_iters=8"))
    wa, wb = (load_checkpoint(str(d / "ckpt.pt"))["model"] for d in (a, b))
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs after resume on the GPU"


@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="DDP over NCCL needs two GPUs here")
def test_ddp_over_nccl_keeps_ranks_identical(data_dir, tmp_path):
    n = 2  # one rank would have no replica to compare
    out = torchrun("tests/distributed_worker.py", *GPU_TINY, "--dtype=bfloat16", "--attention=flash",
                   f"--gradient_accumulation_steps={2 * n}", "--max_iters=10", f"--data_dir={data_dir}",
                   f"--out_dir={tmp_path}", nproc=n)
    assert f"{n} process(es) ddp" in out, out
    first, *others = rank_weights(tmp_path, n)
    assert all(torch.equal(first, w) for w in others), "DDP replicas drifted apart"
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["iter_num"] == 10
