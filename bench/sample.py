"""
Generation speed: tokens/s of model.generate, batch 1, side by side with a reference
(--reference=...):

  nanogpt (default)  nanoGPT's CPU model (4 x 128, block 64), 500 new tokens at temperature 1.0 with
             a fixed torch.Generator, three ways:
    kv_cache   model.generate: each new token runs through the model alone, against cached keys and values,
               its Linears packed for oneDNN where sample.py packs them (sample.pack_for_decoding; then
               kv_cache_unpacked times the same without)
    no_cache   model.generate(use_kv_cache=False): the whole window again for every token (kv_cache's model)
    nanogpt    nanoGPT's generate loop (crop the context to block_size, a full forward per token,
               append with torch.cat) on the same-sized model with nanoGPT's choices (learned positions,
               PyTorch's SDPA attention, the exact GELU)
  transformers  GPT-2 124M's shape and architecture, 200 new greedy tokens (what a user waits for a
             paragraph of), the same weights in both:
    kv_cache          model.generate
    transformers      Hugging Face transformers' GPT2LMHeadModel.generate with its KV cache, in the same dtype
    transformers_fp32 the same in fp32, its default, when the dtype is another

    python bench/sample.py                                 # against nanoGPT, random weights
    python bench/sample.py --block_size=256                # a longer window, where the cache matters more
    python bench/sample.py --out_dir=out                   # a trained checkpoint instead
    python bench/sample.py --reference=transformers        # GPT-2 124M against transformers
    python bench/sample.py --profile=100                   # and where a token's time goes
    python bench/sample.py --max_new_tokens=50 --repeats=2 --out=/tmp/s.json       # smoke test

Random weights are fine for speed: a token costs the same arithmetic whatever the weights are (the
same matmuls over the same window lengths; the sampling step is the same softmax + multinomial).
Only the tokens picked differ, and nothing in generate branches on them.

dtype: the weights themselves are cast, as sample.py does; auto picks what sample.py picks for this
model here (hardware.pick_dtype: on a CPU with bf16 instructions, bf16 once the fp32 weights outgrow
the last-level cache).
Time: the paths alternate (kv_cache, no_cache, nanogpt, kv_cache, ...) for `repeats` rounds after a
short warm-up of each; each sample is one whole generate call with a fresh generator of the same
seed, and the median is reported. The cache path refills the cache once per half block when the
window moves (model.stream).
Sanity check, greedy (temperature 0): model.generate gives the same tokens with and without the cache,
packed and unpacked, and the same tokens as transformers in the same dtype.
Profile (--profile=N): torch.profiler over N new tokens of each path. Per token: the PyTorch ops called
from Python (top-level ops; the ops they call inside are counted in their time), the time spent inside
them, and the rest of the wall time (Python, the loop, the profiler's own cost per op). When a token
is mostly "the rest", fewer ops per token is the lever, not faster kernels.
"""
import copy
import functools
import os
import sys
import tempfile
import time

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import asdict, dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

from attention import Backend, check_backend
from bench.benchutil import (ROOT, fail, fmt, holds_or_not, machine_info, md_table, out_path, parse, print_machine,
                             profiled, resolve_device, resolve_dtype, run, set_threads, show_compiled_kernels, summary,
                             timed, top_ops, write_json)
from checkpoint import ckpt_path, load_checkpoint, model_from_checkpoint
from configurator import check_at_least, first_line
from data.loader import load_meta
from data.prepare import SHAKESPEARE_CHAR_DIR, meta_path
from hardware import DType, device_type_of, dtype_name
from model import GPT, GPTConfig, check_sampling
from sample import check_sampled_fields, compile_for_decoding, pack_for_decoding
from train import TrainConfig, model_config

# Each reference's model and run, unless a flag sets them: nanoGPT's CPU recipe (train.py's CPU default
# shape), and GPT-2 124M for a paragraph, greedy
REFERENCE_DEFAULTS = {
    "nanogpt": {"n_layer": 4, "n_head": 4, "n_embd": 128, "mlp_ratio": 4, "block_size": 64, "max_new_tokens": 500,
                "temperature": 1.0},
    "transformers": {"n_layer": 12, "n_head": 12, "n_embd": 768, "mlp_ratio": 4, "block_size": 1024,
                     "max_new_tokens": 200, "temperature": 0.0}}
