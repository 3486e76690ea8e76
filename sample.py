"""
Sample from a trained model, streaming tokens to the terminal as they are made, or draw its
attention (attention_map.py renders the pictures):

    python sample.py                                   # from out/ckpt.pt, which `python train.py` writes
    python sample.py --start="ROMEO:" --num_samples=3 --max_new_tokens=300 --temperature=0.8
    python sample.py --start=FILE:prompt.txt --init_from=gpt2
    python sample.py --start="ROMEO:" --attention_map=attn.html   # explore its attention, step by step
"""
import contextlib
import os
import random
import signal
import sys
from dataclasses import dataclass
from typing import Optional

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C while torch loads (a second or two) ends the run at once,
    # as in any Unix tool, not in a traceback from inside an import; the last lines below put Python's back

import torch

from attention import Backend, check_backend
from attention_map import (PAGE_MAX_BYTES, PAGE_MAX_TOKENS, PICTURE_FORMATS, page_bytes, plot_attention,
                           write_attention_page)
from checkpoint import (OUT_DIR, check_not_an_out_dir, checkpoint_tokenizer, ckpt_path, field_problems,
                        load_checkpoint, model_from_checkpoint)
from configurator import check_at_least, check_folders_named, check_types, config_from_argv, expand_home, fail
from data.tokenizer import GPT2Tokenizer
from files import NO_ROOM, OutputThatMayClose, check_stdout, check_writable, read_text_file
from hardware import (DType, check_threads, compile_failure, device_type_of, last_level_cache_bytes, make_current,
                      memory_bytes, pick_device, pick_dtype, ran_out_of_memory, set_up_cpu)
from model import GPT, RUNTIME_SETTINGS, check_init_from, check_sampling


SAMPLE_NEW_TOKENS = 500  # tokens per sample when max_new_tokens is not given
# an attention page, when max_new_tokens is not given, shows a line the model writes, at most this many
# tokens: GPT-2's page over a prompt and 128 tokens is a few MB (bench/attention_page.py)
PAGE_NEW_TOKENS = 128
# The settings each way of running leaves unread: samples, an .html attention page (which continues the
# prompt once, with the cache, in float32) and a picture (the prompt's attention alone, in float32, by the
# hand-written path). One given that the way chosen leaves unread gets a note, not silence.
UNREAD = {"samples": ("attention_layer", "attention_head"),
          "an attention page": ("num_samples", "use_kv_cache", "compile", "dtype"),
          "an attention picture": ("num_samples", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
                                   "use_kv_cache", "compile", "dtype", "attention")}
GREEDY_UNREAD = ("top_k", "top_p", "seed")  # temperature=0 takes the likeliest token: nothing is drawn
# what shrinks each way's memory: an attention map runs one sequence, a picture the prompt alone
SMALLER_RUN = {"samples": "ask for fewer --num_samples or --max_new_tokens",
               "an attention page": "ask for fewer --max_new_tokens", "an attention picture": "give a shorter prompt"}


