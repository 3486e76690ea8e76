"""The options behind the CPU recipe (Muon, the time-driven schedule) and the pictures: loss curves
from train.py and attention maps from sample.py, checked for size and content, not pixels."""
import json
import math
import re
import time

import matplotlib.image
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attention_map import plot_attention
from data.prepare import prepare_char
from log import plot_losses
from model import GPT, GPTConfig
from optim import Muon, configure_optimizers, lr_multiplier, orthogonalize
from train import Clock, TrainConfig

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n\n" * 30
TINY = ["--device=cpu", "--dtype=float32", "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=2", "--eval_iters=2", "--warmup_iters=2", "--log_interval=1"]


def assert_picture(path, min_size):
    """A PNG of at least min_size (width, height) pixels that is not one flat colour."""
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert width >= min_size[0] and height >= min_size[1], (width, height)
    assert image[..., :3].std() > 0.05, "the picture is blank"


def test_time_driven_schedule_ends_fully_decayed():
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_seconds=100)
    assert lr_multiplier(cfg, 0, 0.0) == pytest.approx(1 / 11)  # warming up
    assert lr_multiplier(cfg, 10, 0.0) == pytest.approx(1.0)
    # at this pace (a 50th of the time per iteration) warm-up took a 50th of it: halfway from there, halfway down
    assert lr_multiplier(cfg, 500, 50 / 0.99) == pytest.approx(0.55)
    assert lr_multiplier(cfg, 900, 100.0) == pytest.approx(0.1)  # min_lr / learning_rate
    assert lr_multiplier(cfg, 999, 170.0) == pytest.approx(0.1)  # past the budget: stays at min_lr


def test_time_driven_schedule_decays_from_the_peak_on_a_machine_whose_warm_up_takes_half_the_budget():
    """1 s an iteration, 100 of warm-up in 190 s: the decay counted the warm-up's 100 s as its own, so the
    rate fell from 0.99 of the peak to 0.46 in one step and the peak was never held."""
    cfg = TrainConfig(warmup_iters=100, max_seconds=190, min_lr=0)
    assert lr_multiplier(cfg, 99, 99.0) == pytest.approx(100 / 101)
    assert lr_multiplier(cfg, 100, 100.0) == pytest.approx(1.0)
    assert lr_multiplier(cfg, 145, 145.0) == pytest.approx(0.5)  # halfway through what is left
    assert lr_multiplier(cfg, 190, 190.0) == pytest.approx(0.0, abs=1e-12)


def test_clock_leaves_out_paused_time():
    """The clock that drives the schedule counts only from start() (set-up and compiling are not
    training), stops while evaluating and saving, and carries on from a resumed run's seconds."""
    clock = Clock(seconds_before=10.0)
    time.sleep(0.2)
    assert clock.seconds() == 10.0, "counted before start()"
    clock.start()
    time.sleep(0.2)
    assert 10.2 <= clock.seconds() < 10.3
    with clock.paused():
        during = clock.seconds()
        time.sleep(0.3)
        assert clock.seconds() == during, "frozen while paused"
    assert clock.seconds() - during < 0.1