REQUIRED_SPEEDUP = 5.0  # KV cache >= 5x faster than no cache for nanoGPT's model at block_size >= 256
REQUIRED_MIN_BLOCK = 256
REQUIRED_VS_NANOGPT = 3.0  # model.generate >= 3x nanoGPT's loop for that model at nanoGPT's block_size 64
REQUIRED_VS_TRANSFORMERS = 1.5  # model.generate >= 1.5x transformers' generate, GPT-2 124M, same dtype
SHAPE = ("n_layer", "n_head", "n_embd", "mlp_ratio")
OURS = ("kv_cache", "kv_cache_compiled")  # model.generate, eager and compiled for decoding (--compile=true)


@dataclass
class SampleBench:
    reference: Literal["nanogpt", "transformers"] = "nanogpt"  # what model.generate is compared with (see the top)
    out_dir: str = ""  # a train.py out_dir holding ckpt.pt; "": random weights of the shape below
    n_layer: Optional[int] = None  # random weights: transformer blocks (none: the reference's, REFERENCE_DEFAULTS)
    n_head: Optional[int] = None  # random weights: attention heads (none: the reference's)
    n_embd: Optional[int] = None  # random weights: width of the residual stream (none: the reference's)
    mlp_ratio: Optional[int] = None  # random weights: the MLP's width in multiples of n_embd (none: the reference's)
    block_size: Optional[int] = None  # none: the reference's or the checkpoint's; smaller crops a checkpoint
    vocab_size: int = 0  # random weights against nanogpt: 0 takes data/shakespeare_char/meta.json's, else 65
    attention: Optional[Backend] = None  # none: manual / the checkpoint's
    max_new_tokens: Optional[int] = None  # new tokens per generate() call (none: the reference's)
    prompt_len: int = 1  # random prompt tokens
    temperature: Optional[float] = None  # of the timed runs (none: the reference's); the check runs greedy (0)
    repeats: int = 5  # interleaved rounds; the median is reported
    warmup_tokens: int = 32  # each path generates this many untimed first
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: DType = "auto"  # the weights' precision, as sample.py casts them (auto: what sample.py picks here)
    compile: bool = False  # also time kv_cache_compiled: the model compiled for decoding, as sample.py --compile=true
    threads: int = 0  # torch threads; 0: the CPUs this process may use (or OMP_NUM_THREADS)
    seed: int = 1337  # for the random weights, the prompt and every run's generator
    profile: int = 0  # > 0: then profile this many new tokens of each path: ops per token and where the time goes
    out: str = ""  # JSON path; "": bench/results/sample-<device>.json, or sample-transformers-<device>.json

    def __post_init__(self):
        given = [name for name in SHAPE if getattr(self, name) is not None] + ["vocab_size"] * bool(self.vocab_size)
        unused = [f"--{name}={getattr(self, name)}" for name in given] if self.out_dir else []
        if unused:
            raise ValueError(f"--out_dir's checkpoint sets the model's shape: {', '.join(unused)} would not be used; "
                             f"drop {'it' if len(unused) == 1 else 'them'}")
        for name, value in REFERENCE_DEFAULTS[self.reference].items():
            if getattr(self, name) is None and not (self.out_dir and name in (*SHAPE, "block_size")):
                setattr(self, name, value)
        if self.reference == "transformers" and self.out_dir:
            raise ValueError("reference=transformers runs GPT-2's architecture on random weights; a checkpoint's "
                             "model is another (drop --out_dir)")
        if self.reference == "transformers" and self.temperature:  # its path decodes greedily: the same work, tokens
            raise ValueError("reference=transformers compares greedy decoding (temperature=0), the same tokens on "
                             f"both sides; temperature={self.temperature} would time sampling against it")
        check_at_least(self, 1, "max_new_tokens", "prompt_len", "repeats", *SHAPE, "block_size")
        check_at_least(self, 0, "profile", "warmup_tokens")
        check_sampling(self.temperature, top_k=None, top_p=None)