@dataclass
class SampleConfig:
    out_dir: str = OUT_DIR  # where train.py wrote ckpt.pt
    init_from: str = "resume"  # resume (out_dir/ckpt.pt), or GPT-2 weights: gpt2, gpt2-xl, a local HF dir
    start: str = "\n"  # the prompt (a newline unless given; in bash $'...' writes one: --start=$'ROMEO:\n'),
                       # or FILE:path
    num_samples: int = 2  # how many samples, drawn together as one batch
    max_new_tokens: Optional[int] = None  # tokens to write per sample (none: 500; an .html map: to the line end)
    temperature: float = 0.8  # 0 is greedy; below 1 sharpens, above 1 flattens the distribution
    top_k: Optional[int] = 200  # sample only from the k most likely tokens (none: all)
    top_p: Optional[float] = None  # nucleus sampling: the smallest set of tokens with probability >= top_p
    seed: int = 1337  # the same seed gives the same samples
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype: DType = "auto"  # weights' precision; auto: bf16/fp16 on CUDA, on bf16 CPUs bf16 past the cache, else fp32
    threads: int = 0  # torch's CPU threads; 0: OMP_NUM_THREADS, else the CPUs this process may use
    attention: Optional[Backend] = None  # the attention backend to run the model with (none: as trained; a map: manual)
    use_kv_cache: bool = True  # false: recompute the whole context for every token (slower; the same tokens in fp32)
    compile: bool = False  # torch.compile the model for decoding: faster per token; compiles ~40-70 s once,
                           # later ~10-25 s
    attention_map: str = ""  # a .png (or .pdf, .svg, .jpg) picture or an interactive .html page of the attention
    attention_layer: int = 0  # the layer drawn large in the attention map (a page: the one it opens on)
    attention_head: int = 0  # the head drawn large in the attention map (a page: the one it opens on)

    def __post_init__(self):
        check_types(self)  # SampleConfig(use_kv_cache="false") would use the cache
        check_sampling(self.temperature, self.top_k, self.top_p, self.max_new_tokens)
        expand_home(self, "out_dir", "init_from", "attention_map")
        check_init_from(self.init_from, own=("resume",))
        if self.init_from == "resume":
            check_folders_named(self, "out_dir")
        if not 0 <= self.seed < 2**63:  # what torch's generators take, and a --key=value integer can be
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.attention_map:
            folder, extension = os.path.dirname(self.attention_map) or ".", os.path.splitext(self.attention_map)[1]
            if extension.lower() not in PICTURE_FORMATS:  # (.html alone is a name with no extension)
                if os.path.isdir(self.attention_map):  # check_writable's line: name a file in the folder
                    check_writable(self.attention_map, "attn.html")
                raise ValueError(f"attention_map={self.attention_map!r}: the extension picks the format, one of "
                                 f"{', '.join(PICTURE_FORMATS)}")
            if not os.path.isdir(folder):
                there = "is not a directory" if os.path.exists(folder) else "does not exist"
                raise ValueError(f"attention_map={self.attention_map!r}: {folder} {there}; make the folder, or "
                                 "pick another path")
        check_threads(self.threads)
        check_at_least(self, 1, "num_samples")

    def made(self):
        """What this run makes: a key of UNREAD."""
        return ("samples" if not self.attention_map else
                "an attention page" if self.attention_map.lower().endswith(".html") else "an attention picture")

    def new_tokens(self):
        """max_new_tokens, or where it is not given 500 per sample, or a page's line of at most PAGE_NEW_TOKENS;
        none for a picture."""
        if self.made() == "an attention picture":
            return 0
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return PAGE_NEW_TOKENS if self.made() == "an attention page" else SAMPLE_NEW_TOKENS

    def rows(self):
        """Sequences run as one batch: num_samples, or for an attention map the prompt (and a page's line) once."""
        return 1 if self.attention_map else self.num_samples

    def unread(self):
        """The settings given that this run does not read, in groups, each with what leaves it unread: UNREAD's
        for what the run makes, out_dir where GPT-2 weights are read, the sampling options at temperature=0."""
        made, defaults = self.made(), type(self)()
        groups = [(UNREAD[made], f"for {made}"),
                  (("out_dir",) if self.init_from != "resume" else (), f"with --init_from={self.init_from}"),
                  (GREEDY_UNREAD if self.temperature == 0 and "temperature" not in UNREAD[made] else (),
                   "at --temperature=0")]
        given = [([name for name in names if getattr(self, name) != getattr(defaults, name)], why)
                 for names, why in groups]
        return [(names, why) for names, why in given if names]

    def backend(self):
        """The attention backend to run the model with: --attention, else for an attention page the
        hand-written path, which the page's numbers come from anyway and which runs in float32 (the
        page's precision) where a fused kernel may need half precision; else None, the model's own. A
        picture's weights come from the hand-written path alone, whatever is given."""
        if self.made() == "an attention picture":
            return "manual"
        return self.attention or ("manual" if self.attention_map else None)