def test_iteration_schedule_decays_over_lr_decay_iters():
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_seconds=0, max_iters=1000,
                      lr_decay_iters=110)
    assert lr_multiplier(cfg, 60, 0.0) == pytest.approx(0.55)  # half of the 100 decay iterations
    assert lr_multiplier(cfg, 110, 0.0) == pytest.approx(0.1)
    assert lr_multiplier(cfg, 500, 0.0) == pytest.approx(0.1)


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16))
    adamw, muon = configure_optimizers(model, "muon", 1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_lr=0.02,
                                             device_type="cpu")
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    assert muon.param_groups[0]["ns_dtype"] == torch.float32  # an fp32 run does not emulate bf16 matmuls
    for device_type, dtype in (("cpu", torch.bfloat16), ("cuda", torch.float32)):  # bf16 where the step is, or a GPU
        muon_here = configure_optimizers(model, "muon", 1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_lr=0.02,
                                         device_type=device_type, dtype=dtype)[1]
        assert muon_here.param_groups[0]["ns_dtype"] == torch.bfloat16, (device_type, dtype)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    in_adamw = {id(p) for g in adamw.param_groups for p in g["params"]}
    blocks_2d = {id(p) for p in model.transformer.h.parameters() if p.dim() == 2}
    assert in_muon == blocks_2d
    assert not in_muon & in_adamw and in_muon | in_adamw == {id(p) for p in model.parameters()}
    assert id(model.transformer.wte.weight) in in_adamw  # embeddings (tied to the head) stay with AdamW
    for optimizer in (adamw, muon):
        assert all(g["initial_lr"] == g["lr"] for g in optimizer.param_groups)


def test_an_optimizer_name_is_one_of_the_choices():
    """configure_optimizers(model, "Muon", ...) trained with AdamW alone: only "muon" took Muon's branch."""
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16))
    with pytest.raises(ValueError, match="^unknown optimizer 'Muon'; choose one of adamw, muon$"):
        configure_optimizers(model, "Muon", 1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_lr=0.02, device_type="cpu")


@pytest.mark.parametrize("shape", [(4,), (2, 3, 3)])
def test_muon_refuses_a_parameter_that_is_not_a_matrix(shape):
    """Newton-Schulz orthogonalizes matrices: a vector was an IndexError at the first step, a 3-D weight an
    error from inside expand(); torch.optim.Muon refuses them when built, and so does this one."""
    with pytest.raises(ValueError, match=re.escape(f"Muon takes matrices only, got a parameter of shape {shape}")):
        Muon([torch.nn.Parameter(torch.ones(shape))])
    muon = Muon([torch.nn.Parameter(torch.ones(3, 3))])
    with pytest.raises(ValueError, match=re.escape(f"Muon takes matrices only, got a parameter of shape {shape}")):
        muon.add_param_group({"params": [torch.nn.Parameter(torch.ones(shape))]})
    assert len(muon.param_groups) == 1
    with pytest.raises(TypeError, match="ordered collections"):  # torch's own check comes first, as before
        Muon([{"params": {torch.nn.Parameter(torch.ones(3, 3))}}])


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_muon_makes_the_same_steps_as_torch_muon(weight_decay):
    """optim.Muon batches the matrices of one shape; in bf16 its steps are torch.optim.Muon's."""
    torch.manual_seed(0)
    shapes = [(48, 16), (48, 16), (16, 16), (16, 64), (16, 64), (16, 16)]  # tall, square and wide, two of each
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opts = (Muon(ours, lr=0.02, weight_decay=weight_decay, ns_dtype=torch.bfloat16),
            torch.optim.Muon(theirs, lr=0.02, weight_decay=weight_decay))
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        for params, opt in zip((ours, theirs), opts):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert not torch.equal(ours[0], ours[1])  # the same shape, different matrices: no mix-up in the batch


def test_muon_builds_its_momentum_buffers_once():
    """After the first step, a step allocates no new momentum buffers: they are built once and updated in place."""
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(16, 8), (16, 8), (8, 8)]]
    opt = Muon(params, lr=0.02, ns_dtype=torch.float32)
    steps = []
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with torch.profiler.profile() as prof:
            opt.step()
        steps.append(sum(e.name == "aten::zeros_like" for e in prof.events()))
    assert steps == [len(params), 0], steps