def build_model(cfg):
    """(model, source): from the checkpoint, or random weights of train.py's model in cfg's shape."""
    if cfg.out_dir:
        path = ckpt_path(cfg.out_dir)
        try:
            ckpt = load_checkpoint(path)
            check_sampled_fields(ckpt, path)  # as sample.py checks it: what is missing, by name
            model = model_from_checkpoint(ckpt, path, **({"attention": cfg.attention} if cfg.attention else {}))
            if cfg.block_size and cfg.block_size != model.config.block_size:
                model.crop_block_size(cfg.block_size)
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            said = first_line(e)
            fail(said if path in said else f"{path}: {said}")  # the checkpoint's checks name it already
        return model, ckpt_path(cfg.out_dir)  # a path alone: the JSON writes it without the machine's directories
    vocab = cfg.vocab_size
    if not vocab:
        data_dir = os.path.join(ROOT, SHAKESPEARE_CHAR_DIR)
        vocab = load_meta(data_dir)["vocab_size"] if os.path.exists(meta_path(data_dir)) else 65
    try:
        config = model_config(TrainConfig(), vocab, block_size=cfg.block_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd, mlp_ratio=cfg.mlp_ratio,
                              attention=cfg.attention or TrainConfig.attention)  # train.py's model, in this shape
    except ValueError as e:
        fail(e)
    torch.manual_seed(cfg.seed)
    return GPT(config), "random weights"


def build_gpt2_pair(cfg):
    """(ours, transformers' GPT2LMHeadModel): one set of random GPT-2 weights in cfg's shape, saved
    by transformers and loaded by GPT.from_pretrained, as a user's GPT-2 files would be."""
    try:
        import transformers
    except ImportError:
        fail("reference=transformers needs the transformers package: pip install -r requirements-dev.txt")
    transformers.logging.set_verbosity_error()  # its notes on generation settings, on every call
    torch.manual_seed(cfg.seed)
    hf_config = transformers.GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                        n_inner=cfg.mlp_ratio * cfg.n_embd, n_positions=cfg.block_size)
    hf = transformers.GPT2LMHeadModel(hf_config)
    with tempfile.TemporaryDirectory() as work_dir:
        hf.save_pretrained(work_dir)
        ours = GPT.from_pretrained(work_dir, **({"attention": cfg.attention} if cfg.attention else {}))
    return ours, hf


@torch.inference_mode()
def transformers_generate(hf_model, prompt, max_new_tokens):
    """Greedy decoding with transformers' generate and its KV cache, exactly max_new_tokens tokens."""
    return hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                             pad_token_id=hf_model.config.eos_token_id)


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


def generate_path(path, n, temperature, *, models, prompt, seed, device):
    """One timed unit: n new tokens by `path`, from a fresh generator of the same seed."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if path == "nanogpt":
        return nanogpt_generate(models[path], prompt, n, max(temperature, 1e-6), gen)
    if path.startswith("transformers"):
        return transformers_generate(models[path], prompt, n)
    return models[path.replace("no_cache", "kv_cache")].generate(prompt, n, temperature=temperature,
                                                                use_kv_cache=path != "no_cache", generator=gen)


def time_paths(cfg, generate, paths, device, block_size):
    """{path: {"time": summary, "tokens_per_s", "warmup_s"}}, the paths interleaved for cfg.repeats rounds
    after a warm-up; the compiled path's warm-up holds its compile (the first time on a machine)."""
    warmup = {}
    for path in paths:
        # the compiled path also past a window's end, whose refill of the cache is another shape to compile
        n = max(cfg.warmup_tokens, block_size + 1) if path == "kv_cache_compiled" else cfg.warmup_tokens
        started = time.perf_counter()
        try:
            generate(path, min(n, cfg.max_new_tokens), cfg.temperature)
        except Exception as e:  # noqa: BLE001 - inductor's errors have many types (no C++ compiler, say)
            if path != "kv_cache_compiled":
                raise
            fail(f"--compile=true: torch.compile failed here ({first_line(e, with_type=True)[:200]}); "
                 "run with --compile=false", status=1)
        warmup[path] = time.perf_counter() - started
    samples = {path: [] for path in paths}
    for _ in range(cfg.repeats):
        for path in paths:
            samples[path].append(timed(lambda: generate(path, cfg.max_new_tokens, cfg.temperature), device))
    results = {}
    for path in paths:
        s = summary(samples[path])
        results[path] = {"time": s, "tokens_per_s": cfg.max_new_tokens / s["median"], "warmup_s": warmup[path]}
    return results


