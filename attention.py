"""
Multi-head attention, written out by hand, with fused kernels one config value away.

The whole idea is in `manual_attention`: every query scores every key (q·kᵀ/√d), keys in the
future are masked to -inf so the softmax gives them zero weight, and the output is the weighted
sum of the values. `MultiHeadAttention` adds the projections and the split into heads.

`backend` picks who computes that same function:
  "manual"  the few lines below; can return the attention weights; the fastest under bf16 on CPU
  "sdpa"    torch.nn.functional.scaled_dot_product_attention, PyTorch picks the kernel
  "flash"   a FlashAttention kernel: the flash-attn package (FA3 on Hopper, else FA2) when it is
            installed and the tensors are fp16/bf16 on CUDA; otherwise PyTorch's own FlashAttention
            kernel, which on CUDA too needs fp16/bf16, and runs on CPU in any dtype (without dropout)
  "fa2", "fa3"  the flash-attn package only; an error if it cannot run here
"""
import math
from typing import Literal, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Backend = Literal["manual", "sdpa", "flash", "fa2", "fa3"]  # the one list of backend names
BACKENDS = get_args(Backend)
FLASH_BACKENDS = ("flash", "fa2", "fa3")
FLASH_MAX_HEAD_SIZE = 256  # the largest head the FlashAttention kernels take on CUDA (PyTorch's and the package's)
HOPPER = 9  # the compute capability's major version of the GPUs FA3 runs on (H100, H200; not Blackwell's 10, 12)
AMPERE = 8  # the least major version FlashAttention runs on: FA2 and PyTorch's CUDA kernel (not a V100's 7, a T4's 7.5)

try:  # FlashAttention 2 (Ampere and newer), from the optional flash-attn package
    from flash_attn import flash_attn_func as fa2_func
except ImportError:
    fa2_func = None
try:  # FlashAttention 3 (Hopper), built from the same package's hopper/ directory
    from flash_attn_interface import flash_attn_func as fa3_func
except ImportError:
    fa3_func = None


def dropout(x, p, training=True):
    """F.dropout, not even called where it does nothing (sampling, or p=0): when a token costs a few
    microseconds of work per op, every call that does nothing shows."""
    return F.dropout(x, p) if training and p > 0 else x


def manual_attention(q, k, v, mask=None, dropout_p=0.0):
    """q: (B, nh, Tq, hs), k and v: (B, nh, Tk, hs); mask: (Tq, Tk), True where a query may look."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # the future gets zero weight after softmax
    weights = F.softmax(scores, dim=-1)  # each row sums to one
    y = dropout(weights, dropout_p) @ v  # (B, nh, Tq, hs)
    return y, weights


def apply_rotary(x, cos, sin):
    """Rotary position embedding (RoPE): turn each channel pair (x1, x2) of q or k by an angle that
    grows with the position, so q·k depends only on how far apart two tokens are. x: (B, heads, T, hs),
    pairing channel i with i + hs/2; cos and sin: (T, hs), each angle's twice, sin's first half
    negated (GPT.__init__), so that the turn (x1 cos - x2 sin, x2 cos + x1 sin) is x cos + (x2, x1) sin."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat([x2, x1], dim=-1) * sin).type_as(x)


def causal_mask(n_query, n_key, device=None):
    """(Tq, Tk) mask for queries that are the *last* Tq of Tk positions (bottom-right aligned), as
    with a KV cache: query i sits at position Tk - Tq + i and may see keys 0 .. Tk - Tq + i.
    Written as a comparison of positions rather than a triangle of ones (`tril`): compiled, the
    comparison is recomputed inside the softmax's kernel, where the triangle is a stored tensor read
    back, and the softmax runs twice as fast on a CPU (bench/README.md)."""
    query_pos = torch.arange(n_key - n_query, n_key, device=device)  # (Tq,)
    key_pos = torch.arange(n_key, device=device)  # (Tk,)
    return key_pos[None, :] <= query_pos[:, None]  # (Tq, Tk)


def flash_attn_package(backend, q, dropout_p):
    """The flash-attn function to call for these tensors, or None to use PyTorch's kernel."""
    on_hopper = q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == HOPPER
    if backend == "fa3" or (backend == "flash" and fa3_func is not None and on_hopper and dropout_p == 0):
        return fa3_func if q.is_cuda and on_hopper else None
    if backend in ("fa2", "flash") and q.is_cuda and fa2_func is not None:
        return fa2_func
    return None


def check_heads(n_embd, n_head):
    """ValueError unless n_head heads split the n_embd channels evenly (each head gets n_embd // n_head)."""
    if n_head < 1:
        raise ValueError(f"n_head must be at least 1, got {n_head}")
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")


