"""Shared helpers for the bench/ scripts: option parsing, machine description, timing, tables, JSON.

Every script, run as one, puts the repository root first on sys.path before importing this, so that
`bench.benchutil`, the library modules (model, attention, hardware, checkpoint, data.loader, ...) and
train.py (whose training step bench/train.py times; importing it changes nothing) resolve the same from
any directory; imported as a module (`python -m bench.train`, the tests), the root is on sys.path already.
"""
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from configurator import ConfigError, fail, first_line, load_config
from files import atomic_write, check_writable
from hardware import cpu_class, device_type_of, make_current, pick_device, pick_dtype, set_up_cpu, usable_cpus
from interrupts import interrupt_on_sigterm, interrupted_by

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")


def run(main, config):
    """main(config), as each script runs it: Ctrl-C or SIGTERM (`timeout`, a scheduler) ends it in one line and
    128 + the signal, as train.py and sample.py end, not in a traceback; temporary folders and worktrees are
    removed on the way out. The JSON is written last, atomically, so none is left half-written."""
    interrupt_on_sigterm()
    try:
        main(config)
    except KeyboardInterrupt as e:
        fail("interrupted; no results were written", status=128 + interrupted_by(e))


def parse(cls, argv):
    """load_config, with a bad flag reported as one line on stderr (exit status 2)."""
    try:
        return load_config(cls, argv)
    except ConfigError as e:
        fail(e)


def split_list(text, name, convert=str, allowed=None):
    """'a,b,c' -> [convert(a), ...]; a bad item is one clear error."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        fail(f"{name} is empty; give a comma-separated list")
    out = []
    for s in items:
        try:
            v = convert(s)
        except ValueError:
            fail(f"{name}: {s!r} is not a valid {convert.__name__}")
        if allowed is not None and v not in allowed:
            fail(f"{name}: {s!r} is not one of {', '.join(map(str, allowed))}")
        out.append(v)
    return out


def resolve_device(name):
    """hardware.pick_device, with a device that is not here reported as one line (exit status 2); a GPU
    named with its index becomes the current one (make_current)."""
    try:
        device = pick_device(name)
    except ValueError as e:
        fail(e)
    if name == "auto" and device != "cpu":  # else a benchmark meant for this machine's CPU measures its GPU unsaid
        print(f"note: device=auto took {device}; --device=cpu measures this machine's CPU", file=sys.stderr)
    make_current(device)
    return device


def resolve_dtype(name, device_type, training=True, n_params=0):
    """hardware.pick_dtype, with a dtype this device cannot run reported as one line."""
    try:
        return pick_dtype(name, device_type, training, n_params)
    except ValueError as e:
        fail(e)


def out_path(out, name, device):
    """Where a benchmark writes its JSON: out (its --out), or bench/results/<name>-<device>.json. Checked
    before the benchmark runs, so a path that cannot be written is one line rather than a traceback after
    minutes of measuring. Missing folders are fine: write_json makes them."""
    own = f"{name}-{device_type_of(device)}.json"
    path = out or os.path.join(RESULTS, own)
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            fail(f"out={path}: {existing} is a file, not a folder; pick another path")
        existing = os.path.dirname(existing)
    try:
        if existing == folder:
            check_writable(path, own)
        else:  # can the missing folders be made? A probe folder in the nearest one that exists
            tempfile.TemporaryDirectory(dir=existing).cleanup()
    except ValueError as e:
        fail(f"out={path}: {e}")
    except OSError as e:
        fail(f"out={path}: cannot make the folder {folder}: {e.strerror or e} in {existing}; pick another place")
    return path


def set_threads(n):
    """torch's CPU threads, and malloc keeping freed memory, as train.py and sample.py set them
    (hardware.set_up_cpu; n=0: the usable CPUs)."""
    try:
        set_up_cpu(n)
    except ValueError as e:
        fail(e)


def git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "") if head else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(device):
    """What the numbers were measured on; stored in every JSON and printed above every table."""
    kind = device_type_of(device)
    info = {
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if kind == "cuda" else cpu_class(),
        "cpu": cpu_class(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable_cpus(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if kind == "cuda" else None,
        "python": platform.python_version(),
        "os": platform.system(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if kind == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        info["gpu_memory_gib"] = round(total / 2**30, 1)
    return info


def print_machine(info):
    load = ", ".join(f"{x:.1f}" for x in info["load_average"]) if info["load_average"] else "?"
    print(f"machine: {info['device_name']} | device {info['device']} | torch {info['torch']}"
          f"{' (CUDA ' + info['cuda'] + ')' if info['cuda'] else ''} | {info['torch_threads']} threads "
          f"({info['cpus_usable']} of {info['cpu_count']} CPUs usable) | load {load} | git {info['git']}")


def sync(device):
    """Wait for the GPU's queued work, so that a timer around it times the work, not its launch."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device.startswith("mps"):
        torch.mps.synchronize()


