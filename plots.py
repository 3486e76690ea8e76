"""
Pictures of training and of attention, drawn with matplotlib (no display needed).
"""
import json

import matplotlib

matplotlib.use("Agg")  # files only; works on machines without a screen
import matplotlib.pyplot as plt  # noqa: E402


def plot_losses(metrics_path, png_path):
    """Train and val loss against iterations and against training time, from train.py's metrics.jsonl."""
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x in zip(axes, ("iter", "seconds")):
        ax.plot([r[x] for r in steps], [r["loss"] for r in steps], alpha=0.4, label="train (logged steps)")
        ax.plot([r[x] for r in evals], [r["train_loss"] for r in evals], "o-", label="train (eval)")
        ax.plot([r[x] for r in evals], [r["val_loss"] for r in evals], "o-", label="val (eval)")
        ax.set_xlabel("iteration" if x == "iter" else "training seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy loss")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def plot_attention(weights, labels, png_path, layer=0, head=0):
    """weights: per-layer tensors (nh, T, T) for one sequence; labels: the T tokens as text.
    Left: every layer x head as a small grid; right: the chosen (layer, head) large, labelled."""
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
