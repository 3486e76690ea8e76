"""
The whole GPT in one file, but for its attention layer (attention.py, read first): a GPT-2 style
decoder-only Transformer, sampling with a KV cache, and loading of GPT-2 weights in Hugging Face format.

References: GPT-2 (Radford et al. 2019), karpathy/nanoGPT and minGPT, and Hugging Face's GPT-2.
"""
import glob
import json
import math
import os
import pickle
import zipfile
from dataclasses import dataclass, fields, replace
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import Backend, KVCache, MultiHeadAttention, check_heads, dropout
from configurator import as_typed, check_at_least, check_types, first_line, whole_number
from data.tokenizer import GPT2_VOCAB_SIZE
from files import load_torch_file, starts_with


Positions = Literal["learned", "rope"]  # a learned table of positions, or rotary embeddings in attention
# the MLP's nonlinearity: GELU's tanh approximation (GPT-2's), the exact GELU (erf), or ReLU squared
# (relu(x)^2, modded-nanogpt's and nanochat's: cheaper, and as good or better at small scale)
Activation = Literal["gelu_tanh", "gelu", "relu2"]
Norm = Literal["layernorm", "rmsnorm"]  # GPT-2's LayerNorm (centre, then scale), or RMSNorm (scale only: fewer ops)


@dataclass
class GPTConfig:
    vocab_size: int = GPT2_VOCAB_SIZE  # tokens the model reads and predicts
    block_size: int = 1024  # the longest context the model sees
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # on the embeddings, attention weights and residual branches while training
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2 has
    attention: Backend = "manual"  # who computes attention: the hand-written path or a fused kernel
    # beyond GPT-2 (the defaults are GPT-2's, so its weights load): options from later models
    pos_embedding: Positions = "learned"  # positions: a learned table, or rotary in attention
    norm: Norm = "layernorm"  # normalisation before attention, MLP and head
    qk_norm: bool = False  # RMS-normalise queries and keys per head
    zero_init: bool = False  # output projections start at zero: every block starts as the identity
    activation: Activation = "gelu_tanh"  # the MLP's nonlinearity: gelu_tanh as GPT-2, the exact gelu, or relu2
    mlp_ratio: int = 4  # the MLP's hidden width, in multiples of n_embd (GPT-2's is 4)

    def __post_init__(self):
        check_types(self)  # GPTConfig(bias="no") would be a model with biases; n_embd=32.0 a TypeError deep in torch
        check_at_least(self, 1, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")
        fits = head_counts(self.n_embd, rope=self.pos_embedding == "rope")
        can = (f"n_head can be one of {', '.join(map(str, fits))}" if fits else
               "no n_head gives the even head size rope needs: give an even n_embd, or pos_embedding='learned'")
        try:
            check_heads(self.n_embd, self.n_head)
        except ValueError as e:
            raise ValueError(f"{e}; with this n_embd, {can}") from None
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.pos_embedding == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rope needs an even head size; n_embd/n_head = {self.n_embd // self.n_head}; with this "
                             f"n_embd, {can}" + (" (or use pos_embedding='learned')" if fits else ""))


def head_counts(n_embd, rope):
    """Every n_head that fits n_embd: a whole head size, and with rope an even one (its channel pairs)."""
    divisors = {d for i in range(1, math.isqrt(n_embd) + 1) if n_embd % i == 0 for d in (i, n_embd // i)}
    return sorted(h for h in divisors if not rope or (n_embd // h) % 2 == 0)


# Settings that change how trained weights are run, not what they mean: a checkpoint or GPT-2 may
# be run with other values. Every other field is fixed by the weights: a resumed run must repeat it,
# and GPT-2's files decide it.
RUNTIME_SETTINGS = ("dropout", "attention")
WEIGHT_SETTINGS = tuple(f.name for f in fields(GPTConfig) if f.name not in RUNTIME_SETTINGS)


def check_overrides(overrides, whose):
    """ValueError unless every override is one of RUNTIME_SETTINGS: `whose` weights fix the others."""
    fixed = sorted(set(overrides) - set(RUNTIME_SETTINGS))
    if fixed:
        them = "them" if len(fixed) > 1 else "it"
        raise ValueError(f"{', '.join(fixed)} cannot be overridden: {whose} weights fix {them} (only "
                         f"{' and '.join(RUNTIME_SETTINGS)} can be); for a shorter context call crop_block_size() "
                         "after loading")


def make_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout, self.activation = config.dropout, config.activation

    def forward(self, x):
        h = self.c_fc(x)  # (B, T, mlp_ratio * C)
        if self.activation == "relu2":
            h = F.relu(h).square()
        else:  # GPT-2's weights need the tanh form; the exact GELU is the same curve to within 5e-4
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return dropout(self.c_proj(h), self.dropout, self.training)


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = MultiHeadAttention(config.n_embd, config.n_head, config.dropout, config.bias, config.attention,
                                       qk_norm=config.qk_norm)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, rotary=None):
        x = x + self.attn(self.ln_1(x), kv_cache=kv_cache, rotary=rotary)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        if config.pos_embedding == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        else:  # rotary angles: position p turns channel pair i by p / 10000^(2i/hs)
            hs = config.n_embd // config.n_head
            angles = torch.outer(torch.arange(config.block_size).float(),
                                 10000.0 ** (-torch.arange(0, hs, 2) / hs))  # (block_size, hs/2)
            self.register_buffer("rope_cos", angles.cos().repeat(1, 2), persistent=False)  # (block_size, hs)
            self.register_buffer("rope_sin", torch.cat([-angles.sin(), angles.sin()], dim=1),
                                 persistent=False)  # (block_size, hs)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one matrix reads and writes tokens
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
                nn.init.normal_(p, mean=0.0, std=0.0 if config.zero_init else 0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        """Parameter count; position embeddings are left out by default, as in the 6N FLOPs rule."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding and "wpe" in self.transformer else n

    def crop_block_size(self, block_size):
        """Shrink the context (e.g. GPT-2's 1024) to a smaller block_size for cheaper fine-tuning."""
        if not (whole_number(block_size) and block_size > 0):
            raise ValueError(f"block_size must be a positive whole number, got {block_size}")
        if block_size > self.config.block_size:
            raise ValueError(f"block_size={block_size} is larger than the model's {self.config.block_size} (its "
                             f"weights' positions): use a block_size of at most {self.config.block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:  # a copy of the rows kept: a view would keep (and save) the whole table
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())
            self.transformer.wpe.num_embeddings = block_size

    def new_kv_cache(self):
        return [KVCache(self.config.block_size) for _ in range(self.config.n_layer)]

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx: (B, T) token ids, after the kv_cache's positions if one is given. Returns (logits, loss):
        logits (B, T, vocab), or (B, 1, vocab) with last_only=True; loss None without targets."""
        B, T = idx.shape
        if last_only and targets is not None:
            raise ValueError("last_only=True is for sampling; a loss needs the logits of every position")
        start = kv_cache[0].pos if kv_cache else 0
        if start + T > self.config.block_size:
            raise ValueError(f"{start + T} positions exceed block_size={self.config.block_size}; crop the context")
        x = self.transformer.wte(idx)  # (B, T, C)
        rotary = None
        if self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        else:
            rotary = (self.rope_cos[start:start + T], self.rope_sin[start:start + T])
        x = dropout(x, self.config.dropout, self.training)
        for i, block in enumerate(self.transformer.h):
            x = block(x, kv_cache[i] if kv_cache else None, rotary)
        if last_only:  # sampling reads only the newest position: skip the vocabulary matmul for the others
            x = x[:, -1:]
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab); (B, 1, vocab) with last_only
        loss = None
        if targets is not None:  # reshape, not view: a sliced target such as x[:, 1:] is not contiguous
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1),  # (B*T, vocab), (B*T,)
                                   ignore_index=-1)
        return logits, loss

    def attention_steps(self, idx, kv_cache=None):
        """Per layer, (q, k, v, weights) of a forward pass over idx, computed by the hand-written path
        whatever the backend (fused kernels never form the weights): q (B, nh, T, hs), and k and v
        (B, nh, T_all, hs), as attention used them (after QK-norm and RoPE); weights (B, nh, T, T_all)."""
        layers = [block.attn for block in self.transformer.h]
        for attn in layers:
            attn.keep_weights = True
        try:
            self(idx, kv_cache=kv_cache)
            return [(*attn.qkv, attn.weights) for attn in layers]
        finally:
            for attn in layers:
                attn.keep_weights, attn.weights, attn.qkv = False, None, None

    def attention_weights(self, idx, kv_cache=None):
        """Per layer, the attention weights (B, nh, T, T_all) of a forward pass over idx."""
        return [weights for *_, weights in self.attention_steps(idx, kv_cache)]

    def flops_per_token(self):
        """Training FLOPs per token, as in the PaLM paper's appendix B (and nanoGPT): 6 per weight
        (2 forward, 4 backward) plus 12 * n_layer * n_embd * T for attention's scores and sums."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    @torch.inference_mode()  # no autograd bookkeeping at all: less work per op than no_grad
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True,
               generator=None, vocab_size=None):
        """Yield (B, 1) new tokens one at a time, each conditioned on idx (B, T) and those before it.
        Past block_size the window jumps forward by half a block, the same rule with or without the
        cache, so both compute the same logits and the cache is rebuilt only once per half block. (In
        fp32 they give the same tokens; in bf16 the fused kernels round a single query differently from
        a whole window, so a long sample may part ways where two tokens are nearly tied.)
        vocab_size: sample only the first vocab_size tokens (the tokenizer's, if the model's
        vocabulary was padded: the others never occur in the data). generator: a torch.Generator, or a
        list of one per row, so that each row draws what it would draw alone. A model in training mode
        samples in eval mode (no dropout) until the stream ends or is closed."""
        check_sampling(temperature, top_k, top_p, max_new_tokens)
        if vocab_size is not None and not (whole_number(vocab_size) and 1 <= vocab_size <= self.config.vocab_size):
            raise ValueError(f"vocab_size must be a whole number from 1 to the model's {self.config.vocab_size}, "
                             f"or None for all, got {vocab_size}")
        B, T = idx.shape
        check_generators(generator, B)
        if T == 0:
            raise ValueError("the prompt is empty: generation needs at least one token to condition on")
        block_size = self.config.block_size
        tokens = idx.new_empty(B, T + max_new_tokens)  # the prompt, then each new token: no growing copies
        tokens[:, :T] = idx
        start = max(0, T - block_size)  # the window is tokens[:, start:t]
        cache, was_training = None, self.training
        self.eval()  # no dropout while sampling, whatever mode the model was in: temperature=0 is greedy
        try:
            for t in range(T, T + max_new_tokens):
                if t - start > block_size:
                    start = t - max(1, block_size // 2)
                    cache = None
                if not use_kv_cache:
                    logits, _ = self(tokens[:, start:t], last_only=True)
                elif cache is None:  # fill the cache with the whole window
                    cache = self.new_kv_cache()
                    logits, _ = self(tokens[:, start:t], kv_cache=cache, last_only=True)
                else:  # only the newest token goes through the model
                    logits, _ = self(tokens[:, t - 1:t], kv_cache=cache, last_only=True)
                next_token = sample_next(logits[:, -1, :vocab_size], temperature, top_k, top_p, generator)
                tokens[:, t:t + 1] = next_token
                yield next_token
        finally:
            if was_training:  # back once the stream ends or is closed
                self.train()

    def generate(self, idx, max_new_tokens, **sampling):
        """Return idx (B, T) extended by max_new_tokens sampled tokens; `sampling` takes the options
        of stream (temperature=0 is greedy)."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, **sampling)], dim=1)

    @classmethod
    def from_pretrained(cls, name_or_dir, **overrides):
        """GPT-2 weights in Hugging Face format: a local directory (config.json + model.safetensors
        or pytorch_model.bin, whole or sharded, as save_pretrained writes) or a hub name (gpt2, ...).
        `overrides` may set what leaves the weights' meaning as it is: RUNTIME_SETTINGS."""
        check_overrides(overrides, "GPT-2's")
        directory = name_or_dir if os.path.isdir(name_or_dir) else download_from_hub(name_or_dir)
        config = replace(hf_config(directory), **overrides)
        sd_hf = load_hf_state_dict(directory)
        check_hf_shape(sd_hf, config, directory)  # before building: a mistyped n_layer would build for minutes
        model = cls(config)
        sd = model.state_dict()
        # Hugging Face keeps these four as Conv1D with (in, out) weights; nn.Linear wants (out, in)
        conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        used = {"lm_head.weight"}  # where a file has one, it is wte (check_hf_shape)
        for key in sd:  # our names are GPT2LMHeadModel's; plain GPT2Model files lack "transformer."
            candidates = [key, key.removeprefix("transformer.")]
            if key == "lm_head.weight":  # often not saved at all, since it is tied to wte
                candidates += list(HF_WTE_KEYS)
            name = next((c for c in candidates if c in sd_hf), None)
            if name is None:
                raise ValueError(f"{directory}: weights have no tensor for {key}")
            used.add(name)
            w = sd_hf[name].t() if key.endswith(conv1d) else sd_hf[name]
            if w.shape != sd[key].shape:
                raise ValueError(f"{directory}: {key} has shape {tuple(w.shape)}, expected {tuple(sd[key].shape)}")
            sd[key].copy_(w)
        unused = sorted(k for k in sd_hf if k not in used and not k.endswith(HF_ATTENTION_BUFFERS))
        if unused:
            raise ValueError(f"{directory} holds tensors GPT-2 has no place for ({', '.join(unused[:5])}"
                             f"{', ...' if len(unused) > 5 else ''}): a variant this GPT would run without them")
        return model


def check_sampling(temperature, top_k, top_p, max_new_tokens=None):
    """ValueError, saying why, for sampling options that cannot work."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and not (whole_number(top_k) and top_k >= 1):
        raise ValueError(f"top_k must be a whole number, at least 1 (or None for all tokens), got {top_k}")
    if max_new_tokens is not None and not (whole_number(max_new_tokens) and max_new_tokens >= 0):
        raise ValueError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (or None), got {top_p}")


def check_generators(generator, rows):
    """ValueError unless generator is None, one torch.Generator, or a list of one per row."""
    if isinstance(generator, (list, tuple)) and len(generator) != rows:
        raise ValueError(f"{len(generator)} generators for {rows} rows: give one per row, or one for them all")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Pick one token per row of logits (B, vocab): greedy at temperature 0, else sample from the
    softmax, keeping only the top_k most likely and/or the smallest set with probability >= top_p.
    generator: one torch.Generator, or a list of one per row (each row's draws then its own)."""
    if temperature < torch.finfo(torch.float32).tiny:  # 0, or one that fp32 would round to 0 (0 / 0): greedy, its limit
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    # subtract the largest first: divided by a tiny temperature, the others go to -inf, never inf - inf
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.size(-1):  # k tokens exactly, also where some tie with the k-th
        kept = torch.topk(logits, top_k)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, kept.indices, kept.values)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # keep tokens until top_p is reached
        drop[:, 0] = False  # the most likely token always stays
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    # a draw from probs as a race: token i finishes at E_i / p_i with E_i ~ Exp(1), and the first
    # to finish wins with probability p_i. Three small ops, where torch.multinomial's set-up costs
    # more per token on a CPU (and a host sync on a GPU).
    probs = F.softmax(logits, dim=-1)
    if isinstance(generator, (list, tuple)):
        check_generators(generator, probs.size(0))  # zip would give the rows past the list no draws of their own
        race = torch.stack([torch.empty_like(row).exponential_(generator=g) for row, g in zip(probs, generator)])
    else:
        race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(dim=-1, keepdim=True)


GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 models on the Hugging Face hub
HF_WTE_KEYS = ("transformer.wte.weight", "wte.weight")  # the token embedding, as GPT2LMHeadModel or GPT2Model saves it
HF_ATTENTION_BUFFERS = (".attn.bias", ".attn.masked_bias")  # older files keep the causal mask: rebuilt here, not read
# what a Hugging Face GPT-2 config.json may say where it says it, for this model to run it: GPT-2's
# choices (and the activation each GELU name is here); transformers' GPT-2 class has variants beyond them
HF_GPT2_ARCHITECTURE = {
    "activation_function": {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"},
    "layer_norm_epsilon": (1e-5,), "tie_word_embeddings": (True,), "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,)}


def gpt2_activation(hf, directory):
    """The activation a Hugging Face GPT-2 config.json (hf) names; ValueError if it describes a variant
    of GPT-2 beyond HF_GPT2_ARCHITECTURE, which this model would run as GPT-2, wrongly."""
    # type too: JSON's true must not pass for 1, nor 1 for true
    unlike = [f"{k}={hf[k]!r}" for k, allowed in HF_GPT2_ARCHITECTURE.items()
              if k in hf and not any(hf[k] == a and type(hf[k]) is type(a) for a in allowed)]
    if unlike:
        choices = "; ".join(f"{k} {' or '.join(map(repr, v))}" for k, v in HF_GPT2_ARCHITECTURE.items())
        raise ValueError(f"{directory}/config.json has {', '.join(unlike)}: this GPT runs GPT-2's architecture "
                         f"only ({choices})")
    return HF_GPT2_ARCHITECTURE["activation_function"][hf.get("activation_function", "gelu_new")]


def check_init_from(name, own):
    """ValueError unless name is one of a script's own starting points (own: "scratch", "resume") or
    what from_pretrained can be asked for: a local directory, a GPT-2 name, or a hub name (owner/model)."""
    if name in own or name in GPT2_NAMES:  # whatever files the working directory holds
        return
    if os.path.isfile(name):  # out/ckpt.pt would otherwise be asked of the hub as a model named so
        folder = as_typed(os.path.dirname(name) or ".")
        resume = (f", and a checkpoint of train.py's as --init_from=resume --out_dir={folder}"
                  if "resume" in own and zipfile.is_zipfile(name) else "")  # torch saves a zip
        raise ValueError(f"init_from={name!r} is a file; GPT-2's weights are given as the folder that holds "
                         f"config.json and model.safetensors{resume}")
    hub_name = name.count("/") == 1 and not name.startswith(("/", "."))
    if os.path.isdir(name) or hub_name:
        return
    raise ValueError(f"init_from={name!r} is none of: {', '.join(own)}, a GPT-2 name ({', '.join(GPT2_NAMES)}), "
                     "a Hugging Face name (owner/model), a local directory")


# the files of a model's weights, whole or in shards with their index, in the order they are looked for
HUB_WEIGHTS = (("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"),
               ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"))


def download_from_hub(name):
    """Fetch config.json and the weights of a Hugging Face model (or find them in its cache, offline):
    model.safetensors, or where the model has none pytorch_model.bin (read with weights_only=True: no code in
    it runs), as load_hf_state_dict reads them; a clear error offline, or for a model with neither."""
    from huggingface_hub import snapshot_download
    for weights in HUB_WEIGHTS:  # one kind of file only: many models hold the same weights in both
        try:
            directory = snapshot_download(name, allow_patterns=["config.json", *weights])
        except Exception as e:
            raise ValueError(f"could not get {name!r} from the Hugging Face hub ({type(e).__name__}); it is not a "
                             "local directory either. Download it once with network, or pass a directory holding "
                             "config.json and model.safetensors") from None
        if any(glob.glob(os.path.join(glob.escape(directory), pattern)) for pattern in weights):
            return directory
    raise ValueError(f"{name!r} has neither model.safetensors nor pytorch_model.bin on the Hugging Face hub (or in "
                     "its cache here, offline): it holds no GPT-2 weights this code reads")


def hf_config(directory):
    """The GPTConfig that a Hugging Face GPT-2 directory's config.json describes; a ValueError naming
    the file and what is wrong with it."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{directory} has no config.json; a Hugging Face GPT-2 directory holds config.json and "
                         "model.safetensors (or pytorch_model.bin)")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path} is damaged ({first_line(e)}); download the model again") from None
    shape = ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd")
    missing = [k for k in shape if k not in hf] if isinstance(hf, dict) else list(shape)
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it is not a GPT-2 config")
    wrong = [f"{k}={hf[k]!r}" for k in shape if not whole_number(hf[k])]
    if wrong:
        raise ValueError(f"{path} is damaged ({', '.join(wrong)}: these are whole numbers in GPT-2's config); "
                         "download the model again")
    activation = gpt2_activation(hf, directory)
    n_inner = hf.get("n_inner")  # the MLP's hidden width; None: GPT-2's 4 * n_embd
    if n_inner is not None and not (whole_number(n_inner) and n_inner > 0 and hf["n_embd"] > 0
                                    and n_inner % hf["n_embd"] == 0):
        raise ValueError(f"{path} has n_inner={n_inner!r}: this GPT's MLP is a whole multiple of n_embd="
                         f"{hf['n_embd']} wide (or n_inner is null, GPT-2's 4 * n_embd)")
    try:
        return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                         n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True, activation=activation,
                         mlp_ratio=n_inner // hf["n_embd"] if n_inner else 4)
    except ValueError as e:  # n_head=3 for 16 channels, say
        raise ValueError(f"{path} is damaged ({e}); download the model again") from None


def check_hf_shape(sd_hf, config, directory):
    """ValueError unless config.json's number of blocks, width, vocabulary, context and MLP width are
    its weights', and a head the weights hold is their token embedding (GPT-2 ties them)."""
    key_parts = [k.split(".") for k in sd_hf]  # (transformer.)h.<block>.ln_1.weight, ...
    blocks = {parts[parts.index("h") + 1] for parts in key_parts if "h" in parts[:-1]}

    def weight(name):  # GPT2LMHeadModel saves "transformer.<name>", GPT2Model "<name>"
        return next((sd_hf[key] for key in (f"transformer.{name}", name) if key in sd_hf), None)

    wte, wpe, c_fc = weight("wte.weight"), weight("wpe.weight"), weight("h.0.mlp.c_fc.weight")
    found = {"n_layer": len(blocks)}
    if isinstance(wte, torch.Tensor) and wte.dim() == 2:
        found.update(vocab_size=wte.shape[0], n_embd=wte.shape[1])
        if isinstance(c_fc, torch.Tensor) and c_fc.dim() == 2 and c_fc.shape[1] % wte.shape[1] == 0:
            found["mlp_ratio"] = c_fc.shape[1] // wte.shape[1]  # Conv1D: (n_embd, n_inner)
    if isinstance(wpe, torch.Tensor) and wpe.dim() == 2:
        found["block_size"] = wpe.shape[0]  # config.json's n_positions
    said = {"block_size": "n_positions", "mlp_ratio": "n_inner / n_embd"}  # config.json's names for ours
    wrong = [f"{said.get(k, k)}={getattr(config, k)}, the weights {v}" for k, v in found.items()
             if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"{directory}/config.json does not describe its weights ({'; '.join(wrong)}); download the "
                         "model again")
    head = sd_hf.get("lm_head.weight")
    if isinstance(head, torch.Tensor) and isinstance(wte, torch.Tensor) and not torch.equal(head, wte):
        raise ValueError(f"{directory}: its lm_head.weight is not its token embedding (wte): an untied head, which "
                         "this GPT, tied as GPT-2 is, cannot hold")


def load_hf_state_dict(directory):
    """The tensors of model.safetensors (or else pytorch_model.bin), whole or in the shards that its
    index (model.safetensors.index.json, ...) lists, as save_pretrained writes a large model; a
    ValueError naming the file when one cannot be read as weights (a torn download, another format)."""
    from safetensors.torch import load_file
    for name, load in (("model.safetensors", load_file), ("pytorch_model.bin", load_torch_file)):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return read_weights(path, load)
        if os.path.exists(path + ".index.json"):
            tensors = {}
            for shard in shard_names(path + ".index.json"):
                tensors.update(read_weights(os.path.join(directory, shard), load))
            return tensors
    raise ValueError(f"{directory} holds neither model.safetensors nor pytorch_model.bin (whole, or in shards "
                     "with an .index.json)")


GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def read_weights(path, load):
    """load(path): named tensors; a ValueError naming the file if it cannot be read as such."""
    from safetensors import SafetensorError
    try:
        lfs_pointer = starts_with(path, GIT_LFS_POINTER)  # what a clone of a hub model without Git LFS holds
        tensors = None if lfs_pointer else load(path)
    except (SafetensorError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, OSError, EOFError,
            ValueError) as e:
        raise ValueError(f"{path} cannot be read as weights ({first_line(e, with_type=True)}); "
                         "download the model again") from None
    if lfs_pointer:
        raise ValueError(f"{path} is a Git LFS pointer, not the weights: run `git lfs pull` in {os.path.dirname(path)} "
                         "(with Git LFS installed), or download the file itself")
    if not isinstance(tensors, dict):
        raise ValueError(f"{path} holds a {type(tensors).__name__}, not named tensors; download the model again")
    name, value = next(((k, v) for k, v in tensors.items() if not isinstance(v, torch.Tensor)), (None, None))
    if name is not None:
        raise ValueError(f"{path} holds a {type(value).__name__} for {name}, not a tensor; download the model again")
    return tensors


def shard_names(index_path):
    """The files a sharded checkpoint's index maps its tensors to, each once."""
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index_path} is not an index of weight files ({type(e).__name__}: {e}); download the "
                         "model again") from None
