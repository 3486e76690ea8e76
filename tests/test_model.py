"""Tests of model.py: causality of the whole GPT (logits, gradients, behaviour), attention weights
of every layer, KV-cache generation, parity with Hugging Face's GPT-2, training, sampling and
configuration. Every model-level property runs on every backend that runs on CPU, in fp32."""
import importlib
import json
import math
import re
import shutil
import time
import zlib
from dataclasses import asdict, fields
from typing import get_args

import pytest
import torch

from attention import MultiHeadAttention, check_backend
from checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from data.tokenizer import tokenizer_from_meta
from helpers import assert_causal_weights, assert_dropout, backends_that_run_on_a_cpu, check_ok
from model import GPT, HF_GPT2_ARCHITECTURE, MLP, GPTConfig, gpt2_activation, make_norm, sample_next
from optim import configure_optimizers

CPU_BACKENDS = ["manual", "sdpa", "flash"]
B = 2


def randomize_(model, std=0.2, seed=1):
    """Weights well away from GPT-2's tiny init, so attention is far from uniform, logits are far
    apart, and every mistake shows up as a large difference."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            # seeded by name, so the weights do not depend on the order modules are created in
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("weight"):  # LayerNorm gains
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def make_gpt(backend, seed=0, std=0.2, **overrides):
    cfg = dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0, attention=backend)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**cfg))
    if std:
        randomize_(model, std, seed + 1)
    return model.eval()


def rand_tokens(*shape, vocab=64, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def remove_mask_(model):
    """The same model without the causal mask: every attention layer sees the whole sequence."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == model.config.n_layer
    for m in layers:
        m.causal = False
    return model


# --------------------------------------------------------------------------- attention weights


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_forward_returns_causal_weights_for_every_layer(backend):
    model = make_gpt(backend, n_layer=3)
    idx = rand_tokens(B, 12)
    with torch.no_grad():
        weights = model.attention_weights(idx)
        logits, loss = model(idx)
    assert loss is None
    assert len(weights) == 3
    for w in weights:
        assert w.shape == (B, 4, 12, 12)
        assert_causal_weights(w)
    assert all(block.attn.weights is None and not block.attn.keep_weights for block in model.transformer.h), \
        "attention_weights leaves the layers as they were"
    with torch.no_grad():  # the backend's own forward (the weights come from the manual path)
        torch.testing.assert_close(logits, make_gpt("manual", n_layer=3)(idx)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", [{}, {"pos_embedding": "rope", "qk_norm": True, "norm": "rmsnorm"}],
                         ids=["gpt2", "rope-qk_norm"])
