"""Shared pytest setup: make the repository root importable (`import model`, `import attention`)
however pytest is started (pytest.ini's `pythonpath = .` does the same when run from the root), a
tiny character-level data dir, and a cheap way to run the scripts as processes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ENV, ROOT, TEXT

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["XDG_CACHE_HOME"] = ENV["XDG_CACHE_HOME"]  # for the tests run in this process too, before any import

from data.prepare import prepare_char  # noqa: E402 - needs the repository on sys.path


def pytest_xdist_auto_num_workers(config):
    """pytest.ini's `-n auto`: one worker per CPU this process may run on (os.cpu_count() counts the
    machine's, not a `taskset`'s share), at most eight: each worker imports torch and transformers
    for itself, so memory, not speed, sets the limit on a many-core machine."""
    return min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), 8)


def pytest_collection_modifyitems(items):
    """The tests that compile run first: with inductor's cache cold (a fresh clone, CI) they are the longest,
    and one started last keeps a worker busy for half a minute while the other has nothing left to run."""
    items.sort(key=lambda item: "compiles" not in item.keywords)  # a stable sort: the others keep their order


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """train.bin, val.bin and meta.json of helpers.TEXT, characters; one per test module."""
    d = tmp_path_factory.mktemp("data")
    prepare_char(TEXT, str(d))
    return d


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny tensors gain nothing from threads, and on a shared 2-core machine OpenMP threads that
    spin-wait for a busy core make the tests many times slower. OMP_NUM_THREADS too: train.main and
    sample.main, called in this process, set torch's threads from it (else from the CPUs there are, and
    every later test of this worker then spins two threads beside the other worker's). Restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as session_patch:
        session_patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def no_compile(request, monkeypatch):
    """As helpers.ENV does for the scripts: torch.compile off (PyTorch's own switch), except in tests
    marked `compiles`, which check the compiled path itself."""
    if "compiles" not in request.keywords:
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    else:
        monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


# ---- running the scripts as processes, cheaply ---------------------------------------------------
# One process per run without paying, each time, the 1-2 s of CPU that importing torch & co. takes.

FORK_SERVER = r"""
import importlib, json, os, runpy, signal, sys, time, traceback
root, probe = sys.argv[1], sys.argv[2:]


# a virtual environment inside the repository (the README's .venv) holds packages, not our modules
packages = sys.prefix + os.sep if sys.prefix.startswith(root + os.sep) else None


def ours(module):  # the project's own modules: imported afresh by every child, never by the server
    path = os.path.abspath(getattr(module, "__file__", None) or os.sep)
    return path.startswith(root + os.sep) and not (packages and path.startswith(packages))


# Import, once, the third-party modules that the scripts import: a throwaway child imports the
# scripts and reports the modules it ended up with; the server then imports those that are not ours.
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1), os.dup2(devnull, 2)
    sys.path[0] = root
    for name in probe:
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    os.write(w, json.dumps([n for n, m in list(sys.modules.items()) if not ours(m)]).encode())
    os._exit(0)
os.close(w)
with os.fdopen(r, "rb") as f:
    names = json.loads(f.read() or b"[]")
os.waitpid(pid, 0)
for name in names:
    if name not in sys.modules and name != "__main__":
        try:
            importlib.import_module(name)
        except BaseException:
            pass
for name in [n for n, m in list(sys.modules.items()) if ours(m)]:
    del sys.modules[name]  # children must import the project's modules from the files as they are now

reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush(); reply.flush()
    pid = os.fork()
    if pid == 0:  # the child: becomes `python SCRIPT ARGS...` run in cwd with its output in two files
        code = 1
        try:
            for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], os.O_WRONLY | os.O_CREAT),
                                    (2, req["stderr"], os.O_WRONLY | os.O_CREAT)):
                os.dup2(os.open(name, flags, 0o644), fd)
            os.chdir(req["cwd"])
            sys.argv = list(req["argv"])
            sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python SCRIPT` sets it
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:  # what the interpreter does with it
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(code)
    deadline, timed_out = time.time() + req["timeout"], False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline and not timed_out:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.005)
    reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}) + "\n")
    reply.flush()
"""


# what the scripts import inside a function, at a cost each child would pay again: the loss picture's
# matplotlib (~0.5 s), torch._dynamo (~1.2 s, with sympy: torch.compile and train.check_model_fits' meta-device
# model import it), GPT-2's weights and tokenizer, and torch's checkpoint and FSDP modules (little more after it)
LAZY_IMPORTS = ["matplotlib.pyplot", "torch._dynamo", "safetensors.torch", "tiktoken",
                "torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp"]


class ForkServer:
    """Runs `python SCRIPT ARGS` as a child forked from a server that has already imported torch and
    the other third-party modules the scripts use: a separate process, with its own exit status, stdout
    and stderr, at a tenth of the cost. REAL_SUBPROCESS=1 runs plain `python SCRIPT ARGS` instead."""

    def __init__(self, tmp):
        self.tmp, self.n = tmp, 0
        self.server = subprocess.Popen([sys.executable, "-c", FORK_SERVER, ROOT, "train", "sample", *LAZY_IMPORTS],
                                       cwd=ROOT, env=ENV, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, script, *args, timeout=300):
        self.n += 1
        out, err = self.tmp / f"{self.n}.out", self.tmp / f"{self.n}.err"
        argv = [script, *map(str, args)]
        self.server.stdin.write(json.dumps({"argv": argv, "cwd": ROOT, "stdout": str(out), "stderr": str(err),
                                            "timeout": timeout}) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        assert reply, "the fork server died"
        reply = json.loads(reply)
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, reply["returncode"], out.read_text(), err.read_text())

    def close(self):
        self.server.stdin.close()
        self.server.wait(timeout=30)


def real_subprocess(script, *args):
    argv = [script, *map(str, args)]
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def launch(tmp_path_factory):
    """launch(SCRIPT, *ARGS) -> subprocess.CompletedProcess of `python SCRIPT ARGS` run in the repository
    root, with OMP_NUM_THREADS=1 (a tiny model gains nothing from threads, and on a busy machine OpenMP's
    spinning threads make each step many times slower)."""
    if os.environ.get("REAL_SUBPROCESS") == "1":
        yield real_subprocess
        return
    server = ForkServer(tmp_path_factory.mktemp("fork-server"))
    yield server
    server.close()


