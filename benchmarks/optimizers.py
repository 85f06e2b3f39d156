"""Optimizer cost per step on a LoRA of a given model shape: state bytes, peak memory, s/step.

No model and no ComfyUI: the LoRA matrices of a Wan-2.1-14B-like transformer (rank R on the
attention and MLP linears of each block) get random gradients, and each optimizer of the registry
(engine/optimizers) steps them, with gradient clipping as in training. Numbers for docs/optimizers.md.

    python benchmarks/optimizers.py --blocks 40 --rank 32 --dtype bfloat16            # GPU if present
    python benchmarks/optimizers.py --blocks 2 --rank 16 --steps 5 --device cpu       # quick CPU check
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.config.choices import OPTIMIZER_LR_RANGES, OPTIMIZERS  # noqa: E402
from engine.config.sections import TrainSpec
from engine.train.optimizers import build_optimizer  # noqa: E402

LEARNING_RATE = {"prodigy": 1.0, "adafactor": 1e-2}


def lora_shapes(dim: int, ffn: int, blocks: int, rank: int) -> list[tuple[int, int]]:
    """(out, in) of every LoRA matrix: 8 attention linears (self + cross) and 2 MLP linears per block."""
    linears = [(dim, dim)] * 8 + [(ffn, dim), (dim, ffn)]
    shapes = []
    for out_f, in_f in linears * blocks:
        shapes += [(rank, in_f), (out_f, rank)]
    return shapes


def state_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    found: dict[str, int] = {}
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                found[v.device.type] = found.get(v.device.type, 0) + v.numel() * v.element_size()
    return found


def measure(name: str, shapes, dtype: torch.dtype, device: torch.device, steps: int) -> dict:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device, dtype=dtype) * 0.01) for s in shapes]
    grads = [torch.randn(s, device=device, dtype=dtype) * 1e-3 for s in shapes]
    lr = LEARNING_RATE.get(name, 1e-4)
    assert OPTIMIZER_LR_RANGES[name][0] <= lr <= OPTIMIZER_LR_RANGES[name][1]
    opt = build_optimizer(name, params, TrainSpec(learning_rate=lr))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(steps + 1):  # the first step allocates the state: not timed
        for p, g in zip(params, grads):
            p.grad = g.clone()
        start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    n = sum(p.numel() for p in params)
    found = state_bytes(opt)
    return {"optimizer": name, "lora_params_M": round(n / 1e6, 1), "weight_dtype": str(dtype).split(".")[-1],
            "state_bytes_per_weight": {k: round(v / n, 2) for k, v in found.items()},
            "state_GiB": {k: round(v / 2**30, 3) for k, v in found.items()},
            "peak_step_GiB_over_weights": round((torch.cuda.max_memory_allocated(device) - base) / 2**30, 3)
            if cuda else None,
            "s_per_step": round(statistics.median(times[1:]), 4)}


def check_offload_equals_adamw(device: torch.device) -> float:
    """adamw_cpu_offload against torch AdamW on this device: exercises the pinned, non-blocking copies."""
    results = []
    for name in ("adamw", "adamw_cpu_offload"):
        torch.manual_seed(1)
        params = [torch.nn.Parameter(torch.randn(s, device=device) * 0.01) for s in [(64, 3072), (3072, 64)]]
        opt = build_optimizer(name, params, TrainSpec(learning_rate=1e-3))
        for step in range(20):
            g = torch.Generator(device=device).manual_seed(step)
            for p in params:
                p.grad = torch.randn(p.shape, device=device, generator=g)
            opt.step()
        results.append(params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    diff = max((a - b).abs().max().item() for a, b in zip(*results))
    if diff > 1e-5:
        raise SystemExit(f"adamw_cpu_offload differs from adamw on {device} by {diff:g}")
    return diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=5120)
    ap.add_argument("--ffn", type=int, default=13824)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", nargs="*", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    args = ap.parse_args()
    shapes = lora_shapes(args.dim, args.ffn, args.blocks, args.rank)
    diff = check_offload_equals_adamw(torch.device(args.device))
    print(json.dumps({"check": "adamw_cpu_offload == adamw", "device": args.device, "max_abs_diff": diff}))
    for name in args.only:
        row = measure(name, shapes, getattr(torch, args.dtype), torch.device(args.device), args.steps)
        print(json.dumps(row), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
