"""
Model FLOPs utilisation: the share of the hardware's peak matmul throughput a training step uses.

FLOPs per token follow the PaLM paper's appendix B (as nanoGPT does): 6N for the weights (2 forward,
4 backward per parameter) plus 12 * n_layer * n_embd * T for the attention scores and their
weighted sums. Peaks come from a table of datasheet numbers (dense, no sparsity) for GPUs, and on a
CPU from a short matrix-multiply probe run once and cached, since no table can know a CPU's.
"""
import json
import os
import platform
import time

import torch

# Dense peak FLOP/s by GPU name fragment, for bf16/fp16 tensor cores and for fp32 (as TF32, which
# train.py enables on CUDA). Checked in order: put longer names first.
GPU_PEAKS = [
    ("H200", {"bf16": 989e12, "fp32": 494e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp32": 378e12}),
    ("H100", {"bf16": 989e12, "fp32": 494e12}),
    ("B200", {"bf16": 2250e12, "fp32": 1100e12}),
    ("A100", {"bf16": 312e12, "fp32": 156e12}),
    ("A10G", {"bf16": 70e12, "fp32": 35e12}),
    ("A10", {"bf16": 125e12, "fp32": 62.5e12}),
    ("L40S", {"bf16": 362e12, "fp32": 183e12}),
    ("L4", {"bf16": 121e12, "fp32": 60e12}),
    ("RTX 4090", {"bf16": 165e12, "fp32": 82.6e12}),
    ("RTX 3090", {"bf16": 71e12, "fp32": 35.6e12}),
    ("V100", {"bf16": 125e12, "fp32": 15.7e12}),  # fp16 only; V100 has no bf16
    ("T4", {"bf16": 65e12, "fp32": 8.1e12}),
]
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "gpt-from-scratch", "cpu_peak_flops.json")


def flops_per_token(config, n_params):
    """Training FLOPs per token: forward and backward through weights and attention."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * config.block_size


def measure_cpu_peak(dtype, size=1024, seconds=1.0):
    """FLOP/s of a square matmul on this CPU with torch's threads: the practical peak."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    for _ in range(3):  # warm-up: thread pool, caches, kernel choice
        a @ b
    best = 0.0
    for _ in range(5):  # the best of several short runs: a busy moment only lowers one of them
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 5:
            a @ b
            n += 1
        best = max(best, 2 * size ** 3 * n / (time.perf_counter() - start))
    return best


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_flops(device_type, dtype):
    """(peak FLOP/s, where it came from) for this device and dtype; (None, reason) if unknown."""
    key = "fp32" if dtype == torch.float32 else "bf16"
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
        for fragment, peaks in GPU_PEAKS:
            if fragment in name:
                return peaks[key], f"{name} datasheet, {key}"
        return None, f"{name} is not in mfu.GPU_PEAKS"
    if device_type != "cpu":
        return None, f"no peak known for {device_type}"
    machine = f"{cpu_name()}|{os.cpu_count()}|{torch.get_num_threads()}|{dtype}"
    try:
        with open(CACHE) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if machine not in cached:
        cached[machine] = measure_cpu_peak(dtype)
        try:
            os.makedirs(os.path.dirname(CACHE), exist_ok=True)
            with open(CACHE, "w") as f:
                json.dump(cached, f)
        except OSError:
            pass  # an unwritable home only costs a re-measure next time
    return cached[machine], f"measured {key} matmul on this CPU ({torch.get_num_threads()} threads)"
