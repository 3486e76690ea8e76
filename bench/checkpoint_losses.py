"""
The mean loss of trained checkpoints on given batches, computed by the model code of the checkout this
runs in (its working directory), not by the code of the checkout this file came from. bench/recipe.py
runs it once per checkout whose train.py trained runs, so that a base commit's checkpoints are scored by
the model that trained them: a forward that changed without a config setting to say so (a scratch
change of the MLP, say) would otherwise be scored as this checkout's model, or fail to load.

    cd CHECKOUT && python /path/to/bench/checkpoint_losses.py OUT.json BATCHES.pt THREADS DEVICE CKPT.pt ...

BATCHES.pt holds {split: [(x, y), ...]} (torch.save); OUT.json gets, per checkpoint, {split: mean loss}
or {"error": why it could not be scored}. It needs only what every checkout since the base commit of
bench/README.md has: checkpoint.load_checkpoint, checkpoint.model_from_checkpoint, and a forward that
returns (logits, loss).
"""
import json
import os
import sys


def parse_args(argv):
    """main's arguments from the command line; --help prints this file's docstring, and a wrong command line
    is one line (this runs inside another checkout, so it uses nothing of this repository's to say so)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    if len(argv) < 5 or not argv[2].isdigit():
        print("error: bench/checkpoint_losses.py takes OUT.json BATCHES.pt THREADS DEVICE CKPT.pt ..., THREADS a whole "
              "number (0: torch's own); bench/recipe.py runs it", file=sys.stderr)
        sys.exit(2)
    return argv[0], argv[1], int(argv[2]), *argv[3:]


if __name__ == "__main__":  # the command line first: what follows is imported from the checkout this runs in
    ARGS = parse_args(sys.argv[1:])
    sys.path[0] = os.getcwd()  # the checkout's modules, not those beside this file (bench/train.py is no train.py)

import torch  # noqa: E402

from checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402 - from the checkout, after the path


@torch.no_grad()
def mean_loss(model, batches):
    return sum(model(x, y)[1].float().item() for x, y in batches) / len(batches)


def checkpoint_losses(path, splits, device):
    """{split: mean loss} of the checkpoint at path, in float32 without dropout, or {"error": ...}."""
    try:
        model = model_from_checkpoint(load_checkpoint(path), path).to(device).eval()
    except ValueError as e:
        return {"error": str(e).splitlines()[0]}
    return {split: mean_loss(model, batches) for split, batches in splits.items()}


def main(out, batches_path, threads, device, *paths):
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        splits = torch.load(batches_path, map_location=device, weights_only=True)
    except OSError as e:
        print(f"error: {batches_path}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    results = [checkpoint_losses(path, splits, device) for path in paths]
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*ARGS)