def main(cfg):
    """Load the model and its tokenizer, read the prompt, then draw its attention or stream samples."""
    try:
        check_stdout()
        device = pick_device(cfg.device)
        make_current(device)
        set_up_cpu(cfg.threads)
        model, tokenizer = load_model(cfg)
        # the page and the pictures show attention's arithmetic in full precision, whatever --dtype says
        dtype = torch.float32 if cfg.attention_map else pick_dtype(cfg.dtype, device_type_of(device), training=False,
                                                                   n_params=model.num_params(non_embedding=False))
        check_model_backend(model, cfg, device, dtype)
        if cfg.attention_map:
            check_writable(cfg.attention_map, "attn" + os.path.splitext(cfg.attention_map)[1])
            check_layer_and_head(model.config, cfg)
        prompt = read_prompt(cfg.start)
        ids = encode_prompt(tokenizer, prompt, cfg.start == type(cfg).start)
        if not ids:
            raise ValueError("the prompt is empty; give at least one character with --start=...")
        check_fits(model, cfg, len(ids), device, dtype)
        if cfg.attention_map.lower().endswith(".html"):
            check_page_size(model.config, len(ids), cfg.new_tokens())
    except (ValueError, OSError) as e:
        fail(e)
    except KeyboardInterrupt:  # while the weights or the tokenizer load: nothing was written yet
        fail("stopped by Ctrl-C", status=128 + signal.SIGINT)
    for names, why in cfg.unread():  # once the input has passed its checks: bad input is one line
        print(f"note: {', '.join(f'--{name}' for name in names)} {'is' if len(names) == 1 else 'are'} not used {why}",
              file=sys.stderr)
    try:
        # the weights themselves in dtype, not autocast: a token then reads each weight once, in half the
        # bytes in bf16, where autocast would cast every fp32 weight again for every token
        model.eval().to(device=device, dtype=dtype)
        with stoppable_output():
            if cfg.attention_map:
                draw_attention(model, tokenizer, ids, cfg)
            else:
                if cfg.compile:
                    compile_and_warm_up(model, ids, cfg)
                else:
                    pack_for_decoding(model, dtype)
                write_samples(model, tokenizer, prompt, ids, cfg)
    except (RuntimeError, MemoryError) as e:  # check_fits judged by the machine's memory; a limit can be lower
        if not ran_out_of_memory(e):
            raise
        if not cfg.attention_map:
            print()  # end the prompt already written, so that the error starts its own line
        fail(f"out of memory with {cfg.rows()} sample(s) of {len(ids) + cfg.new_tokens():,} tokens on {device}; "
             f"{SMALLER_RUN[cfg.made()]}", status=1)
    except OSError as e:  # writing the map (samples go to stdout, whose reader leaving is a stop)
        if not cfg.attention_map:
            raise
        kept = "; the file that was there is kept" if os.path.exists(cfg.attention_map) else ""
        full = "free some space or " if e.errno in NO_ROOM else ""
        fail(f"could not write {cfg.attention_map}: {e.strerror or e}{kept}; {full}pick another place", status=1)


@contextlib.contextmanager
def stoppable_output():
    """Ways to stop sampling early, as a Unix tool stops: a reader of stdout that leaves (python
    sample.py | head) ends the run quietly with 128 + SIGPIPE, not a BrokenPipeError; Ctrl-C ends it
    with one line and 128 + SIGINT, not a traceback."""
    stdout, sys.stdout = sys.stdout, OutputThatMayClose(sys.stdout, output_closed)
    try:
        yield
    except KeyboardInterrupt:
        print()  # end the line being written, so that the error starts its own
        fail("stopped by Ctrl-C", status=128 + signal.SIGINT)
    finally:
        sys.stdout = stdout


def output_closed(error):
    """stdout takes no more text: its reader left (python sample.py | head), which ends the run quietly
    as a Unix tool ends, or its disk is full, which is said."""
    if isinstance(error, BrokenPipeError):
        sys.exit(128 + signal.SIGPIPE)
    fail(f"could not write the samples to stdout: {error.strerror or error}", status=1)


def read_prompt(start):
    """The prompt: the text of --start, or of the file that --start=FILE:path names."""
    if not start.startswith("FILE:"):
        if any("\udc80" <= c <= "\udcff" for c in start):  # bytes of the command line that are not UTF-8
            raise ValueError("--start is not UTF-8 text (the terminal's encoding?); give it in UTF-8, or put it in "
                             "a UTF-8 file and give --start=FILE:path")
        return start
    return read_text_file(os.path.expanduser(start.removeprefix("FILE:")), "--start=FILE:")


def check_fits(model, cfg, n_prompt, device, dtype):
    """ValueError if the batch cannot be held: the tokens of every row, and their KV cache (two
    tensors per layer of rows x block_size x n_embd), against the device's memory."""
    c, new, rows = model.config, cfg.new_tokens(), cfg.rows()
    needed = rows * ((n_prompt + new) * 8 + 2 * c.n_layer * c.block_size * c.n_embd * dtype.itemsize)
    memory = memory_bytes(device)
    if memory is not None and needed > memory:
        tokens = f"{n_prompt + new:,} tokens"
        asked = tokens if cfg.attention_map else f"num_samples={rows} x {tokens}"
        raise ValueError(f"{asked} need ~{needed / 2**30:,.0f} GiB for their tokens and KV cache; this "
                         f"{device_type_of(device)} has {memory / 2**30:,.0f} GiB: {SMALLER_RUN[cfg.made()]}")


