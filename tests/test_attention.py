"""Tests of attention.py: the causal mask, the three CPU backends (manual, sdpa, flash), the KV
cache, cross-attention, the backend checks, and the code around the flash-attn package's call (fa2,
fa3), with the package, which needs a GPU, stood in for by its contract written with SDPA.

Every property is checked on every backend that runs on CPU, in fp32, with batch > 1. Expected
values come from `reference_attention`, an explicit per-query loop that slices the visible keys
instead of masking, so it shares no masking code with attention.py.
"""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attention import (KVCache, MultiHeadAttention, apply_rotary, causal_mask, check_backend,
                       manual_attention)
from helpers import assert_causal_weights, assert_dropout, backends_that_run_on_a_cpu
from model import GPT, GPTConfig

CPU_BACKENDS = ["manual", "sdpa", "flash"]
FUSED_BACKENDS = ["sdpa", "flash"]  # compared against "manual"
B, C, NH, BLOCK = 2, 32, 4, 16
HS = C // NH
ATOL = 1e-5


def make_mha(backend, seed=0, causal=True, bias=True, qk_norm=False):
    """A small attention layer in eval mode; the same seed gives the same weights on every backend."""
    torch.manual_seed(seed)
    return MultiHeadAttention(C, NH, dropout=0.0, bias=bias, backend=backend, causal=causal, qk_norm=qk_norm).eval()


def clone_as(m, backend):
    twin = MultiHeadAttention(C, NH, dropout=0.0, bias=m.c_attn.bias is not None,
                              backend=backend, causal=m.causal, qk_norm=m.qk_norm).eval()
    twin.load_state_dict(m.state_dict())
    return twin


def with_weights(m, x, **kwargs):
    """(y, attention weights) of m(x): the keep_weights flag routes it through manual_attention."""
    m.keep_weights = True
    try:
        return m(x, **kwargs), m.weights
    finally:
        m.keep_weights = False


