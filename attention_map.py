"""
Pictures of attention weights: an interactive, self-contained HTML page (the template
attention_map.html beside this file, filled in with the weights) and a static picture drawn with
matplotlib (.png, .pdf, .svg, .jpg). `python sample.py --attention_map=FILE` writes them.
"""
import base64
import html
import json
import os

import torch

from files import atomic_write

PICTURE_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".html")  # what --attention_map writes, by its extension


def write_attention_page(weights, labels, path, title):
    """One self-contained HTML page (attention_map.html, beside this file, filled in) to explore the weights:
    per layer (nh, T, T); labels: the T tokens as text. Each head's lower triangle is kept, rounded
    to a byte (1/255), so a block of 256 tokens x 144 heads (GPT-2) is about 6 MB."""
    T = len(labels)
    lower = torch.ones(T, T, dtype=torch.bool).tril()  # row i holds weights 0..i; the rest are masked
    packed = torch.cat([(w.float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)[:, lower].flatten()
                        for w in weights])  # layer by layer, head by head, row by row
    data = {"tokens": labels, "n_layer": len(weights), "n_head": weights[0].size(0),
            "weights": base64.b64encode(packed.numpy().tobytes()).decode("ascii")}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_map.html"), encoding="utf-8") as f:
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
    visible = [repr(t)[1:-1].replace(" ", "␣") for t in labels]  # make newlines and spaces visible
    ax.set_xticks(range(len(visible)), visible, rotation=90, fontsize=7)
    ax.set_yticks(range(len(visible)), visible, fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(f"layer {layer}, head {head}: row i = how query i spreads its attention")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