# At one token per forward every matmul is a matrix-vector product, whose time is the time to read the
# weights: inductor's decompose_mm_pass turns each into a fused multiply-and-sum, which reads them at the
# memory's full speed and fuses the small ops around them (bench/README.md: GPT-2 124M compiled with it made
# 100-132 tokens/s, without it 68-78, in separate runs). On a CPU the pass takes matrices up to 2048 wide; the
# limit is lifted so that the MLP and the head (vocab_size rows) go the same way. GPUs keep their matmuls
# (the pass leaves one row to cuBLAS there).
DECODE_MM_PASS = {"cpu_max_other_dimension_decomposition": 2**31}


class PackedLinear(torch.nn.Module):
    """An nn.Linear for decoding on a CPU: its weight copied once into oneDNN's blocked layout, from which
    oneDNN computes the same products and reads the weight up to twice as fast as from the (out, in)
    layout, and a token's matrix-vector products are that read. PyTorch's own ops for this, the ones its
    compiler's CPU inference calls. The copy is for decoding only: no gradient, and no .to() moves it."""

    def __init__(self, linear):
        super().__init__()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)  # for 1 row: a token
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x):
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def packing_pays(device, dtype, weight_bytes):
    """Whether PackedLinear decodes faster (bench/README.md, "Packed weights"): on a CPU with oneDNN, in bf16
    at every size measured, and in fp32 once the weights outgrow the last-level cache (a model that fits
    in it, as the tiny default does, runs faster on the plain kernel)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.bfloat16 or (dtype == torch.float32 and weight_bytes > last_level_cache_bytes())


def pack_for_decoding(model, dtype):
    """Every nn.Linear of the model (in dtype) as a PackedLinear where that pays, and where this torch's
    oneDNN ops compute what nn.Linear does (checked on the first one: an op another torch version lacks, a
    dtype its oneDNN does not take). Returns whether it packed. A head tied to the token embedding (GPT-2's)
    is then held twice, the embedding's and the packed copy: vocab_size x n_embd more weights in memory."""
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is torch.nn.Linear]
    weight_bytes = sum(child.weight.nbytes for _, _, child in linears)
    if not linears or not packing_pays(next(model.parameters()).device, dtype, weight_bytes):
        return False
    first = linears[0][2]
    x = torch.randn(2, first.in_features, dtype=dtype, generator=torch.Generator().manual_seed(0))  # not the global one
    try:
        with torch.no_grad():
            torch.testing.assert_close(PackedLinear(first)(x), first(x))
    except Exception:  # noqa: BLE001 - an op this torch lacks, a dtype its oneDNN does not take, another result
        return False
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child))
    return True


def compile_for_decoding(model):
    """torch.compile the model's forward with dynamic shapes, so one graph serves the cache as it grows
    by a key per token; compiled lazily, on the first forward of each shape. Inductor reads the pass's
    limits when it first compiles in a process, so they go in its config, not in this compile's options."""
    import torch._inductor.config as inductor_config  # here: importing it costs ~0.7 s, needed only to compile

    inductor_config.post_grad_fusion_options["decompose_mm_pass"] = DECODE_MM_PASS
    model.compile(dynamic=True)


def compile_and_warm_up(model, ids, cfg):
    """compile_for_decoding, compiled now for each shape decoding meets, so that none compiles mid-stream:
    with the batch of num_samples and use_kv_cache as sampling has them, a first token alone, a longer
    prompt (or the cache's refill when the window moves), and a token after cached ones (or, without
    the cache, windows of 1 to 3 tokens). Inductor keeps what it compiled on disk, so the next run
    compiles in seconds (bench/sample.py --compile=true measures both)."""
    print("compiling the model for decoding (the first run on a machine takes longest)", file=sys.stderr, flush=True)
    compile_for_decoding(model)
    device = next(model.parameters()).device
    try:
        for prompt in ((ids * 2)[:1], (ids * 2)[:2]):
            model.generate(torch.tensor([prompt] * cfg.num_samples, device=device), 2, temperature=0,
                           use_kv_cache=cfg.use_kv_cache)
    except Exception as e:  # inductor's errors have many types: no C++ compiler, an unsupported op, ...
        fail(f"--compile=true: torch.compile failed here ({compile_failure(e)}); "
             "sample with --compile=false", status=1)


