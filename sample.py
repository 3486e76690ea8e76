"""
Sample from a trained model, streaming tokens to the terminal as they are made:

    python sample.py                                   # from out/ckpt.pt, which `python train.py` writes
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=300 --temperature=0.8
    python sample.py --start=FILE:prompt.txt --init_from=gpt2
"""
import os
import sys
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from configurator import config_from_argv, fail
from model import GPT
from plots import plot_attention
from tokenizer import GPT2Tokenizer, tokenizer_from_meta
from train import pick_device, pick_dtype


@dataclass
class SampleConfig:
    out_dir: str = "out"  # where train.py wrote ckpt.pt
    init_from: str = "resume"  # "resume" (out_dir/ckpt.pt), or GPT-2: "gpt2", "gpt2-xl", a local HF dir
    start: str = "\n"  # the prompt, or FILE:path to read it from a file
    num_samples: int = 2
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0 is greedy; below 1 sharpens, above 1 flattens the distribution
    top_k: Optional[int] = 200  # sample only from the k most likely tokens (none: all)
    top_p: Optional[float] = None  # nucleus sampling: the smallest set of tokens with probability >= top_p
    seed: int = 1337
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attention: Optional[str] = None  # swap the attention backend of the checkpoint (none: as trained)
    use_kv_cache: bool = True
    attention_map: str = ""  # a .png path: draw the prompt's attention weights there instead of sampling
    attention_layer: int = 0  # the (layer, head) drawn large in the attention map
    attention_head: int = 0

    def __post_init__(self):
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1 (or none), got {self.top_k}")


def load_model(cfg):
    """The model and its tokenizer, from out_dir/ckpt.pt or from GPT-2 weights."""
    overrides = {"attention": cfg.attention} if cfg.attention else {}
    if cfg.init_from != "resume":
        return GPT.from_pretrained(cfg.init_from, **overrides), GPT2Tokenizer()
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint, path, **overrides)
    try:
        tokenizer = tokenizer_from_meta(checkpoint["tokenizer"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path} does not match this code's model (an incompatible config): no tokenizer "
                         f"({type(e).__name__}: {e})") from None
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{path}: its tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}; the checkpoint is inconsistent")
    return model, tokenizer


@torch.no_grad()
def draw_attention(model, tokenizer, ids, cfg):
    """The attention weights of the prompt, every layer and head, as a picture."""
    c = model.config
    if not (0 <= cfg.attention_layer < c.n_layer and 0 <= cfg.attention_head < c.n_head):
        fail(f"attention_layer must be in [0, {c.n_layer}) and attention_head in [0, {c.n_head}) for this model")
    ids = ids[-c.block_size:]
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    _, _, weights = model(idx, need_weights=True)  # per layer (1, nh, T, T)
    plot_attention([w[0] for w in weights], [tokenizer.decode([i]) for i in ids], cfg.attention_map,
                   cfg.attention_layer, cfg.attention_head)
    print(f"wrote {cfg.attention_map}: {c.n_layer} layers x {c.n_head} heads over {len(ids)} tokens")


def main(cfg):
    try:
        device = pick_device(cfg.device)
        dtype = pick_dtype(cfg.dtype, device.split(":")[0], training=False)
        model, tokenizer = load_model(cfg)
        prompt = cfg.start
        if prompt.startswith("FILE:"):
            with open(prompt[5:], encoding="utf-8") as f:
                prompt = f.read()
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty; give at least one character with --start=...")
    except (ValueError, OSError) as e:
        fail(e)

    model.eval().to(device)
    if cfg.attention_map:
        draw_attention(model, tokenizer, ids, cfg)
        return
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    autocast = torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)
    for _ in range(cfg.num_samples):
        sys.stdout.write(prompt)
        pending = []  # BPE tokens can end inside a UTF-8 character; hold them until it is complete
        with autocast:
            for token in model.stream(idx, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                                      cfg.use_kv_cache, generator):
                pending.append(token.item())
                text = tokenizer.decode(pending)
                if not text.endswith("\ufffd"):
                    sys.stdout.write(text)
                    sys.stdout.flush()
                    pending = []
        sys.stdout.write(tokenizer.decode(pending) + "\n---------------\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(config_from_argv(SampleConfig))
