"""
How the weights learn: the optimizers (AdamW, and Muon for the blocks' matrices) and the
learning-rate schedule that scales their rates, step by step.
"""
import math
from typing import Literal, get_args

import torch

Optimizer = Literal["adamw", "muon"]  # the one list of optimizer names


def configure_optimizers(model, optimizer, learning_rate, weight_decay, betas, muon_lr, device_type,
                         dtype=torch.float32):
    """optimizer="adamw": AdamW for everything, with weight decay on matrices (Linear weights,
    embeddings) only, not on biases and norms. "muon": Muon (below) for the 2-D weights inside
    the blocks, AdamW for the rest. dtype is the training precision: Muon's Newton-Schulz
    matmuls run in bf16 where the step does (or on CUDA), else in fp32. Each group keeps its
    peak rate as "initial_lr", which set_lr scales."""
    if optimizer not in get_args(Optimizer):
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(get_args(Optimizer))}")
    muon_params = [p for p in model.transformer.h.parameters() if p.dim() == 2] if optimizer == "muon" else []
    in_muon = {id(p) for p in muon_params}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in in_muon]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = device_type in ("cuda", "cpu")  # one kernel for all parameters, not a loop of small ops
    optimizers = [torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)]
    if muon_params:
        ns_dtype = torch.bfloat16 if device_type == "cuda" or dtype == torch.bfloat16 else torch.float32
        optimizers.append(Muon(muon_params, lr=muon_lr, weight_decay=weight_decay, ns_dtype=ns_dtype))
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def lr_multiplier(cfg, it, elapsed):
    """The learning rate as a fraction of its peak: linear warm-up over warmup_iters, then a cosine
    down to min_lr/learning_rate as training progresses, by the clock if max_seconds is set: from the
    warm-up's end (its seconds taken at the run's pace so far, so that a slow machine, whose warm-up
    takes much of the budget, still starts the decay at the peak) to max_seconds.
    cfg: train.py's settings; it: the iteration; elapsed: seconds of training so far."""
    if it < cfg.warmup_iters:
        return (it + 1) / (cfg.warmup_iters + 1)
    if cfg.max_seconds > 0:
        warmup_seconds = elapsed * cfg.warmup_iters / it if it else 0.0
        left = cfg.max_seconds - warmup_seconds
        progress = (elapsed - warmup_seconds) / left if left > 0 else 1.0
    else:
        decay_iters = (cfg.max_iters if schedule_reads_max_iters(cfg) else cfg.lr_decay_iters) - cfg.warmup_iters
        progress = (it - cfg.warmup_iters) / max(1, decay_iters)
    floor = cfg.min_lr / cfg.learning_rate
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (1.0 - floor)


def schedule_note(cfg):
    """A note on a schedule that is likely not what was meant, else "": lr_decay_iters set but not used, since
    with max_seconds the decay follows the clock (a config's iteration schedule run for a time, as
    bench/recipe.py runs nanoGPT's); max_iters set where the decay follows the clock, so that a run it stops
    ends before its decay does; or a run by iterations that ends before its decay starts (where
    lr_decay_iters sets the decay's end, max_iters only stops the run, as under the clock). "" where
    nothing trains (eval_only)."""
    if cfg.eval_only:
        return ""
    if cfg.max_seconds > 0 and cfg.lr_decay_iters:
        return (f"note: lr_decay_iters={cfg.lr_decay_iters} is not used: with max_seconds={cfg.max_seconds:g} the "
                "learning rate decays by the clock (--max_seconds=0 decays it by iterations)")
    if cfg.max_seconds > 0 and cfg.max_iters < type(cfg)().max_iters:  # fewer than the default: set to stop
        return (f"note: with max_seconds={cfg.max_seconds:g} the learning rate decays by the clock: max_iters="
                f"{cfg.max_iters} only stops the run, before the decay ends if it comes first (--max_seconds=0 "
                "decays it by iterations, to max_iters)")
    # the decay starts at the peak; a run of one step has nothing to decay (nor a setting that would change that)
    if schedule_reads_max_iters(cfg) and 2 <= cfg.max_iters <= cfg.warmup_iters + 1:
        return (f"note: max_iters={cfg.max_iters} ends by the warm-up's end (warmup_iters={cfg.warmup_iters}): the "
                "learning rate never decays; set --warmup_iters below max_iters - 1 for a warm-up and a decay")
    return ""


def unused_by_optimizer(cfg):
    """The rate settings that cfg's optimizer does not read: Muon's beside AdamW alone."""
    return ("muon_lr",) if cfg.optimizer != "muon" else ()


def unread_by_schedule(cfg):
    """The settings that lr_multiplier does not read with cfg's: under the clock lr_decay_iters, and max_iters
    where it only stops the run (a later stop trains as an uninterrupted run would)."""
    by_the_clock = ("lr_decay_iters",) if cfg.max_seconds > 0 else ()
    return by_the_clock + (() if schedule_reads_max_iters(cfg) else ("max_iters",))


