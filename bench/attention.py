"""
Forward + backward time and peak memory of causal self-attention (attention.MultiHeadAttention,
projections included) per backend, over sequence lengths:

    python bench/attention.py                                   # CPU: fp32, T = 128 .. 8192
    python bench/attention.py --dtype=bfloat16 --seq_lens=1024,4096,16384 --n_embd=768 --n_head=12
    python bench/attention.py --seq_lens=128,256 --repeats=2 --out=/tmp/attn.json   # smoke test

Time: at each T the backends run interleaved (manual, sdpa, flash, manual, sdpa, flash, ...) for
`repeats` rounds after a warm-up, and the median is reported, so load on a shared machine hits every
backend alike. Each sample is at least min_sample_s long (several back-to-back calls for small T).

Peak memory: the growth above a baseline taken after the module and the inputs exist, so it counts
the activations saved for backward, the temporaries (the manual path's causal mask among them), the
output and the gradients of one forward + backward.
  CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, in this process, on a call
        after the warm-up (so cuBLAS workspaces are not counted).
  CPU:  there is no allocator counter, so each (backend, T) runs in a fresh subprocess of this script
        (--single=backend:T) that measures the peak resident set size of one call: it resets the
        kernel's high-water mark (write "5" to /proc/self/clear_refs, Linux >= 4.0) just before the
        call and reads VmHWM from /proc/self/status after it. A fresh process matters because glibc
        keeps freed memory around, which would hide part of a later measurement; the child also gets
        MALLOC_MMAP_THRESHOLD_ fixed, so every large tensor is its own mmap, returned to the kernel when
        freed and so visible in RSS only while alive. Where clear_refs cannot be written the child falls
        back to ru_maxrss minus the RSS before the call (can undercount when an earlier peak, e.g. the
        import of torch, was higher; the JSON records which method ran). RSS is pages touched, so the
        numbers are rounded up to pages and include small one-time allocations (thread pools, kernel
        caches) of the first call: a few MiB, negligible next to the manual path's T*T scores.
A backend stops growing T once it runs out of memory or one call takes longer than time_budget;
the larger T are marked skipped. On CPU a run predicted not to fit in the available memory is
skipped, not attempted, so the kernel's OOM killer never has to pick a process on a shared machine.
"""
import os
import sys

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json
import math
import subprocess
import time
from dataclasses import asdict, dataclass

import torch

import attention as attn_mod
from attention import BACKENDS, HOPPER, MultiHeadAttention, check_backend, check_heads
from bench.benchutil import (cuda_peak, fail, failure, fmt, holds_or_not, machine_info, md_table, out_path, parse,
                             print_machine, resolve_device, run, set_threads, split_list, summary, timed, write_json)
from configurator import check_at_least, check_positive
from hardware import TorchDType, device_type_of, pick_threads, ran_out_of_memory

STATED_SHAPE = ("batch_size", "n_embd", "n_head", "dtype")  # the memory goal's, at their defaults
CHECK_T = 4096  # the goal checked: fused peak memory <= 1/10 of manual at this T on CPU
CHECK_RATIO = 0.1


@dataclass
class AttentionBench:
    seq_lens: str = "128,256,512,1024,2048,4096,8192"  # sequence lengths T, comma-separated
    backends: str = "auto"  # comma-separated; auto: manual,sdpa,flash and fa2/fa3 where they can run
    batch_size: int = 1  # sequences per call
    n_embd: int = 128  # width of the input and output
    n_head: int = 4  # attention heads
    dtype: TorchDType = "float32"  # dtype of the module and inputs (no autocast)
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    repeats: int = 5  # interleaved timing rounds per T; the median is reported
    min_sample_s: float = 0.02  # each timing sample runs back-to-back calls until at least this long
    time_budget: float = 20.0  # seconds for one forward + backward; above it a backend stops growing T
    memory: bool = True  # measure peak memory (on CPU: one subprocess per backend and T)
    threads: int = 0  # torch threads; 0: the CPUs this process may use (or OMP_NUM_THREADS)
    seed: int = 0  # for the weights and inputs
    out: str = ""  # JSON path; "": bench/results/attention-<device>.json
    single: str = ""  # internal: "backend:T" measures one point (CPU peak memory) and prints JSON

    def __post_init__(self):
        check_at_least(self, 1, "batch_size", "n_embd", "n_head", "repeats")
        check_heads(self.n_embd, self.n_head)
        check_positive(self, "time_budget")
        check_at_least(self, 0, "min_sample_s", meaning="0: one call per sample")


