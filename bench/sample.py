"""
Generation speed: tokens/s of model.generate for max_new_tokens new tokens, batch 1, temperature
1.0 with a fixed torch.Generator, three ways side by side:

  kv_cache   model.generate: each new token runs through the model alone, against cached keys and values
  no_cache   model.generate(use_kv_cache=False): the whole window again for every token
  nanogpt    nanoGPT's generate loop (crop the context to block_size, a full forward per token,
             append with torch.cat) on the same-sized model with nanoGPT's choices (learned positions,
             PyTorch's SDPA attention, the exact GELU)

    python bench/sample.py                                 # nanoGPT's CPU model (4 x 128, block 64), random weights
    python bench/sample.py --block_size=256                # a longer window, where the cache matters more
    python bench/sample.py --out_dir=out                   # a trained checkpoint instead
    python bench/sample.py --profile=100                   # and where a token's time goes
    python bench/sample.py --max_new_tokens=50 --repeats=2 --out=/tmp/s.json       # smoke test

Random weights are fine for speed: a token costs the same arithmetic whatever the weights are (the
same matmuls over the same window lengths; the sampling step is the same softmax + multinomial).
Only the tokens picked differ, and nothing in generate branches on them.

Time: the paths alternate (kv_cache, no_cache, nanogpt, kv_cache, ...) for `repeats` rounds after a
short warm-up of each; each sample is one whole generate call with a fresh generator of the same
seed, and the median is reported. The cache path refills the cache once per half block when the
window moves (model.stream).
Sanity check: at temperature 0 (greedy) model.generate must give the same tokens with and without the cache.
Profile (--profile=N): torch.profiler over N new tokens of each path. Per token: the PyTorch ops called
from Python (top-level ops; the ops they call inside are counted in their time), the time spent inside
them, and the rest of the wall time (Python, the loop, the profiler's own cost per op). When a token
is mostly "the rest", fewer ops per token is the lever, not faster kernels.
"""
import os
import functools
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import asdict, dataclass, replace
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from attention import Backend
from bench.benchutil import (ROOT, default_out, fail, fmt, machine_info, md_table, parse, print_machine, profiled,
                             resolve_device, resolve_dtype, set_threads, summary, timed, top_ops, write_json)
from checkpoint import ckpt_path, load_checkpoint, model_from_checkpoint
from data.loader import load_meta
from data.prepare import SHAKESPEARE_CHAR_DIR
from hardware import autocast
from model import GPT
from train import TrainConfig, model_config

DEFAULT_SHAPE = {"n_layer": 4, "n_head": 4, "n_embd": 128}  # train.py's CPU default, and nanoGPT's CPU recipe
REQUIRED_SPEEDUP = 5.0  # KV cache >= 5x faster than no cache for that model at block_size >= 256
REQUIRED_MIN_BLOCK = 256
REQUIRED_VS_NANOGPT = 3.0  # model.generate >= 3x nanoGPT's loop for that model at nanoGPT's block_size 64
NANOGPT_BLOCK = 64
REQUIRED_NEW_TOKENS = 500  # the generation length the goals are stated for


