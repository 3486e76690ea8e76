"""What several test files share: where the repository is, the environment scripts run in, a tiny
corpus, and the checks on a finished script run and on attention weights."""
import math
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one thread: a tiny model gains nothing from more, and on a busy 2-core machine OpenMP's spinning
# threads make each step many times slower
# and no torch.compile (PyTorch's own switch): compiling each tiny model would cost the suite minutes; the
# compiled path has tests of its own (test_compile.py)
# and a cache folder of their own: a CPU's peak measured while the tests share its cores is not the user's
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled",
       "TORCHDYNAMO_DISABLE": "1", "XDG_CACHE_HOME": os.path.join(tempfile.gettempdir(), "gpt-from-scratch-tests")}
# torchrun's workers import the repository's modules: the repository first, then the caller's own path
TORCHRUN_ENV = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 20


def check_ok(proc):
    """A script run that exited 0 without a traceback; its output when it did not."""
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


def torchrun(*args, nproc=2, timeout=240):
    """stdout of `torchrun --standalone --nproc_per_node=NPROC ARGS`, run in the repository, which must succeed.
    Its log folder is a temporary one of the test's: torchrun's own default is a new folder in /tmp, left there."""
    with tempfile.TemporaryDirectory() as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               f"--log-dir={logs}", *args]
        return check_ok(subprocess.run(cmd, cwd=ROOT, env=TORCHRUN_ENV, capture_output=True, text=True,
                                       timeout=timeout)).stdout


def rank_weights(out_dir, nproc=2):
    """Each rank's final weights, as tests/distributed_worker.py saved them (flat; a shard under FSDP)."""
    return [torch.load(os.path.join(out_dir, f"weights-rank{r}.pt"), weights_only=True) for r in range(nproc)]


def assert_causal_weights(w, q_start=0):
    """w: (B, nh, Tq, Tk) attention weights of queries at positions q_start.. : exactly zero on the
    future, strictly positive on the past and present, rows summing to one."""
    Tq, Tk = w.shape[-2:]
    future = torch.arange(Tk)[None, :] > torch.arange(Tq)[:, None] + q_start  # (Tq, Tk)
    assert torch.all(w[..., future] == 0), "a future key got nonzero attention weight"
    assert torch.all(w[..., ~future] > 0), "a past or present key got zero attention weight"
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6, rtol=0)


def backends_that_run_on_a_cpu():
    """The attention backends that attention.check_backend, the one place a backend is checked, lets
    run on a CPU in some dtype."""
    from attention import BACKENDS, check_backend

    def runs(backend):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            try:
                check_backend(backend, "cpu", dtype, 0.0)
                return True
            except ValueError:
                pass
        return False

    return {b for b in BACKENDS if runs(b)}


def assert_dropout(before, after, p, site="the tensor"):
    """after is before through dropout at rate p: a fraction p of its entries zeroed (to within four
    standard deviations of that many coin flips), every other one scaled by exactly 1 / (1 - p)."""
    assert before.ne(0).all(), "an entry that is zero before dropout would count as dropped"
    dropped = after == 0
    fraction, spread = dropped.float().mean().item(), 4 * math.sqrt(p * (1 - p) / dropped.numel())
    assert abs(fraction - p) <= spread, (f"{site}: {fraction:.3f} of the entries dropped "
                                         f"at rate {p} ({p} ± {spread:.3f})")
    torch.testing.assert_close(after[~dropped], before[~dropped] / (1 - p), atol=0, rtol=1e-6,
                               msg=lambda m: f"{site}, the entries kept: {m}")


def mount_tmpfs(directory, size):
    """Mount a tmpfs of size on directory; the reason it could not be (it needs root), or ""."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    return "" if mounted.returncode == 0 else f"cannot mount a tmpfs here: {mounted.stderr.strip()[:200]}"