def make_case(cfg, backend, T, device):
    """A step function: one causal self-attention forward + backward at length T. The module and its
    inputs are built here and live exactly as long as the function does (its closure holds them), so
    a caller measures memory above them while it holds `step`, and frees them by dropping it."""
    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    mha = MultiHeadAttention(cfg.n_embd, cfg.n_head, backend=backend).to(device, dtype)
    x = torch.randn(cfg.batch_size, T, cfg.n_embd, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def step():
        mha(x).backward(grad)
        mha.zero_grad(set_to_none=True)  # the next call starts with none: its peak counts its own gradients
        x.grad = None

    return step


def warm_up_autograd(device, dtype):
    """The first backward() given an explicit gradient imports modules (torch.fx's symbolic shapes and
    sympy: tens of MiB and most of a second). Pay that once, before any baseline or timing, so neither
    the peak memory of a call nor the calibration of the first case counts an import."""
    w = torch.ones(2, device=device, dtype=dtype, requires_grad=True)
    (w * 2).backward(torch.ones_like(w))


# ---- CPU peak memory, in a child process -------------------------------------------------------

PROC_STATUS, CLEAR_REFS = "/proc/self/status", "/proc/self/clear_refs"  # Linux's; a Mac has neither


def max_rss_kb():
    """This process's peak RSS so far, in KiB: getrusage's ru_maxrss (which macOS gives in bytes)."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def proc_kb(path, field):
    """A "Field:   123 kB" line's number in a /proc file (/proc/self/status, /proc/meminfo)."""
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in {path}")


def single(cfg):
    """Child: one (backend, T) point. Prints one JSON line: peak bytes over the baseline and seconds."""
    backend, _, t = cfg.single.partition(":")
    if backend not in BACKENDS or not t.isdigit() or int(t) < 1:
        fail(f"single={cfg.single!r}: give BACKEND:T, a backend of {', '.join(BACKENDS)} and T >= 1 (e.g. manual:1024)")
    T = int(t)
    device = resolve_device(cfg.device)
    # torch's threads alone: set_threads would also make malloc keep freed memory (hardware.keep_freed_memory),
    # undoing the MALLOC_* limits this child was started with, which make a freed tensor leave RSS at once
    try:
        torch.set_num_threads(pick_threads(cfg.threads))
    except ValueError as e:
        fail(e)
    try:
        warm_up_autograd(device, getattr(torch, cfg.dtype))
        step = make_case(cfg, backend, T, device)  # the baseline below includes its module and inputs
        try:
            with open(CLEAR_REFS, "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            method = "VmHWM after clear_refs"
        except OSError:
            method = "ru_maxrss - VmRSS (clear_refs not writable; may undercount)"
        has_proc = os.path.exists(PROC_STATUS)
        if not has_proc:  # macOS: the peak's growth, from the peak so far
            method = "ru_maxrss growth (no /proc; counts only what passes the peak before the step)"
        base_kb = proc_kb(PROC_STATUS, "VmRSS") if has_proc else max_rss_kb()
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
        peak_kb = proc_kb(PROC_STATUS, "VmHWM") if method.startswith("VmHWM") else max_rss_kb()
        result = {"status": "ok", "peak_bytes": max(0, peak_kb - base_kb) * 1024, "seconds": seconds,
                  "method": method}
    except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
        result = {"status": "oom" if ran_out_of_memory(e) else "error", "message": f"{type(e).__name__}: {e}"[:500]}
    print("RESULT " + json.dumps(result), flush=True)


def mem_available():
    try:
        return proc_kb("/proc/meminfo", "MemAvailable") * 1024
    except OSError:
        return None


def predicted_bytes(cfg, backend, T):
    """A generous guess of one call's peak on CPU, to skip runs that cannot fit (see the docstring)."""
    elem = torch.finfo(getattr(torch, cfg.dtype)).bits // 8
    linear = 20 * cfg.batch_size * T * cfg.n_embd * elem  # projections, q/k/v, outputs, gradients
    if backend == "manual":  # scores, masked scores, weights, and their gradients: ~ 5 (B, nh, T, T)
        return linear + 5 * cfg.batch_size * cfg.n_head * T * T * max(elem, 4)
    return linear


def child_point(cfg, backend, T):
    """Parent side of the CPU memory measurement."""
    need, avail = predicted_bytes(cfg, backend, T), mem_available()
    if avail is not None and need > 0.7 * avail:
        return {"status": "oom", "message": f"predicted ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available; "
                                            "not attempted"}
    shape = ("batch_size", "n_embd", "n_head", "dtype", "device", "threads", "seed")
    argv = [sys.executable, os.path.abspath(__file__), f"--single={backend}:{T}"] + \
           [f"--{k}={getattr(cfg, k)}" for k in shape]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    limit = 3 * cfg.time_budget + 120  # import of torch, building inputs, then one call
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "slow", "message": f"the child did not finish within {limit:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    if proc.returncode in (-9, 137):
        return {"status": "oom", "message": "the child was killed (SIGKILL: out of memory?)"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "message": f"exit {proc.returncode}: {tail}"[:500]}


# ---- the sweep ----------------------------------------------------------------------------------

def available_backends(cfg, device):
    kind = device_type_of(device)
    dtype = getattr(torch, cfg.dtype)
    if cfg.backends != "auto":  # each one named can run here, or one line says why before any is timed
        names = split_list(cfg.backends, "backends", allowed=BACKENDS)
        for name in names:
            try:
                check_backend(name, kind, dtype, 0.0)
            except ValueError as e:
                fail(f"--backends={cfg.backends}: {e}")
        return names
    names = ["manual", "sdpa", "flash"]
    for extra in ("fa2", "fa3"):
        try:
            check_backend(extra, kind, dtype, 0.0)
        except ValueError:
            continue
        if extra == "fa3" and torch.cuda.get_device_capability(device)[0] != HOPPER:
            continue
        names.append(extra)
    return names


def flash_kernel(device, dtype):
    """What backend='flash' resolves to here: the flash-attn package (fa2/fa3) or PyTorch's kernel."""
    q = torch.empty(1, 1, 1, 8, device=device, dtype=dtype)
    fn = attn_mod.flash_attn_package("flash", q, dropout_p=0.0)
    return "fa3" if fn is not None and fn is attn_mod.fa3_func else "fa2" if fn is not None else "pytorch"


def cpu_memory_point(cfg, b, T, rec):
    """CPU peak memory (and one cold call's time) of (b, T) from a child process, into rec; False
    when the point failed or was too slow there, so the backend stops growing T."""
    point = child_point(cfg, b, T)
    rec.update(peak_bytes=point.get("peak_bytes"), memory_method=point.get("method"),
               cold_seconds=point.get("seconds"))
    if point["status"] != "ok":
        rec.update(status=point["status"], message=point.get("message"))
        return False
    if point["seconds"] > cfg.time_budget:
        rec.update(status="slow", message=f"one call took {point['seconds']:.1f} s > time_budget")
        return False
    return True


def prepare_point(cfg, b, T, device):
    """(record, step function or None): backend b at length T measured for memory, warmed up and
    calibrated (calls per timing sample), ready for the interleaved timing; None when it failed or was
    over time_budget, which the record says. A failed case's tensors are freed when this returns."""
    kind = device_type_of(device)
    rec = {"status": "ok"}
    if cfg.memory and kind == "cpu" and not cpu_memory_point(cfg, b, T, rec):
        return rec, None
    try:
        step = make_case(cfg, b, T, device)
        first = timed(step, device)  # warm-up: kernel choice, thread pools, workspaces
        if cfg.memory and kind == "cuda":
            first, peak_bytes = cuda_peak(step, device)
            rec.update(peak_bytes=peak_bytes, memory_method="torch.cuda.max_memory_allocated")
    except Exception as e:  # noqa: BLE001 - any failure stops this backend, not the sweep
        rec.update(status="oom" if ran_out_of_memory(e) else "error",
                   message=failure(e))
        return rec, None
    if first > cfg.time_budget:
        rec.update(status="slow", time={"median": first, "min": first, "max": first, "n": 1},
                   message=f"one call took {first:.1f} s > time_budget")
        return rec, None
    if first < cfg.min_sample_s:  # calibrate on the fastest of a few calls: one can hit a stall
        first = min(first, *(timed(step, device) for _ in range(3)))
    rec["inner"] = max(1, math.ceil(cfg.min_sample_s / max(first, 1e-9)))
    return rec, step


def time_interleaved(cfg, live, device, stopped, T):
    """`repeats` rounds of one timing sample of each live backend ({backend: (step, record)}), then
    each record's summary; a backend that fails or is over time_budget stops growing T."""
    samples = {b: [] for b in live}
    for _ in range(cfg.repeats):
        for b, (step, rec) in live.items():
            if rec["status"] != "ok":
                continue
            try:
                samples[b].append(timed(step, device, rec["inner"]))
            except Exception as e:  # noqa: BLE001
                rec.update(status="oom" if ran_out_of_memory(e) else "error",
                           message=failure(e, " while timing"))
                stopped[b] = f"{rec['status']} at T={T}"
    for b, (step, rec) in live.items():
        if rec["status"] != "ok":
            continue
        rec["time"] = summary(samples[b])
        if rec["time"]["median"] > cfg.time_budget:
            stopped[b] = f"slow at T={T}"


def sweep(cfg, device, backends, seq_lens):
    """{backend: {T: record}}: every backend at every T, until it fails or gets too slow."""
    kind, dtype = device_type_of(device), getattr(torch, cfg.dtype)
    results = {b: {} for b in backends}  # backend -> T -> record
    stopped = {}  # backend -> why it stopped growing T
    for b in backends:
        try:
            check_backend(b, kind, dtype, 0.0)
        except ValueError as e:
            stopped[b] = f"unsupported: {e}"
    for T in seq_lens:
        live = {}  # backend -> (step, record): the cases timed at this T
        for b in backends:
            if b in stopped:
                results[b][T] = {"status": "skipped", "message": stopped[b]}
                continue
            results[b][T], step = prepare_point(cfg, b, T, device)
            if step is None:
                stopped[b] = f"{results[b][T]['status']} at T={T}"
                if kind == "cuda":  # what the failed case held is free now
                    torch.cuda.empty_cache()
            else:
                live[b] = (step, results[b][T])
        time_interleaved(cfg, live, device, stopped, T)
        live.clear()  # frees this T's modules and inputs before the next T
        if kind == "cuda":
            torch.cuda.empty_cache()
        line = "  ".join(f"{b} {cell_ms(results[b][T])} ms / {cell_mib(results[b][T])} MiB" for b in backends)
        print(f"T={T}: {line}", flush=True)
    return results


def main(cfg):
    if cfg.single:
        return single(cfg)
    device = resolve_device(cfg.device)
    kind = device_type_of(device)
    out = out_path(cfg.out, "attention", device)
    set_threads(cfg.threads)
    seq_lens = split_list(cfg.seq_lens, "seq_lens", int)
    if any(t < 1 for t in seq_lens):
        fail("seq_lens must be positive integers")
    backends = available_backends(cfg, device)
    info = machine_info(device)
    print_machine(info)
    memory = ("not measured (--memory=false)" if not cfg.memory else "max_memory_allocated" if kind == "cuda"
              else "peak RSS growth in a fresh subprocess" if kind == "cpu" else "not measured")
    print(f"causal self-attention forward+backward | B={cfg.batch_size} n_embd={cfg.n_embd} n_head={cfg.n_head} "
          f"dtype={cfg.dtype} | backends {', '.join(backends)} "
          f"(flash -> {flash_kernel(device, getattr(torch, cfg.dtype))}) | "
          f"median of {cfg.repeats} interleaved rounds | peak memory: {memory}")
    warm_up_autograd(device, getattr(torch, cfg.dtype))
    results = sweep(cfg, device, backends, seq_lens)
    # before the JSON: a run that measured nothing would overwrite a kept result with nothing
    if not any(rec.get("time") for by_t in results.values() for rec in by_t.values()):
        why = "; ".join(f"{b}: {next(iter(by_t.values())).get('message', 'failed')}" for b, by_t in results.items())
        fail(f"no backend could run here ({why}); nothing was measured or written", status=1)
    report(cfg, device, info, backends, seq_lens, results, out)


def cell_ms(rec):
    t = rec.get("time")
    if rec["status"] in ("ok", "slow") and t:
        return fmt(t["median"] * 1e3, ".2f") + ("*" if rec["status"] == "slow" else "")
    return rec["status"]


def cell_mib(rec):
    return fmt(rec["peak_bytes"] / 2**20, ".1f") if rec.get("peak_bytes") is not None else (
        "-" if rec["status"] in ("ok", "slow") else rec["status"])


def ratio(results, b, ref, T, key):
    a, r = results[b].get(T, {}), results[ref].get(T, {})
    if key == "time":
        x = a.get("time") and a["time"]["median"]
        y = r.get("time") and r["time"]["median"]
        return y / x if x and y else None  # speed-up over ref
    x, y = a.get("peak_bytes"), r.get("peak_bytes")
    return x / y if x is not None and y else None  # memory as a share of ref


def report(cfg, device, info, backends, seq_lens, results, out):
    kind = device_type_of(device)
    others = [b for b in backends if b != "manual"] if "manual" in backends else []
    headers = ["T"] + [f"{b} ms" for b in backends] + [f"{b} MiB" for b in backends] + \
              [f"{b} speed-up" for b in others] + [f"{b} mem/manual" for b in others]
    rows = []
    for T in seq_lens:
        row = [T] + [cell_ms(results[b][T]) for b in backends] + [cell_mib(results[b][T]) for b in backends]
        speedups = [ratio(results, b, "manual", T, "time") for b in others]
        row += [fmt(speedup, ".2f") + ("x" if speedup else "") for speedup in speedups]
        row += [fmt(ratio(results, b, "manual", T, "mem"), ".3f") for b in others]
        rows.append(row)
    print()
    print(md_table(headers, rows))
    print("(ms: median forward+backward; MiB: peak memory growth of one call; speed-up = manual time / backend time;"
          " * = over time_budget, stopped there)")
    notes = sorted({f"{b}: {rec['message']}" for b in backends for rec in results[b].values()
                    if rec.get("message")})
    for n in notes:
        print(f"  note: {n}")

    check = None
    if "manual" in backends and "flash" in backends:
        r = ratio(results, "flash", "manual", CHECK_T, "mem")
        sd = ratio(results, "sdpa", "manual", CHECK_T, "mem") if "sdpa" in backends else None
        holds = None if r is None else r <= CHECK_RATIO
        stated = type(cfg)()  # the goal's shape: the defaults (memory grows with n_head*T^2 against T*n_embd)
        applies = kind == "cpu" and all(getattr(cfg, k) == getattr(stated, k) for k in STATED_SHAPE)
        check = {"T": CHECK_T, "flash_over_manual_peak_memory": r, "sdpa_over_manual_peak_memory": sd,
                 "required_at_most": CHECK_RATIO, "applies": applies, "holds": holds}
        if r is None:
            verdict = f"not measured (T={CHECK_T} not in seq_lens, or a backend did not run there)"
        else:
            verdict = f"{r:.4f} (1/{1 / r:.0f})" if r > 0 else "0"
            verdict += f" -> requirement <= {CHECK_RATIO}: {holds_or_not(holds)}"
            if not applies:
                here = "" if kind == "cpu" else f"; this run is on {kind}"
                verdict += (" (the requirement is stated on a CPU at " + ", ".join(
                    f"{k}={getattr(stated, k)}" for k in STATED_SHAPE) + f"{here}; shown for information)")
        print(f"peak memory flash / manual at T={CHECK_T}: {verdict}"
              + (f"; sdpa / manual: {sd:.4f}" if sd is not None else ""))

    write_json(out, {"benchmark": "attention", "machine": info, "config": asdict(cfg),
                     "flash_kernel": flash_kernel(device, getattr(torch, cfg.dtype)),
                     "results": {b: {str(T): rec for T, rec in results[b].items()} for b in backends},
                     "requirement": check})


if __name__ == "__main__":
    run(main, parse(AttentionBench, sys.argv[1:]))
