"""
Where a run goes and how fast it can go: the device, the precision and the CPU threads that the
settings device=, dtype= and threads= pick; malloc keeping the memory a step frees; the peak FLOP/s
that MFU (model FLOPs utilisation) is measured against; and whether another process is busy on this
run's CPUs.
"""
import contextlib
import ctypes
import fcntl
import functools
import glob
import json
import os
import platform
import re
import time
import typing

import torch

from configurator import first_line
from files import atomic_write, cache_home

TorchDType = typing.Literal["float32", "bfloat16", "float16"]  # the precisions a script may run in
DType = typing.Literal["auto", TorchDType]  # the choices of every script's dtype setting


def ran_out_of_memory(error):
    """Whether error is a failed allocation: a GPU's torch.OutOfMemoryError, Python's MemoryError, or
    what torch raises as a plain RuntimeError from a CPU's allocator or Apple's MPS."""
    text = str(error)
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "DefaultCPUAllocator: can't allocate memory"
            in text or "MPS backend out of memory" in text)


def compile_failure(error):
    """torch.compile's error as one line for a note: its first line ("C++ compile error"), and the first line of a
    C++ compiler's output that says what went wrong, which names what to install (Python.h: the Python headers;
    omp.h: OpenMP, on a Mac)."""
    said = first_line(error, with_type=True)[:200]
    detail = next((m.group(0) for line in str(error).splitlines()[1:]
                   for m in [re.search(r"(fatal )?error: .*", line)] if m), "")
    return f"{said}: {detail[:200]}" if detail else said


def pick_device(name):
    """The device the setting `device` names: auto picks cuda, then mps, then cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    spelt = re.fullmatch(r"(cpu|cuda|mps)(?::(0|[1-9][0-9]*))?", name)  # as torch.device reads it
    if not spelt:
        raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda, cuda:N or mps")
    kind, index = spelt.groups()
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use --device=cpu (or auto)")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device={name!r}: this machine has CUDA devices 0 to {torch.cuda.device_count() - 1}")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} but MPS is not available here; use --device=cpu (or auto)")
    return name


def device_type_of(device):
    """The kind of device a name like "cuda:1" names: cuda, mps or cpu."""
    return device.split(":")[0]


def dtype_name(dtype):
    """A torch dtype as the dtype setting names it: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def make_current(device):
    """Make a GPU named with its index (cuda:N) the current one: what dtype=auto, the attention backends
    and the datasheet peak ask about is the current GPU."""
    if device.startswith("cuda:"):
        torch.cuda.set_device(device)


def pick_dtype(name, device_type, training=True, n_params=0):
    """The torch dtype the setting `dtype` names. auto: bf16 on CUDA GPUs that have it (else fp16). On
    CPUs with bf16 instructions: bf16 for training; for sampling (training=False) a model of n_params
    weights, bf16 once its fp32 weights outgrow the last-level cache, since every token then streams
    all of them from memory and bf16 halves the bytes, while a model that fits in the cache is
    faster with fp32's kernels (bench/sample.py measures both). fp32 on other CPUs and on Apple's GPUs (MPS)."""
    if name == "auto":
        if device_type == "cuda":
            # bf16 only where the GPU computes in it (Ampere and later): torch otherwise counts emulated bf16
            # (V100, T4), far slower than their fp16 tensor cores
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        if device_type != "cpu" or not cpu_has_bf16():
            return torch.float32
        return torch.bfloat16 if training or 4 * n_params > last_level_cache_bytes() else torch.float32
    dtype = getattr(torch, name)
    if dtype == torch.bfloat16 and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU cannot do bfloat16; use --dtype=float16 (or auto)")
    if dtype == torch.float16 and device_type == "cpu":
        raise ValueError("float16 is not supported on CPU here; use --dtype=bfloat16 or float32 (or auto)")
    return dtype


def autocast(device_type, dtype):
    """The autocast context of a run in dtype: mixed precision, or nothing at all in fp32."""
    return torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)