def test_attention_steps_are_the_q_k_v_behind_the_weights_and_the_output(arch):
    """attention_steps' q, k, v are the ones attention used (after QK-norm and RoPE): the softmax of
    q·kᵀ/√d under the causal mask is its weights, and Σ α v, heads joined and projected, its output.
    With QK-norm each head's q and k vector has unit RMS (RoPE turns pairs, so keeps it); without, far from it."""
    model = make_gpt("sdpa", **arch)
    idx = rand_tokens(B, 12)
    outputs = []
    hooks = [block.attn.register_forward_hook(lambda m, args, out: outputs.append(out))
             for block in model.transformer.h]
    with torch.no_grad():
        steps = model.attention_steps(idx)
    for hook in hooks:
        hook.remove()
    for (q, k, v, weights), attn, out in zip(steps, [b.attn for b in model.transformer.h], outputs):
        scores = (q @ k.transpose(-2, -1) / q.size(-1) ** 0.5).masked_fill(~torch.ones(12, 12).tril().bool(),
                                                                           -torch.inf)
        torch.testing.assert_close(scores.softmax(-1), weights, rtol=0, atol=1e-6)
        joined = (weights @ v).transpose(1, 2).reshape(B, 12, -1)  # (B, T, C): heads side by side
        torch.testing.assert_close(attn.c_proj(joined), out, rtol=0, atol=1e-5)
        for t in (q, k):
            mean_square = t.square().mean(-1)  # (B, nh, T): one per head vector
            if arch.get("qk_norm"):
                torch.testing.assert_close(mean_square, torch.ones_like(mean_square), rtol=0, atol=1e-5)
            else:
                assert (mean_square - 1).abs().amax() > 0.5, "q and k have unit RMS without QK-norm"
    assert all(b.attn.qkv is None and b.attn.weights is None for b in model.transformer.h)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_forward_weights_with_kv_cache_cover_cached_positions(backend):
    """Queries after a cache (filled by the backend itself) get the very weights a full pass gives
    their positions: the rows 6.. of the full pass's (T, T) weights, over every cached key."""
    model = make_gpt(backend)
    idx = rand_tokens(B, 10)
    with torch.no_grad():
        cache = model.new_kv_cache()
        model(idx[:, :6], kv_cache=cache)
        weights = model.attention_weights(idx[:, 6:], kv_cache=cache)
        full = model.attention_weights(idx)
    assert len(weights) == len(full) == 2 and cache[0].pos == 10
    for w, w_full in zip(weights, full):
        assert w.shape == (B, 4, 4, 10)
        assert_causal_weights(w, q_start=6)
        torch.testing.assert_close(w, w_full[:, :, 6:], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- causality


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_changing_token_t_leaves_earlier_logits_unchanged(backend):
    T, V = 16, 64
    model = make_gpt(backend)
    idx = rand_tokens(B, T, seed=1)
    with torch.no_grad():
        logits, _ = model(idx)
        for t in (0, 1, 7, 12, T - 1):
            idx2 = idx.clone()
            idx2[:, t:] = (idx[:, t:] + 1 + rand_tokens(B, T - t, vocab=V - 1, seed=t)) % V  # all differ
            logits2, _ = model(idx2)
            torch.testing.assert_close(logits2[:, :t], logits[:, :t], atol=1e-6, rtol=0,
                                       msg=f"changing tokens from {t} on changed an earlier logit")
            change = (logits2[:, t] - logits[:, t]).abs().amax(-1)
            assert torch.all(change > 1e-2), f"the logits at {t} ignore the token at {t}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_changing_only_a_later_token_changes_later_logits(backend):
    """The converse: information does flow forward, so a change at t reaches every later position."""
    model = make_gpt(backend)
    idx = rand_tokens(B, 16, seed=1)
    idx2 = idx.clone()
    idx2[:, 4] = (idx[:, 4] + 5) % 64
    with torch.no_grad():
        d = (model(idx2)[0] - model(idx)[0]).abs().amax(-1)  # (B, T)
    assert torch.all(d[:, :4] <= 1e-6)
    assert torch.all(d[:, 4:] > 1e-4), f"later positions do not see the token at 4: {d}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_logit_gradient_is_exactly_zero_for_future_embeddings(backend):
    T = 12
    model = make_gpt(backend, n_layer=2)
    captured = []
    hook = model.transformer.wte.register_forward_hook(lambda mod, inp, out: captured.append(out))
    try:
        logits, _ = model(rand_tokens(B, T, seed=2))
    finally:
        hook.remove()
    (emb,) = captured  # (B, T, C): the token embeddings, as if fed in as inputs_embeds
    r = torch.randn(logits.size(-1), generator=torch.Generator().manual_seed(3))
    for b in range(B):
        for i in range(T):
            (g,) = torch.autograd.grad((logits[b, i] * r).sum(), emb, retain_graph=True)
            assert torch.all(g[b, i + 1:] == 0), f"logits at {i} have a gradient from a future token"
            assert torch.all(g[:b] == 0) and torch.all(g[b + 1:] == 0), "batch elements leak into each other"
            per_pos = g[b, :i + 1].abs().amax(-1)
            assert torch.all(per_pos > 1e-7), f"logits at {i} do not depend on some token j <= {i}: {per_pos}"


def train_future_token_task(backend, masked, V=8, T=8, steps=150, seed=0):
    """Target at position i is the *next input token*: only a model that sees the future can learn
    it. Fresh random sequences every step, so there is nothing to memorise; returns held-out loss."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=4, n_embd=32, attention=backend))
    if not masked:
        remove_mask_(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed + 1)

    def batch(n):
        seq = torch.randint(0, V, (n, T + 1), generator=g)
        targets = seq[:, 1:].clone()
        targets[:, -1] = -1  # the last target is not among the inputs at all
        return seq[:, :T], targets

    for _ in range(steps):
        _, loss = model(*batch(64))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(*batch(1024))[1].item()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_masked_model_cannot_predict_future_tokens_but_unmasked_can(backend):
    chance = math.log(8)
    masked = train_future_token_task(backend, masked=True)
    unmasked = train_future_token_task(backend, masked=False)
    assert masked > 0.9 * chance, f"the masked model predicts the future: loss {masked:.3f} vs chance {chance:.3f}"
    assert unmasked < 0.3 * chance, f"the task is learnable without the mask, yet loss is {unmasked:.3f}"


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cached_forward_matches_full_forward_position_by_position(backend):
    model = make_gpt(backend)
    idx = rand_tokens(B, 16, seed=4)
    with torch.no_grad():
        full, _ = model(idx)
        cache = model.new_kv_cache()
        logits, _ = model(idx[:, :5], kv_cache=cache)  # prefill
        torch.testing.assert_close(logits, full[:, :5], atol=1e-5, rtol=0)
        for t in range(5, 16):  # then one token at a time
            logits, _ = model(idx[:, t:t + 1], kv_cache=cache)
            torch.testing.assert_close(logits[:, 0], full[:, t], atol=1e-5, rtol=0, msg=f"position {t}")
        assert all(c.pos == 16 for c in cache)

        cache, start = model.new_kv_cache(), 0  # and in uneven chunks
        for n in (3, 4, 1, 2, 6):
            logits, _ = model(idx[:, start:start + n], kv_cache=cache)
            torch.testing.assert_close(logits, full[:, start:start + n], atol=1e-5, rtol=0)
            start += n

        last, _ = model(idx, last_only=True)  # what sampling asks for: the newest position only
        assert last.shape == (B, 1, full.size(-1))
        with pytest.raises(ValueError, match="last_only"):
            model(idx, idx, last_only=True)
        torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=0)
        cache = model.new_kv_cache()
        model(idx[:, :9], kv_cache=cache, last_only=True)
        last, _ = model(idx[:, 9:], kv_cache=cache, last_only=True)
        torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_forward_refuses_more_than_block_size(backend):
    model = make_gpt(backend)
    with pytest.raises(ValueError, match="block_size=16"):
        model(rand_tokens(B, 17))
    cache = model.new_kv_cache()
    with torch.no_grad():
        model(rand_tokens(B, 10), kv_cache=cache)
        with pytest.raises(ValueError, match="block_size=16"):
            model(rand_tokens(B, 7), kv_cache=cache)


def greedy_reference(model, idx, n):
    """Greedy decoding by full recomputation while the whole sequence fits in block_size."""
    for _ in range(n):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("prompt_len", [1, 7, 20])
def test_kv_cache_generation_equals_full_recomputation(backend, prompt_len):
    model = make_gpt(backend, std=0.5)
    prompt = rand_tokens(B, prompt_len, seed=prompt_len)
    with torch.no_grad():
        cached = model.generate(prompt, 40, temperature=0, use_kv_cache=True)
        full = model.generate(prompt, 40, temperature=0, use_kv_cache=False)
        assert cached.shape == (B, prompt_len + 40)
        assert torch.equal(cached[:, :prompt_len], prompt)
        assert torch.equal(cached, full), "KV-cache generation differs from full recomputation"
        assert cached[:, prompt_len:].unique().numel() >= 5, "degenerate generation proves nothing"
        if prompt_len < 16:  # before the window moves, generation is plain greedy decoding
            n = 16 - prompt_len
            assert torch.equal(cached[:, :16], greedy_reference(model, prompt, n))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_generate_uses_only_the_last_block(backend):
    """A prompt longer than block_size is cropped: tokens before the last block have no influence."""
    model = make_gpt(backend, std=0.5)
    prompt = rand_tokens(B, 24, seed=5)
    other = prompt.clone()
    other[:, :8] = (other[:, :8] + 1) % 64
    with torch.no_grad():
        a = model.generate(prompt, 10, temperature=0)
        b = model.generate(other, 10, temperature=0)
        expected_first = model(prompt[:, -16:])[0][:, -1].argmax(-1)
    assert torch.equal(a[:, 24:], b[:, 24:])
    assert torch.equal(a[:, 24], expected_first)


def documented_window_start(t, first, block_size):
    """Where generate's window begins when it predicts token t, from its docstring: the window is
    the last block_size tokens of the prompt (starting at first), and once it would hold more than
    block_size tokens it jumps forward by half a block. Each jump moves it block_size + 1 - half
    tokens, so the k-th window starts at first + k * (block_size + 1 - half)."""
    half = max(1, block_size // 2)
    k = max(0, math.ceil((t - first - block_size) / (block_size + 1 - half)))
    return first + k * (block_size + 1 - half)


@pytest.mark.parametrize("use_kv_cache", [True, False])
@pytest.mark.parametrize("prompt_len", [3, 20])
def test_generation_past_block_size_jumps_the_window_by_half_a_block(use_kv_cache, prompt_len):
    """Past block_size, each greedy token is the argmax of a full forward over the documented
    window, computed here from a formula rather than by a loop like generate's: another window
    rule (sliding, one token, never moving) writes other tokens."""
    model = make_gpt("manual", std=0.5)
    prompt = rand_tokens(B, prompt_len, seed=7)
    first = max(0, prompt_len - 16)
    with torch.no_grad():
        out = model.generate(prompt, 50, temperature=0, use_kv_cache=use_kv_cache)
        for t in range(prompt_len, prompt_len + 50):
            start = documented_window_start(t, first, 16)
            assert 8 <= t - start <= 16 or t <= 16, (t, start)
            expected = model(out[:, start:t])[0][:, -1].argmax(-1)
            assert torch.equal(out[:, t], expected), f"token {t}, window {start}:{t}"
    assert out[:, prompt_len:].unique().numel() >= 5, "degenerate generation proves nothing"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_crop_block_size_keeps_logits_and_causality(backend):
    model = make_gpt(backend)
    idx = rand_tokens(B, 8, seed=9)
    with torch.no_grad():
        before, _ = model(idx)
        model.crop_block_size(8)
        after, _ = model(idx)
        assert model.config.block_size == 8 and model.transformer.wpe.weight.shape[0] == 8
        assert model.transformer.wpe.num_embeddings == 8  # what the module says of itself, and what it saves:
        assert model.transformer.wpe.weight.untyped_storage().nbytes() == 8 * model.config.n_embd * 4  # no dead rows
        torch.testing.assert_close(after, before, atol=1e-6, rtol=0)
        weights = model.attention_weights(idx)
        for w in weights:
            assert_causal_weights(w)
        with pytest.raises(ValueError, match="block_size=8"):
            model(rand_tokens(B, 9))
        cached = model.generate(idx[:, :3], 12, temperature=0, use_kv_cache=True)
        assert torch.equal(cached, model.generate(idx[:, :3], 12, temperature=0, use_kv_cache=False))
    with pytest.raises(ValueError, match=r"^block_size=9 is larger than the model's 8 \(its weights' positions\): "
                                         r"use a block_size of at most 8$"):
        model.crop_block_size(9)
    for size in (0, -3, 2.5, True):  # a negative size had cut wpe to its first rows but 3, and the model took it
        with pytest.raises(ValueError, match=rf"block_size must be a positive whole number, got {size}"):
            model.crop_block_size(size)
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape[0] == 8
    model.crop_block_size(8)  # the context it has: what train.py asks for GPT-2 at its full block_size
    assert model.config.block_size == 8


def test_a_rope_model_tells_orders_apart():
    """Without a learned table, positions reach the model only through attention's rotation: a one-layer model
    would see the tokens before its last as a set (the same logits in any order) unless GPT hands every block
    the rotation of its positions."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, bias=False,
                          pos_embedding="rope")).eval()
    with torch.no_grad():
        for p in model.parameters():  # large weights: sharp attention, far from GPT-2's near-uniform start
            p.normal_(0.0, 0.5)
        last = [model(torch.tensor([order]))[0][0, -1] for order in ([1, 2, 3, 4, 5], [3, 1, 4, 2, 5])]
    assert (last[0] - last[1]).abs().max() > 1e-2, "the order of the earlier tokens made no difference"


# --------------------------------------------------------------------------- GPT-2 parity


