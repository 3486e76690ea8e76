"""The shape a reader meets, kept by tests: the card's files at the top level with their support
modules, scripts that no library imports, imports that change nothing global, and functions short
enough to read."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ENV, ROOT

CARD = ("attention.py", "model.py", "train.py", "sample.py")


def python_files():
    """The repository's own Python files outside tests/."""
    return [p for p in Path(ROOT).rglob("*.py") if "tests" not in p.relative_to(ROOT).parts
            and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def library_modules(with_bench=False):
    """Every importable module of the repository: the top level and data/, and bench/ if asked."""
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in python_files()
                  if (with_bench or p.relative_to(ROOT).parts[0] != "bench") and p.name != "__init__.py")


def test_top_level_is_the_card_and_its_support_modules():
    """The four card files at the top, with the modules beside them that README's reading guide lists."""
    top = {p.name for p in Path(ROOT).glob("*.py")}
    assert set(CARD) <= top
    readme = (Path(ROOT) / "README.md").read_text(encoding="utf-8")
    for name in top:
        assert f"| [`{name}`]({name}) |" in readme, f"{name} is not in the README's reading guide"
    for folder in ("data", "configs", "tests", "bench"):
        assert (Path(ROOT) / folder).is_dir()


def test_only_tests_and_bench_import_the_scripts():
    for path in python_files():
        if path.relative_to(ROOT).parts[0] == "bench":  # benchmarks time train.py's own step
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"train", "sample"} - {path.stem}, f"{path.relative_to(ROOT)} imports a script"


def test_functions_fit_on_a_screen():
    """No function in the card files over 60 lines, none elsewhere over 80."""
    for path in python_files():
        limit = 60 if path.name in CARD and path.parent == Path(ROOT) else 80
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= limit, f"{path.relative_to(ROOT)}: {node.name}() is {length} lines (limit {limit})"


def test_lines_fit_in_120_characters():
    """Code, configs and scripts, tests included, in lines a reader sees whole (Markdown's prose and tables
    wrap where they are read)."""
    paths = [p for ext in ("py", "sh", "toml") for p in Path(ROOT).rglob(f"*.{ext}")
             if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)] + [Path(ROOT) / ".ci" / "run"]
    long = [f"{p.relative_to(ROOT)}:{n}" for p in paths
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if len(line) > 120]
    assert not long, long


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


GLOBAL_STATE = """(list(sys.path), dict(os.environ), [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)],
 torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_num_threads(),
 torch.get_default_dtype(), torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
 torch.backends.cudnn.allow_tf32, torch.are_deterministic_algorithms_enabled(),
 [f for f in warnings.filters if f[2].__module__ == "builtins"])"""  # sympy, imported by torch, adds its own


def test_importing_changes_no_global_state():
    """Importing every module, scripts and benchmarks included, leaves the process as it was: sys.path, the
    environment, signal handlers, every random generator, torch's threads and numeric settings, warning filters, and
    matplotlib unimported."""
    run_python("import importlib, os, random, signal, sys, warnings\nimport numpy, torch\n"
               f"def state(): return {GLOBAL_STATE}\n"
               "before = state()\n"
               f"for name in {library_modules(with_bench=True)!r}: importlib.import_module(name)\n"
               "names = 'sys.path environ signals torch_rng random numpy_rng threads dtype matmul_precision "
               "cuda_tf32 cudnn_tf32 deterministic warning_filters'.split()\n"
               "changed = [n for n, a, b in zip(names, before, state()) "
               "if not (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)]\n"
               "assert not changed, changed\n"
               "assert 'matplotlib' not in sys.modules, 'matplotlib imported (and its backend chosen) at import'\n")


def test_preparing_data_and_reading_settings_need_neither_torch_nor_the_model():
    """`python data/prepare.py` and the settings loader start without importing torch (and so neither
    the model nor torch.distributed)."""
    run_python("import sys, configurator, data.prepare\n"
               "assert not {'torch', 'model', 'attention'} & set(sys.modules), "
               "sorted({'torch', 'model', 'attention'} & set(sys.modules))\n")


def test_the_scripts_start_without_torchs_checkpoint_and_fsdp_modules():
    """train.py and sample.py import torch's checkpoint and FSDP modules where a save, a resume or FSDP uses them:
    with DTensor and sympy they cost most of a second, which `--help` and a bad setting's line need not wait for."""
    heavy = ["torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.distributed.tensor", "sympy"]
    run_python(f"import sys, train, sample\nheavy = {heavy!r}\n"
               "assert not set(heavy) & set(sys.modules), sorted(set(heavy) & set(sys.modules))\n")


def test_main_restores_signal_handlers_and_leaves_no_process_group(tmp_path, data_dir):
    """train.main's own finally puts back the caller's handlers, also when it stops on bad input."""
    import signal

    import torch

    import train
    from train import TrainConfig
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    train.StopRequest()  # until training starts, Ctrl-C interrupts as usual (a long download, say)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
    cfg = TrainConfig(device="cpu", dtype="float32", max_seconds=0, max_iters=1, n_layer=1, n_head=2, n_embd=16,
                      block_size=8, batch_size=2, eval_iters=1, data_dir=str(data_dir), out_dir=str(tmp_path / "o"))
    train.main(cfg)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
    with pytest.raises(SystemExit) as stopped:
        train.main(TrainConfig(**{**cfg.__dict__, "data_dir": str(tmp_path / "missing")}))
    assert stopped.value.code == 2
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before
    assert not torch.distributed.is_initialized()
    assert os.path.exists(tmp_path / "o" / "ckpt.pt")


def test_an_older_python_is_told_which_it_needs():
    """tomllib came with Python 3.11: on 3.10 every script had stopped in a traceback at configurator's import."""
    older = "import sys; sys.version_info = (3, 10, 13); sys.version = '3.10.13 (main)'; import configurator"
    proc = subprocess.run([sys.executable, "-c", older], cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", "error: this code needs Python 3.11 or newer; this is 3.10.13\n"), proc.stderr[-2000:]