def test_muon_takes_up_the_state_of_torch_muon():
    """A checkpoint written while train.py used torch.optim.Muon resumes with optim.Muon."""
    torch.manual_seed(0)
    theirs = torch.nn.Parameter(torch.randn(8, 4))
    old = torch.optim.Muon([theirs], lr=0.02)
    theirs.grad = torch.randn(8, 4)
    old.step()
    ours = torch.nn.Parameter(theirs.detach().clone())
    new = Muon([ours], lr=0.02, ns_dtype=torch.float32)
    new.load_state_dict(old.state_dict())
    torch.testing.assert_close(new.state[ours]["momentum_buffer"], old.state[theirs]["momentum_buffer"])
    ours.grad = torch.randn(8, 4)
    new.step()  # the old groups' settings, and bf16 iterations as before
    assert new.param_groups[0]["ns_dtype"] == torch.bfloat16


def test_orthogonalize_in_fp32_brings_every_singular_value_near_one():
    g = torch.randn(3, 40, 24) * torch.logspace(-2, 0, 24)  # singular values over two decades
    singular = torch.linalg.svdvals(orthogonalize(g, steps=5))
    assert singular.min() > 0.5 and singular.max() < 1.3, singular


def test_time_limited_run_stops_on_time_decayed_and_draws_its_loss_curve(tmp_path, launch):
    data, out = tmp_path / "data", tmp_path / "out"
    prepare_char(TEXT, str(data))
    proc = launch("train.py", *TINY, f"--data_dir={data}", f"--out_dir={out}", "--max_seconds=3",
                  "--max_iters=1000000", "--eval_interval=50", "--learning_rate=1e-3", "--min_lr=1e-4")
    assert proc.returncode == 0, proc.stderr
    with open(out / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    steps = [r for r in records if "loss" in r]
    assert steps[-1]["seconds"] <= 3.5 and steps[-1]["iter"] > 10
    assert steps[-1]["lr"] < 1e-4 + 0.1 * (1e-3 - 1e-4), "a time-limited run ends with the schedule decayed"
    assert any("val_loss" in r for r in records)
    assert_picture(out / "loss.png", (800, 300))


@pytest.fixture
def drawn_figures(monkeypatch):
    """The figures the plotting functions save, kept for a test to read what they drew."""
    from matplotlib.figure import Figure
    figures, savefig = [], Figure.savefig

    def save(fig, *args, **kwargs):
        figures.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", save)
    return figures


def test_drawing_leaves_the_processs_matplotlib_backend_alone(tmp_path):
    """Called from a notebook, plot_attention and plot_losses switched its backend (inline plots) to Agg."""
    import matplotlib
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        plot_attention([torch.full((1, 2, 2), 0.5)], ["a", "b"], str(tmp_path / "attn.png"))
        (tmp_path / "metrics.jsonl").write_text(json.dumps({"iter": 1, "loss": 2.0, "seconds": 0.1, "run": "r"}))
        plot_losses(str(tmp_path / "metrics.jsonl"), str(tmp_path / "loss.png"), "r")
        assert matplotlib.get_backend() == "svg"
        assert (tmp_path / "attn.png").stat().st_size > 0 and (tmp_path / "loss.png").stat().st_size > 0
    finally:
        matplotlib.use(before)


def test_plot_losses_draws_both_axes_of_its_own_runs_records(tmp_path, drawn_figures):
    """Every record of run r1 with the numbers a curve needs; not another run's (an earlier run's, kept
    until r1's first save), nor one edited by hand that lacks them."""
    path = tmp_path / "metrics.jsonl"
    steps, evals = range(1, 101), range(25, 101, 25)
    with open(path, "w") as f:
        f.write(json.dumps({"iter": 1, "loss": 9.0, "seconds": 0.1, "run": "r0"}) + "\n")
        f.write(json.dumps({"iter": 1, "train_loss": 9.0, "val_loss": 9.0, "seconds": 0.1, "run": "r0"}) + "\n")
        for i in steps:
            f.write(json.dumps({"iter": i, "loss": 4 * math.exp(-i / 30) + 1, "seconds": i / 10, "run": "r1"}) + "\n")
            if i in evals:
                f.write(json.dumps({"iter": i, "train_loss": 4 * math.exp(-i / 30) + 1.1,
                                    "val_loss": 4 * math.exp(-i / 30) + 1.2, "seconds": i / 10, "run": "r1"}) + "\n")
        f.write(json.dumps({"iter": 101, "loss": 1.0, "run": "r1"}) + "\n")  # no seconds
        f.write(json.dumps({"iter": 101, "train_loss": 1.0, "val_loss": "1.2", "seconds": 10.1, "run": "r1"}) + "\n")
    plot_losses(str(path), str(tmp_path / "loss.png"), "r1")
    assert_picture(tmp_path / "loss.png", (1000, 350))
    by_iter, by_seconds = drawn_figures[0].axes
    for ax, x in ((by_iter, lambda i: i), (by_seconds, lambda i: i / 10)):  # each curve, point for point
        drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
        assert drawn == [([x(i) for i in steps], [4 * math.exp(-i / 30) + 1 for i in steps]),
                         ([x(i) for i in evals], [4 * math.exp(-i / 30) + 1.1 for i in evals]),
                         ([x(i) for i in evals], [4 * math.exp(-i / 30) + 1.2 for i in evals])]
        assert all(line.get_marker() not in ("None", "", " ", None) for line in ax.get_lines()), \
            "a run that logged one step (shorter than --log_interval's 50 iterations twice) showed no training curve"


@pytest.mark.parametrize("n_tokens", [20, 300], ids=["within a window", "many windows"])
def test_the_page_size_sample_py_checks_is_the_pages(tmp_path, n_tokens):
    """attention_map.page_bytes, which sample.py refuses a page by, is what write_attention_page writes: the
    page less its template and its tokens, within 1 %."""
    import attention_map
    from attention_map import page_bytes, write_attention_page
    config = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=3, n_embd=24)
    model = GPT(config).eval()
    ids = torch.randint(40, (n_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    write_attention_page(model, ids, ["x"] * n_tokens, n_tokens // 2, str(tmp_path / "a.html"), "t")
    template = len(open(attention_map.__file__.removesuffix(".py") + ".html", encoding="utf-8").read())
    written = (tmp_path / "a.html").stat().st_size - template - len(json.dumps(["x"] * n_tokens))
    assert abs(written - page_bytes(config, n_tokens)) < 0.01 * written + 300, (written, page_bytes(config, n_tokens))


def test_plot_attention_shows_the_causal_triangle(tmp_path, drawn_figures):
    torch.manual_seed(0)
    T = 12
    scores = torch.randn(2, 3, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    weights = list(scores.softmax(-1))  # 2 layers of (3 heads, T, T)
    plot_attention(weights, list("ROMEO:\nBut s"), str(tmp_path / "attn.png"), layer=0, head=1)  # not the last
    assert_picture(tmp_path / "attn.png", (1000, 500))
    panels = [ax for ax in drawn_figures[0].axes if ax.get_images()]  # the grid, then the large one
    shown = [torch.from_numpy(ax.get_images()[0].get_array().data) for ax in panels]
    assert len(shown) == 2 * 3 + 1
    for (i, j), picture in zip([(i, j) for i in range(2) for j in range(3)] + [(0, 1)], shown):
        assert torch.equal(picture, weights[i][j]), (i, j)  # the triangle as computed: zero above the diagonal


def test_plot_attention_writes_a_dollar_as_a_dollar(tmp_path, drawn_figures):
    """matplotlib reads text between two $ as a formula: GPT-2's "$$" token (LaTeX) was a traceback."""
    weights = [torch.ones(1, 3, 3).tril() / torch.arange(1, 4).view(3, 1)]
    plot_attention(weights, [" $$", "a$b", "$"], str(tmp_path / "attn.png"))
    assert_picture(tmp_path / "attn.png", (500, 300))
    labels = [label.get_text() for label in drawn_figures[0].axes[-2].get_xticklabels()]  # the large panel's
    assert labels == ["␣\\$\\$", "a\\$b", "\\$"], labels
    # a newline made visible; a byte token's text, escaped by the tokenizer already, as it is (it read \\xe6)
    plot_attention(weights, ["\n", "\\xe6", "a\tb"], str(tmp_path / "bytes.png"))
    labels = [label.get_text() for label in drawn_figures[-1].axes[-2].get_xticklabels()]
    assert labels == ["\\n", "\\xe6", "a\\tb"], labels


def test_a_title_that_holds_the_pages_placeholders_is_only_a_title(tmp_path):
    """The checkpoint's path is the page's title: one holding __DATA__ put the page's data into its heading."""
    from attention_map import write_attention_page
    model = GPT(GPTConfig(vocab_size=40, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    write_attention_page(model, [1, 2, 3], ["a", "b", "c"], 1, str(tmp_path / "a.html"), "t__DATA__<i>")
    page = (tmp_path / "a.html").read_text()
    assert page.count('"tokens": ["a", "b", "c"]') == 1 and "<title>Attention: t__DATA__&lt;i&gt;" in page


class LargestTensor(TorchDispatchMode):
    """Records the most numbers any one op makes while it is on."""

    numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numel = max([self.numel] + [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
        return out


def test_the_attention_page_past_the_first_window_keeps_a_bounded_amount_at_once(monkeypatch):
    """Each row past the first window takes a forward over its own window. The windows go in batches
    that keep at most KEPT_PER_FORWARD numbers (64 windows of GPT-2's 1024 tokens kept ~46 GB), and
    the page's arithmetic makes no tensor larger than one layer's weights of the forward (it once
    stacked the layers'). The numbers are those of a forward over the row's window alone."""
    from attention_map import KEPT_PER_FORWARD, attention_rows, windows_per_forward
    T = 256  # here 64 windows at once would keep more than KEPT_PER_FORWARD
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=T, n_layer=2, n_head=2, n_embd=16)).eval()
    ids = torch.randint(20, (T + 70,)).tolist()
    kept, attention_steps = [], model.attention_steps

    def counted(idx):
        steps = attention_steps(idx)
        kept.append((len(idx), [t.numel() for layer in steps for t in layer]))
        return steps

    monkeypatch.setattr(model, "attention_steps", counted)
    with LargestTensor() as largest:
        scores, shares, norms = attention_rows(model, ids)
    assert max(windows for windows, _ in kept) > 1
    assert all(sum(numbers) <= KEPT_PER_FORWARD for _, numbers in kept), [(w, sum(n)) for w, n in kept]
    assert largest.numel <= max(n for _, numbers in kept for n in numbers), largest.numel
    row = T + 60  # in the second batch of windows
    with torch.no_grad():
        steps = attention_steps(torch.tensor([ids[row - T + 1:row + 1]]))
    at = T * (T + 1) // 2 + (row - T) * T  # rows 0..T-1 hold 1..T keys, each later row T
    for layer, (q, k, v, weights) in enumerate(steps):
        q, weights = q[0, :, -1:], weights[0, :, -1]  # (nh, 1, hs), (nh, T)
        torch.testing.assert_close(scores[layer, :, at:at + T], (q @ k[0].transpose(-2, -1))[:, 0])
        brought = weights * v[0].norm(dim=-1)
        torch.testing.assert_close(shares[layer, :, at:at + T], brought / brought.sum(-1, keepdim=True))
        torch.testing.assert_close(norms[layer, :, row], (weights[:, None] @ v[0])[:, 0].norm(dim=-1))
    assert windows_per_forward(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)) == 1


def test_sample_draws_an_attention_map_from_a_checkpoint(tmp_path, launch):
    data, out = tmp_path / "data", tmp_path / "out"
    prepare_char(TEXT, str(data))
    trained = launch("train.py", *TINY, "--max_seconds=0", f"--data_dir={data}", f"--out_dir={out}",
                     "--max_iters=4", "--eval_interval=4")
    assert trained.returncode == 0, trained.stderr
    png = tmp_path / "attn.png"
    proc = launch("sample.py", f"--out_dir={out}", "--start=ROMEO:\nBut soft", f"--attention_map={png}",
                  "--attention_layer=1", "--attention_head=1")
    assert proc.returncode == 0, proc.stderr
    assert "2 layers x 2 heads over 15 tokens\n" in proc.stdout
    assert_picture(png, (1000, 500))
    asked = launch("sample.py", f"--out_dir={out}", "--start=ROMEO:", f"--attention_map={png}", "--max_new_tokens=50",
                   "--num_samples=3", "--compile=true", "--dtype=float16", "--attention_head=1")  # float16, which
    # a CPU refuses: not read at all
    assert asked.returncode == 0 and "over 6 tokens\n" in asked.stdout, asked.stderr
    long = launch("sample.py", f"--out_dir={out}", f"--start={'ROMEO: ' * 4}", f"--attention_map={png}")
    assert long.returncode == 0 and "over 16 tokens (the prompt's last 16 of 28: the model's window)\n" in long.stdout
    assert asked.stderr == ("note: --num_samples, --max_new_tokens, --compile, --dtype are not used for an attention "
                            "picture\n")
    page = launch("sample.py", f"--out_dir={out}", f"--attention_map={tmp_path / 'a.html'}", "--use_kv_cache=false",
                  "--max_new_tokens=3", "--temperature=0")
    assert page.returncode == 0 and page.stderr == "note: --use_kv_cache is not used for an attention page\n"
    samples = launch("sample.py", f"--out_dir={out}", "--attention_layer=1", "--max_new_tokens=3", "--seed=3")
    assert samples.returncode == 0 and samples.stderr == "note: --attention_layer is not used for samples\n"
    # bad input is the one line, with no note before it (a setting unread by a picture, here): it is checked with
    # the rest of the input, not when the picture is drawn
    bad = launch("sample.py", f"--out_dir={out}", f"--attention_map={png}", "--attention_layer=5", "--max_new_tokens=3")
    assert bad.returncode == 2 and bad.stderr == ("error: attention_layer=5, attention_head=0: this model has 2 "
                                                  "layers and 2 heads; give --attention_layer from 0 to 1 and "
                                                  "--attention_head from 0 to 1\n"), bad.stderr


def test_greedy_sampling_and_attention_maps_name_what_they_leave_unread_and_hold_only_what_they_run(tmp_path, launch):
    """--temperature=0 draws nothing: --top_k, --top_p and --seed get a note. An attention map runs one
    sequence (a picture: the prompt alone), so --num_samples and --max_new_tokens it does not read cannot
    make its memory check refuse it (100,000,000 samples, or 10^11 new tokens, were refused)."""
    data, out = tmp_path / "data", tmp_path / "out"
    prepare_char(TEXT, str(data))
    assert launch("train.py", *TINY, "--max_seconds=0", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=2",
                  "--eval_interval=2").returncode == 0
    greedy = launch("sample.py", f"--out_dir={out}", "--temperature=0", "--top_k=3", "--seed=5", "--max_new_tokens=3")
    assert greedy.returncode == 0 and greedy.stderr == "note: --top_k, --seed are not used at --temperature=0\n"
    page = launch("sample.py", f"--out_dir={out}", "--start=ROMEO", f"--attention_map={tmp_path / 'a.html'}",
                  "--num_samples=100000000", "--max_new_tokens=5")
    assert page.returncode == 0 and page.stderr == "note: --num_samples is not used for an attention page\n"
    picture = launch("sample.py", f"--out_dir={out}", "--start=ROMEO", f"--attention_map={tmp_path / 'a.png'}",
                     f"--max_new_tokens={10**11}")
    assert picture.returncode == 0 and picture.stderr == "note: --max_new_tokens is not used for an attention picture\n"


def test_sample_draws_the_layer_and_head_it_is_asked_for_from_the_models_own_weights(monkeypatch):
    """The picture's large panel is the layer and head sample.py was given (neither swapped nor left at 0),
    and its maps are the model's weights over the prompt's tokens."""
    import sample
    from data.tokenizer import CharTokenizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=3, n_head=2, n_embd=16, bias=False)).eval()
    tokenizer, drawn = CharTokenizer(TEXT), {}
    monkeypatch.setattr(sample, "plot_attention", lambda *args: drawn.update(args=args))
    ids = tokenizer.encode("ROMEO: light")
    sample.draw_attention(model, tokenizer, ids, sample.SampleConfig(attention_map="a.png", attention_layer=2,
                                                                      attention_head=1))
    weights, tokens, path, layer, head = drawn["args"]
    assert (path, layer, head) == ("a.png", 2, 1) and tokens == [tokenizer.token_text(i) for i in ids]
    expected = model.attention_weights(torch.tensor([ids]))
    assert len(weights) == 3 and all(torch.equal(w, e[0]) for w, e in zip(weights, expected))


def test_zero_init_starts_every_block_as_the_identity():
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16, zero_init=True))
    projections = [p for name, p in model.named_parameters() if name.endswith("c_proj.weight")]
    assert len(projections) == 4 and all(torch.count_nonzero(p) == 0 for p in projections)
    idx = torch.randint(0, 20, (2, 8))
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(8))
    assert torch.allclose(model(idx)[0], model.lm_head(model.transformer.ln_f(x)), atol=1e-6)
    default = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=16))
    assert all(torch.count_nonzero(p) > 0 for n, p in default.named_parameters() if n.endswith("c_proj.weight"))