@pytest.mark.parametrize("name", [None, *HF_GPT2_ARCHITECTURE["activation_function"]])
def test_each_gpt2_activation_name_runs_transformers_own_function(name):
    """Each activation a Hugging Face GPT-2 config.json may name is run as transformers runs it; a config.json
    that names none gets GPT2Config's default."""
    from transformers import GPT2Config
    from transformers.activations import ACT2FN

    hf = {} if name is None else {"activation_function": name}
    mlp = MLP(GPTConfig(n_embd=4, n_head=1, mlp_ratio=1, bias=False, activation=gpt2_activation(hf, "a-gpt2")))
    with torch.no_grad():  # both projections the identity: the MLP is its activation alone
        mlp.c_fc.weight.copy_(torch.eye(4))
        mlp.c_proj.weight.copy_(torch.eye(4))
        x = torch.linspace(-6, 6, 1000).view(250, 4)
        torch.testing.assert_close(mlp(x), ACT2FN[name or GPT2Config().activation_function](x), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """A small random GPT-2 in Hugging Face format: (directory, input ids, its logits)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=100,
                     bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(cfg)
    randomize_(hf, std=0.2, seed=2)  # also the LayerNorms and biases, so loading them is checked
    hf.eval()
    directory = tmp_path_factory.mktemp("hf_gpt2")
    hf.save_pretrained(directory)
    idx = rand_tokens(3, 40, vocab=100, seed=6)
    with torch.no_grad():
        logits = hf(idx).logits
    return str(directory), idx, logits, hf


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_from_pretrained_matches_hugging_face_gpt2(hf_gpt2, backend):
    directory, idx, expected, _ = hf_gpt2
    model = GPT.from_pretrained(directory, attention=backend).eval()
    c = model.config
    assert (c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd, c.attention) == (100, 64, 2, 4, 32, backend)
    with torch.no_grad():
        logits, _ = model(idx)
    assert expected.abs().max() > 1, "logits this small would make the comparison weak"
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_from_pretrained_reads_pytorch_model_bin_and_bare_gpt2model(hf_gpt2, tmp_path):
    directory, idx, expected, hf = hf_gpt2
    config = open(f"{directory}/config.json").read()
    bin_dir, bare_dir = tmp_path / "bin", tmp_path / "bare"
    bin_dir.mkdir(), bare_dir.mkdir()
    (bin_dir / "config.json").write_text(config)
    torch.save(hf.state_dict(), bin_dir / "pytorch_model.bin")  # with "transformer." and lm_head
    (bare_dir / "config.json").write_text(config)
    torch.save(hf.transformer.state_dict(), bare_dir / "pytorch_model.bin")  # GPT2Model: no prefix
    for d in (bin_dir, bare_dir):
        with torch.no_grad():
            logits, _ = GPT.from_pretrained(str(d)).eval()(idx)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_from_pretrained_refuses_a_pytorch_model_bin_damaged_inside_a_tensor(hf_gpt2, tmp_path):
    """torch.load checks no CRC-32: a torn or damaged download's weights loaded as they were."""
    directory, _, _, hf = hf_gpt2
    (tmp_path / "config.json").write_text(open(f"{directory}/config.json").read())
    wte = hf.state_dict()["transformer.wte.weight"]
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    data = bytearray((tmp_path / "pytorch_model.bin").read_bytes())
    start = data.index(wte[5].numpy().tobytes())
    data[start:start + 8] = bytes(8)
    (tmp_path / "pytorch_model.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"pytorch_model.bin cannot be read as weights \(BadZipFile: its record "
                                         r"\S+ fails its CRC-32 check.*\); download the model again$"):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_refuses_tensors_it_would_not_use(hf_gpt2, tmp_path):
    """A head of its own (untied) or a tensor GPT-2 lacks loaded without a word: the separate head even
    overwrote the token embedding it is tied to here. An older file's causal-mask buffers still load."""
    directory, idx, expected, hf = hf_gpt2
    (tmp_path / "config.json").write_text(open(f"{directory}/config.json").read())
    weights = hf.state_dict()
    mask = {"transformer.h.0.attn.bias": torch.tril(torch.ones(1, 1, 64, 64, dtype=torch.bool)),
            "transformer.h.0.attn.masked_bias": torch.tensor(-1e4)}
    torch.save({**weights, **mask}, tmp_path / "pytorch_model.bin")
    with torch.no_grad():
        torch.testing.assert_close(GPT.from_pretrained(str(tmp_path)).eval()(idx)[0], expected, atol=1e-4, rtol=0)
    for extra, said in (({"lm_head.bias": torch.zeros(100)}, r"tensors GPT-2 has no place for \(lm_head.bias\)"),
                        ({"lm_head.weight": weights["lm_head.weight"] + 1}, r"an untied head")):
        torch.save({**weights, **extra}, tmp_path / "pytorch_model.bin")
        with pytest.raises(ValueError, match=said):
            GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_hub_name_offline_fails_clearly(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.chdir(tmp_path)  # so that "gpt2" is not a local directory
    with pytest.raises(ValueError, match=r"could not get 'gpt2' from the Hugging Face hub.*directory"):
        GPT.from_pretrained("gpt2")


def test_a_hub_model_with_only_pytorch_model_bin_loads_from_it(hf_gpt2, tmp_path, monkeypatch):
    """From the hub, model.safetensors is fetched where a model has it, else pytorch_model.bin (read with
    weights_only=True). Only model.safetensors had been: a model with only pytorch_model.bin, or a cache offline
    that held only that, was told that the hub lacked model.safetensors and to download the file by hand. Here
    a stand-in repository, copied as snapshot_download copies, by its allow_patterns."""
    import fnmatch

    import huggingface_hub
    directory, idx, expected, hf = hf_gpt2
    repo, snapshot = tmp_path / "repo", tmp_path / "snapshot"
    repo.mkdir(), snapshot.mkdir()
    shutil.copy(f"{directory}/config.json", repo)
    torch.save(hf.state_dict(), repo / "pytorch_model.bin")

    def snapshot_download(name, allow_patterns):
        for f in repo.iterdir():
            if any(fnmatch.fnmatch(f.name, pattern) for pattern in allow_patterns):
                shutil.copy(f, snapshot)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with torch.no_grad():
        torch.testing.assert_close(GPT.from_pretrained("someone/gpt2-bin").eval()(idx)[0], expected, atol=1e-4, rtol=0)
    assert sorted(f.name for f in snapshot.iterdir()) == ["config.json", "pytorch_model.bin"]
    (repo / "pytorch_model.bin").unlink()
    (snapshot / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match="^'someone/gpt2-bin' has neither model.safetensors nor pytorch_model.bin on "
                                         "the Hugging Face hub"):
        GPT.from_pretrained("someone/gpt2-bin")


def test_weights_in_torchs_format_from_before_its_zip_archives_load(hf_gpt2, tmp_path):
    """torch.save before torch 1.6 (or with _use_new_zipfile_serialization=False) wrote no zip archive: older
    hub models' pytorch_model.bin was refused as "not a file torch.save wrote ... download the model again"."""
    directory, idx, expected, hf = hf_gpt2
    shutil.copy(f"{directory}/config.json", tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with torch.no_grad():
        torch.testing.assert_close(GPT.from_pretrained(str(tmp_path)).eval()(idx)[0], expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_git_lfs_pointer_in_place_of_the_weights_says_to_fetch_them(hf_gpt2, tmp_path, name):
    """A model cloned from the hub without Git LFS holds 130-byte pointers: "download the model again" led back to
    the same clone."""
    directory, *_ = hf_gpt2
    shutil.copy(f"{directory}/config.json", tmp_path)
    (tmp_path / name).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 +
                                 "\nsize 1234\n")
    with pytest.raises(ValueError, match=f"^{tmp_path}/{name} is a Git LFS pointer, not the weights: run "
                                         f"`git lfs pull` in {tmp_path}"):
        GPT.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_from_pretrained_reads_sharded_weights(hf_gpt2, tmp_path, safe):
    """save_pretrained splits a model larger than max_shard_size into files listed by an index (and
    transformers before 5 wrote pytorch_model-0000N-of-0000M.bin files the same way)."""
    directory, idx, expected, hf = hf_gpt2
    if safe:
        hf.save_pretrained(tmp_path, max_shard_size="20KB")
    else:
        (tmp_path / "config.json").write_text(open(f"{directory}/config.json").read())
        names = list(hf.state_dict())
        halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
        for file, part in halves.items():
            torch.save({name: hf.state_dict()[name] for name in part}, tmp_path / file)
        (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {name: file for file, part in halves.items() for name in part}}))
    index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    assert len(set(json.loads((tmp_path / index).read_text())["weight_map"].values())) > 1
    with torch.no_grad():
        logits, _ = GPT.from_pretrained(str(tmp_path)).eval()(idx)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("content", [b"junk\n", b"abc", b""], ids=["text", "three bytes", "empty"])
def test_from_pretrained_names_a_pytorch_model_bin_that_is_not_weights(hf_gpt2, tmp_path, content):
    directory, *_ = hf_gpt2
    (tmp_path / "config.json").write_text(open(f"{directory}/config.json").read())
    (tmp_path / "pytorch_model.bin").write_bytes(content)  # torch.load itself: KeyError, IndexError tracebacks
    with pytest.raises(ValueError, match=r"pytorch_model.bin cannot be read as weights \(NotSavedByTorch: not a file "
                                         r"torch.save wrote \(a zip archive\)"):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_names_a_weight_that_is_not_a_tensor(hf_gpt2, tmp_path):
    directory, *_ = hf_gpt2
    (tmp_path / "config.json").write_text(open(f"{directory}/config.json").read())
    torch.save({"transformer.h.0.attn.c_attn.weight": [1, 2]}, tmp_path / "pytorch_model.bin")  # was an AttributeError
    with pytest.raises(ValueError, match=r"pytorch_model.bin holds a list for transformer.h.0.attn.c_attn.weight, "
                                         r"not a tensor; download the model again"):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_directory_without_weights_fails_clearly(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        dict(vocab_size=100, n_positions=64, n_layer=2, n_head=4, n_embd=32)))
    with pytest.raises(ValueError, match="neither model.safetensors nor pytorch_model.bin"):
        GPT.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("override", [{"n_layer": 1}, {"block_size": 32}, {"pos_embedding": "rope"}])
def test_from_pretrained_refuses_overrides_that_change_the_weights(hf_gpt2, override):
    directory, *_ = hf_gpt2
    with pytest.raises(ValueError, match=f"{next(iter(override))} cannot be overridden.*crop_block_size"):
        GPT.from_pretrained(directory, **override)


def test_a_checkpoints_model_refuses_overrides_that_change_the_weights(tmp_path):
    """model_from_checkpoint(..., n_layer=3) blamed the file ("damaged, or written by other code") for the
    caller's override; only settings that leave the weights as they are may be given."""
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8))
    checkpoint = {"model_config": asdict(model.config), "model": model.state_dict()}
    assert model_from_checkpoint(checkpoint, "ckpt.pt", dropout=0.1).config.dropout == 0.1
    with pytest.raises(ValueError, match="^n_layer cannot be overridden: the checkpoint's weights fix it"):
        model_from_checkpoint(checkpoint, "ckpt.pt", n_layer=3)