def check_backend(backend, device_type=None, dtype=None, dropout=0.0, head_size=None):
    """Raise ValueError, saying what to change, if `backend` is unknown or, when a device is given,
    cannot run on that device and dtype (with heads of head_size, where given). The one place a
    backend is checked against a device; GPTConfig refuses an unknown name before a model gets here."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if device_type is None:
        return
    if backend in ("fa2", "fa3"):
        fn = fa2_func if backend == "fa2" else fa3_func
        if fn is None:
            how = ("pip install flash-attn on a CUDA machine" if backend == "fa2" else "FA3 is built from the "
                   "flash-attn repository's hopper/ directory, as flash_attn_interface")
            raise ValueError(f"attention={backend!r} needs the flash-attn package's {backend.upper()}, which is not "
                             f"installed ({how}); use attention='flash' for PyTorch's kernel")
        if device_type != "cuda":
            raise ValueError(f"attention={backend!r} runs only on CUDA GPUs; use attention='flash' or 'sdpa' on "
                             f"{device_type}")
        if dtype == torch.float32:
            raise ValueError(f"attention={backend!r} needs float16 or bfloat16; set dtype=bfloat16 or use "
                             "attention='sdpa'")
        if backend == "fa3" and dropout > 0:
            raise ValueError("attention='fa3' has no dropout; set dropout=0 or use attention='fa2'")
        if backend == "fa3" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != HOPPER:
            raise ValueError("attention='fa3' needs a Hopper GPU (H100, H200); use attention='fa2' or 'flash' here")
    if backend in FLASH_BACKENDS and device_type == "cuda" and torch.cuda.is_available() and \
            torch.cuda.get_device_capability()[0] < AMPERE:  # the kernel refuses it only at the first forward
        major, minor = torch.cuda.get_device_capability()
        raise ValueError(f"attention={backend!r} needs an Ampere or newer GPU (compute capability 8.0 and up; this "
                         f"one's is {major}.{minor}); use attention='sdpa'")
    if backend in FLASH_BACKENDS and device_type == "cuda" and (head_size or 0) > FLASH_MAX_HEAD_SIZE:
        raise ValueError(f"attention={backend!r} on CUDA takes heads of at most {FLASH_MAX_HEAD_SIZE} numbers, and "
                         f"n_embd/n_head is {head_size}; use attention='sdpa' (or, for a model of your own, more "
                         "heads: --n_head)")
    if backend == "flash" and device_type == "cpu" and dropout > 0:
        raise ValueError("PyTorch's FlashAttention kernel on CPU has no dropout; set dropout=0 or use attention='sdpa'")
    if backend == "flash" and device_type == "cuda" and dtype == torch.float32:
        raise ValueError("attention='flash' on CUDA needs float16 or bfloat16; set dtype=bfloat16 or use "
                         "attention='sdpa'")


class KVCache:
    """Keys and values of the tokens already seen, so each new token costs one row of attention
    instead of a recomputation of the whole context. One per attention layer. It is for decoding:
    each call writes into the buffers an earlier call read, so gradients reach through the newest
    call only (autograd refuses a backward through two)."""

    def __init__(self, max_len):
        self.max_len = max_len
        self.k = self.v = None
        self.pos = 0  # how many positions are filled

    def append(self, k, v):
        """Store k, v (B, nh, T, hs) after the cached ones; return all keys and values so far."""
        if self.k is None:  # allocated on first use, so it takes the dtype autocast gives k and v
            B, nh, _, hs = k.shape
            self.k = k.new_empty(B, nh, self.max_len, hs)
            self.v = v.new_empty(B, nh, self.max_len, hs)
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {end} were asked for")
        self.k[:, :, self.pos:end] = k
        self.v[:, :, self.pos:end] = v
        self.pos = end
        return self.k[:, :, :end], self.v[:, :, :end]


class MultiHeadAttention(nn.Module):
    """Self-attention (causal by default), or cross-attention when `context` is given."""

    def __init__(self, n_embd, n_head, dropout=0.0, bias=True, backend="manual", causal=True, qk_norm=False):
        super().__init__()
        check_heads(n_embd, n_head)
        check_backend(backend)
        self.n_head, self.dropout, self.backend, self.causal, self.qk_norm = n_head, dropout, backend, causal, qk_norm
        self.head_size = n_embd // n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # Q, K and V for all heads in one matmul
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)  # mixes the concatenated heads
        # keep_weights=True: forward goes through manual_attention and keeps its weights in
        # self.weights, (B, nh, Tq, Tk), and the q, k, v they came from in self.qkv, for pictures
        # and tests (fused kernels never form them)
        self.keep_weights, self.weights, self.qkv = False, None, None

    def forward(self, x, context=None, kv_cache=None, rotary=None):
        """x: (B, Tq, C); context: (B, Tk, C) for cross-attention; kv_cache: x's earlier keys and values
        (self-attention only); rotary: (cos, sin) for the Tq positions, to apply RoPE to self-attention.
        Returns y: (B, Tq, C)."""
        B, Tq, C = x.shape
        if context is not None and kv_cache is not None:
            raise ValueError("a KV cache holds the keys and values of x's earlier tokens; with context, they come "
                             "from context, which every call would append again: call cross-attention without kv_cache")
        nh = self.n_head
        if context is None:  # q's and k's heads side by side: one call norms and turns both (a token decoded
            # one at a time pays for every op called, bench/README.md)
            qk, v = self.heads(self.c_attn(x)).split([2 * nh, nh], dim=1)  # (B, 2nh, T, hs), (B, nh, T, hs)
            q, k = self.position_and_scale(qk, rotary).chunk(2, dim=1)  # (B, nh, T, hs) each
        else:  # queries from x; keys and values from the other sequence, with the same weights
            if context.size(0) != B:
                raise ValueError(f"context has {context.size(0)} rows and x {B}: each of x's rows attends to its own "
                                 "row of context, so give them the same batch size")
            w_q, w_kv = self.c_attn.weight.split([C, 2 * C])  # (C, C), (2C, C)
            b_q, b_kv = self.c_attn.bias.split([C, 2 * C]) if self.c_attn.bias is not None else (None, None)
            k, v = self.heads(F.linear(context, w_kv, b_kv)).chunk(2, dim=1)  # (B, nh, Tk, hs) each
            q, k = self.position_and_scale(self.heads(F.linear(x, w_q, b_q))), self.position_and_scale(k)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, nh, Tk, hs): the cached keys, then these
        Tk = k.size(2)
        causal = self.causal and context is None
        dropout_p = self.dropout if self.training else 0.0

        self.weights = self.qkv = None
        if self.backend == "manual" or self.keep_weights:
            mask = causal_mask(Tq, Tk, q.device) if causal and Tq > 1 else None  # one newest query sees all
            y, weights = manual_attention(q, k, v, mask, dropout_p)
            if self.keep_weights:
                self.weights, self.qkv = weights, (q, k, v)
        elif self.backend == "sdpa":
            y = self.sdpa(q, k, v, causal, dropout_p)
        else:
            y = self.flash(q, k, v, causal, dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, Tq, C)  # (B, Tq, C): heads side by side again
        return dropout(self.c_proj(y), self.dropout, self.training)

    def heads(self, t):
        """(B, T, n * C) -> (B, n * nh, T, hs): t's channels split into heads of C // n_head."""
        B, T, _ = t.shape
        return t.view(B, T, -1, self.head_size).transpose(1, 2)

    def position_and_scale(self, t, rotary=None):
        """Queries or keys (B, heads, T, hs) as the scores use them: with qk_norm at unit RMS, which keeps
        the softmax's logits in a tame range; with rotary (cos, sin) turned by their positions (RoPE)."""
        if self.qk_norm:
            t = F.rms_norm(t, (t.size(-1),))
        return t if rotary is None else apply_rotary(t, *rotary)

    def sdpa(self, q, k, v, causal, dropout_p):
        Tq, Tk = q.size(2), k.size(2)
        if not causal or Tq == 1:  # a single newest query may see every key
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        if Tq == Tk:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        # is_causal=True would align the mask top-left, which is wrong when queries follow a cache
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(Tq, Tk, q.device), dropout_p=dropout_p)

    def flash(self, q, k, v, causal, dropout_p):
        # v has the dtype autocast gave the projections; a norm on q and k may have left them in fp32
        check_backend(self.backend, q.device.type, v.dtype, dropout_p, q.size(-1))  # a clear error, not a kernel's
        fn = flash_attn_package(self.backend, q, dropout_p)
        if fn is not None:  # flash-attn takes (B, T, nh, hs), all in one dtype, and knows nothing of autocast
            qt, kt, vt = (t.transpose(1, 2).to(v.dtype) for t in (q, k, v))
            if fn is fa3_func:  # FA3 has no dropout; check_backend made sure none is asked for
                y = fn(qt, kt, vt, causal=causal)  # bottom-right aligned, as a KV cache needs
                y = y[0] if isinstance(y, tuple) else y  # some FA3 builds also return the logsumexp
            else:
                y = fn(qt, kt, vt, dropout_p=dropout_p, causal=causal)
            return y.transpose(1, 2)  # (B, nh, Tq, hs)
        B, nh, Tq, hs = q.shape
        Tk = k.size(2)
        pad = Tk - Tq if causal and 1 < Tq < Tk else 0
        if pad:  # the kernel aligns is_causal top-left; put blank queries first so ours sit bottom-right
            q = torch.cat([q.new_zeros(B, nh, pad, hs), q], dim=2)  # (B, nh, Tk, hs)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal and Tq > 1)
        return y[:, :, pad:]