def runtime_overrides(cfg):
    """The settings of model.RUNTIME_SETTINGS that SampleConfig has a field for and that were given (None:
    as trained), the attention backend as backend() resolves it: what the model runs with here."""
    given = {name: getattr(cfg, name, None) for name in RUNTIME_SETTINGS} | {"attention": cfg.backend()}
    return {name: value for name, value in given.items() if value is not None}


def load_model(cfg):
    """The model and its tokenizer, from out_dir/ckpt.pt or from GPT-2 weights, checked to fit each other."""
    overrides = runtime_overrides(cfg)
    if cfg.init_from != "resume":
        check_not_an_out_dir(cfg.init_from)
        model, tokenizer = GPT.from_pretrained(cfg.init_from, **overrides), GPT2Tokenizer()
        check_vocabulary(model, tokenizer, f"--init_from={cfg.init_from}", "sample.py reads Hugging Face "
                         "models with GPT-2's tokenizer; give GPT-2 weights or a fine-tune of them")
        return model, tokenizer
    path = ckpt_path(cfg.out_dir)
    checkpoint = load_checkpoint(path)
    check_sampled_fields(checkpoint, path)
    model = model_from_checkpoint(checkpoint, path, **overrides)
    tokenizer = checkpoint_tokenizer(checkpoint, path)
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise ValueError(f"{path} holds non-finite (NaN or inf) weights: the run that wrote it diverged; "
                         "train again with a lower --learning_rate (and --overwrite=true, which replaces it)")
    check_vocabulary(model, tokenizer, path, "the checkpoint is inconsistent")
    return model, tokenizer


def check_layer_and_head(config, cfg):
    """ValueError unless the model has the layer and head that the attention map draws large."""
    if not (0 <= cfg.attention_layer < config.n_layer and 0 <= cfg.attention_head < config.n_head):
        raise ValueError(f"attention_layer={cfg.attention_layer}, attention_head={cfg.attention_head}: this model has "
                         f"{config.n_layer} layers and {config.n_head} heads; give --attention_layer from 0 to "
                         f"{config.n_layer - 1} and --attention_head from 0 to {config.n_head - 1}")


def check_page_size(config, n_prompt, n_new):
    """ValueError if the attention page over the prompt and n_new tokens would be larger than a browser opens
    well (attention_map.PAGE_MAX_BYTES), or would draw its maps on canvases a browser leaves blank
    (PAGE_MAX_TOKENS): it holds every row of the whole text."""
    if n_prompt + n_new > PAGE_MAX_TOKENS:
        raise ValueError(f"an attention page over {n_prompt + n_new:,} tokens ({n_prompt:,} of the prompt) would draw "
                         f"each map {n_prompt + n_new:,} pixels wide, which a browser leaves blank (at most "
                         f"{PAGE_MAX_TOKENS:,}): give a shorter prompt or fewer --max_new_tokens")
    size = page_bytes(config, n_prompt + n_new)
    if size > PAGE_MAX_BYTES:
        raise ValueError(f"an attention page over {n_prompt + n_new:,} tokens ({n_prompt:,} of the prompt) would be "
                         f"~{size / 2**20:,.0f} MiB, more than a browser opens well "
                         f"({PAGE_MAX_BYTES / 2**20:,.0f} MiB): "
                         "give a shorter prompt or fewer --max_new_tokens, or draw a picture (.png) of the prompt's "
                         "last window, which continues nothing")


def check_model_backend(model, cfg, device, dtype):
    """ValueError if the model's attention backend cannot run here; where it is the trained model's own
    (no --attention), the error says so and what to give instead."""
    c = model.config
    try:
        check_backend(c.attention, device_type_of(device), dtype, head_size=c.n_embd // c.n_head)
    except ValueError as e:
        if cfg.attention:
            raise
        raise ValueError(f"{e} (attention={c.attention!r} is the model's own: --attention=manual samples it on any "
                         "device)") from None


def check_sampled_fields(checkpoint, path):
    """ValueError naming what is wrong where the fields that sampling reads are not what train.py
    writes: a damaged file, or another program's."""
    wrong = field_problems(checkpoint, ("model", "model_config", "tokenizer"))
    if wrong:
        raise ValueError(f"{path} is damaged or not train.py's checkpoint ({', '.join(wrong)}); sample from one "
                         "that train.py wrote")


def check_vocabulary(model, tokenizer, source, why):
    """ValueError, naming source and why, where the tokenizer makes ids past the model's embedding."""
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}; {why}")