def test_from_pretrained_names_a_missing_config_field(hf_gpt2, tmp_path):
    directory, *_ = hf_gpt2
    cfg = json.load(open(f"{directory}/config.json"))
    del cfg["n_head"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="config.json lacks n_head"):
        GPT.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("field, value", [("activation_function", "relu"), ("layer_norm_epsilon", 1e-2),
                                          ("tie_word_embeddings", False), ("scale_attn_by_inverse_layer_idx", True),
                                          ("scale_attn_weights", False)])
def test_from_pretrained_refuses_a_config_beyond_gpt2s_architecture(hf_gpt2, tmp_path, field, value):
    """transformers' GPT-2 class runs these variants; loaded as GPT-2 they would give other logits."""
    directory, *_ = hf_gpt2
    cfg = json.load(open(f"{directory}/config.json"))
    shutil.copy(f"{directory}/model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=f"has {field}={value!r}: this GPT runs GPT-2's architecture only"):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_runs_the_exact_gelu_that_config_json_names(hf_gpt2, tmp_path):
    from transformers import GPT2LMHeadModel
    directory, idx, _, _ = hf_gpt2
    cfg = json.load(open(f"{directory}/config.json"))
    shutil.copy(f"{directory}/model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "activation_function": "gelu"}))
    with torch.no_grad():
        expected = GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()(idx).logits
        model = GPT.from_pretrained(str(tmp_path)).eval()
        assert model.config.activation == "gelu"
        torch.testing.assert_close(model(idx)[0], expected, atol=1e-4, rtol=0)


def test_from_pretrained_runs_the_mlp_width_that_config_json_names(tmp_path):
    """n_inner sets a GPT-2's MLP width (null: 4 * n_embd); one that is no whole multiple of n_embd, this
    GPT's mlp_ratio, is refused by name rather than by a tensor's shape."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=50, n_inner=32))
    randomize_(hf, std=0.2, seed=3)
    hf.save_pretrained(tmp_path / "narrow")
    idx = rand_tokens(2, 20, vocab=50, seed=4)
    with torch.no_grad():
        model = GPT.from_pretrained(str(tmp_path / "narrow")).eval()
        assert model.config.mlp_ratio == 2 and model.transformer.h[0].mlp.c_fc.out_features == 32
        torch.testing.assert_close(model(idx)[0], hf.eval()(idx).logits, atol=1e-4, rtol=0)
    cfg = json.load(open(tmp_path / "narrow" / "config.json"))
    for n_inner in (24, 0, 32.0, True):
        (tmp_path / "odd").mkdir(exist_ok=True)
        (tmp_path / "odd" / "config.json").write_text(json.dumps({**cfg, "n_inner": n_inner}))
        with pytest.raises(ValueError, match=rf"has n_inner={n_inner!r}: this GPT's MLP is a whole multiple of "
                                             r"n_embd=16 wide"):
            GPT.from_pretrained(str(tmp_path / "odd"))


@pytest.mark.parametrize("key, value, says", [
    ("n_embd", 64, r"does not describe its weights \(n_embd=64, the weights 32\)"),  # 32-wide tensors
    # checked before the model is built: a hundred thousand blocks would take minutes and all memory
    ("n_layer", 100_000, r"does not describe its weights \(n_layer=100000, the weights 2\)"),
    ("n_positions", 32, r"does not describe its weights \(n_positions=32, the weights 64\)"),
    ("n_positions", 10**9, r"does not describe its weights \(n_positions=1000000000, the weights 64\)"),
    ("n_inner", 32 * 10**7, r"does not describe its weights \(n_inner / n_embd=10000000, the weights 4\)"),
    ("n_head", 3, r"config.json is damaged \(n_embd=32 must be divisible by n_head=3"),
])
def test_from_pretrained_rejects_a_config_that_does_not_fit_its_weights(hf_gpt2, tmp_path, key, value, says):
    directory, *_ = hf_gpt2
    cfg = json.load(open(f"{directory}/config.json"))
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_positions"]) == (2, 32, 64)  # what the messages name
    (tmp_path / "config.json").write_text(json.dumps({**cfg, key: value}))
    (tmp_path / "model.safetensors").write_bytes(open(f"{directory}/model.safetensors", "rb").read())
    started = time.time()
    with pytest.raises(ValueError, match=says):
        GPT.from_pretrained(str(tmp_path))
    assert time.time() - started < 10


# --------------------------------------------------------------------------- training


def test_init_is_gpt2s_with_residual_projections_scaled_by_one_over_sqrt_2_n_layer():
    """GPT-2's init: every matrix and embedding N(0, 0.02), except the projections that write into the
    residual stream, 0.02 / sqrt(2 n_layer) = 0.005 with 8 layers, so the stream's variance does not grow
    with depth; biases zero, norm gains one. Each std comes from 16k to 262k samples (relative standard
    error under 0.6%), so 5% is safe and the unscaled 0.02 would miss by 300%."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, block_size=64, n_layer=8, n_head=8, n_embd=256))
    checked = set()
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif p.dim() == 1:  # LayerNorm gains
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            expected = 0.02 / math.sqrt(2 * 8) if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(expected, rel=0.05), name
            assert abs(p.mean().item()) < 0.05 * expected, name
            checked.add(name.split(".")[-2] if "h." in name else name)
    assert checked == {"c_attn", "c_proj", "c_fc", "transformer.wte.weight", "transformer.wpe.weight"}, checked


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_tiny_model_overfits_one_batch(backend):
    model = make_gpt(backend, std=0).train()  # GPT-2's own init
    idx = rand_tokens(4, 16, seed=7)
    targets = rand_tokens(4, 16, seed=8)
    opt, = configure_optimizers(model, "adamw", 1e-2, weight_decay=0.0, betas=(0.9, 0.95), muon_lr=0.0,
                                     device_type="cpu")
    _, first = model(idx, targets)
    assert abs(first.item() - math.log(64)) < 0.5, "an untrained model should start near chance"
    for _ in range(150):
        _, loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, f"could not overfit one batch: loss {loss.item():.3f}"


def test_loss_ignores_targets_of_minus_one():
    """Targets of -1 are left out; every other position counts, the last one too (a loss that skipped
    it never trained the position sampling predicts from once the window is full)."""
    model = make_gpt("manual")
    idx, targets = rand_tokens(B, 8), rand_tokens(B, 8, seed=1)
    with torch.no_grad():
        logits, loss = model(idx, targets)
        masked = targets.clone()
        masked[:, 4:] = -1
        _, partial = model(idx, masked)
    expected = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, 64), targets[:, :4].reshape(-1))
    torch.testing.assert_close(partial, expected, atol=1e-6, rtol=0)
    assert not torch.isclose(partial, loss)
    every = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1))
    torch.testing.assert_close(loss, every, atol=1e-6, rtol=0)


def test_loss_takes_a_sliced_target():
    """model(x[:, :-1], x[:, 1:]): the natural call, with targets that are a non-contiguous view."""
    model = make_gpt("manual")
    x = rand_tokens(B, 9)
    assert not x[:, 1:].is_contiguous()
    with torch.no_grad():
        _, loss = model(x[:, :-1], x[:, 1:])
        _, expected = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
    assert torch.equal(loss, expected)


def test_configure_optimizers_decays_matrices_only():
    model = make_gpt("manual", std=0)
    opt, = configure_optimizers(model, "adamw", 1e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.0,
                                      device_type="cpu")
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decay["params"] and no_decay["params"]
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    in_groups = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(in_groups) == len(set(in_groups)), "a parameter is in the optimizer twice"
    assert set(in_groups) == {id(p) for p in model.parameters()}
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: one tensor, decayed once


# --------------------------------------------------------------------------- sampling


def test_stream_samples_only_the_first_vocab_size_tokens():
    """A padded vocabulary: tokens past the tokenizer's never occur in the data, so never sample them."""
    model = make_gpt("manual")
    prompt = rand_tokens(B, 4)
    g = torch.Generator().manual_seed(0)
    free = model.generate(prompt, 40, temperature=2.0, generator=g)[:, 4:]
    limited = model.generate(prompt, 40, temperature=2.0, generator=g, vocab_size=10)[:, 4:]
    assert free.max() >= 10, "the unrestricted model does sample later tokens"
    assert limited.max() < 10
    for bad in (0, -3, 2.5, model.config.vocab_size + 1):  # -3 had sampled all but the last 3; 0 an IndexError
        with pytest.raises(ValueError, match=rf"^vocab_size must be a whole number from 1 to the model's "
                                             rf"{model.config.vocab_size}, or None for all, got {bad}$"):
            model.generate(prompt, 2, vocab_size=bad)


@pytest.mark.parametrize("options, match", [({"temperature": -1.0}, "temperature"),
                                            ({"temperature": float("nan")}, "temperature"),
                                            ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k must be a whole number"),
                                            ({"top_k": True}, "top_k must be a whole number"),
                                            ({"top_p": 0.0}, "top_p"),
                                            ({"max_new_tokens": -1}, "max_new_tokens must be a whole number >= 0")])
def test_generate_refuses_options_it_cannot_sample_with(options, match):
    options = {"max_new_tokens": 3, **options}  # -1 was a RuntimeError from inside torch
    with pytest.raises(ValueError, match=match):
        make_gpt("manual").generate(rand_tokens(B, 4), **options)


