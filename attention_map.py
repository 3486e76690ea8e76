"""
Pictures of attention: an interactive, self-contained HTML page (the template attention_map.html
beside this file, filled in with the model's numbers) and a static picture drawn with matplotlib
(.png, .pdf, .svg, .jpg). `python sample.py --attention_map=FILE` writes them.

The page covers the whole text, prompt and what the model wrote. Each token's row is its attention
over its own window, the last block_size tokens up to it (all of them while the text is shorter): a
window that slides, where sampling's jumped by half a block, which the page tells its reader. A row
holds the arithmetic of manual_attention with the model's numbers: for every key in the window the
raw score q·k, and the share of the output o = Σ α v that the key brings (α_j |v_j| over Σ α |v|),
and per row |o|. The page divides by √d and takes the softmax itself, so what it shows as
weights is what it shows as scores, put through the formula.
"""
import base64
import html
import json
import os
import re

import torch

from attention import causal_mask
from files import atomic_write

PICTURE_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".html")  # what --attention_map writes, by its extension
# what one forward over windows past the first may keep, summed over layers: attention_steps holds every
# layer's weights (W, nh, T, T) and q, k, v (W, nh, T, hs) at once. 2**24 numbers, 64 MiB in fp32:
# ~100 windows of train.py's default model; one of GPT-2's, which alone keeps ~180M
KEPT_PER_FORWARD = 2**24


PAGE_MAX_BYTES = 512 * 2**20  # a page larger than this is more than a browser opens well (and takes GiBs to make)
# each small map of a page is a canvas of tokens x tokens pixels: a browser draws nothing on one wider than this
# (Chrome's limit; Firefox's is 32,767), and says nothing either
PAGE_MAX_TOKENS = 16_384


def page_bytes(config, n_tokens):
    """About how large write_attention_page's page over n_tokens is: for every layer and head, each row's
    keys (min(i + 1, block_size) for row i) a half-precision score and a byte share, and a row's fp32 |o|,
    in base64 (4 characters for 3 bytes)."""
    T = config.block_size
    keys = n_tokens * (n_tokens + 1) // 2 if n_tokens <= T else T * (T + 1) // 2 + (n_tokens - T) * T
    return config.n_layer * config.n_head * (3 * keys + 4 * n_tokens) * 4 // 3