def schedule_reads_max_iters(cfg):
    """Whether lr_multiplier's decay ends at max_iters: not where it follows the clock (max_seconds) or
    ends at lr_decay_iters; there max_iters is only where a run stops."""
    return cfg.max_seconds <= 0 and not cfg.lr_decay_iters


def set_lr(optimizers, multiplier):
    """Every group's rate: its peak ("initial_lr") times the schedule's multiplier."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * multiplier


class Muon(torch.optim.Optimizer):
    """Muon (Keller Jordan, 2024): momentum SGD whose update, a matrix, is replaced by the nearest
    orthogonal-ish matrix, found by a few Newton-Schulz iterations. The same update as
    torch.optim.Muon (Nesterov momentum, decoupled weight decay, lr scaled by sqrt(max(1, rows/cols))),
    written out because that one runs its iterations in bf16 always, one matrix at a time, which is
    slow on a CPU without bf16 instructions (bench/README.md). Here the matrices of one shape go
    through the iterations together, as one batched matmul, in ns_dtype."""

    def __init__(self, params, lr=0.02, weight_decay=0.1, momentum=0.95, ns_steps=5, ns_dtype=torch.bfloat16):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps,
                                      ns_dtype=ns_dtype))
        self.update, self.compiled = muon_update, False  # compile() swaps in a compiled update

    def add_param_group(self, param_group):  # torch.optim.Optimizer.__init__ adds its groups here too
        super().add_param_group(param_group)  # torch's own checks first: tensors, in a list
        not_matrix = next((p for p in self.param_groups[-1]["params"] if p.dim() != 2), None)
        if not_matrix is not None:
            self.param_groups.pop()
            raise ValueError(f"Muon takes matrices only, got a parameter of shape {tuple(not_matrix.shape)}: give "
                             "vectors (biases, norms) and other shapes to AdamW")

    def __setstate__(self, state):  # load_state_dict comes here: a torch.optim.Muon state has no ns_dtype
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("ns_dtype", torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # torch.optim's contract: re-evaluate the model, return its loss
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for shape, params in by_shape(p for p in group["params"] if p.grad is not None).items():
                for p in params:  # not setdefault, which would build (and zero) a new buffer every step
                    if "momentum_buffer" not in self.state[p]:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                bufs = [self.state[p]["momentum_buffer"] for p in params]
                self.update(params, [p.grad for p in params], bufs, *update_settings(group, shape, self.compiled))
        return loss

    @torch.no_grad()
    def compile(self):
        """From now on, each shape's update runs as one compiled graph (on a CPU its two dozen small
        ops cost more than their arithmetic: bench/README.md). Compiled here, on zeros shaped like
        the parameters, so not in the first step; the weights and the state are not touched. Raises
        what torch.compile raises, and the update stays as it was."""
        update = torch.compile(muon_update, dynamic=False)  # a graph per shape, as step() calls it
        for group in self.param_groups:
            for shape, params in by_shape(group["params"]).items():
                zeros = [torch.zeros_like(p) for p in params]
                update([torch.nn.Parameter(z.clone()) for z in zeros], zeros, [z.clone() for z in zeros],
                       *update_settings(group, shape, rate_as_tensor=True))
        self.update, self.compiled = update, True


def by_shape(params):
    """{shape: [the parameters of that shape]}: the matrices that go through Newton-Schulz together."""
    groups = {}
    for p in params:
        groups.setdefault(p.shape, []).append(p)
    return groups


def update_settings(group, shape, rate_as_tensor):
    """muon_update's settings for the matrices of one shape in group. A compiled update takes the rate
    as a tensor, so that every rate the schedule gives runs the same graph (a number would be compiled
    in, and each new one compiled again)."""
    lr = torch.tensor(group["lr"], device=group["params"][0].device) if rate_as_tensor else group["lr"]
    scale = max(1, shape[0] / shape[1]) ** 0.5
    return lr, group["weight_decay"], group["momentum"], group["ns_steps"], group["ns_dtype"], scale


def muon_update(params, grads, bufs, lr, weight_decay, momentum, ns_steps, ns_dtype, scale):
    """One Muon step for matrices of one shape: momentum, Nesterov's look-ahead, orthogonalized,
    weight decay, then the step. params, grads, bufs: lists of (rows, cols); lr: a number or a 0-d tensor."""
    torch._foreach_lerp_(bufs, grads, 1 - momentum)
    updates = torch.stack(torch._foreach_lerp(grads, bufs, momentum))  # Nesterov: (n, rows, cols)
    updates = orthogonalize(updates.to(ns_dtype), ns_steps).to(params[0].dtype)
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_add_(params, (updates * (-lr * scale)).unbind(0))


def orthogonalize(g, steps, eps=1e-7):
    """Newton-Schulz iterations towards U V^T for each matrix U S V^T in g (n, rows, cols); the
    quintic's coefficients push small singular values up fast, to ~[0.7, 1.2] rather than exactly 1."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.size(1) > g.size(2)
    x = g.mT if tall else g  # (n, r, k) with r <= k: the Gram matrices are the small side
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (n, r, r)
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x