def test_generate_samples_without_dropout_in_either_mode():
    """A model left in training mode (mid-training, say) samples as in eval mode, without dropout, so
    temperature=0 is greedy; its mode is as it was afterwards."""
    model = make_gpt("manual", dropout=0.5)
    prompt = rand_tokens(B, 4)
    expected = model.generate(prompt, 10, temperature=0)
    model.train()
    assert torch.equal(model.generate(prompt, 10, temperature=0), expected)
    assert model.training and all(m.training for m in model.modules())
    stream = model.stream(prompt, 10, temperature=0)
    next(stream)
    stream.close()  # a stream left before its end: the mode is back at once
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    stream = model.stream(prompt, 10, temperature=0)
    next(stream)
    stream.close()
    assert not any(m.training for m in model.modules())


def test_generate_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match="prompt is empty"):
        make_gpt("manual").generate(torch.zeros(1, 0, dtype=torch.long), 3)


def test_a_tiny_temperature_is_greedy_not_nan():
    model = make_gpt("manual")
    prompt = rand_tokens(B, 4)
    with torch.no_grad():
        tiny = model.generate(prompt, 10, temperature=1e-40, generator=torch.Generator().manual_seed(0))
        assert torch.equal(tiny, model.generate(prompt, 10, temperature=0))


def test_sample_next_takes_one_generator_or_one_per_row():
    """A list of one generator for three rows gave every row the same draws."""
    with pytest.raises(ValueError, match="^1 generators for 3 rows: give one per row, or one for them all$"):
        sample_next(torch.zeros(3, 50), 1.0, generator=[torch.Generator().manual_seed(1)])


def test_sample_next_temperature_zero_is_greedy():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1, keepdim=True))
    # a positive temperature fp32 rounds to 0 (below ~7e-46): the largest logit was 0 / 0, and token 0 won every row
    for tiny in (7e-46, 1e-300, 5e-324):
        assert torch.equal(sample_next(logits, temperature=tiny), logits.argmax(-1, keepdim=True)), tiny


@pytest.mark.parametrize("setting, value", [("bias", "no"), ("qk_norm", "yes"), ("n_head", True), ("mlp_ratio", 2.5),
                                            ("vocab_size", 10.5), ("n_embd", 32.0), ("dropout", "0.1")])
def test_gptconfig_refuses_a_value_of_the_wrong_type(setting, value):
    """Built in Python (train.py's flags are parsed by type already): bias="no" ran as a model with biases, and
    mlp_ratio=2.5 was a TypeError deep inside torch."""
    with pytest.raises(ValueError, match=rf"^{setting} must be (int|bool|float), got {re.escape(repr(value))}$"):
        GPTConfig(**{"n_embd": 32, "n_head": 2, setting: value})
    assert GPTConfig(n_embd=32, n_head=2, dropout=0).dropout == 0  # an int is a float


@pytest.mark.parametrize("setting, value", [("eval_only", "false"), ("overwrite", "no"), ("batch_size", 2.5),
                                            ("max_seconds", "60"), ("n_embd", 32.0)])
def test_trainconfig_refuses_a_value_of_the_wrong_type(setting, value):
    """Built in Python, as bench/ and the tests build it: eval_only="false" evaluated and trained nothing, and
    batch_size=2.5 was a TypeError deep inside torch; only the model's own fields were checked."""
    from train import TrainConfig
    with pytest.raises(ValueError, match=rf"^{setting} must be (int|bool|float), got {re.escape(repr(value))}$"):
        TrainConfig(**{setting: value})


def test_sampleconfig_refuses_a_value_of_the_wrong_type():
    """SampleConfig(use_kv_cache="false") sampled with the cache."""
    import sample
    with pytest.raises(ValueError, match=r"^use_kv_cache must be bool, got 'false'$"):
        sample.SampleConfig(use_kv_cache="false")


@pytest.mark.parametrize("script, setting, value", [("train", "optimizer", "sgd"), ("train", "parallelism", "tp"),
                                                    ("train", "dtype", "fp32"), ("sample", "dtype", "fp32")])
def test_script_configs_refuse_a_choice_they_do_not_have(script, setting, value):
    """Built in Python, a choice is checked as the command line checks it: TrainConfig(optimizer="sgd") trained
    with AdamW alone, and dtype="fp32" was an AttributeError inside torch."""
    config_class = {"train": "TrainConfig", "sample": "SampleConfig"}[script]
    cls = getattr(importlib.import_module(script), config_class)
    choices = ", ".join(get_args(next(f.type for f in fields(cls) if f.name == setting)))
    with pytest.raises(ValueError, match=f"^unknown {setting} '{value}'; choose one of {choices}$"):
        cls(**{setting: value})


def written_module(tmp_path, monkeypatch, name, source):
    """The module `name`, its source written into tmp_path and imported from there."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_a_config_in_a_module_with_postponed_annotations_is_checked_too(tmp_path, monkeypatch):
    """`from __future__ import annotations` makes every field's type a string: check_types read the strings and
    let a forker's Config(steps="x", mode="zzz") through."""
    header = "from __future__ import annotations\nfrom dataclasses import dataclass\nfrom typing import Literal\n"
    Config = written_module(tmp_path, monkeypatch, "postponed", header +
                            "from configurator import check_types\n\n\n@dataclass\nclass Config:\n"
                            "    steps: int = 1\n    mode: Literal['a', 'b'] = 'a'\n\n"
                            "    def __post_init__(self):\n        check_types(self)\n").Config
    with pytest.raises(ValueError, match=r"^steps must be int, got 'x'$"):
        Config(steps="x")
    with pytest.raises(ValueError, match=r"^unknown mode 'zzz'; choose one of a, b$"):
        Config(mode="zzz")
    # a type named inside the function that made the class cannot be read back: unchecked, as before, not a NameError
    make = written_module(tmp_path, monkeypatch, "local_alias", header +
                          "from configurator import check_types\n\n\ndef make():\n    Mode = Literal['a', 'b']\n\n"
                          "    @dataclass\n    class Config:\n        mode: Mode = 'a'\n\n"
                          "        def __post_init__(self):\n            check_types(self)\n    return Config\n").make
    assert make()(mode="b").mode == "b"
    # ... and a subclass's own such field leaves the fields it extends checked: TrainConfig's optimizer here
    make = written_module(tmp_path, monkeypatch, "local_subclass", header +
                          "from train import TrainConfig\n\n\ndef make():\n    Schedule = Literal['cos', 'wsd']\n\n"
                          "    @dataclass\n    class Config(TrainConfig):\n        schedule: Schedule = 'cos'\n"
                          "    return Config\n").make
    with pytest.raises(ValueError, match=r"^unknown optimizer 'sgd'; choose one of adamw, muon$"):
        make()(optimizer="sgd")
    # ... but not a field such a subclass declares again with a type of its own: that type is the field's now
    make = written_module(tmp_path, monkeypatch, "local_fork", header +
                          "from train import TrainConfig\n\n\ndef make():\n"
                          "    Opt = Literal['adamw', 'muon', 'sgd']\n\n"
                          "    @dataclass\n    class Config(TrainConfig):\n        optimizer: Opt = 'sgd'\n"
                          "    return Config\n").make
    assert make()().optimizer == "sgd"


def test_a_literal_inside_optional_or_annotated_or_a_forward_reference_is_checked(tmp_path, monkeypatch):
    """typing.get_type_hints reads the Literal inside Optional["Mode"] and Annotated[...]: a reading of the
    annotations that stopped at the top level let both take any value."""
    Config = written_module(tmp_path, monkeypatch, "nested",
                            "from dataclasses import dataclass\nfrom typing import Annotated, Literal, Optional\n"
                            "from configurator import check_types\n\nMode = Literal['a', 'b']\n\n\n@dataclass\n"
                            "class Config:\n    mode: Optional['Mode'] = None\n"
                            "    kind: Annotated[Literal['x', 'y'], 'the kind'] = 'x'\n\n"
                            "    def __post_init__(self):\n        check_types(self)\n").Config
    with pytest.raises(ValueError, match=r"^unknown mode 'zzz'; choose one of a, b$"):
        Config(mode="zzz")
    with pytest.raises(ValueError, match=r"^unknown kind 'zzz'; choose one of x, y$"):
        Config(kind="zzz")


def test_a_file_named_as_a_starting_point_is_not_taken_for_it(tmp_path, monkeypatch):
    """init_from is a name before it is a path: files called scratch, resume or gpt2 in the working directory
    had made every run refuse its own default, "init_from='scratch' is a file"."""
    from model import check_init_from
    monkeypatch.chdir(tmp_path)
    for name in ("scratch", "resume", "gpt2"):
        (tmp_path / name).write_text("")
        check_init_from(name, own=("scratch", "resume"))
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ValueError, match="^init_from='weights.bin' is a file; GPT-2's weights are given as the folder"):
        check_init_from("weights.bin", own=("scratch", "resume"))


def test_an_optional_choice_may_be_left_unset():
    """Optional[Literal[...]] (as bench/train.py's dtype, where none is the config's) takes None and its choices."""
    from dataclasses import dataclass
    from typing import Literal, Optional

    from configurator import check_types

    @dataclass
    class Settings:
        dtype: Optional[Literal["float32", "bfloat16"]] = None

        def __post_init__(self):
            check_types(self)

    assert Settings().dtype is None and Settings("bfloat16").dtype == "bfloat16"
    with pytest.raises(ValueError, match="^unknown dtype 'bf16'; choose one of float32, bfloat16$"):
        Settings("bf16")