def test_attention_map_from_gpt2_weights(tmp_path, launch):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)).save_pretrained(tmp_path / "gpt2")
    png = tmp_path / "attn.png"
    proc = launch("sample.py", f"--init_from={tmp_path / 'gpt2'}", "--start=Hello world, said the model.",
                  f"--attention_map={png}", "--device=cpu", f"--out_dir={tmp_path}", "--attention=fa2")
    assert proc.returncode == 0, proc.stderr
    assert "2 layers x 2 heads over 7 tokens" in proc.stdout  # GPT-2 BPE tokens, labelled one by one
    # a picture's weights come from the hand-written path whatever --attention says (fa2 cannot run here)
    assert proc.stderr == (f"note: --attention is not used for an attention picture\nnote: --out_dir is not used "
                           f"with --init_from={tmp_path / 'gpt2'}\n")
    assert_picture(png, (1000, 500))


def test_attention_page_from_gpt2_weights_shows_bpe_pieces_readably(tmp_path, launch):
    """The .html page from GPT-2 weights: BPE pieces as text, their leading spaces kept (the page shows
    them as visible marks); per entry of each head's lower triangle a half-precision score and a byte
    share, and per row |o| in fp32."""
    import base64
    import re

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)).save_pretrained(tmp_path / "gpt2")
    page = tmp_path / "attn.html"
    proc = launch("sample.py", f"--init_from={tmp_path / 'gpt2'}", "--start=Hello world, said the model.",
                  f"--attention_map={page}", "--max_new_tokens=3", "--device=cpu")
    assert proc.returncode == 0, proc.stderr
    assert "2 layers x 2 heads over 10 tokens" in proc.stdout
    text = page.read_text(encoding="utf-8")
    assert "<script src" not in text and "http" not in text.split("<script>")[1], "the page must need no network"
    data = json.loads(re.search(r"const DATA = (\{.*?\});", text).group(1))
    assert data["tokens"][:3] == ["Hello", " world", ","] and len(data["tokens"]) == 10 and data["n_prompt"] == 7
    entries = 2 * 2 * 10 * 11 // 2  # layers x heads x the lower triangle of 10 rows
    assert [len(base64.b64decode(data[name])) for name in ("scores", "shares", "out_norms")] == \
        [2 * entries, entries, 4 * 2 * 2 * 10]