def rand(*shape, seed=1, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_(requires_grad)


def reference_attention(m, x, context=None, causal=True, q_start=0):
    """Attention written as a loop over queries. Self-attention: queries are x[:, q_start:], keys
    and values all of x, and the query at absolute position p sees keys 0..p (a KV cache holding
    x[:, :q_start] is the same thing). Cross-attention: keys and values from `context`, no mask.
    With m.qk_norm, each head's queries and keys are scaled to unit RMS first."""
    Wq, Wk, Wv = m.c_attn.weight.split(C)
    bq, bk, bv = m.c_attn.bias.split(C) if m.c_attn.bias is not None else (None, None, None)
    src = x if context is None else context
    heads = lambda t: t.view(t.size(0), t.size(1), NH, HS).transpose(1, 2)  # (B, nh, T, hs)
    q = heads(F.linear(x, Wq, bq))[:, :, q_start:]
    k, v = heads(F.linear(src, Wk, bk)), heads(F.linear(src, Wv, bv))
    if m.qk_norm:
        q, k = (t / t.pow(2).mean(-1, keepdim=True).add(torch.finfo(t.dtype).eps).sqrt() for t in (q, k))
    rows = []
    for i in range(q.size(2)):
        n = q_start + i + 1 if (causal and context is None) else k.size(2)  # keys this query sees
        scores = q[:, :, i:i + 1] @ k[:, :, :n].transpose(-2, -1) / math.sqrt(HS)  # (B, nh, 1, n)
        rows.append(scores.softmax(-1) @ v[:, :, :n])
    y = torch.cat(rows, dim=2).transpose(1, 2).reshape(x.size(0), -1, C)
    return m.c_proj(y)


def grads(out, inputs, params, seed=7):
    """Gradients of a random projection of `out` w.r.t. inputs and parameters."""
    r = rand(*out.shape, seed=seed)
    return torch.autograd.grad((out * r).sum(), list(inputs) + list(params), retain_graph=True)


# --------------------------------------------------------------------------- the mask itself


@pytest.mark.parametrize("tq,tk", [(1, 1), (4, 4), (16, 16), (1, 5), (2, 5), (5, 9)])
def test_causal_mask_is_bottom_right_aligned(tq, tk):
    mask = causal_mask(tq, tk)
    expected = torch.tensor([[j <= tk - tq + i for j in range(tk)] for i in range(tq)])
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("tq,tk", [(8, 8), (3, 8), (1, 8)])
def test_manual_attention_masked_weights_exactly_zero_rows_sum_to_one(tq, tk):
    q, k, v = rand(B, NH, tq, HS, seed=1), rand(B, NH, tk, HS, seed=2), rand(B, NH, tk, HS, seed=3)
    y, w = manual_attention(q, k, v, causal_mask(tq, tk))
    assert w.shape == (B, NH, tq, tk)
    assert_causal_weights(w, q_start=tk - tq)
    torch.testing.assert_close(y, w @ v, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- weights, per backend


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kept_weights_masked_exactly_zero_rows_sum_to_one(backend):
    m = make_mha(backend)
    x = rand(B, 12, C)
    with torch.no_grad():
        y_w, w = with_weights(m, x)
        y = m(x)
    assert m.weights is None, "weights are kept only while keep_weights is set"
    assert w.shape == (B, NH, 12, 12)
    assert_causal_weights(w)
    torch.testing.assert_close(y_w, y, atol=ATOL, rtol=0)  # the weights path computes the same output
    torch.testing.assert_close(y, reference_attention(m, x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kept_weights_with_kv_cache_masks_bottom_right(backend):
    m = make_mha(backend)
    x = rand(B, 9, C)
    with torch.no_grad():
        cache = KVCache(BLOCK)
        m(x[:, :5], kv_cache=cache)
        y, w = with_weights(m, x[:, 5:8], kv_cache=cache)  # queries at positions 5, 6, 7
        y1, w1 = with_weights(m, x[:, 8:], kv_cache=cache)  # one query at position 8
    assert w.shape == (B, NH, 3, 8) and w1.shape == (B, NH, 1, 9)
    assert_causal_weights(w, q_start=5)
    assert_causal_weights(w1, q_start=8)
    torch.testing.assert_close(y, reference_attention(m, x[:, :8], q_start=5), atol=ATOL, rtol=0)
    torch.testing.assert_close(y1, reference_attention(m, x, q_start=8), atol=ATOL, rtol=0)
    with torch.no_grad():  # and the backend's own path, which keep_weights bypasses, on the same cache
        cache = KVCache(BLOCK)
        m(x[:, :5], kv_cache=cache)
        torch.testing.assert_close(m(x[:, 5:8], kv_cache=cache), y, atol=ATOL, rtol=0)
        torch.testing.assert_close(m(x[:, 8:], kv_cache=cache), y1, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- causality


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_changing_future_inputs_leaves_earlier_outputs_unchanged(backend):
    T = 12
    m = make_mha(backend)
    x = rand(B, T, C, seed=1)
    with torch.no_grad():
        y = m(x)
        for t in (0, 1, 5, T - 1):
            x2 = x.clone()
            x2[:, t:] = rand(B, T - t, C, seed=100 + t)
            y2 = m(x2)
            torch.testing.assert_close(y2[:, :t], y[:, :t], atol=1e-6, rtol=0,
                                       msg=f"changing inputs from {t} on changed an earlier output")
            change = (y2[:, t] - y[:, t]).abs().amax(-1)  # per batch element
            assert torch.all(change > 1e-3), f"the output at {t} ignores its own input"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_output_gradient_is_exactly_zero_for_future_inputs(backend):
    T = 10
    m = make_mha(backend)
    x = rand(B, T, C, requires_grad=True)
    y = m(x)
    r = rand(C, seed=3)
    for b in range(B):
        for i in range(T):
            (g,) = torch.autograd.grad((y[b, i] * r).sum(), x, retain_graph=True)
            assert torch.all(g[b, i + 1:] == 0), f"output {i} has a gradient from a future input"
            assert torch.all(g[:b] == 0) and torch.all(g[b + 1:] == 0), "batch elements leak into each other"
            per_pos = g[b, :i + 1].abs().amax(-1)
            assert torch.all(per_pos > 1e-7), f"output {i} does not depend on some input j <= {i}: {per_pos}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gradient_with_kv_cache_is_zero_for_later_queries(backend):
    m = make_mha(backend)
    x = rand(B, 10, C)
    cache = KVCache(BLOCK)
    with torch.no_grad():
        m(x[:, :6], kv_cache=cache)
    xq = x[:, 6:].clone().requires_grad_(True)  # queries at positions 6..9 after a cache of 6
    y = m(xq, kv_cache=cache)
    r = rand(C, seed=3)
    for i in range(4):
        (g,) = torch.autograd.grad((y[:, i] * r).sum(), xq, retain_graph=True)
        assert torch.all(g[:, i + 1:] == 0), f"cached query {i} has a gradient from a later query"
        assert torch.all(g[:, :i + 1].abs().amax(-1) > 1e-7)


# --------------------------------------------------------------------------- backends agree


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_backend_matches_manual_outputs_and_gradients(backend):
    ref = make_mha("manual")
    m = clone_as(ref, backend)
    for T in (1, 2, 7, BLOCK):  # 2: the shortest window a causal mask changes
        x_ref = rand(B, T, C, seed=T, requires_grad=True)
        x = x_ref.detach().clone().requires_grad_(True)
        y_ref, y = ref(x_ref), m(x)
        torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
        g_ref = grads(y_ref, [x_ref], ref.parameters())
        g = grads(y, [x], m.parameters())
        for a, e in zip(g, g_ref):
            torch.testing.assert_close(a, e, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backend_matches_reference(backend):
    m = make_mha(backend)
    x = rand(B, BLOCK, C)
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference_attention(m, x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("prefix,tq", [(5, 3), (1, 6), (4, 1), (15, 1), (8, 8), (10, 2)])
def test_kv_cache_queries_match_full_computation(backend, prefix, tq):
    """Queries after a cache (Tq < Tk, and Tq == 1) see exactly the keys up to their own position."""
    ref = make_mha("manual")
    m = clone_as(ref, backend)
    x = rand(B, prefix + tq, C)
    with torch.no_grad():
        full = ref(x)
        cache = KVCache(BLOCK)
        m(x[:, :prefix], kv_cache=cache)
    xq = x[:, prefix:].clone().requires_grad_(True)
    y = m(xq, kv_cache=cache)
    assert cache.pos == prefix + tq
    torch.testing.assert_close(y, full[:, prefix:], atol=ATOL, rtol=0)
    torch.testing.assert_close(y, reference_attention(m, x, q_start=prefix), atol=ATOL, rtol=0)

    # gradients w.r.t. the new inputs and the parameters agree with the manual backend's
    cache_ref = KVCache(BLOCK)
    with torch.no_grad():
        ref(x[:, :prefix], kv_cache=cache_ref)
    xq_ref = x[:, prefix:].clone().requires_grad_(True)
    y_ref = ref(xq_ref, kv_cache=cache_ref)
    for a, e in zip(grads(y, [xq], m.parameters()), grads(y_ref, [xq_ref], ref.parameters())):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kv_cache_fed_in_uneven_chunks_matches_full(backend):
    m = make_mha(backend)
    x = rand(B, BLOCK, C)
    with torch.no_grad():
        full = reference_attention(m, x)
        cache, start, outs = KVCache(BLOCK), 0, []
        for n in (3, 1, 4, 2, 1, 5):
            outs.append(m(x[:, start:start + n], kv_cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tq,tk", [(5, 9), (9, 5), (1, 7), (6, 6)])
def test_cross_attention_sees_all_of_context(backend, bias, tq, tk):
    ref = make_mha("manual", bias=bias)
    m = clone_as(ref, backend)
    x_ref, c_ref = rand(B, tq, C, seed=1, requires_grad=True), rand(B, tk, C, seed=2, requires_grad=True)
    x, c = (t.detach().clone().requires_grad_(True) for t in (x_ref, c_ref))
    y = m(x, context=c)
    y_ref = ref(x_ref, context=c_ref)
    assert y.shape == (B, tq, C)
    with torch.no_grad():
        expected = reference_attention(m, x, context=c)
    torch.testing.assert_close(y, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(y_ref, expected, atol=ATOL, rtol=0)
    for a, e in zip(grads(y, [x, c], m.parameters()), grads(y_ref, [x_ref, c_ref], ref.parameters())):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=0)
    with torch.no_grad():
        _, w = with_weights(m, x, context=c)
    assert w.shape == (B, NH, tq, tk)
    assert torch.all(w > 0), "cross-attention must not mask any context position"
    torch.testing.assert_close(w.sum(-1), torch.ones(B, NH, tq), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_qk_norm_scales_every_query_and_key(backend, cross):
    """With qk_norm, the queries and the keys of every head are at unit RMS before they are scored, in
    self-attention (whose q and k are normed side by side) and in cross-attention (each apart)."""
    m = make_mha(backend, qk_norm=True)
    x, c = rand(B, 6, C, seed=1), rand(B, 9, C, seed=2) * 5  # large inputs: the norm must change the scores
    context = c if cross else None
    with torch.no_grad():
        y, expected = m(x, context=context), reference_attention(m, x, context=context)
        unnormed = reference_attention(make_mha("manual"), x, context=context)
    torch.testing.assert_close(y, expected, atol=ATOL, rtol=0)
    assert (y - unnormed).abs().max() > 100 * ATOL, "the norm made no difference: the test cannot see it"


def test_cross_attention_refuses_a_kv_cache():
    """A KV cache holds x's earlier keys; cross-attention's come from context, which each decoding step
    would append to the cache again (overflowing it, or attending over stale copies): refused, saying why."""
    m, cache = make_mha("manual"), KVCache(BLOCK)
    with pytest.raises(ValueError, match="with context, they come from context.*without kv_cache"):
        m(rand(B, 1, C), context=rand(B, 9, C, seed=2), kv_cache=cache)
    assert cache.pos == 0, "refused before anything was appended"


@pytest.mark.parametrize("context_batch", [1, 3])
def test_cross_attention_refuses_a_context_of_another_batch(context_batch):
    """Each row of x attends to its own row of context: a context of batch 1 for x's 2 rows was broadcast by
    manual and sdpa and refused by flash ("No available kernel"), and batch 3 was a reshape's error."""
    with pytest.raises(ValueError, match=f"^context has {context_batch} rows and x 2: each of x's rows attends to"):
        make_mha("manual")(rand(2, 3, C), context=rand(context_batch, 5, C, seed=2))


@pytest.mark.parametrize("n_head", [0, -3])
def test_attention_refuses_fewer_than_one_head(n_head):
    with pytest.raises(ValueError, match=f"^n_head must be at least 1, got {n_head}$"):
        MultiHeadAttention(16, n_head)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_non_causal_self_attention_sees_everything(backend):
    ref = make_mha("manual", causal=False)
    m = clone_as(ref, backend)
    x_ref = rand(B, 11, C, requires_grad=True)
    x = x_ref.detach().clone().requires_grad_(True)
    y, y_ref = m(x), ref(x_ref)
    with torch.no_grad():
        torch.testing.assert_close(y, reference_attention(m, x, causal=False), atol=ATOL, rtol=0)
    for a, e in zip(grads(y, [x], m.parameters()), grads(y_ref, [x_ref], ref.parameters())):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=0)
    (g,) = torch.autograd.grad(y[:, 0].sum(), x)
    assert torch.all(g[:, 1:].abs().amax(-1) > 1e-7), "without the mask position 0 should see the future"


# --------------------------------------------------------------------------- the flash-attn package's path
# attention="fa2"/"fa3" call the flash-attn package, which runs only on CUDA GPUs. Its contract is
# written out below with SDPA, and put where attention.py looks for the package, so that the code around
# the call (the layout, the dtype, FA3's tuple, dropout) runs here against the manual backend.


def sdpa_flash_attn(q, k, v, dropout_p=0.0, causal=False, softmax_scale=None):
    """flash_attn_func's contract, computed with SDPA: q (B, Tq, H, D), k and v (B, Tk, H, D), all three
    in one dtype with a contiguous last dimension (the kernels refuse anything else); the causal mask
    bottom-right aligned (flash-attn >= 2.1); softmax_scale None means 1/sqrt(D). Returns (B, Tq, H, D)."""
    assert q.dim() == k.dim() == v.dim() == 4, "flash-attn takes (B, T, H, D)"
    assert q.shape[0] == k.shape[0] == v.shape[0] and q.shape[2:] == k.shape[2:] == v.shape[2:] \
        and k.shape[1] == v.shape[1], f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    assert q.dtype == k.dtype == v.dtype, "query, key and value must have the same dtype"
    assert all(t.stride(-1) == 1 for t in (q, k, v)), "input tensors must have a contiguous last dimension"
    Tq, Tk = q.size(1), k.size(1)
    mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else None
    y = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, dropout_p=dropout_p,
                                       scale=softmax_scale)
    return y.transpose(1, 2)


@pytest.fixture
def flash_attn_package(monkeypatch):
    """As if the flash-attn package were installed and the tensors bf16 on a Hopper GPU (for
    check_backend): attention.fa2_func and fa3_func are sdpa_flash_attn with FA2's and FA3's signatures
    (FA3's without dropout_p, returning (out, logsumexp) as some builds do, or out alone when
    `fa3_returns_tuple` is set False), and flash_attn_package picks them for "fa2" and "fa3".
    `calls` records each call: (function, dropout_p, causal)."""
    import attention

    package = SimpleNamespace(calls=[], fa3_returns_tuple=True)

    def fa2(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        package.calls.append(("fa2", dropout_p, causal))
        return sdpa_flash_attn(q, k, v, dropout_p, causal, softmax_scale)

    def fa3(q, k, v, softmax_scale=None, causal=False):
        package.calls.append(("fa3", 0.0, causal))
        out = sdpa_flash_attn(q, k, v, 0.0, causal, softmax_scale)
        lse = out.new_zeros(out.size(0), out.size(2), out.size(1), dtype=torch.float32)  # (B, H, Tq)
        return (out, lse) if package.fa3_returns_tuple else out

    check = attention.check_backend
    monkeypatch.setattr(attention, "fa2_func", fa2)
    monkeypatch.setattr(attention, "fa3_func", fa3)
    monkeypatch.setattr(attention, "flash_attn_package",
                        lambda backend, q, dropout_p: {"fa2": fa2, "fa3": fa3}[backend])
    monkeypatch.setattr(attention, "check_backend",
                        lambda backend, device_type=None, dtype=None, dropout=0.0, head_size=None:
                        check(backend, device_type and "cuda", device_type and torch.bfloat16, dropout, head_size))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return package


PACKAGE_BACKENDS = {"fa2": ("fa2", True), "fa3": ("fa3", True), "fa3-tensor": ("fa3", False)}


@pytest.mark.parametrize("variant", list(PACKAGE_BACKENDS))
def test_flash_attn_package_path_matches_manual(flash_attn_package, variant):
    """Through the flash-attn package's path ((B, T, H, D) in and out, FA3's tuple or tensor), "fa2"
    and "fa3" compute what the manual backend computes, outputs and gradients: causal self-attention,
    queries after a KV cache (bottom-right), one query, and cross-attention (no mask)."""
    backend, flash_attn_package.fa3_returns_tuple = PACKAGE_BACKENDS[variant]
    ref = make_mha("manual")
    m = clone_as(ref, backend)

    def check(prefix, tq, context_len=None):
        x = rand(B, prefix + tq, C, seed=prefix + tq)
        context = rand(B, context_len, C, seed=99) if context_len else None
        results = []
        for layer in (ref, m):
            cache = KVCache(BLOCK) if prefix else None
            if prefix:
                with torch.no_grad():
                    layer(x[:, :prefix], kv_cache=cache)
            xq = x[:, prefix:].clone().requires_grad_(True)
            y = layer(xq, context=context, kv_cache=cache)
            results.append((y, grads(y, [xq], layer.parameters())))
        (y_ref, g_ref), (y, g) = results
        torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0, msg=f"prefix {prefix}, {tq} queries")
        for a, e in zip(g, g_ref):
            torch.testing.assert_close(a, e, atol=ATOL, rtol=0, msg=f"gradient: prefix {prefix}, {tq} queries")

    for prefix, tq in ((0, 1), (0, 7), (0, BLOCK), (5, 3), (4, 1), (8, 8)):
        check(prefix, tq)
    check(0, 5, context_len=9)
    check(0, 9, context_len=5)
    # every forward of the layer went to the package (prefills too), causal but for the cross-attentions
    assert flash_attn_package.calls == [(backend, 0.0, True)] * 9 + [(backend, 0.0, False)] * 2


def test_flash_attn_package_gets_dropout_in_training_only(flash_attn_package):
    """FA2 is given the layer's dropout while training and none in eval; FA3, which has none, runs the
    layer in eval and refuses it while training, as check_backend says."""
    torch.manual_seed(0)
    x = rand(B, 6, C)
    m = MultiHeadAttention(C, NH, dropout=0.1, backend="fa2")
    m.train()(x)
    m.eval()(x)
    assert flash_attn_package.calls == [("fa2", 0.1, True), ("fa2", 0.0, True)]
    m = MultiHeadAttention(C, NH, dropout=0.1, backend="fa3")
    m.eval()(x)
    with pytest.raises(ValueError, match="'fa3' has no dropout"):
        m.train()(x)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_flash_attn_package_gets_q_k_v_in_one_dtype(flash_attn_package, backend):
    """A norm may leave q and k in fp32 where autocast gave v bf16: the package gets all three in v's
    dtype (its kernels refuse a mix), and the output comes back in it, the attention of the three."""
    m = make_mha(backend)
    q, k = rand(B, NH, 7, HS, seed=1), rand(B, NH, 7, HS, seed=2)
    v = rand(B, NH, 7, HS, seed=3).bfloat16()
    y = m.flash(q, k, v, True, 0.0)
    assert y.dtype == torch.bfloat16 and y.shape == (B, NH, 7, HS)
    expected, _ = manual_attention(q, k, v.float(), causal_mask(7, 7))
    torch.testing.assert_close(y.float(), expected, atol=2e-2, rtol=0)
    assert flash_attn_package.calls == [(backend, 0.0, True)]


# --------------------------------------------------------------------------- KV cache object


def test_kv_cache_appends_and_refuses_overflow():
    cache = KVCache(6)
    k1, v1 = rand(B, NH, 4, HS, seed=1), rand(B, NH, 4, HS, seed=2)
    k2, v2 = rand(B, NH, 2, HS, seed=3), rand(B, NH, 2, HS, seed=4)
    cache.append(k1, v1)
    k, v = cache.append(k2, v2)
    assert cache.pos == 6
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    with pytest.raises(ValueError, match="6 positions"):
        cache.append(k2[:, :, :1], v2[:, :, :1])


# --------------------------------------------------------------------------- configuration errors


def test_check_backend_accepts_what_runs_on_cpu():
    for backend in CPU_BACKENDS:
        check_backend(backend, "cpu", torch.float32, 0.0)
    check_backend("manual", "cpu", torch.float32, 0.1)
    check_backend("sdpa", "cpu", torch.float32, 0.1)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_check_backend_rejects_flash_attn_package_on_cpu(backend):
    with pytest.raises(ValueError, match=rf"attention='{backend}'.*(flash-attn|CUDA)"):
        check_backend(backend, "cpu", torch.float32, 0.0)
    with pytest.raises(ValueError, match=rf"attention='{backend}'"):
        check_backend(backend, "cpu", torch.bfloat16, 0.0)


def test_check_backend_rejects_fa3_off_hopper(monkeypatch):
    """As if the package were installed on a pre-Hopper GPU (an A100): FA3 kernels need sm90."""
    import attention

    monkeypatch.setattr(attention, "fa3_func", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="'fa3' needs a Hopper GPU.*'fa2'"):
        check_backend("fa3", "cuda", torch.bfloat16, 0.0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_backend("fa3", "cuda", torch.bfloat16, 0.0)  # an H100 / H200


@pytest.mark.parametrize("backend", ["flash", "fa2"])
def test_check_backend_rejects_flash_attention_before_ampere(monkeypatch, backend):
    """On a T4 (sm75) or a V100 (sm70), FlashAttention's kernels (FA2, PyTorch's) refuse to run: the check had
    passed, and the first forward was a traceback ("No available kernel")."""
    import attention

    monkeypatch.setattr(attention, "fa2_func", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(ValueError, match=rf"^attention='{backend}' needs an Ampere or newer GPU \(compute capability "
                                         r"8.0 and up; this one's is 7.5\); use attention='sdpa'$"):
        check_backend(backend, "cuda", torch.float16, 0.0)
    check_backend("sdpa", "cuda", torch.float16, 0.0)  # the remedy
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))  # an A10, an RTX 3090
    check_backend(backend, "cuda", torch.float16, 0.0)


def test_flash_picks_fa3_on_hopper_only_and_without_dropout(monkeypatch):
    """What flash_attn_package picks, as if the package were installed, by GPU generation: FA3 runs on
    Hopper (sm90) only, not on Blackwell (sm100, sm120), and has no dropout; FA2 runs on the others."""
    import types

    import attention
    fa2, fa3 = object(), object()
    monkeypatch.setattr(attention, "fa2_func", fa2)
    monkeypatch.setattr(attention, "fa3_func", fa3)
    q = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    picked = {}
    for capability in [(8, 0), (9, 0), (10, 0), (12, 0)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        for backend, dropout_p in [("flash", 0.0), ("flash", 0.1), ("fa2", 0.0), ("fa3", 0.0)]:
            picked[capability[0], backend, dropout_p] = attention.flash_attn_package(backend, q, dropout_p)
    assert picked == {(8, "flash", 0.0): fa2, (8, "flash", 0.1): fa2, (8, "fa2", 0.0): fa2, (8, "fa3", 0.0): None,
                      (9, "flash", 0.0): fa3, (9, "flash", 0.1): fa2, (9, "fa2", 0.0): fa2, (9, "fa3", 0.0): fa3,
                      (10, "flash", 0.0): fa2, (10, "flash", 0.1): fa2, (10, "fa2", 0.0): fa2, (10, "fa3", 0.0): None,
                      (12, "flash", 0.0): fa2, (12, "flash", 0.1): fa2, (12, "fa2", 0.0): fa2, (12, "fa3", 0.0): None}
    cpu_q = types.SimpleNamespace(is_cuda=False, device="cpu")
    assert all(attention.flash_attn_package(b, cpu_q, 0.0) is None for b in ("flash", "fa2", "fa3"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))  # a B200
    with pytest.raises(ValueError, match="'fa3' needs a Hopper GPU"):
        check_backend("fa3", "cuda", torch.bfloat16, 0.0)


def test_check_backend_rejects_heads_too_large_for_flash_on_cuda(monkeypatch):
    """The FlashAttention kernels on CUDA take heads of up to 256 numbers; past that PyTorch's raised
    "No available kernel" mid-training. SDPA and the hand-written path take any, and so does the CPU."""
    import attention
    monkeypatch.setattr(attention, "fa2_func", object())  # as if flash-attn were installed, on an H100
    monkeypatch.setattr(attention, "fa3_func", object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for backend in ("flash", "fa2", "fa3"):
        with pytest.raises(ValueError, match=rf"attention='{backend}' on CUDA takes heads of at most 256 numbers, "
                                             r"and n_embd/n_head is 320; use attention='sdpa' \(or, for a model "
                                             r"of your own, more heads: --n_head\)"):
            check_backend(backend, "cuda", torch.bfloat16, 0.0, head_size=320)
    check_backend("flash", "cuda", torch.bfloat16, 0.0, head_size=256)
    check_backend("sdpa", "cuda", torch.bfloat16, 0.0, head_size=320)
    check_backend("flash", "cpu", torch.float32, 0.0, head_size=320)


def test_check_backend_rejects_flash_with_dropout_on_cpu():
    with pytest.raises(ValueError, match="dropout"):
        check_backend("flash", "cpu", torch.float32, 0.1)


def test_check_backend_rejects_unknown_backend():
    with pytest.raises(ValueError, match="unknown attention backend 'fa4'"):
        check_backend("fa4", "cpu", torch.float32, 0.0)


def test_mha_constructor_rejects_bad_config():
    with pytest.raises(ValueError, match="n_embd=30 must be divisible by n_head=4"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        MultiHeadAttention(C, NH, backend="xformers")


def test_cpu_backends_are_every_backend_that_runs_on_a_cpu():
    """CPU_BACKENDS, which every equivalence test here runs over, is exactly the backends that can run
    on a CPU: a new backend that runs here cannot escape them, and none listed is one that cannot run."""
    assert set(CPU_BACKENDS) == backends_that_run_on_a_cpu()
    assert set(FUSED_BACKENDS) == set(CPU_BACKENDS) - {"manual"}


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_flash_attn_package_backends_fail_clearly_on_cpu(backend):
    m = make_mha(backend)
    how = r"pip install flash-attn" if backend == "fa2" else r"FA3 is built from the flash-attn repository's hopper/"
    with pytest.raises(ValueError, match=rf"attention='{backend}' needs the flash-attn package's "
                                         rf"{backend.upper()}, which is not installed \({how}"):
        m(rand(B, 4, C))


def test_flash_with_dropout_fails_clearly_when_training_on_cpu():
    torch.manual_seed(0)
    m = MultiHeadAttention(C, NH, dropout=0.1, backend="flash").train()
    with pytest.raises(ValueError, match="dropout"):
        m(rand(B, 4, C))
    m.eval()  # no dropout at inference: it runs
    assert m(rand(B, 4, C)).shape == (B, 4, C)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_dropout_is_applied_in_training_only(backend):
    torch.manual_seed(0)
    m = MultiHeadAttention(C, NH, dropout=0.5, backend=backend)
    x = rand(B, 8, C)
    with torch.no_grad():
        m.eval()
        torch.testing.assert_close(m(x), m(x), atol=0, rtol=0)
        m.train()
        assert not torch.allclose(m(x), m(x)), "dropout=0.5 in training should make outputs random"


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_dropout_drops_attention_weights_and_the_output_at_its_rate(backend):
    """At dropout=0.2 (not 0.5, where p and 1 - p agree), while training: the attention weights, and the
    layer's output after c_proj, each lose a fifth of their entries, the rest scaled by 1 / 0.8. The
    weights are seen through v = x = the identity: with q = k = 0 row i weighs tokens 0..i by 1/(i + 1),
    and c_proj's input is then the dropped weights themselves."""
    p, T = 0.2, C
    torch.manual_seed(0)
    m = MultiHeadAttention(C, 1, dropout=p, backend=backend).train()  # c_proj's bias: no output is zero
    with torch.no_grad():
        m.c_attn.weight.zero_(), m.c_attn.bias.zero_()
        m.c_attn.weight[2 * C:] = torch.eye(C)  # q = k = 0, v = x
    seen = {}
    m.c_proj.register_forward_pre_hook(lambda module, args: seen.update(weights=args[0]))
    m.c_proj.register_forward_hook(lambda module, args, out: seen.update(projected=out))
    x = torch.eye(T).expand(8, T, C)  # 8 sequences: 8 x 528 weights
    with torch.no_grad():
        y = m(x)
    causal = torch.ones(T, T).tril().bool()
    uniform = causal / causal.sum(-1, keepdim=True)  # (T, T): 1/(i + 1) on and below the diagonal
    assert_dropout(uniform.expand(8, T, T)[:, causal], seen["weights"][:, causal], p)
    assert_dropout(seen["projected"], y, p)


def test_rotary_turns_pairs_so_scores_depend_only_on_distance():
    """apply_rotary with GPT's tables: a rotation (lengths kept) whose q·k depends on how far apart
    the two positions are, not on where they are; and the pairs are (i, i + hs/2), as trained."""
    model = GPT(GPTConfig(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=16, pos_embedding="rope"))
    cos, sin = model.rope_cos, model.rope_sin  # (16, 8)
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 8)
    at = lambda x, pos: apply_rotary(x.expand(1, 1, 16, 8), cos, sin)[0, 0, pos]  # x placed at position pos
    torch.testing.assert_close(at(q, 5).norm(), q.norm())
    for shift in (1, 4, 9):
        torch.testing.assert_close(at(q, 3 + shift) @ at(k, 3), at(q, 6 + shift) @ at(k, 6))
    assert not torch.allclose(at(q, 4) @ at(k, 3), at(q, 9) @ at(k, 3))
    angle = torch.tensor(1.0)  # position 1 turns the pair (channel 0, channel 4) by 1 * 10000^0 radians
    e0 = torch.zeros(8)
    e0[0] = 1.0
    turned = at(e0.view(1, 1, 1, 8), 1)
    torch.testing.assert_close(turned[[0, 4]], torch.stack([angle.cos(), angle.sin()]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_rotary_attention_sees_how_far_apart_tokens_are_not_where_they_are(backend):
    """MultiHeadAttention turns queries and keys alike: the same ten tokens at positions 0-9 or 7-16 give the
    same output (q·k depends on distance only), and another output than with no rotation. Keys left unturned
    (queries only) had passed every test and trained a worse model."""
    model = GPT(GPTConfig(vocab_size=8, block_size=32, n_layer=1, n_head=2, n_embd=16, pos_embedding="rope"))
    attn = MultiHeadAttention(16, 2, dropout=0.0, bias=False, backend=backend).eval()
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    at = lambda start: attn(x, rotary=(model.rope_cos[start:start + 10], model.rope_sin[start:start + 10]))
    with torch.no_grad():
        torch.testing.assert_close(at(0), at(7), atol=1e-5, rtol=0)
        assert (at(0) - attn(x)).abs().max() > 1e-2, "the rotation changed nothing"


@pytest.mark.parametrize("position, pair", [(1, 1), (5, 1), (7, 2), (15, 3), (15, 0)])
def test_rotary_tables_turn_pair_i_at_position_p_by_p_times_10000_to_the_minus_2i_over_hs(position, pair):
    """GPT's rope_cos and rope_sin against RoPE's formula, written out here in float64: position p turns
    pair i (channels i and i + hs/2) by p * 10000^(-2i/hs); cos is the same in both halves, sin negated
    in the first (apply_rotary). Pairs past the first show the base: with 1000 they would turn 0.07 to
    0.4 rad further, against a tolerance of 1e-6 (the float32 tables are within 1e-7)."""
    hs = 8
    model = GPT(GPTConfig(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=2 * hs, pos_embedding="rope"))
    angle = position * 10000 ** (-2 * pair / hs)
    cos, sin = model.rope_cos[position].double(), model.rope_sin[position].double()  # (hs,)
    expected_cos = torch.tensor([math.cos(angle)] * 2, dtype=torch.float64)
    expected_sin = torch.tensor([-math.sin(angle), math.sin(angle)], dtype=torch.float64)
    torch.testing.assert_close(cos[[pair, pair + hs // 2]], expected_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[[pair, pair + hs // 2]], expected_sin, rtol=0, atol=1e-6)