def greedy_check(cfg, generate, mine, other):
    """(same tokens at temperature 0 from the paths mine and other?, the first new token that differs or None)."""
    ours = generate(mine, cfg.max_new_tokens, 0.0)
    theirs = generate(other, cfg.max_new_tokens, 0.0)
    if torch.equal(ours, theirs):
        return True, None
    return False, int((ours != theirs)[0].nonzero()[0]) - cfg.prompt_len


def nanogpt_model(config, seed):
    """A model of the same size with nanoGPT's choices: learned positions, PyTorch's SDPA, nn.GELU() (the
    exact GELU), no biases (its train.py's default), GPT-2's init; every other setting GPTConfig's default
    (GPT-2's), a forker's new ones too."""
    torch.manual_seed(seed)
    size = {k: getattr(config, k) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")}
    return GPT(GPTConfig(**size, pos_embedding="learned", attention="sdpa", activation="gelu", bias=False))


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


def check_requirements(c, cfg, device_type, ratios):
    """The sampling goals (bench/README.md), each printed as holding or not, or as not applicable to this run."""
    stated = dict(REFERENCE_DEFAULTS[cfg.reference], block_size=c.block_size)
    as_stated = device_type == "cpu" and all(getattr(c, k) == v for k, v in stated.items() if k in SHAPE) \
        and cfg.max_new_tokens >= stated["max_new_tokens"] and cfg.temperature == stated["temperature"] \
        and cfg.prompt_len == type(cfg).prompt_len  # at 0 generate takes the argmax, nanoGPT's loop samples
    block = REFERENCE_DEFAULTS["nanogpt"]["block_size"]
    goals = {"nanogpt": {"kv_cache_vs_no_cache": (REQUIRED_SPEEDUP, c.block_size >= REQUIRED_MIN_BLOCK,
                                                  f"block_size >= {REQUIRED_MIN_BLOCK}"),
                         "kv_cache_vs_nanogpt": (REQUIRED_VS_NANOGPT, c.block_size == block, f"block_size {block}")},
             "transformers": {"kv_cache_vs_transformers": (REQUIRED_VS_TRANSFORMERS, True, "the same dtype")}}
    requirements = {}
    for name, goal in list(goals[cfg.reference].items()):  # the same goals for the compiled decode, if timed
        if name.replace("kv_cache", "kv_cache_compiled") in ratios:
            goals[cfg.reference][name.replace("kv_cache", "kv_cache_compiled")] = goal
    for name, (minimum, applies, condition) in goals[cfg.reference].items():
        r = requirements[name] = {"min": minimum, "value": ratios[name], "applies": as_stated and applies,
                                  "stated": condition, "holds": ratios[name] >= minimum}
        shape = {k: REFERENCE_DEFAULTS[cfg.reference][k] for k in (*SHAPE, "max_new_tokens", "temperature")}
        here = "" if device_type == "cpu" else f"; this run is on {device_type}"
        verdict = holds_or_not(r["holds"]) if r["applies"] else \
            f"not applicable to this run (stated on a CPU for {shape}, {condition}{here})"
        print(f"requirement {name} >= {minimum:.1f}x: {verdict}")
    return requirements


def build_paths(cfg, device, device_type):
    """({path: the model it runs, on device in the dtype}, where the weights came from, the dtype)."""
    if cfg.reference == "transformers":
        ours, hf = build_gpt2_pair(cfg)
        models = {"kv_cache": ours, "transformers": hf, "transformers_fp32": copy.deepcopy(hf)}
        source = "random GPT-2 weights, saved by transformers"
    else:
        ours, source = build_model(cfg)
        models = {"kv_cache": ours, "no_cache": ours, "nanogpt": nanogpt_model(ours.config, cfg.seed)}
    dtype = resolve_dtype(cfg.dtype, device_type, training=False, n_params=ours.num_params(non_embedding=False))
    try:  # as sample.py checks it: a backend that cannot run here is one line, before anything is timed
        check_backend(ours.config.attention, device_type, dtype)
    except ValueError as e:
        fail(e)
    if dtype == torch.float32:
        models.pop("transformers_fp32", None)  # the same run as "transformers"
    for path, model in models.items():
        model.eval().to(device=device, dtype=torch.float32 if path == "transformers_fp32" else dtype)
    if cfg.compile:  # a copy, so that the other paths stay eager
        models["kv_cache_compiled"] = copy.deepcopy(models["kv_cache"])
        compile_for_decoding(models["kv_cache_compiled"])
    unpacked = copy.deepcopy(models["kv_cache"])
    if pack_for_decoding(models["kv_cache"], dtype):  # as sample.py decodes; the plain Linears beside it
        models["kv_cache_unpacked"] = unpacked
    return models, source, dtype


def main(cfg):
    device = resolve_device(cfg.device)
    device_type = device_type_of(device)
    out = out_path(cfg.out, "sample" if cfg.reference == "nanogpt" else "sample-transformers", device)
    set_threads(cfg.threads)
    if cfg.profile:
        show_compiled_kernels()
    models, source, dtype = build_paths(cfg, device, device_type)
    c = models["kv_cache"].config
    info = machine_info(device)
    print_machine(info)
    print(f"model: {c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}, block_size {c.block_size}, vocab "
          f"{c.vocab_size}, attention {c.attention}, positions {c.pos_embedding} ({source}) | {cfg.max_new_tokens} "
          f"new tokens after a {cfg.prompt_len}-token prompt, batch 1, temperature {cfg.temperature}, "
          f"dtype {str(dtype).removeprefix('torch.')}")
    if cfg.prompt_len > c.block_size:
        fail(f"prompt_len={cfg.prompt_len} exceeds block_size={c.block_size}")
    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(c.vocab_size, (1, cfg.prompt_len), generator=g).to(device)
    generate = functools.partial(generate_path, models=models, prompt=prompt, seed=cfg.seed, device=device)
    paths = tuple(models)
    results = time_paths(cfg, generate, paths, device, c.block_size)
    reference = "nanogpt" if cfg.reference == "nanogpt" else "transformers"
    ours = [path for path in OURS if path in paths]
    ratios = {f"{mine}_vs_{path}": results[mine]["tokens_per_s"] / results[path]["tokens_per_s"]
              for mine in ours for path in paths if path not in OURS}
    same_as = "no_cache" if cfg.reference == "nanogpt" else "transformers"
    # no_cache runs kv_cache's model: the packed model is checked against the plain one too
    pairs = [(mine, same_as) for mine in ours] + ([("kv_cache", "kv_cache_unpacked")] if "kv_cache_unpacked" in paths
                                                  else [])
    checks = [greedy_check(cfg, generate, mine, other) for mine, other in pairs]
    same, first_diff = all(ok for ok, _ in checks), next((d for ok, d in checks if not ok), None)

    print()
    print(md_table(["path", "tokens/s", "median s", "min-max s", f"vs {reference}"],
                   [[name, f"{r['tokens_per_s']:,.0f}", fmt(r["time"]["median"], ".3f"),
                     f"{r['time']['min']:.3f}-{r['time']['max']:.3f}",
                     f"{r['tokens_per_s'] / results[reference]['tokens_per_s']:.2f}x"] for name, r in results.items()]))
    print(f"(median of {cfg.repeats} interleaved runs) " + "; ".join(f"{k.replace('_vs_', ' vs ')}: {v:.2f}x"
                                                                        for k, v in ratios.items()))
    if "kv_cache_compiled" in results:
        print(f"kv_cache_compiled's warm-up tokens, with its compile: "
              f"{results['kv_cache_compiled']['warmup_s']:.1f} s (the first run on a machine compiles longest)")
    requirements = check_requirements(c, cfg, device_type, ratios)
    profiles = profile_paths(cfg, generate, paths, device) if cfg.profile else None
    print("greedy (temperature 0) tokens identical: " + "; ".join(f"{mine} and {other}" for mine, other in pairs)
          + f": {'yes' if same else 'NO'}" + ("" if same else f" (first difference at new token {first_diff})"))
    write_json(out, {"benchmark": "sample", "machine": info, "config": asdict(cfg), "model": asdict(c),
                     "source": source, "dtype": dtype_name(dtype), "results": results,
                     "ratios": ratios, "requirements": requirements, "profile": profiles,
                     "greedy_identical": same, "greedy_compared_with": same_as, "greedy_pairs": pairs,
                     "greedy_first_difference": first_diff})
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    run(main, parse(SampleBench, sys.argv[1:]))