def windows_per_forward(config):
    """How many windows of block_size tokens one forward takes: as many as keep at most
    KEPT_PER_FORWARD numbers, and at least one."""
    T = config.block_size
    per_window = config.n_layer * T * (config.n_head * T + 3 * config.n_embd)  # weights, and q, k, v
    return max(1, KEPT_PER_FORWARD // per_window)


@torch.no_grad()
def attention_rows(model, ids):
    """The page's numbers for the text ids (N tokens): scores and shares (n_layer, n_head, E), and
    out_norms (n_layer, n_head, N); row i holds the min(i + 1, block_size) keys of its window in
    order, and E sums them, row after row."""
    block_size, device = model.config.block_size, next(model.parameters()).device
    tokens = torch.tensor(ids, device=device)
    first = tokens[:block_size]  # rows 0 .. block_size-1: one causal forward gives all of them
    parts = [forward_rows(model, first[None], len(first))]
    step = windows_per_forward(model.config)
    for start in range(block_size, len(ids), step):  # row i sees tokens i-block_size+1 .. i
        ends = range(start, min(start + step, len(ids)))
        windows = torch.stack([tokens[end - block_size + 1:end + 1] for end in ends])  # (W, block_size)
        parts.append(forward_rows(model, windows, 1))  # each window's last row
    return tuple(torch.cat(x, dim=-1) for x in zip(*parts))


def forward_rows(model, windows, n_rows):
    """The page's numbers from one forward over windows (W, T): of each window's last n_rows rows,
    each over its keys up to itself, stacked over layers: scores and shares (L, nh, W * K), K the
    keys of those rows, and |o| (L, nh, W * n_rows). Only these rows are worked out and kept."""
    seen = causal_mask(n_rows, windows.size(1), windows.device)  # (n_rows, T)
    parts = []
    for q, k, v, weights in model.attention_steps(windows):
        scores, shares, norms = row_arithmetic(q[:, :, -n_rows:], k, v, weights[:, :, -n_rows:])
        parts.append((scores[:, :, seen].transpose(0, 1).flatten(1),  # (nh, W * K)
                      shares[:, :, seen].transpose(0, 1).flatten(1), norms.transpose(0, 1).flatten(1)))
    return tuple(torch.stack(x) for x in zip(*parts))


def row_arithmetic(q, k, v, weights):
    """One layer's numbers for R query rows, from q (B, nh, R, hs), k and v (B, nh, T, hs) and weights
    (B, nh, R, T): the raw scores q·k and each key's share of o, both (B, nh, R, T), and |o| (B, nh, R)."""
    q, k, v, weights = q.float(), k.float(), v.float(), weights.float()
    scores = q @ k.transpose(-2, -1)  # before the division by √d, which the page shows as its own step
    brought = weights * v.norm(dim=-1).unsqueeze(-2)  # α_j |v_j|: how much of the sum each key brings
    return scores, brought / brought.sum(dim=-1, keepdim=True), (weights @ v).norm(dim=-1)


def write_attention_page(model, ids, labels, n_prompt, path, title, layer=0, head=0):
    """One self-contained HTML page (attention_map.html, beside this file, filled in) to explore the
    attention of the text ids (labels: each token as text; the first n_prompt are the prompt), opened
    on one layer and head.
    Scores are kept in half precision (3 significant digits), shares in a byte (1/255), |o| in
    fp32: a few MB for the default model over 1,000 tokens (bench/attention_page.py measures it)."""
    scores, shares, norms = attention_rows(model, ids)
    c = model.config
    data = {"tokens": labels, "n_prompt": n_prompt, "n_layer": c.n_layer, "n_head": c.n_head,
            "head_size": c.n_embd // c.n_head, "block_size": c.block_size, "layer": layer, "head": head,
            "scores": packed(scores.to(torch.float16)), "shares": packed((shares * 255).round().to(torch.uint8)),
            "out_norms": packed(norms.to(torch.float32))}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_map.html"), encoding="utf-8") as f:
        page = f.read()
    fills = {"__TITLE__": html.escape(title), "__DATA__": json.dumps(data).replace("</", "<\\/")}
    page = re.sub("__TITLE__|__DATA__", lambda m: fills[m.group()], page)  # one pass: neither fills the other
    atomic_write(path, lambda f: f.write(page.encode("utf-8")))


def packed(t):
    """A tensor's values as base64 of their little-endian bytes, layer by layer, head by head, row by row."""
    array = t.contiguous().cpu().numpy()
    return base64.b64encode(array.astype(array.dtype.newbyteorder("<")).tobytes()).decode("ascii")


def plot_attention(weights, labels, path, layer=0, head=0):
    """weights: per-layer tensors (nh, T, T) for one sequence; labels: the T tokens as text.
    Left: every layer x head as a small grid; right: the chosen (layer, head) large, labelled. Written
    to path in the format its extension names (PICTURE_FORMATS)."""
    from matplotlib.figure import Figure  # to a file, without pyplot: no screen, no backend set for the process

    n_layer, n_head = len(weights), weights[0].size(0)
    fig = Figure(figsize=(2 * n_head + 8, max(2 * n_layer, 6)))
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
    # newlines and spaces made visible; a $ literal, where matplotlib would start a formula between two
    # (a byte token's text is escaped already, \xe6: shown as it is, not escaped again)
    visible = ["".join(c if c.isprintable() else repr(c)[1:-1] for c in t).replace(" ", "␣").replace("$", r"\$")
               for t in labels]
    ax.set_xticks(range(len(visible)), visible, rotation=90, fontsize=7)
    ax.set_yticks(range(len(visible)), visible, fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(f"layer {layer}, head {head}: row i = how query i spreads its attention")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    # whole or not at all, as the page: a full disk leaves the picture that was there
    atomic_write(path, lambda f: fig.savefig(f, format=os.path.splitext(path)[1][1:].lower(), dpi=100))
