"""
Generation speed with and without the KV cache: tokens/s of model.generate for max_new_tokens new
tokens, batch 1, temperature 1.0 with a fixed torch.Generator.

    python bench/sample.py                                 # the CPU default model, block_size 256, random weights
    python bench/sample.py --out_dir=out                   # a trained checkpoint instead
    python bench/sample.py --max_new_tokens=50 --repeats=2 --out=/tmp/s.json       # smoke test

Random weights are fine for speed: a token costs the same arithmetic whatever the weights are (the
same matmuls over the same window lengths; the sampling step is the same softmax + multinomial).
Only the tokens picked differ, and nothing in generate branches on them.

Time: the two paths alternate (cache, no cache, cache, ...) for `repeats` rounds after a short
warm-up of each; each sample is one whole generate() call with a fresh generator of the same seed,
and the median is reported. The no-cache path re-runs the whole window (up to block_size tokens)
for every new token; the cache path runs one token, and refills the cache once per half block when
the window moves (model.stream).
Sanity check: at temperature 0 (greedy) both paths must produce the same tokens.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import asdict, dataclass
from typing import Literal, Optional

import torch

from attention import Backend
from bench.benchutil import (ROOT, default_out, fail, fmt, machine_info, md_table, parse, print_machine,
                             resolve_device, resolve_dtype, set_threads, summary, timed, write_json)
from checkpoint import ckpt_path, load_checkpoint, model_from_checkpoint
from data.loader import SHAKESPEARE_CHAR_DIR, load_meta
from model import GPT, GPTConfig

DEFAULT_SHAPE = {"n_layer": 4, "n_head": 4, "n_embd": 128}  # train.py's CPU default
REQUIRED_SPEEDUP = 5.0  # the issue: cache >= 5x faster for the CPU default model at block_size >= 256
REQUIRED_MIN_BLOCK = 256
REQUIRED_NEW_TOKENS = 500  # the generation length


@dataclass
class SampleBench:
    out_dir: str = ""  # a train.py out_dir holding ckpt.pt; "": random weights of the shape below
    n_layer: int = 4  # random weights: transformer blocks
    n_head: int = 4  # random weights: attention heads
    n_embd: int = 128  # random weights: width of the residual stream
    block_size: Optional[int] = None  # none: 256 (random weights) or the checkpoint's; smaller crops a checkpoint
    vocab_size: int = 0  # random weights: 0 takes data/shakespeare_char/meta.json's, else 65
    attention: Optional[Backend] = None  # none: manual / the checkpoint's
    max_new_tokens: int = 500  # new tokens per generate() call
    prompt_len: int = 1  # random prompt tokens
    temperature: float = 1.0  # of the timed runs; the sanity check also runs greedy (0)
    repeats: int = 5  # interleaved rounds; the median is reported
    warmup_tokens: int = 32  # each path generates this many untimed first
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # autocast dtype, as sample.py
    threads: int = 0  # torch threads; 0: torch's default
    seed: int = 1337  # for the random weights, the prompt and every run's generator
    out: str = ""  # JSON path; "": bench/results/sample-<device>.json

    def __post_init__(self):
        for name in ("max_new_tokens", "prompt_len", "repeats", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
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
            config = GPTConfig(vocab_size=vocab, block_size=cfg.block_size or 256, n_layer=cfg.n_layer,
                               n_head=cfg.n_head, n_embd=cfg.n_embd, attention=cfg.attention or "manual")
        except ValueError as e:
            fail(e)
        torch.manual_seed(cfg.seed)
        model = GPT(config)
        source = "random weights"
    return model.eval().to(device), source


def main(cfg):
    device = resolve_device(cfg.device)
    device_type = device.split(":")[0]
    set_threads(cfg.threads)
    dtype = resolve_dtype(cfg.dtype, device_type, training=False)
    model, source = build_model(cfg, device)
    c = model.config
    info = machine_info(device)
    print_machine(info)
    print(f"model: {c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}, block_size {c.block_size}, vocab "
          f"{c.vocab_size}, attention {c.attention} ({source}) | {cfg.max_new_tokens} new tokens after a "
          f"{cfg.prompt_len}-token prompt, batch 1, temperature {cfg.temperature}, dtype {cfg.dtype}")

    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(c.vocab_size, (1, cfg.prompt_len), generator=g).to(device)
    if cfg.prompt_len > c.block_size:
        fail(f"prompt_len={cfg.prompt_len} exceeds block_size={c.block_size}")
    autocast = torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)

    def generate(use_cache, n, temperature):
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
        with autocast:
            return model.generate(prompt, n, temperature=temperature, use_kv_cache=use_cache, generator=gen)

    paths = {"kv_cache": True, "no_cache": False}
    for use in paths.values():  # warm-up
        generate(use, min(cfg.warmup_tokens, cfg.max_new_tokens), cfg.temperature)
    samples = {name: [] for name in paths}
    for _ in range(cfg.repeats):
        for name, use in paths.items():
            samples[name].append(timed(lambda: generate(use, cfg.max_new_tokens, cfg.temperature), device))
    results = {}
    for name in paths:
        s = summary(samples[name])
        results[name] = {"time": s, "tokens_per_s": cfg.max_new_tokens / s["median"]}
    speedup = results["kv_cache"]["tokens_per_s"] / results["no_cache"]["tokens_per_s"]

    greedy_cache = generate(True, cfg.max_new_tokens, 0.0)
    greedy_full = generate(False, cfg.max_new_tokens, 0.0)
    same = torch.equal(greedy_cache, greedy_full)
    first_diff = None
    if not same:
        diff = (greedy_cache != greedy_full)[0].nonzero()
        first_diff = int(diff[0]) - cfg.prompt_len
    same_t1 = torch.equal(generate(True, cfg.max_new_tokens, cfg.temperature),
                          generate(False, cfg.max_new_tokens, cfg.temperature))

    print()
    print(md_table(["path", "tokens/s", "median s", "min-max s"],
                   [[name, f"{r['tokens_per_s']:,.0f}", fmt(r["time"]["median"], ".3f"),
                     f"{r['time']['min']:.3f}-{r['time']['max']:.3f}"] for name, r in results.items()]))
    print(f"KV cache speed-up: {speedup:.2f}x (median of {cfg.repeats} interleaved runs)")
    applies = device_type == "cpu" and all(getattr(c, k) == v for k, v in DEFAULT_SHAPE.items()) \
        and c.block_size >= REQUIRED_MIN_BLOCK and cfg.max_new_tokens >= REQUIRED_NEW_TOKENS
    holds = speedup >= REQUIRED_SPEEDUP
    if applies:
        print(f"requirement (>= {REQUIRED_SPEEDUP:.0f}x for the CPU default model at block_size >= {REQUIRED_MIN_BLOCK}): "
              f"{'HOLDS' if holds else 'DOES NOT HOLD'}")
    else:
        print(f"requirement (>= {REQUIRED_SPEEDUP:.0f}x): not applicable to this run (it is stated for the CPU default "
              f"model {DEFAULT_SHAPE} on CPU with block_size >= {REQUIRED_MIN_BLOCK} and >= {REQUIRED_NEW_TOKENS} new "
              f"tokens); {'would hold' if holds else 'would not hold'}")
    print(f"greedy (temperature 0) tokens identical with and without the cache: {'yes' if same else 'NO'}"
          + ("" if same else f" (first difference at new token {first_diff})"))
    print(f"sampled (temperature {cfg.temperature}, same generator seed) tokens identical: {'yes' if same_t1 else 'no'}"
          " (informational: float rounding may flip a draw)")
    out = cfg.out or default_out("sample", device)
    write_json(out, {"benchmark": "sample", "machine": info, "config": asdict(cfg), "model": asdict(c),
                     "source": source, "results": results, "speedup": speedup,
                     "requirement": {"min_speedup": REQUIRED_SPEEDUP, "applies": applies, "holds": holds},
                     "greedy_identical": same, "greedy_first_difference": first_diff,
                     "sampled_identical": same_t1})
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main(parse(SampleBench, sys.argv[1:]))