@dataclass
class SampleBench:
    out_dir: str = ""  # a train.py out_dir holding ckpt.pt; "": random weights of the shape below
    n_layer: int = 4  # random weights: transformer blocks
    n_head: int = 4  # random weights: attention heads
    n_embd: int = 128  # random weights: width of the residual stream
    block_size: Optional[int] = None  # none: 64 (random weights) or the checkpoint's; smaller crops a checkpoint
    vocab_size: int = 0  # random weights: 0 takes data/shakespeare_char/meta.json's, else 65
    attention: Optional[Backend] = None  # none: manual / the checkpoint's
    max_new_tokens: int = 500  # new tokens per generate() call
    prompt_len: int = 1  # random prompt tokens
    temperature: float = 1.0  # of the timed runs; the sanity check also runs greedy (0)
    repeats: int = 5  # interleaved rounds; the median is reported
    warmup_tokens: int = 32  # each path generates this many untimed first
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # autocast dtype, as sample.py
    threads: int = 0  # torch threads; 0: the CPUs this process may use (or OMP_NUM_THREADS)
    seed: int = 1337  # for the random weights, the prompt and every run's generator
    profile: int = 0  # > 0: then profile this many new tokens of each path: ops per token and where the time goes
    out: str = ""  # JSON path; "": bench/results/sample-<device>.json

    def __post_init__(self):
        for name in ("max_new_tokens", "prompt_len", "repeats", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.profile < 0:
            raise ValueError(f"profile must be >= 0, got {self.profile}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")


def build_model(cfg, device):
    if cfg.out_dir:
        try:
            ckpt = load_checkpoint(ckpt_path(cfg.out_dir))
            model = model_from_checkpoint(ckpt, ckpt_path(cfg.out_dir),
                                          **({"attention": cfg.attention} if cfg.attention else {}))
            if cfg.block_size and cfg.block_size != model.config.block_size:
                model.crop_block_size(cfg.block_size)
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            fail(f"{cfg.out_dir}/ckpt.pt: {str(e).splitlines()[0]}")
        source = f"checkpoint {cfg.out_dir}/ckpt.pt"
    else:
        vocab = cfg.vocab_size
        if not vocab:
            data_dir = os.path.join(ROOT, SHAKESPEARE_CHAR_DIR)
            vocab = load_meta(data_dir)["vocab_size"] if os.path.exists(os.path.join(data_dir, "meta.json")) else 65
        try:
            config = replace(model_config(TrainConfig(), vocab), block_size=cfg.block_size or NANOGPT_BLOCK,
                             n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                             attention=cfg.attention or TrainConfig.attention)  # train.py's model, in this shape
        except ValueError as e:
            fail(e)
        torch.manual_seed(cfg.seed)
        model = GPT(config)
        source = "random weights"
    return model.eval().to(device), source


@torch.no_grad()
def nanogpt_generate(model, idx, max_new_tokens, temperature=1.0, generator=None):
    """nanoGPT's GPT.generate (karpathy/nanoGPT model.py), as the baseline: crop the context to
    block_size, run all of it through the model for every new token, append with torch.cat."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= model.config.block_size else idx[:, -model.config.block_size:]
        logits, _ = model(idx_cond, last_only=True)  # nanoGPT's forward also skips the head for all but the last
        probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1, generator=generator)), dim=1)
    return idx


def generate_path(path, n, temperature, *, model, baseline, prompt, seed, device, autocast):
    """One timed unit: n new tokens by `path`, from a fresh generator of the same seed."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with autocast:
        if path == "nanogpt":
            return nanogpt_generate(baseline, prompt, n, max(temperature, 1e-6), gen)
        return model.generate(prompt, n, temperature=temperature, use_kv_cache=path == "kv_cache", generator=gen)


def time_paths(cfg, generate, paths, device):
    """{path: {"time": summary, "tokens_per_s"}}, the paths interleaved for cfg.repeats rounds after a warm-up."""
    for path in paths:
        generate(path, min(cfg.warmup_tokens, cfg.max_new_tokens), cfg.temperature)
    samples = {path: [] for path in paths}
    for _ in range(cfg.repeats):
        for path in paths:
            samples[path].append(timed(lambda: generate(path, cfg.max_new_tokens, cfg.temperature), device))
    results = {}
    for path in paths:
        s = summary(samples[path])
        results[path] = {"time": s, "tokens_per_s": cfg.max_new_tokens / s["median"]}
    return results


def greedy_check(cfg, generate):
    """(same tokens at temperature 0 with and without the cache?, the first new token that differs or None)."""
    greedy_cache = generate("kv_cache", cfg.max_new_tokens, 0.0)
    greedy_full = generate("no_cache", cfg.max_new_tokens, 0.0)
    if torch.equal(greedy_cache, greedy_full):
        return True, None
    return False, int((greedy_cache != greedy_full)[0].nonzero()[0]) - cfg.prompt_len


def nanogpt_model(config, seed, device):
    """A model of the same size with nanoGPT's choices: learned positions, PyTorch's SDPA, nn.GELU() (the
    exact GELU), GPT-2's init."""
    torch.manual_seed(seed)
    nanogpt = replace(config, pos_embedding="learned", attention="sdpa", norm="layernorm", qk_norm=False,
                      activation="gelu")
    return GPT(nanogpt).eval().to(device)


def profile_paths(cfg, generate, paths, device):
    """Where a token's time goes, per path: torch.profiler over cfg.profile new tokens (see the top)."""
    profiles = {}
    for path in paths:
        wall, prof = profiled(lambda: generate(path, cfg.profile, cfg.temperature), device)
        wall /= cfg.profile
        top_level = [e for e in prof.events()
                     if e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))]
        in_ops = sum(e.cpu_time_total for e in top_level) / 1e6 / cfg.profile
        p = profiles[path] = {"token_ms": wall * 1e3, "ops_per_token": len(top_level) / cfg.profile,
                              "in_ops_ms": in_ops * 1e3, "outside_ops_ms": (wall - in_ops) * 1e3,
                              "top_ops_us": {k: us / cfg.profile for k, us in top_ops(prof, 10).items()}}
        print(f"\nprofile of {path}: {p['token_ms']:.2f} ms per token under the profiler; "
              f"{p['ops_per_token']:.0f} ops called per token, {p['in_ops_ms']:.2f} ms inside them "
              f"({in_ops / wall:.0%}), {p['outside_ops_ms']:.2f} ms outside (Python, the loop, the profiler)")
        print(md_table(["op (self time)", "us/token", "share"],
                       [[k, f"{us:.1f}", f"{us / 1e3 / p['token_ms']:.1%}"] for k, us in p["top_ops_us"].items()]))
    return profiles