def timed(fn, device, inner=1):
    """Seconds per call of fn, averaged over `inner` back-to-back calls (device synchronised)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - start) / inner


def cuda_peak(fn, device):
    """Run fn once on a CUDA device: (its seconds, the most memory it held above what was allocated
    before it, in bytes)."""
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    seconds = timed(fn, device)
    return seconds, torch.cuda.max_memory_allocated(device) - before


def profiled(fn, device, record_shapes=False):
    """Run fn once under torch.profiler (CPU ops, and CUDA kernels on a GPU): (wall seconds, profiler).
    record_shapes: each op's events also say its arguments' shapes, strides, dtypes and numbers."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with without_profiler_lines(), profile(activities=activities, record_shapes=record_shapes) as prof:
        wall = timed(fn, device)
    return wall, prof


@contextlib.contextmanager
def without_profiler_lines():
    """stderr without the profiler library's own lines: kineto (in torch 2.13) writes one from C++ as each
    profile starts and stops ("USDT: ... profiler_start"), which landed between a script's tables. Every other
    line written to stderr meanwhile is passed on when the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not line.startswith(("USDT:", "STAGE:"))))
            sys.stderr.flush()


def os_costs(fn):
    """Run fn: (page faults the process took meanwhile, seconds of CPU time the kernel spent for it),
    from getrusage; (None, None) where there is none (Windows). A fault on every step is memory that
    was handed back to the kernel and has to be fetched again (hardware.keep_freed_memory)."""
    try:
        import resource
    except ImportError:
        fn()
        return None, None
    before = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_minflt + after.ru_majflt - before.ru_minflt - before.ru_majflt), after.ru_stime - before.ru_stime


# inductor's C++ kernels, as they report to the profiler: "graph_0_cpp_fused__softmax_div_masked_fill_3"
INDUCTOR_KERNEL = re.compile(r"graph_\d+_(cpp_fused_\w+)")


def show_compiled_kernels():
    """Make the C++ kernels that torch.compile writes from now on report to the profiler, so that time
    spent inside a compiled model's fused ops is listed by kernel (each call then costs ~1 us more)."""
    import torch._inductor.config as inductor_config  # only when profiling: its import costs ~0.7 s
    inductor_config.cpp.enable_kernel_profile = True


def top_ops(prof, n):
    """The n PyTorch ops and compiled kernels (show_compiled_kernels) with the most time of their own,
    costliest first: {name: microseconds}; a kernel is named "inductor:" and the ops it fuses."""
    times = {}
    for e in prof.key_averages():
        kernel = INDUCTOR_KERNEL.fullmatch(e.key)
        if e.key.startswith("aten::") or kernel:
            name = f"inductor:{kernel[1].removeprefix('cpp_fused_')}" if kernel else e.key
            times[name] = times.get(name, 0) + e.self_cpu_time_total
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:n])


def summary(samples):
    """median / min / max / n of a list of seconds (or any numbers)."""
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples),
            "samples": samples}


def md_table(headers, rows):
    """A GitHub markdown table; cells are printed with str()."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])


def without_local_paths(obj):
    """obj with every absolute path in it made portable: relative to the repository where it lies in
    it, else its last part (a results file names no directory of the machine that wrote it)."""
    if isinstance(obj, dict):
        return {k: without_local_paths(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [without_local_paths(v) for v in obj]
    if isinstance(obj, str) and "," in obj:  # a list setting, such as recipe.py's --configs
        return ",".join(without_local_paths(part) for part in obj.split(","))
    if isinstance(obj, str) and os.path.isabs(obj):
        inside = obj.startswith(ROOT + os.sep)
        return os.path.relpath(obj, ROOT) if inside else os.path.basename(obj.rstrip(os.sep)) or obj
    return obj


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = json.dumps(without_local_paths(obj), indent=1, default=str)
    text = text.replace(ROOT + os.sep, "")  # paths in the repository inside longer strings, too
    atomic_write(path, lambda f: f.write((text + "\n").encode()))
    path = os.path.abspath(path)
    print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path}")


def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def failure(e, doing=""):
    """An exception as one short line for a result's "message": its type, what was being done, and
    the first line of what it says."""
    said = first_line(e, with_type=True)  # "Type: what it says", or "Type" where it says nothing
    return (said.replace(type(e).__name__, type(e).__name__ + doing, 1))[:300]


def holds_or_not(holds):
    """How a goal's check is printed."""
    return "HOLDS" if holds else "DOES NOT HOLD"

