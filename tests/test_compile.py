"""torch.compile itself. The slow ones are opt-in (cold compiles cost ~30 s): python -m pytest -m slow"""
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import ENV, ROOT, check_ok
from model import GPT, GPTConfig

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.mark.slow
@pytest.mark.compiles
@pytest.mark.parametrize("device,attention,dtype,tolerance", [
    ("cpu", "manual", torch.float32, 1e-4),
    ("cpu", "sdpa", torch.float32, 1e-4),
    pytest.param("cuda", "sdpa", torch.float32, 1e-4, marks=needs_cuda),
    pytest.param("cuda", "flash", torch.bfloat16, 2e-2, marks=needs_cuda),  # bf16 rounding, as in training
])
def test_compiled_model_trains_like_eager(device, attention, dtype, tolerance):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, attention=attention)
    eager = GPT(config).to(device)
    compiled = GPT(config).to(device)
    compiled.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled)
    x = torch.randint(0, 32, (2, 4, 16), device=device)
    y = torch.randint(0, 32, (2, 4, 16), device=device)
    losses = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[name] = []
        for step in range(2):
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(x[step], y[step])[1]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    assert losses["eager"][1] != losses["eager"][0]  # the step did something
    for a, b in zip(losses["eager"], losses["compiled"]):
        assert abs(a - b) < tolerance, losses


@pytest.mark.slow  # as sample.py --compile=true is opt-in; ~50 s of cold compiles on a 2-core CPU
@pytest.mark.compiles
def test_compiled_decoding_reads_every_weight_as_a_fused_reduction():
    """sample.py --compile=true: greedy decoding gives the eager model's tokens, and its compiled
    forwards (filling the cache from a one-token prompt, then a token at a time) have no matmul call
    left, the head (4096 rows, past the decomposition pass's own 2048 limit) included; the
    matrix-vector products are fused reductions. A fresh process, as sample.py is: inductor reads the
    pass's limits when it first compiles. (Past the window's end: the slow sample.py test.)"""
    script = textwrap.dedent("""
        import copy
        import torch
        from torch._inductor.utils import run_and_get_code
        from model import GPT, GPTConfig
        from sample import compile_for_decoding
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=4096, block_size=16, n_layer=1, n_head=2, n_embd=32)).eval()
        with torch.no_grad():  # weights far from their init, whose greedy text repeats one token
            for p in model.parameters():
                p.normal_(0, 0.5)
        eager = copy.deepcopy(model)
        compile_for_decoding(model)
        prompt = torch.zeros(1, 1, dtype=torch.long)
        tokens, code = run_and_get_code(model.generate, prompt, 15, temperature=0)
        print("compiled", *tokens[0].tolist())
        print("eager", *eager.generate(prompt, 15, temperature=0)[0].tolist())
        print(*code, sep="\\n")
    """)
    env = {k: v for k, v in ENV.items() if k != "TORCHDYNAMO_DISABLE"}
    out = check_ok(subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=300)).stdout
    compiled, eager, code = out.split("\n", 2)
    assert compiled.split()[1:] == eager.split()[1:] and len(eager.split()) == 17, out[:1000]
    assert len(set(eager.split()[2:])) >= 3, eager  # a text, not one token again and again
    assert code.count("def call") == 2, code  # inductor's modules for both forwards, not an eager fallback
    assert not any(f"extern_kernels.{mm}(" in code for mm in ("mm", "addmm", "bmm")), code


@pytest.mark.compiles
def test_compiled_causal_mask_is_recomputed_inside_the_softmax():
    """causal_mask compares positions, so inductor folds the mask into the softmax's kernels, forward
    and backward; a mask made as a tensor (tril of ones) is stored once and read back as bools in
    every row, which made the softmax twice as slow on a CPU. No bool buffer may appear."""
    from torch._inductor.utils import run_and_get_code

    from attention import MultiHeadAttention

    attention = torch.compile(MultiHeadAttention(n_embd=16, n_head=2))  # builds its mask in forward, as GPT's do
    x = torch.randn(2, 16, 16)

    def forward_backward(x):
        attention(x).square().sum().backward()

    code = "\n".join(run_and_get_code(forward_backward, x)[1])
    assert code.count("def call") == 2, code  # inductor compiled the forward and the backward
    assert "masked_fill" in code and "torch.bool" not in code and "bool*" not in code, code


@pytest.mark.compiles
def test_compiled_muon_makes_the_eager_steps_and_compiles_only_before_them():
    """Muon.compile(): the same steps as the eager update, at every rate the schedule gives; compile()
    itself leaves the weights and the state alone, and the steps after it compile nothing more."""
    from torch._dynamo.utils import counters

    from optim import Muon

    torch.manual_seed(0)
    shapes = [(48, 16), (48, 16), (16, 16), (16, 64)]  # tall (twice), square and wide
    eager = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    compiled = [torch.nn.Parameter(p.detach().clone()) for p in eager]
    start = [p.detach().clone() for p in eager]
    opts = Muon(eager, ns_dtype=torch.float32), Muon(compiled, ns_dtype=torch.float32)
    opts[1].compile()
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled)) and not opts[1].state
    graphs = counters["stats"]["unique_graphs"]
    for step in range(3):
        grads = [torch.randn(s) for s in shapes]
        for params, opt in zip((eager, compiled), opts):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            for group in opt.param_groups:
                group["lr"] = 0.02 / (step + 1)
            opt.step()
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled in the steps
    assert not torch.equal(eager[0], start[0])  # the steps moved the weights
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