@torch.no_grad()
def draw_attention(model, tokenizer, ids, cfg):
    """The attention, every layer and head: of the prompt as a picture, or, as an interactive page
    (.html), of the whole text, the prompt and what the model then writes (continuation)."""
    c = model.config
    if cfg.attention_map.lower().endswith(".html"):
        text = ids + continuation(model, tokenizer, ids, cfg)
        title = cfg.init_from if cfg.init_from != "resume" else ckpt_path(cfg.out_dir)
        write_attention_page(model, text, [tokenizer.token_text(i) for i in text], len(ids), cfg.attention_map, title,
                             cfg.attention_layer, cfg.attention_head)
        print(f"wrote {cfg.attention_map}: {c.n_layer} layers x {c.n_head} heads over {len(text)} tokens "
              f"({len(ids)} of the prompt, {len(text) - len(ids)} written)")
        return
    window = ids[-c.block_size:]  # a picture of the window the model sees
    device = next(model.parameters()).device
    weights = [w[0] for w in model.attention_weights(torch.tensor([window], device=device))]  # per layer (nh, T, T)
    plot_attention(weights, [tokenizer.token_text(i) for i in window], cfg.attention_map, cfg.attention_layer,
                   cfg.attention_head)
    cut = f" (the prompt's last {len(window)} of {len(ids)}: the model's window)" if len(window) < len(ids) else ""
    print(f"wrote {cfg.attention_map}: {c.n_layer} layers x {c.n_head} heads over {len(window)} tokens{cut}")


def continuation(model, tokenizer, ids, cfg):
    """The tokens the model writes after ids for the page: max_new_tokens of them if that is given,
    else to the end of the first line it writes, at most PAGE_NEW_TOKENS (and one window)."""
    device = next(model.parameters()).device
    given, new = cfg.max_new_tokens is not None, []
    generators = sample_generators(cfg.seed, 1, device)
    for token in model.stream(torch.tensor([ids], device=device),
                              cfg.new_tokens() if given else min(cfg.new_tokens(), model.config.block_size),
                              cfg.temperature, cfg.top_k, cfg.top_p, generator=generators,
                              vocab_size=tokenizer.vocab_size):
        new.append(token.item())
        if not given and "\n" in tokenizer.decode(new[-1:]) and tokenizer.decode(new).strip():
            break
    return new


def sample_generators(seed, n, device):
    """A random generator for each of n samples, seeded from seed: sample i draws the same whatever the
    number of samples (as nanoGPT's, drawn one after another from one seed), and the page's continuation
    is the first sample."""
    seeds = random.Random(seed)
    return [torch.Generator(device=device).manual_seed(seeds.getrandbits(63)) for _ in range(n)]


def encode_prompt(tokenizer, prompt, default):
    """The prompt's token ids; a ValueError that says what to give --start when the model's vocabulary
    lacks a character of it (the default prompt too, for a model of a text without newlines)."""
    try:
        return tokenizer.encode(prompt)
    except ValueError as e:
        which = "the default prompt, a newline" if default else "--start"
        raise ValueError(f"{e} ({which}); give --start=... with characters of the text the model was trained on") \
            from None


def write_samples(model, tokenizer, prompt, ids, cfg):
    """num_samples continuations of the prompt, sampled together as one batch: the first is
    streamed to stdout token by token, the others follow when the batch is done."""
    device = next(model.parameters()).device
    generators = sample_generators(cfg.seed, cfg.num_samples, device)
    idx = torch.tensor([ids] * cfg.num_samples, dtype=torch.long, device=device)  # (num_samples, T)
    new, pending = [], []  # BPE tokens can end inside a UTF-8 character; hold them until it is complete
    sys.stdout.write(prompt)
    for tokens in model.stream(idx, cfg.new_tokens(), cfg.temperature, cfg.top_k, cfg.top_p,
                               cfg.use_kv_cache, generators, vocab_size=tokenizer.vocab_size):
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
    if signal.getsignal(signal.SIGINT) is signal.SIG_DFL:  # set at the top, while the imports ran
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here Ctrl-C raises KeyboardInterrupt
    main(config_from_argv(SampleConfig))