def enable_tf32():
    """On CUDA, fp32 matmuls and convolutions on TF32 tensor cores: the datasheet's fp32 peak assumes it."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


# more threads than CPUs only wait for each other (pick_threads), yet a few a CPU still run (a test of
# determinism across threads may want 2 on a 1-CPU machine); thousands exhaust the system's threads
# and crash the process
MOST_THREADS_PER_CPU = 4


def check_threads(n, setting="threads"):
    """ValueError for a thread count the setting `threads`, or the OMP_NUM_THREADS it defers to, may not ask for."""
    if n < 0:
        raise ValueError(f"threads must be at least 0 (0: OMP_NUM_THREADS, else the CPUs this process may use), "
                         f"got {n}")
    if n > MOST_THREADS_PER_CPU * usable_cpus():
        instead = "give 0" if setting == "threads" else "unset it"
        raise ValueError(f"{setting}={n} is far more than the {usable_cpus()} CPUs this process may use, and threads "
                         f"beyond those only wait for each other; {instead} for one per CPU, or a number up to "
                         f"{usable_cpus()} (at most {MOST_THREADS_PER_CPU * usable_cpus()} are accepted)")


# OpenMP told to bind its threads (OMP_PROC_BIND, as Intel's tuning guides advise) pins this process's first
# thread to one CPU as torch loads, and that thread's affinity then reads one CPU. torch counted the CPUs
# the process started with before that, for its default number of threads: read here, before any change.
OPENMP_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
TORCH_STARTING_THREADS = torch.get_num_threads()


def usable_cpus():
    """The CPUs this process may use: those it may run on (its affinity: taskset, or a container's
    cpuset), and no more than the CPU time its cgroups allow (a container's --cpus; rounded down:
    a thread beyond it spends the quota that the others' OpenMP barriers wait for)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if any(os.environ.get(name, "false").strip().lower() != "false" for name in OPENMP_BINDING):
        cpus = max(cpus, min(TORCH_STARTING_THREADS, os.cpu_count() or 1))
    quota = cgroup_cpus()
    return max(1, min(cpus, int(quota))) if quota is not None else cpus


def separate_cores(topology="/sys/devices/system/cpu"):
    """One CPU of each core this process may run on, in CPU order. Two threads of one core (SMT) share its
    arithmetic units, so runs given a core each do not slow each other, as runs on two of its threads would.
    A CPU whose core Linux does not say counts as a core of its own."""
    cores, cpus = set(), []
    here = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)  # macOS: all
    for cpu in sorted(here):
        try:
            core = tuple(read_file(f"{topology}/cpu{cpu}/topology/{name}")
                         for name in ("physical_package_id", "core_id"))
        except OSError:
            core = ("cpu", cpu)
        if core not in cores:
            cores.add(core)
            cpus.append(cpu)
    return cpus


CGROUP_ROOT, PROC_CGROUP = "/sys/fs/cgroup", "/proc/self/cgroup"  # where Linux shows a process its cgroups


def cgroup_dirs(controller):
    """(cgroup version, directory) of this process's cgroup for controller ("cpu", "memory") and of each
    cgroup above it, its own first; [] where there are none (not Linux). In a container that shows the
    host's path of its cgroup, the directories that do not exist inside it are skipped."""
    try:
        with open(PROC_CGROUP) as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return []
    found = []
    for entry in entries:
        if len(entry) != 3 or (entry[1] and controller not in entry[1].split(",")):
            continue
        version = 2 if not entry[1] else 1
        # v1: the hierarchy's directory, named for its controllers ("cpu,cpuacct"; "cpu" is often a link to it);
        # v2: beside v1 (a hybrid), or alone at the root
        named = [os.path.join(CGROUP_ROOT, name) for name in (entry[1], controller)] if version == 1 else \
            [os.path.join(CGROUP_ROOT, "unified")]
        base = next((d for d in named if os.path.isdir(d)), CGROUP_ROOT)
        parts = [part for part in entry[2].split("/") if part]
        found += [(version, d) for d in (os.path.join(base, *parts[:n]) for n in range(len(parts), -1, -1))
                  if os.path.isdir(d)]
    return found


def cgroup_values(controller, v1_names, v2_name):
    """The text of a cgroup setting (v1_names under cgroup v1, v2_name under v2) in each cgroup that holds
    this process (cgroup_dirs): lists of the v1 files' texts, or the v2 file's text split in words."""
    values = []
    for version, directory in cgroup_dirs(controller):
        try:
            if version == 1:
                values.append([read_file(os.path.join(directory, name)) for name in v1_names])
            else:
                values.append(read_file(os.path.join(directory, v2_name)).split())
        except (OSError, ValueError):  # a cgroup without that setting (the root's, say), or not text
            continue
    return values


