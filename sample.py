"""
Sample from a trained model, streaming tokens to the terminal as they are made, or draw its
attention (attention_map.py renders the pictures):

    python sample.py                                   # from out/ckpt.pt, which `python train.py` writes
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=300 --temperature=0.8
    python sample.py --start=FILE:prompt.txt --init_from=gpt2
    python sample.py --start="ROMEO:" --max_new_tokens=40 --attention_map=attn.html   # explore its attention
"""
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from attention import Backend, check_backend
from attention_map import PICTURE_FORMATS, plot_attention, write_attention_page
from checkpoint import ckpt_path, load_checkpoint, model_from_checkpoint
from configurator import config_from_argv, fail
from data.tokenizer import GPT2Tokenizer, tokenizer_from_meta
from hardware import DType, check_threads, pick_device, pick_dtype, pick_threads
from model import GPT, check_sampling


@dataclass
class SampleConfig:
    out_dir: str = "out"  # where train.py wrote ckpt.pt
    init_from: str = "resume"  # resume (out_dir/ckpt.pt), or GPT-2 weights: gpt2, gpt2-xl, a local HF dir
    start: str = "\n"  # the prompt, or FILE:path to read it from a file
    num_samples: int = 2  # how many samples, drawn together as one batch
    max_new_tokens: int = 500  # tokens to write per sample
    temperature: float = 0.8  # 0 is greedy; below 1 sharpens, above 1 flattens the distribution
    top_k: Optional[int] = 200  # sample only from the k most likely tokens (none: all)
    top_p: Optional[float] = None  # nucleus sampling: the smallest set of tokens with probability >= top_p
    seed: int = 1337  # the same seed gives the same samples
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: DType = "auto"  # the weights' precision; auto: bf16/fp16 on GPUs, bf16 on CPUs for models beyond the cache
    threads: int = 0  # torch's CPU threads; 0: OMP_NUM_THREADS, else the CPUs this process may use
    attention: Optional[Backend] = None  # run the model with another attention backend (none: as trained)
    use_kv_cache: bool = True  # false: recompute the whole context for every token (same tokens, slower)
    attention_map: str = ""  # a .png (or .pdf, .svg, .jpg) picture or an interactive .html page of the attention
    attention_layer: int = 0  # the layer drawn large in the attention map
    attention_head: int = 0  # the head drawn large in the attention map

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.attention_map:
            folder, extension = os.path.dirname(self.attention_map) or ".", os.path.splitext(self.attention_map)[1]
            if extension.lower() not in PICTURE_FORMATS:
                raise ValueError(f"attention_map={self.attention_map!r}: the extension picks the format, one of "
                                 f"{', '.join(PICTURE_FORMATS)}")
            if not os.path.isdir(folder):
                raise ValueError(f"attention_map={self.attention_map!r}: there is no directory {folder}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        check_threads(self.threads)
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")


def main(cfg):
    """Load the model and its tokenizer, read the prompt, then draw its attention or stream samples."""
    try:
        device = pick_device(cfg.device)
        torch.set_num_threads(pick_threads(cfg.threads))
        model, tokenizer = load_model(cfg)
        dtype = pick_dtype(cfg.dtype, device.split(":")[0], training=False,
                           n_params=model.num_params(non_embedding=False))
        if cfg.attention_map:  # the page and the pictures show attention's arithmetic: in full precision
            dtype = torch.float32
        check_backend(model.config.attention, device.split(":")[0], dtype)
        prompt = cfg.start
        if prompt.startswith("FILE:"):
            with open(prompt[5:], encoding="utf-8") as f:
                prompt = f.read()
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty; give at least one character with --start=...")
    except (ValueError, OSError) as e:
        fail(e)
    # the weights themselves in dtype, not autocast: a token then reads each weight once, in half the
    # bytes in bf16, where autocast would cast every fp32 weight again for every token
    model.eval().to(device=device, dtype=dtype)
    if cfg.attention_map:
        draw_attention(model, tokenizer, ids, cfg)
    else:
        write_samples(model, tokenizer, prompt, ids, cfg)


def load_model(cfg):
    """The model and its tokenizer, from out_dir/ckpt.pt or from GPT-2 weights."""
    overrides = {"attention": cfg.attention} if cfg.attention else {}
    if cfg.init_from != "resume":
        return GPT.from_pretrained(cfg.init_from, **overrides), GPT2Tokenizer()
    path = ckpt_path(cfg.out_dir)
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint, path, **overrides)
    try:
        tokenizer = tokenizer_from_meta(checkpoint["tokenizer"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path} does not match this code's model (an incompatible config): no tokenizer "
                         f"({type(e).__name__}: {e})") from None
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise ValueError(f"{path} holds non-finite (NaN or inf) weights: the run that wrote it diverged; "
                         "train again with a lower --learning_rate")
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{path}: its tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}; the checkpoint is inconsistent")
    return model, tokenizer


@torch.no_grad()
def draw_attention(model, tokenizer, ids, cfg):
    """The attention weights, every layer and head: of the prompt as a picture, or, as an interactive
    page (.html), of the prompt and the max_new_tokens that the model first writes after it (the last
    block_size tokens of them: the window the model sees)."""
    c = model.config
    if not (0 <= cfg.attention_layer < c.n_layer and 0 <= cfg.attention_head < c.n_head):
        fail(f"attention_layer must be in [0, {c.n_layer}) and attention_head in [0, {c.n_head}) for this model")
    device = next(model.parameters()).device
    page = cfg.attention_map.lower().endswith(".html")
    if page and cfg.max_new_tokens:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        ids = model.generate(torch.tensor([ids], device=device), cfg.max_new_tokens, temperature=cfg.temperature,
                             top_k=cfg.top_k, top_p=cfg.top_p, generator=generator,
                             vocab_size=tokenizer.vocab_size)[0].tolist()
    ids = ids[-c.block_size:]
    weights = [w[0] for w in model.attention_weights(torch.tensor([ids], device=device))]  # per layer (nh, T, T)
    labels = [tokenizer.decode([i]) for i in ids]
    if page:
        write_attention_page(weights, labels, cfg.attention_map, cfg.init_from if cfg.init_from != "resume"
                             else ckpt_path(cfg.out_dir))
    else:
        plot_attention(weights, labels, cfg.attention_map, cfg.attention_layer, cfg.attention_head)
    print(f"wrote {cfg.attention_map}: {c.n_layer} layers x {c.n_head} heads over {len(ids)} tokens")


def write_samples(model, tokenizer, prompt, ids, cfg):
    """num_samples continuations of the prompt, sampled together as one batch: the first is
    streamed to stdout token by token, the others follow when the batch is done."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    idx = torch.tensor([ids] * cfg.num_samples, dtype=torch.long, device=device)  # (num_samples, T)
    new, pending = [], []  # BPE tokens can end inside a UTF-8 character; hold them until it is complete
    sys.stdout.write(prompt)
    for tokens in model.stream(idx, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                               cfg.use_kv_cache, generator, vocab_size=tokenizer.vocab_size):
        new.append(tokens)  # (num_samples, 1)
        pending.append(tokens[0, 0].item())
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text)
            sys.stdout.flush()
            pending = []
    sys.stdout.write(tokenizer.decode(pending) + "\n---------------\n")
    rows = torch.cat(new, dim=1).tolist() if new else [[] for _ in range(cfg.num_samples)]
    for row in rows[1:]:
        sys.stdout.write(prompt + tokenizer.decode(row) + "\n---------------\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(config_from_argv(SampleConfig))
