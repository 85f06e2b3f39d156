"""Where a training step's GPU time goes: one step under torch.profiler, summed by kind of kernel.

Used by benchmarks/memory.py --profile. Kinds are read from kernel names (cuBLAS/CUTLASS GEMMs,
attention kernels, Triton kernels from torch.compile, copies, everything else = eager elementwise and
reductions). Matmul ops are also split by shape: a LoRA matmul has the LoRA rank as one of its
dimensions, so "LoRA GEMM" is the device time of mm/addmm calls with a dimension equal to the rank.
"GPU idle" is wall time minus the union of kernel intervals: launch overhead and host syncs; the
host side's top entries (self CPU time: Python ops, cudaLaunchKernel, synchronisations) say which.
The profiler's own overhead inflates host time, so read these as shares, not as step times.
"""
from __future__ import annotations

_KINDS = (  # first match wins
    ("attention", ("fmha", "flash", "cudnn", "attention", "sdpa")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "sm100_", "splitkreduce")),
    ("compiled (triton)", ("triton",)),
    ("copy", ("memcpy", "memset", "copy_", "copykernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, needles in _KINDS:
        if any(n in low for n in needles):
            return kind
    return "eager elementwise/other"


def _union_us(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    return busy


def profile_step(step, lora_rank: int = 32, top: int = 12) -> dict:
    """Run `step()` once under the profiler (CUDA) and return the summary (times in ms)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        started = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = 1000 * (time.perf_counter() - started)
    # Device-side events minus the ranges the profiler draws around them (torch.compile's "## Call
    # CompiledFxGraph ##", "Optimizer.step#AdamW.step"): those are not kernels and would count twice.
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False) and not e.name.startswith("##") and "#" not in e.name]
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    intervals = []
    for e in kernels:
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        by_kind[kind_of(e.name)] = by_kind.get(kind_of(e.name), 0.0) + us / 1000
        by_name[e.name] = by_name.get(e.name, 0.0) + us / 1000
        intervals.append((e.time_range.start, e.time_range.end))
    lora_ms = 0.0
    for avg in prof.key_averages(group_by_input_shape=True):
        if avg.key in ("aten::mm", "aten::addmm") and any(lora_rank in s for s in avg.input_shapes if s):
            lora_ms += getattr(avg, "self_device_time_total", getattr(avg, "self_cuda_time_total", 0)) / 1000
    busy_ms = _union_us(intervals) / 1000
    host = sorted(((a.key, a.self_cpu_time_total / 1000, a.count) for a in prof.key_averages()), key=lambda t: -t[1])
    return {"wall_ms": round(wall_ms, 1), "kernel_ms": round(sum(by_kind.values()), 1),
            "gpu_idle_ms": round(wall_ms - busy_ms, 1), "lora_gemm_ms": round(lora_ms, 1),
            "by_kind_ms": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [(n[:90], round(v, 2)) for n, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]],
            "top_host_ms": [(k[:60], round(ms, 2), n) for k, ms, n in host[:top]]}


def format_summary(label: str, s: dict) -> str:
    lines = [f"profile {label}: wall {s['wall_ms']} ms, kernels {s['kernel_ms']} ms, GPU idle {s['gpu_idle_ms']} ms, "
             f"LoRA matmuls {s['lora_gemm_ms']} ms"]
    lines += [f"  {k}: {v} ms" for k, v in s["by_kind_ms"].items()]
    lines += ["  top kernels:"] + [f"    {v:8.2f} ms  {n}" for n, v in s["top_kernels_ms"]]
    lines += ["  top host-side (self CPU time, calls):"] + [f"    {v:8.2f} ms  {c:6d}x  {n}" for n, v, c in s["top_host_ms"]]
    return "\n".join(lines)