def read_file(path):
    with open(path) as f:
        return f.read().strip()


def cgroup_cpus():
    """The CPUs' worth of time the cgroups holding this process allow it (docker --cpus, a Kubernetes CPU
    limit), the strictest of them; None where none is set."""
    allowed = []
    for value in cgroup_values("cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us"), "cpu.max"):
        quota, period = (value + ["", ""])[:2]  # what is not two whole numbers (v1's -1, v2's max) is no limit
        if quota.isdecimal() and period.isdecimal() and int(quota) > 0 and int(period) > 0:
            allowed.append(int(quota) / int(period))
    return min(allowed, default=None)


def cgroup_memory_bytes():
    """The memory the cgroups holding this process allow it (docker --memory), the strictest; None where
    none is set (v1 writes "no limit" as a number near 2**63)."""
    limits = [int(value[0]) for value in cgroup_values("memory", ("memory.limit_in_bytes",), "memory.max")
              if value and value[0].isdecimal() and int(value[0]) < 2**62]
    return min(limits, default=None)


def processes_on_this_machine():
    """How many processes torchrun started on this machine (1 without it): they share its CPUs."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def pick_threads(n, processes_here=1):
    """The setting `threads`: torch's CPU threads. 0: OMP_NUM_THREADS if it is set, else the CPUs
    this process may run on (usable_cpus), shared among the processes torchrun started on this
    machine. More threads than free cores is the worst case: OpenMP threads spin waiting for each
    other, and a step can take many times as long as with one thread."""
    check_threads(n)
    if n:
        return n
    from_environment = os.environ.get("OMP_NUM_THREADS", "").strip()
    if from_environment:  # OpenMP's form: a list of positive integers, one per nesting level; the first is ours
        first = from_environment.split(",")[0].strip()
        if not (first.isdigit() and int(first) > 0):
            raise ValueError(f"OMP_NUM_THREADS={from_environment!r} is not a number of threads; set it to a "
                             "positive integer (OMP_NUM_THREADS=2), or unset it to use every CPU this process may use")
        check_threads(int(first), "OMP_NUM_THREADS")
        return int(first)
    return max(1, usable_cpus() // processes_here)


def set_up_cpu(threads, processes_here=1):
    """How every script uses the CPU: torch's threads (pick_threads) and malloc keeping the memory
    that tensors free (keep_freed_memory). Raises ValueError for a bad `threads`."""
    torch.set_num_threads(pick_threads(threads, processes_here))
    keep_freed_memory()


def keep_freed_memory():
    """Keep freed memory in the process, for the next tensors of the same sizes. glibc's malloc
    otherwise hands it back to the kernel: blocks above its mmap threshold are unmapped when freed,
    and free memory at the heap's top beyond its trim threshold is released. Each training step's
    activations then fault their pages in again: thousands of page faults a step, and 8-10 % of
    train.py's iterations on a 2-core CPU (bench/README.md). jemalloc and tcmalloc, which PyTorch's
    CPU performance tuning guide suggests preloading, keep such memory anyway; these two limits make
    glibc do the same: blocks up to 32 MiB (the most its dynamic threshold would reach) come from the
    heap, and up to 1 GiB of it stays free rather than going back. Only where malloc is glibc's;
    returns whether it was."""
    if platform.libc_ver()[0] != "glibc":  # macOS, musl: another malloc, with its own policy
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


@functools.cache
def cpuinfo():
    """The text of /proc/cpuinfo ("" where there is none, as on macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_name():
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


def cpu_fields():
    """The first CPU's fields in /proc/cpuinfo ("cpu family", "model", "flags", ...); {} where there is none."""
    fields = {}
    for line in cpuinfo().splitlines():
        if not line.strip():
            break  # the first processor's block ends here; every core of a machine reports the same
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the instructions that set a CPU's matmul speed


def cpu_has_bf16():
    """bf16 autocast pays on CPUs with bf16 matrix instructions (bench/train.py measures it); elsewhere fp32."""
    flags = cpu_fields().get("flags", "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_class():
    """Which kind of CPU this is, for a benchmark's header: the model name says "AMD EPYC" for CPUs three
    generations and 2x apart in speed, so add the family, the model and the matmul instructions."""
    fields = cpu_fields()
    if "flags" not in fields:
        return cpu_name()
    flags = fields["flags"].split()
    isa = " ".join(f for f in MATMUL_FLAGS if f in flags) or "no avx2"
    return f"{cpu_name()} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}; {isa})"


@functools.cache
def last_level_cache_bytes():
    """The size of the CPU's largest cache (Linux's sysfs), or 32 MiB where it cannot be read."""
    sizes = {}
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(index, "level")) as f, open(os.path.join(index, "size")) as g:
                level, size = int(f.read()), g.read().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if size[:-1].isdigit() and size[-1] in units:
            sizes[level] = int(size[:-1]) * units[size[-1]]
    return sizes[max(sizes)] if sizes else 32 * 2**20


def memory_bytes(device):
    """How much memory the device has: a GPU's own, or for a CPU this machine's, or less where the process's
    cgroups allow less (a container's limit); None where it cannot be told."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[1]
    physical = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min((m for m in (physical, cgroup_memory_bytes()) if m is not None), default=None)


# ---- MFU: model FLOPs utilisation, the share of the hardware's peak matmul throughput a training
# step uses. Peaks come from datasheets (dense, no sparsity) on GPUs, and on a CPU from a short
# matrix-multiply probe run once and cached, since no table can know a CPU's.

# Dense peak FLOP/s by GPU name fragment, for bf16/fp16 tensor cores and for fp32 (as TF32, which
# train.py enables on CUDA). Checked in order (gpu_datasheet_peaks): longer names first.
GPU_PEAKS = [
    ("H200", {"bf16": 989e12, "fp32": 494e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp32": 378e12}),
    ("H100", {"bf16": 989e12, "fp32": 494e12}),
    ("B200", {"bf16": 2250e12, "fp32": 1100e12}),
    ("A100", {"bf16": 312e12, "fp32": 156e12}),
    ("A10G", {"bf16": 70e12, "fp32": 35e12}),
    ("A10", {"bf16": 125e12, "fp32": 62.5e12}),
    ("L40S", {"bf16": 362e12, "fp32": 183e12}),
    ("L40", {"bf16": 181e12, "fp32": 90.5e12}),
    ("L4", {"bf16": 121e12, "fp32": 60e12}),
    ("RTX 4090", {"bf16": 165e12, "fp32": 82.6e12}),
    ("RTX 3090", {"bf16": 71e12, "fp32": 35.6e12}),
    ("V100", {"bf16": 125e12, "fp32": 15.7e12}),  # fp16 only; V100 has no bf16
    ("T4", {"bf16": 65e12, "fp32": 8.1e12}),
]


def gpu_datasheet_peaks(name):
    """GPU_PEAKS' entry for a GPU named name (torch.cuda.get_device_name), or None where it has none. An
    entry matches where no letter or digit follows it: "A100" is not the RTX A1000's, "L4" not the L40's;
    the GH200's GPU is an H200."""
    return next((peaks for fragment, peaks in GPU_PEAKS if re.search(rf"{re.escape(fragment)}(?![0-9A-Za-z])", name)),
                None)


BUSY_WAIT = 0.25  # CPUs' worth of time a process's threads spend waiting for a CPU when others share its cores
BUSY_SHARE = 0.75  # where the kernel does not tell waiting time: a smaller share of its threads' CPU time
CPU_PEAK_CACHE = os.path.join(cache_home(), "gpt-from-scratch", "cpu_peak_flops.json")
CPU_PEAK_RANGE = (1e8, 1e16)  # FLOP/s: a cached peak outside it is not one a CPU has (a hand edit, a damaged file)


def waiting_seconds():
    """Seconds this process's threads have spent ready to run but waiting for a CPU, from Linux's
    /proc/self/task/*/schedstat (its second field); None where the kernel does not say."""
    total, found = 0, False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total / 1e9 if found else None


class CpuMeter:
    """The CPU time a stretch of work got and waited for, in CPUs (seconds per second of wall time)."""

    def __init__(self):
        self.wall, self.cpu, self.waited = time.perf_counter(), time.process_time(), waiting_seconds()

    def read(self):
        """(wall seconds, CPUs used, CPUs' worth of waiting for a CPU or None) since this meter started."""
        wall = time.perf_counter() - self.wall
        waited = waiting_seconds()
        waiting = None if waited is None or self.waited is None else max(0.0, waited - self.waited) / wall
        return wall, (time.process_time() - self.cpu) / wall, waiting


def cpus_shared(threads, cpus_used, cpus_waiting):
    """Did other work take this process's CPUs? Where the kernel says how long its threads waited for
    a CPU, that decides: a math library may well keep fewer threads busy than torch has (oneDNN runs
    some bf16 matmuls on one thread), and that is no sign of sharing. Elsewhere, a small share of its
    threads' CPU time is."""
    if cpus_waiting is not None:
        return cpus_waiting > BUSY_WAIT
    return cpus_used < BUSY_SHARE * threads


def measure_cpu_peak(dtype, size=1024, seconds=1.0):
    """(FLOP/s of a square matmul on this CPU with torch's threads, the practical peak; whether other
    work shared the CPUs meanwhile, which makes the figure low). Its operands come from a generator of
    its own: a probe, which runs only when nothing is cached, must not move the seeded RNG that
    dropout draws from."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, dtype=dtype, generator=generator)
    b = torch.randn(size, size, dtype=dtype, generator=generator)
    for _ in range(3):  # warm-up: thread pool, caches, kernel choice
        a @ b
    best, meter = 0.0, CpuMeter()
    for _ in range(5):  # the best of several short runs: a busy moment only lowers one of them
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 5:
            a @ b
            n += 1
        best = max(best, 2 * size ** 3 * n / (time.perf_counter() - start))
    _, cpus_used, cpus_waiting = meter.read()
    return best, cpus_shared(torch.get_num_threads(), cpus_used, cpus_waiting)


def cpu_peak_key(dtype):
    """Whose peak a cached probe is: this kind of CPU, its CPUs and torch's threads, the dtype, and torch's
    version (whose matmul kernels set the speed)."""
    return f"{cpu_class()}|{os.cpu_count()}|{torch.get_num_threads()}|{dtype}|torch {torch.__version__}"


def peak_flops(device_type, dtype, reached=0.0):
    """(peak FLOP/s, where it came from) for this device and dtype; (None, reason) if unknown.
    reached: FLOP/s a run has reached; on a CPU it raises the cached peak if higher, so MFU <= 100%."""
    key = "fp32" if dtype == torch.float32 else "bf16"
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
        peaks = gpu_datasheet_peaks(name)
        label = "fp16" if dtype == torch.float16 else key  # the same tensor cores' peak: a T4 has no bf16
        return (peaks[key], f"{name} datasheet, {label}") if peaks else (None, f"{name} is not in hardware.GPU_PEAKS")
    if device_type != "cpu":
        return None, f"no peak known for {device_type}"
    threads = torch.get_num_threads()
    machine = cpu_peak_key(dtype)
    source = f"measured {key} matmul on this CPU ({threads} threads)"
    cached = cached_cpu_peaks()
    if machine in cached and cached[machine] >= reached:
        return cached[machine], source
    if machine in cached:  # a run beat the probe: the probe was low
        cached[machine] = reached
    elif reached:  # a run beat a probe that other work slowed: no second probe in the middle of training
        return reached, source + ", raised to what this run reached: not cached"
    else:
        peak, shared = measure_cpu_peak(dtype)
        if shared:  # a low figure, not the machine's: its own threads waited for one another, or other work ran
            why = (f"its threads outnumber the {usable_cpus()} CPU(s) it may use" if threads > usable_cpus() else
                   "while other work ran")
            return max(peak, reached), f"{source}, {why}: not cached"
        cached[machine] = max(peak, reached)
    try:
        cache_cpu_peak(machine, cached[machine])
    except OSError as e:  # an unwritable home only costs a re-measure next time: said, as a busy probe's is
        return cached[machine], source + f", not cached ({CPU_PEAK_CACHE}: {e.strerror or e})"
    return cached[machine], source


def cache_cpu_peak(machine, peak):
    """Add machine's peak to CPU_PEAK_CACHE, keeping every other entry, those that runs starting at the same
    moment write too: each reads, adds and writes it holding a lock (flock: released when its process ends)."""
    os.makedirs(os.path.dirname(CPU_PEAK_CACHE), exist_ok=True)
    with open(CPU_PEAK_CACHE + ".lock", "a") as lock:
        with contextlib.suppress(OSError):  # a filesystem without locks (NFS without lockd): written unlocked
            fcntl.flock(lock, fcntl.LOCK_EX)
        peaks = {**cached_cpu_peaks(), machine: peak}
        atomic_write(CPU_PEAK_CACHE, lambda f: f.write(json.dumps(peaks).encode()))


def cached_cpu_peaks():
    """CPU_PEAK_CACHE's peaks by cpu_peak_key. A damaged file (strings, a list, a bool, a peak no CPU has)
    costs a re-measure, never a failed run: what is not a peak reads as absent."""
    try:
        with open(CPU_PEAK_CACHE) as f:
            cached = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: brackets nested past json's depth
        cached = {}
    if not isinstance(cached, dict):
        return {}
    return {k: v for k, v in cached.items() if type(v) in (int, float) and CPU_PEAK_RANGE[0] <= v <= CPU_PEAK_RANGE[1]}


class BusyCheck:
    """Is another process busy on this run's CPUs? Judged over windows of `window` seconds of training
    steps: the process gets well under the CPU time its threads could use, or runs at a third of its
    own best speed. Waiting threads can then make each step many times slower than this machine can
    (see pick_threads). Says so once."""

    def __init__(self, tokens_per_step, window=5.0):
        self.tokens_per_step, self.window = tokens_per_step, window
        self.best_tokens_per_s, self.warned = 0.0, False
        self.restart()

    def restart(self):
        """A new window (after an evaluation, say: it is not training)."""
        self.meter, self.steps = CpuMeter(), 0

    def step(self):
        """Count a training step; the warning to print, once, when a window shows the CPUs shared."""
        self.steps += 1
        if time.perf_counter() - self.meter.wall < self.window:
            return None
        seconds, cpus_used, cpus_waiting = self.meter.read()
        tokens_per_s = self.steps * self.tokens_per_step / seconds
        self.restart()
        return self.judge(tokens_per_s, cpus_used, cpus_waiting)

    def judge(self, tokens_per_s, cpus_used, cpus_waiting):
        """The warning, the first time a window's speed and CPU time (CPUs used and waited for) show
        the CPUs shared."""
        threads = torch.get_num_threads()
        self.best_tokens_per_s = max(self.best_tokens_per_s, tokens_per_s)
        starved = threads > 1 and cpus_shared(threads, cpus_used, cpus_waiting)
        if self.warned or not (starved or tokens_per_s < self.best_tokens_per_s / 3):
            return None
        self.warned = True
        waited = "" if cpus_waiting is None else f", and waited {cpus_waiting:.1f} CPUs' time for a CPU"
        cpus, processes = usable_cpus(), processes_on_this_machine()
        if threads * processes > cpus:  # its own threads take each other's CPUs: no other process needed
            each = f"{threads} thread{'s' if threads > 1 else ''} each"
            whose = f"its {threads} threads" if processes == 1 else f"its {processes} processes' {each}"
            fix = (f"Run with --threads={cpus // processes}" if processes <= cpus else  # one thread each is too many
                   f"Start at most {cpus} processes here (--nproc_per_node={cpus}), with --threads=1")
            cause = f"{whose} outnumber the {cpus} CPUs it may use. {fix}"
        else:  # (not OMP_NUM_THREADS=1: --threads, where given, wins over it)
            fix = "Run with --threads=1, or stop the other work" if threads > 1 else "Stop it"
            cause = f"another process is busy on these CPUs. {fix}"
        return (f"warning: this run is slow for this machine ({tokens_per_s:,.0f} tokens/s, best so far "
                f"{self.best_tokens_per_s:,.0f}; it used {cpus_used:.1f} of its {threads} threads' CPU time{waited}): "
                + cause)


def threads_text():
    """torch's threads in words, and where they outnumber the CPUs this process may use, that too: they
    then wait for each other, and a run is slower than one thread per CPU."""
    threads, cpus, processes = torch.get_num_threads(), usable_cpus(), processes_on_this_machine()
    named = f"{threads} thread{'s' if threads > 1 else ''}"
    if threads * processes <= cpus:
        return named
    shared = f"x {processes} processes here: " if processes > 1 else ""  # torchrun's, on the same CPUs
    return f"{named} ({shared}more than the {cpus} CPUs it may use)"