def test_num_params_and_flops_per_token_count_what_the_model_computes():
    """The parameter count (without the position table by default) and the 6N + 12·L·C·T rule that MFU and
    bench/train.py's tokens-per-FLOP rest on, worked out here from the shapes."""
    L, H, C, T, V, R = 2, 2, 32, 16, 50, 3
    for positions in ("learned", "rope"):
        model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C, mlp_ratio=R, bias=False,
                              norm="rmsnorm", pos_embedding=positions))
        matrices = L * (4 + 2 * R) * C * C + V * C  # attention's four, the MLP's two, the tied embedding
        gains = (2 * L + 1) * C  # RMSNorm's: before attention, before the MLP, before the head
        table = T * C if positions == "learned" else 0
        assert (model.num_params(non_embedding=False), model.num_params()) == (matrices + gains + table,
                                                                               matrices + gains), positions
        # 2 FLOPs a weight forward and 4 backward; q·kᵀ and weights·v, 2·T·C each a layer forward, 3x with
        # backward
        assert model.flops_per_token() == 6 * (matrices + gains) + 3 * L * 2 * (2 * T * C), positions


def test_sample_next_top_k_one_is_greedy():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        assert torch.equal(sample_next(logits, 1.0, top_k=1, generator=g), logits.argmax(-1, keepdim=True))
    tied = torch.tensor([[1.0, 1.0, 0.0, 1.0]])  # bf16 logits tie often: still one token for top_k=1, two for 2
    assert len({int(sample_next(tied, 1.0, top_k=1, generator=g)) for _ in range(50)}) == 1
    assert len({int(sample_next(tied, 1.0, top_k=2, generator=g)) for _ in range(100)}) == 2


def test_sample_next_small_top_p_keeps_only_the_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 0.1  # nearly flat
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        assert torch.equal(sample_next(logits, 1.0, top_p=1e-3, generator=g), logits.argmax(-1, keepdim=True))


def test_sample_next_top_p_keeps_the_smallest_set_that_reaches_it():
    """Two tokens of probability exactly 0.5: top_p=0.5 is reached by one of them, so the other never comes."""
    logits = torch.tensor([[0.0, 0.0, -1e9]])
    g = torch.Generator().manual_seed(0)
    assert len({int(sample_next(logits, 1.0, top_p=0.5, generator=g)) for _ in range(200)}) == 1


