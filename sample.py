"""
Sample from a trained model, streaming tokens to the terminal as they are made:

    python sample.py                                   # from out/ckpt.pt, which `python train.py` writes
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=300 --temperature=0.8
    python sample.py --start=FILE:prompt.txt --init_from=gpt2
    python sample.py --start="ROMEO:" --max_new_tokens=40 --attention_map=attn.html   # explore its attention
"""
import base64
import html
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from attention import Backend, check_backend
from checkpoint import atomic_write, ckpt_path, load_checkpoint, model_from_checkpoint
from configurator import DType, check_threads, config_from_argv, fail, pick_device, pick_dtype, pick_threads
from data.tokenizer import GPT2Tokenizer, tokenizer_from_meta
from model import GPT, check_sampling


PICTURE_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".html")  # what --attention_map writes, by its extension


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
    dtype: DType = "auto"  # autocast precision; auto: bf16/fp16 on GPUs, fp32 on CPUs
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


def main(cfg):
    """Load the model and its tokenizer, read the prompt, then draw its attention or stream samples."""
    try:
        device = pick_device(cfg.device)
        dtype = pick_dtype(cfg.dtype, device.split(":")[0], training=False)
        torch.set_num_threads(pick_threads(cfg.threads))
        if cfg.attention:
            check_backend(cfg.attention, device.split(":")[0], dtype)
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
    else:
        write_samples(model, tokenizer, prompt, ids, cfg, dtype)


def write_samples(model, tokenizer, prompt, ids, cfg, dtype):
    """num_samples continuations of the prompt, sampled together as one batch: the first is
    streamed to stdout token by token, the others follow when the batch is done."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    idx = torch.tensor([ids] * cfg.num_samples, dtype=torch.long, device=device)  # (num_samples, T)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    new, pending = [], []  # BPE tokens can end inside a UTF-8 character; hold them until it is complete
    sys.stdout.write(prompt)
    with autocast:
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


def write_attention_page(weights, labels, path, title):
    """One self-contained HTML page (assets/attention_page.html filled in) to explore the weights:
    per layer (nh, T, T); labels: the T tokens as text. Each head's lower triangle is kept, rounded
    to a byte (1/255), so a block of 256 tokens x 144 heads (GPT-2) is about 6 MB."""
    T = len(labels)
    lower = torch.ones(T, T, dtype=torch.bool).tril()  # row i holds weights 0..i; the rest are masked
    packed = torch.cat([(w.float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)[:, lower].flatten()
                        for w in weights])  # layer by layer, head by head, row by row
    data = {"tokens": labels, "n_layer": len(weights), "n_head": weights[0].size(0),
            "weights": base64.b64encode(packed.numpy().tobytes()).decode("ascii")}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "attention_page.html"),
              encoding="utf-8") as f:
        page = f.read()
    page = page.replace("__TITLE__", html.escape(title)).replace("__DATA__", json.dumps(data).replace("</", "<\\/"))
    atomic_write(path, lambda f: f.write(page.encode("utf-8")))


def plot_attention(weights, labels, png_path, layer=0, head=0):
    """weights: per-layer tensors (nh, T, T) for one sequence; labels: the T tokens as text.
    Left: every layer x head as a small grid; right: the chosen (layer, head) large, labelled."""
    import matplotlib
    matplotlib.use("Agg")  # files only; works on machines without a screen
    import matplotlib.pyplot as plt

    n_layer, n_head = len(weights), weights[0].size(0)
    fig = plt.figure(figsize=(2 * n_head + 8, max(2 * n_layer, 6)))
    grid = fig.add_gridspec(n_layer, n_head + 4)
    for i in range(n_layer):
        for j in range(n_head):
            ax = fig.add_subplot(grid[i, j])
            ax.imshow(weights[i][j].float().cpu().numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {j}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"layer {i}", fontsize=8)
    ax = fig.add_subplot(grid[:, n_head:])
    image = ax.imshow(weights[layer][head].float().cpu().numpy(), cmap="viridis", vmin=0, vmax=1)
    shown = [repr(t)[1:-1].replace(" ", "␣") for t in labels]  # make newlines and spaces visible
    ax.set_xticks(range(len(shown)), shown, rotation=90, fontsize=7)
    ax.set_yticks(range(len(shown)), shown, fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(f"layer {layer}, head {head}: row i = how query i spreads its attention")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main(config_from_argv(SampleConfig))
