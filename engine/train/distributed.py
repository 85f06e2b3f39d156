"""Process-group helpers: rank/world, and the few collectives the train loop needs."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def init(device_type: str, timeout_s: float = 1800) -> None:
    """Join the other ranks; every later collective fails after timeout_s without an answer (a lost node)."""
    import deepspeed

    from ..launch.cluster import ClusterError, rendezvous_failure

    if device_type == "cpu":
        # The CPU shared-memory allreduce op would JIT-compile (~50 s) on first use; gloo is enough.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    try:
        deepspeed.init_distributed(dist_backend="nccl" if device_type == "cuda" else "gloo",
                                   timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:  # torch's DistStoreError / DistNetworkError: say which master and what to check
        raise ClusterError(rendezvous_failure(e, timeout_s)) from e


def leave() -> None:
    """End the process group on every rank at once (barrier, then destroy). A gloo rank whose peer
    has already exited can abort (SIGABRT) when its background reader sees the closed socket;
    leaving together closes the connections while every rank still waits for them."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def deepspeed_config(train) -> dict:
    """DeepSpeed's config for a TrainSpec (the optimizer and schedule are passed as objects). Its clipping
    stays off: the engines clip by train.grad_clip themselves (engine/patches/deepspeed.py, own_norm_and_clip)."""
    return {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def mean(value: float, device: torch.device) -> float:
    """Average of a float over all ranks."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t.item())


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every rank if it is true on any rank (keeps ranks deciding together)."""
    return any_true_each((flag,), device)[0]


def any_true_each(flags: tuple[bool, ...], device: torch.device) -> tuple[bool, ...]:
    """any_true of each flag, in one all-reduce."""
    t = torch.tensor([1.0 if flag else 0.0 for flag in flags], device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(value > 0 for value in t.tolist())