def test_a_one_token_context_samples_as_a_bigram_model():
    """block_size=1: each token sees only the one before it, and the window moves by one token, never by none."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=1, n_layer=1, n_head=1, n_embd=8)).eval()
    with torch.no_grad():
        cached = model.generate(torch.tensor([[3]]), 4, temperature=0)
        assert torch.equal(cached, model.generate(torch.tensor([[3]]), 4, temperature=0, use_kv_cache=False))
        step = {int(t): int(model(torch.tensor([[t]]))[0][0, -1].argmax()) for t in range(8)}  # the bigram table
    assert cached[0].tolist() == [3, step[3], step[step[3]], step[step[step[3]]], step[step[step[step[3]]]]]


def test_sample_next_top_k_and_top_p_keep_the_right_sets():
    # probabilities 0.05, 0.5, 0.15, 0.3 at shuffled positions: the smallest set reaching 0.7 is {1, 3}
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log().repeat(2, 1)
    g = torch.Generator().manual_seed(0)
    top_p = {int(sample_next(logits, 1.0, top_p=0.7, generator=g)[0]) for _ in range(200)}
    assert top_p == {1, 3}
    top_k = {int(sample_next(logits, 1.0, top_k=3, generator=g)[1]) for _ in range(200)}
    assert top_k == {1, 3, 2}
    everything = {int(sample_next(logits, 1.0, generator=g)[0]) for _ in range(400)}
    assert everything == {0, 1, 2, 3}


def test_sample_next_draws_each_token_with_its_probability():
    """20,000 draws from p = softmax(logits / T): every frequency within 4 standard errors of p."""
    probs = torch.tensor([0.02, 0.08, 0.1, 0.3, 0.5, 0.0])
    logits = probs.clamp(min=1e-30).log().repeat(20_000, 1) * 0.5  # divided by temperature 0.5: p again
    drawn = sample_next(logits, temperature=0.5, generator=torch.Generator().manual_seed(0))[:, 0]
    frequency = torch.bincount(drawn, minlength=6).float() / 20_000
    tolerance = 4 * (probs * (1 - probs) / 20_000).sqrt() + 1e-9  # 0.005 for p = 0.5
    assert ((frequency - probs).abs() <= tolerance).all(), frequency


@pytest.mark.parametrize("temperature, top_k, top_p, kept", [
    # top_k=2 leaves tokens 1 and 3 at 0.625 and 0.375: top_p=0.6 of those keeps 1 alone (of the
    # untruncated probabilities it would keep 1 and 3)
    (1.0, 2, 0.6, [1]),
    # at temperature 0.5 the probabilities are p² renormalised, 0.685 for token 1, which reaches 0.6
    # alone (at temperature 1, 1 and 3 are needed)
    (0.5, None, 0.6, [1]),
    # at temperature 2, √p renormalised: 0.38, 0.29, 0.21 for tokens 1, 3, 2; three reach 0.7 (at
    # temperature 1, two do)
    (2.0, None, 0.7, [1, 3, 2]),
    # both, at temperature 2: top_k=3 renormalises 1, 3, 2 to 0.43, 0.33, 0.24, and two of them reach 0.7
    (2.0, 3, 0.7, [1, 3]),
], ids=["top_k-then-top_p", "cold-top_p", "hot-top_p", "hot-top_k-then-top_p"])
def test_sample_next_applies_temperature_then_top_k_then_top_p(temperature, top_k, top_p, kept):
    """The order of the truncations: the temperature first, then top_k, then top_p on what top_k left,
    renormalised; each token kept is then drawn with its renormalised probability (20,000 draws, every
    frequency within 4 standard errors; the others never)."""
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    expected = probs ** (1 / temperature)
    expected[[i for i in range(4) if i not in kept]] = 0
    expected /= expected.sum()
    logits = probs.log().repeat(20_000, 1)
    drawn = sample_next(logits, temperature, top_k, top_p, generator=torch.Generator().manual_seed(0))[:, 0]
    frequency = torch.bincount(drawn, minlength=4).float() / 20_000
    assert set(drawn.tolist()) == set(kept)
    tolerance = 4 * (expected * (1 - expected) / 20_000).sqrt() + 1e-9
    assert ((frequency - expected).abs() <= tolerance).all(), (frequency, expected)


# --------------------------------------------------------------------------- sample.py's options

SEPARATOR = "\n---------------\n"


@pytest.fixture(scope="module")
def sampling_out_dir(tmp_path_factory, data_dir):
    """An out_dir whose ckpt.pt holds what sample.py reads of train.py's: a small model with random
    weights (make_gpt's), its config and data_dir's character tokenizer. Written here rather than
    trained, so that it is cheap and the distributions are far from flat and far from one-hot."""
    meta = json.loads((data_dir / "meta.json").read_text())
    model = make_gpt("manual", vocab_size=meta["vocab_size"], std=0.3)
    out = tmp_path_factory.mktemp("out")
    save_checkpoint({"model": model.state_dict(), "model_config": asdict(model.config), "tokenizer": meta},
                    str(out / "ckpt.pt"))
    return out


def sample_py(launch, out_dir, *args):
    """The three samples (prompt and continuation each) that `python sample.py ARGS` writes from
    out_dir/ckpt.pt: 30 new tokens after "All", past the end of the 16-token window."""
    proc = check_ok(launch("sample.py", f"--out_dir={out_dir}", "--device=cpu", "--dtype=float32", "--start=All",
                           "--max_new_tokens=30", "--num_samples=3", *args))
    samples = proc.stdout.split(SEPARATOR)
    assert len(samples) == 4 and samples[-1] == "", proc.stdout
    return samples[:3]


def test_sample_py_draws_each_sample_the_same_whatever_num_samples_is(launch, sampling_out_dir):
    """Sample i of a seed does not depend on how many are drawn with it (the noise was drawn for the whole
    batch at once: --num_samples=1 began otherwise than --num_samples=3), nor on the cache; other seeds
    and other rows draw otherwise."""
    three = sample_py(launch, sampling_out_dir, "--temperature=1.5")
    one = check_ok(launch("sample.py", f"--out_dir={sampling_out_dir}", "--device=cpu", "--dtype=float32",
                          "--start=All", "--max_new_tokens=30", "--num_samples=1", "--temperature=1.5")).stdout
    assert one.split(SEPARATOR)[0] == three[0] and len(set(three)) == 3, (one, three)
    assert sample_py(launch, sampling_out_dir, "--temperature=1.5", "--use_kv_cache=false") == three
    assert sample_py(launch, sampling_out_dir, "--temperature=1.5", "--seed=1338")[0] != three[0]


def test_a_generator_per_row_draws_each_row_as_it_would_alone():
    model = make_gpt("manual", vocab_size=32, std=0.3)
    prompt = rand_tokens(3, 5, vocab=32)
    seeds = [7, 8, 9]
    rows = model.generate(prompt, 20, temperature=1.5, generator=[torch.Generator().manual_seed(s) for s in seeds])
    alone = [model.generate(prompt[i:i + 1], 20, temperature=1.5, generator=torch.Generator().manual_seed(s))
             for i, s in enumerate(seeds)]
    assert torch.equal(rows, torch.cat(alone)) and not torch.equal(rows[0, 5:], rows[1, 5:])
    with pytest.raises(ValueError, match="2 generators for 3 rows: give one per row, or one for them all"):
        model.generate(prompt, 2, generator=[torch.Generator(), torch.Generator()])


@pytest.mark.parametrize("truncation", [["--top_k=1"], ["--top_p=0.001", "--top_k=none"]], ids=["top_k", "top_p"])
def test_sample_py_top_k_one_and_a_tiny_top_p_decode_greedily(launch, sampling_out_dir, truncation):
    """--top_k=1, or a top_p that only the most likely token reaches, leaves one token to draw: sample.py
    then writes, at a hot temperature and with any seed, what greedy decoding (--temperature=0) writes;
    without the flag, the same run samples something else. Shows that the flag reaches the sampler."""
    greedy = sample_py(launch, sampling_out_dir, "--temperature=0", "--seed=2")
    assert len(set(greedy)) == 1, "greedy decoding writes the same for every sample of a batch"
    hot = ["--temperature=1.5", "--seed=1"]
    assert sample_py(launch, sampling_out_dir, *hot, *truncation) == greedy
    assert all(sample != greedy[0] for sample in sample_py(launch, sampling_out_dir, *hot)), \
        "sampling without the truncation writes what greedy decoding writes: the test proves nothing"


def test_sample_py_samples_with_the_top_k_and_top_p_it_is_given(launch, sampling_out_dir, data_dir):
    """sample.py's samples are model.generate's, same seed (a generator per sample), with the temperature,
    top_k and top_p of its flags: values that each truncate this model's distributions, so that without
    either of them generate samples something else."""
    from sample import sample_generators
    options = dict(temperature=1.3, top_k=5, top_p=0.8)
    samples = sample_py(launch, sampling_out_dir, "--seed=3", *(f"--{k}={v}" for k, v in options.items()))
    checkpoint = load_checkpoint(str(sampling_out_dir / "ckpt.pt"))
    model = model_from_checkpoint(checkpoint, "ckpt.pt").eval()
    tokenizer = tokenizer_from_meta(checkpoint["tokenizer"])

    def generate(**sampling):
        rows = model.generate(torch.tensor([tokenizer.encode("All")] * 3), 30, vocab_size=tokenizer.vocab_size,
                              generator=sample_generators(3, 3, "cpu"), **sampling)
        return [tokenizer.decode(row) for row in rows.tolist()]

    assert samples == generate(**options)
    assert generate(**{**options, "top_k": None}) != samples, "top_k=5 changes nothing here: the test proves nothing"
    assert generate(**{**options, "top_p": None}) != samples, "top_p=0.8 changes nothing here: the test proves nothing"


def test_an_attention_map_runs_a_flash_checkpoint_by_the_hand_written_path(sampling_out_dir, tmp_path):
    """Both GPU configs train with attention="flash", which on CUDA needs half precision; a map runs in
    float32, so sample.py runs it by the hand-written path, which the map's numbers come from anyway.
    Sampling keeps the checkpoint's backend, and --attention still chooses, for a page's continuation too; a
    picture's weights come from the hand-written path alone, which it runs whatever --attention says."""
    import sample
    checkpoint = load_checkpoint(str(sampling_out_dir / "ckpt.pt"))
    checkpoint["model_config"]["attention"] = "flash"
    save_checkpoint(checkpoint, str(tmp_path / "ckpt.pt"))

    def backend(**options):
        model, _ = sample.load_model(sample.SampleConfig(out_dir=str(tmp_path), **options))
        return model.config.attention

    assert backend(attention_map=str(tmp_path / "attn.html")) == "manual"
    check_backend("manual", "cuda", torch.float32)  # what sample.py then checks on a GPU: it runs
    with pytest.raises(ValueError, match="needs float16 or bfloat16"):
        check_backend("flash", "cuda", torch.float32)
    assert backend() == "flash"
    assert backend(attention_map=str(tmp_path / "attn.html"), attention="sdpa") == "sdpa"
    assert backend(attention_map=str(tmp_path / "attn.png"), attention="sdpa") == "manual"


@pytest.mark.parametrize("num_samples, use_kv_cache", [(3, True), (3, False), (1, True)])
def test_compile_warms_up_every_shape_that_sampling_then_meets(sampling_out_dir, monkeypatch, capsys, num_samples,
                                                               use_kv_cache):
    """sample.py --compile=true compiles each graph while warming up, none mid-stream: the forwards of
    sampling (past the window's end) have no shape the warm-up's lacked. A shape as dynamic=True tells
    graphs apart: sizes 0 and 1 specialised, larger ones one symbol; the batch, and the cache or none."""
    import sample
    cfg = sample.SampleConfig(out_dir=str(sampling_out_dir), device="cpu", num_samples=num_samples,
                              use_kv_cache=use_kv_cache, max_new_tokens=40, compile=True)
    model, tokenizer = sample.load_model(cfg)
    shapes, forward = [], GPT.forward

    def recorded(self, idx, targets=None, kv_cache=None, last_only=False):
        shapes.append((min(idx.size(0), 2), min(idx.size(1), 2), kv_cache and min(kv_cache[0].pos, 2)))
        return forward(self, idx, targets, kv_cache, last_only)

    monkeypatch.setattr(GPT, "forward", recorded)
    monkeypatch.setattr(sample, "compile_for_decoding", lambda model: None)
    ids = tokenizer.encode("All")
    sample.compile_and_warm_up(model, ids, cfg)
    warmed_up = set(shapes)
    shapes.clear()
    sample.write_samples(model, tokenizer, "All", ids, cfg)
    assert len(shapes) == 40 and set(shapes) <= warmed_up, (set(shapes) - warmed_up, warmed_up)


def test_sampling_without_the_cache_never_makes_one(sampling_out_dir, monkeypatch, capsys):
    """use_kv_cache=False (sample.py --use_kv_cache=false) runs the whole window for every token: the reference
    that each "cached == uncached" test compares with. A stream that made a cache anyway, or sample.py passing
    True whatever the flag said, left those tests comparing the cache with itself, and passing."""
    import sample
    cfg = sample.SampleConfig(out_dir=str(sampling_out_dir), device="cpu", use_kv_cache=False, max_new_tokens=10)
    model, tokenizer = sample.load_model(cfg)
    ids = tokenizer.encode("All")
    monkeypatch.setattr(GPT, "new_kv_cache", lambda self: pytest.fail("a KV cache was made"))
    assert model.generate(torch.tensor([ids]), 5, use_kv_cache=False).shape == (1, len(ids) + 5)
    sample.write_samples(model, tokenizer, "All", ids, cfg)
    assert capsys.readouterr().out.count("All") == cfg.num_samples


def test_a_compile_that_fails_without_a_message_is_one_line(sampling_out_dir, monkeypatch, capsys):
    """Inductor's bare asserts raise an AssertionError that says nothing: sample.py's line about the
    failed compile took the first line of an empty message, an IndexError's traceback."""
    import sample
    cfg = sample.SampleConfig(out_dir=str(sampling_out_dir), device="cpu", compile=True)
    model, tokenizer = sample.load_model(cfg)
    monkeypatch.setattr(sample, "compile_for_decoding", lambda model: None)
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError()))
    with pytest.raises(SystemExit) as exit:
        sample.compile_and_warm_up(model, tokenizer.encode("All"), cfg)
    assert exit.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --compile=true: torch.compile failed here (AssertionError); sample with --compile=false")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linears_packed_for_decoding_compute_what_the_model_does(dtype, monkeypatch):
    """sample.py's packed Linears (oneDNN's layout) give the plain model's logits, to the dtype's rounding, and
    greedy decoding writes the same tokens, with the cache and without: each packed copy is its own Linear's
    weight and bias (another layer's, or a transposed one, would move every logit)."""
    import copy

    import sample
    monkeypatch.setattr(sample, "last_level_cache_bytes", lambda: 0)  # fp32 too, as for weights beyond the cache
    model = make_gpt("manual", std=0.3).to(dtype)
    packed, rng = copy.deepcopy(model), torch.get_rng_state()
    assert sample.pack_for_decoding(packed, dtype)
    assert torch.equal(torch.get_rng_state(), rng), "packing drew from torch's generator, which sampling may use"
    assert {type(m).__name__ for m in packed.modules()} >= {"PackedLinear"} and \
        not any(type(m) is torch.nn.Linear for m in packed.modules())
    prompt = rand_tokens(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(packed(prompt)[0], model(prompt)[0])
    for use_kv_cache in (True, False):
        assert torch.equal(packed.generate(prompt, 24, temperature=0, use_kv_cache=use_kv_cache),
                           model.generate(prompt, 24, temperature=0, use_kv_cache=use_kv_cache))


def test_sample_py_packs_its_linears_only_where_that_pays_and_computes_the_same(sampling_out_dir, monkeypatch,
                                                                               capsys):
    """On a CPU: bf16 at any size, fp32 once the weights outgrow the last-level cache, nothing on a GPU;
    sample.py then samples from the packed model what it samples from the plain one (here: where it would
    compile, a stub). A packed op that computes otherwise here (another torch, another oneDNN) leaves every
    Linear as it was."""
    import sample
    cpu, cache = torch.device("cpu"), 1000
    monkeypatch.setattr(sample, "last_level_cache_bytes", lambda: cache)
    assert sample.packing_pays(cpu, torch.bfloat16, 10) and sample.packing_pays(cpu, torch.float32, cache + 1)
    assert not sample.packing_pays(cpu, torch.float32, cache) and not sample.packing_pays(torch.device("cuda"),
                                                                                          torch.bfloat16, 10**9)
    linear_bytes = sum(m.weight.nbytes for m in make_gpt("manual").modules() if type(m) is torch.nn.Linear)
    for cache, packed in ((linear_bytes - 1, True), (linear_bytes, False)):  # every Linear's weights together
        monkeypatch.setattr(sample, "last_level_cache_bytes", lambda: cache)
        assert sample.pack_for_decoding(make_gpt("manual"), torch.float32) == packed, cache
    packs, pack = [], sample.pack_for_decoding
    monkeypatch.setattr(sample, "pack_for_decoding", lambda model, dtype: packs.append((dtype, pack(model, dtype))))
    monkeypatch.setattr(sample, "compile_and_warm_up", lambda model, ids, cfg: None)
    written = []
    for compile in (False, True):
        sample.main(sample.SampleConfig(out_dir=str(sampling_out_dir), device="cpu", dtype="bfloat16",
                                        max_new_tokens=20, temperature=0.8, compile=compile))
        written.append(capsys.readouterr().out)
    assert packs == [(torch.bfloat16, True)] and written[0] == written[1] and written[0].count(SEPARATOR) == 2
    model = make_gpt("manual").to(torch.bfloat16)
    monkeypatch.setattr(sample.PackedLinear, "forward", lambda self, x: torch.zeros(()))
    assert not pack(model, torch.bfloat16) and not any(type(m).__name__ == "PackedLinear" for m in model.modules())


# --------------------------------------------------------------------------- configuration


def test_config_rejects_n_embd_not_divisible_by_n_head():
    with pytest.raises(ValueError, match="n_embd=30 must be divisible by n_head=4"):
        GPTConfig(n_embd=30, n_head=4)


def test_every_backend_that_runs_on_a_cpu_is_tested_here():
    """CPU_BACKENDS, which every model-level property runs over, is exactly the backends that
    attention.check_backend lets run on a CPU (in some dtype): a new one cannot escape the tests."""
    assert set(CPU_BACKENDS) == backends_that_run_on_a_cpu()


@pytest.mark.parametrize("field, typo", [("attention", "flash3"), ("norm", "RMSNorm"), ("pos_embedding", "alibi"),
                                         ("activation", "silu")])
def test_config_rejects_a_choice_it_does_not_have_listing_the_choices(field, typo):
    """The model branches on these names; an unknown one would quietly build another branch's model. The
    choices listed are the Literal's, so a fork's new choice is listed without an edit here."""
    choices = ", ".join(get_args(next(f.type for f in fields(GPTConfig) if f.name == field)))
    with pytest.raises(ValueError, match=f"unknown {field} '{typo}'; choose one of {choices}$"):
        GPTConfig(**{field: typo})


@pytest.mark.parametrize("field", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
def test_config_rejects_non_positive_sizes(field):
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{field: 0})


def test_config_rejects_dropout_outside_unit_interval():
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)