def check_requirements(c, cfg, device_type, speedup, vs_nanogpt):
    """The two sampling goals (bench/README.md), each printed as holding or not, or as not applicable to this run."""
    default_model = device_type == "cpu" and all(getattr(c, k) == v for k, v in DEFAULT_SHAPE.items()) \
        and cfg.max_new_tokens >= REQUIRED_NEW_TOKENS
    requirements = {
        "kv_cache_vs_no_cache": {"min": REQUIRED_SPEEDUP, "value": speedup,
                                 "applies": default_model and c.block_size >= REQUIRED_MIN_BLOCK,
                                 "stated": f"block_size >= {REQUIRED_MIN_BLOCK}"},
        "kv_cache_vs_nanogpt": {"min": REQUIRED_VS_NANOGPT, "value": vs_nanogpt,
                                "applies": default_model and c.block_size == NANOGPT_BLOCK,
                                "stated": f"block_size {NANOGPT_BLOCK}"}}
    for name, r in requirements.items():
        r["holds"] = r["value"] >= r["min"]
        verdict = ("HOLDS" if r["holds"] else "DOES NOT HOLD") if r["applies"] else \
            f"not applicable to this run (stated for the CPU model {DEFAULT_SHAPE}, {r['stated']}, " \
            f"{REQUIRED_NEW_TOKENS} new tokens)"
        print(f"requirement {name} >= {r['min']:.0f}x: {verdict}")
    return requirements


def main(cfg):
    device = resolve_device(cfg.device)
    device_type = device.split(":")[0]
    set_threads(cfg.threads)
    dtype = resolve_dtype(cfg.dtype, device_type, training=False)
    model, source = build_model(cfg, device)
    c = model.config
    baseline = nanogpt_model(c, cfg.seed, device)
    info = machine_info(device)
    print_machine(info)
    print(f"model: {c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}, block_size {c.block_size}, vocab "
          f"{c.vocab_size}, attention {c.attention}, positions {c.pos_embedding} ({source}) | {cfg.max_new_tokens} "
          f"new tokens after a {cfg.prompt_len}-token prompt, batch 1, temperature {cfg.temperature}, dtype {cfg.dtype}")

    if cfg.prompt_len > c.block_size:
        fail(f"prompt_len={cfg.prompt_len} exceeds block_size={c.block_size}")
    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(c.vocab_size, (1, cfg.prompt_len), generator=g).to(device)
    generate = functools.partial(generate_path, model=model, baseline=baseline, prompt=prompt, seed=cfg.seed,
                                 device=device, autocast=autocast(device_type, dtype))
    paths = ("kv_cache", "no_cache", "nanogpt")
    results = time_paths(cfg, generate, paths, device)
    speedup = results["kv_cache"]["tokens_per_s"] / results["no_cache"]["tokens_per_s"]
    vs_nanogpt = results["kv_cache"]["tokens_per_s"] / results["nanogpt"]["tokens_per_s"]
    same, first_diff = greedy_check(cfg, generate)

    print()
    print(md_table(["path", "tokens/s", "median s", "min-max s", "vs nanogpt"],
                   [[name, f"{r['tokens_per_s']:,.0f}", fmt(r["time"]["median"], ".3f"),
                     f"{r['time']['min']:.3f}-{r['time']['max']:.3f}",
                     f"{r['tokens_per_s'] / results['nanogpt']['tokens_per_s']:.2f}x"] for name, r in results.items()]))
    print(f"(median of {cfg.repeats} interleaved runs) KV cache vs no cache: {speedup:.2f}x; "
          f"model.generate vs nanoGPT's loop: {vs_nanogpt:.2f}x")
    requirements = check_requirements(c, cfg, device_type, speedup, vs_nanogpt)
    profiles = profile_paths(cfg, generate, paths, device) if cfg.profile else None
    print(f"greedy (temperature 0) tokens identical with and without the cache: {'yes' if same else 'NO'}"
          + ("" if same else f" (first difference at new token {first_diff})"))
    out = cfg.out or default_out("sample", device)
    write_json(out, {"benchmark": "sample", "machine": info, "config": asdict(cfg), "model": asdict(c),
                     "source": source, "results": results, "speedup": speedup, "vs_nanogpt": vs_nanogpt,
                     "requirements": requirements, "profile": profiles, "greedy_identical": same,
                     "greedy_first_difference": first_diff})
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main(parse(SampleBench, sys.argv[1:]))