def test_flash_with_dropout_fails_clearly_when_training_on_cpu():
    model = make_gpt("flash", std=0, dropout=0.1).train()
    with pytest.raises(ValueError, match="dropout"):
        model(rand_tokens(B, 8))


def test_gpt_drops_the_embeddings_and_each_residual_branch_at_its_rate():
    """GPTConfig(dropout=0.2) while training (not 0.5, where p and 1 - p agree): the embeddings, and in
    every block the attention's and the MLP's output, each lose a fifth of their entries, the rest
    scaled by 1 / 0.8; seen around each site in one forward (attention's weights: test_attention.py)."""
    p = 0.2
    model = make_gpt("manual", dropout=p).train()
    idx = rand_tokens(8, 16)
    outputs = {}  # module -> its output, and the embeddings as the first block gets them
    model.transformer.h[0].register_forward_pre_hook(lambda block, args: outputs.update(embedded=args[0]))
    branches = [branch for block in model.transformer.h for branch in (block.attn, block.mlp)]
    for module in branches + [branch.c_proj for branch in branches]:
        module.register_forward_hook(lambda module, args, output: outputs.update({module: output}))
    with torch.no_grad():
        model(idx)
        embedded = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(16))
    assert_dropout(embedded, outputs["embedded"], p, "embeddings")
    for branch in branches:  # the branch's output is its c_proj's, dropped
        assert_dropout(outputs[branch.c_proj], outputs[branch], p, type(branch).__name__)


# --------------------------------------------------------------------------- options beyond GPT-2

@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu2"])
def test_activation_is_gpt2s_tanh_gelu_the_exact_one_or_relu_squared(activation):
    """Each setting computes its own formula, written out here; the two GELUs differ by up to 5e-4, far
    above the tolerance, so an ignored or swapped setting shows."""
    mlp = MLP(GPTConfig(n_embd=16, n_head=2, activation=activation)).double()
    x = torch.randn(4, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    h = mlp.c_fc(x)
    if activation == "gelu_tanh":  # GPT-2's: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    elif activation == "gelu":  # h * Phi(h), Phi the standard normal's distribution function
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    else:  # max(h, 0)^2
        h = torch.where(h > 0, h * h, torch.zeros_like(h))
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), mlp.c_proj(h), atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm, norm_class", [("layernorm", torch.nn.LayerNorm), ("rmsnorm", torch.nn.RMSNorm)])
def test_norm_setting_builds_that_norm_before_attention_mlp_and_head(norm, norm_class):
    """norm= picks the class of every norm in the model, ln_1 and ln_2 of each block and ln_f, so a
    setting that is read but not used shows; RMSNorm has a gain and no bias, LayerNorm both."""
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, norm=norm))
    norms = [n for block in model.transformer.h for n in (block.ln_1, block.ln_2)] + [model.transformer.ln_f]
    assert [type(n) for n in norms] == [norm_class] * 5
    norm_keys = [key for key in model.state_dict() if key.split(".")[-2].startswith("ln_")]
    assert len([key for key in norm_keys if key.endswith(".weight")]) == 5
    assert len([key for key in norm_keys if key.endswith(".bias")]) == (5 if norm == "layernorm" else 0)
    unbiased = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, norm=norm, bias=False))
    assert [key for key in unbiased.state_dict() if key.endswith(".bias")] == []  # bias=False: the norms' too


def test_rmsnorm_divides_by_the_root_mean_square_and_scales_by_its_gain():
    """x / sqrt(mean(x^2) + eps) * g, eps the dtype's own: its class alone said nothing of its arithmetic (an
    eps of 1e-2 swamps a residual stream of RMS ~0.02, as at initialisation)."""
    torch.manual_seed(0)
    norm = make_norm(GPTConfig(n_embd=8, n_head=1, norm="rmsnorm"))
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = 0.02 * torch.randn(3, 5, 8)
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(norm(x), x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * norm.weight)


VARIANTS = {
    "rope": dict(pos_embedding="rope"),
    "rope-rmsnorm-qknorm": dict(pos_embedding="rope", norm="rmsnorm", qk_norm=True),
    "learned-qknorm": dict(qk_norm=True),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_stay_causal_and_cache_consistent(backend, variant):
    """The same causality and KV-cache properties with rotary embeddings, RMSNorm and QK-norm, where
    a wrong rotary offset under the cache, or a norm mixing positions, would show."""
    model = make_gpt(backend, std=0.3, **VARIANTS[variant])
    idx = rand_tokens(B, 16, seed=11)
    with torch.no_grad():
        for w in model.attention_weights(idx):
            assert_causal_weights(w)
        full, _ = model(idx)  # through the backend itself, not the weights path
        for t in (0, 5, 15):
            idx2 = idx.clone()
            idx2[:, t:] = (idx[:, t:] + 1) % 64
            logits2, _ = model(idx2)
            torch.testing.assert_close(logits2[:, :t], full[:, :t], atol=1e-6, rtol=0)
            assert torch.all((logits2[:, t] - full[:, t]).abs().amax(-1) > 1e-2)
        cache = model.new_kv_cache()
        model(idx[:, :6], kv_cache=cache)
        for t in range(6, 16):
            logits, _ = model(idx[:, t:t + 1], kv_cache=cache)
            torch.testing.assert_close(logits[:, 0], full[:, t], atol=1e-5, rtol=0, msg=f"position {t}")
        model = make_gpt(backend, std=0.5, **VARIANTS[variant])  # sharper, for varied greedy text
        prompt = idx[:, :5]
        cached = model.generate(prompt, 30, temperature=0, use_kv_cache=True)
        assert torch.equal(cached, model.generate(prompt, 30, temperature=0, use_kv_cache=False))
        assert cached[:, 5:].unique().numel() >= 5
