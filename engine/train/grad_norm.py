"""The global gradient norm of the trained weights before clipping, once per optimizer step: the
`grad_norm` of each `step` event and TensorBoard's train/grad_norm, and the clipping by that norm.

Each engine measures it at its optimizer step, after the gradients are averaged over the data-parallel
replicas, clips by it (train.grad_clip) and keeps it as `engine.pipetrain_grad_norm`: the plain backend in
PlainTrainer.step, DeepSpeed's engines through engine/patches/deepspeed.py (own_norm_and_clip), whose own
clipping is off: DeepSpeed 0.18 measures and scales each tensor on its own from Python (two kernel launches
per tensor, ~3,000 a step for SDXL's 1,478 LoRA tensors; torch's fused ones take a few) and its
get_global_grad_norm() is None with a plain torch optimizer in fp32. Pipelined, each stage holds part of
the weights: the squared norms are summed over the stages of a pipeline, so every stage clips by the norm
of the whole replica.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist


def total_norm(params, group=None) -> torch.Tensor:
    """The 2-norm of the gradients of `params` as one vector, in fp32; with `group` (the stages of one
    pipeline) over every rank's part. Parameters without a gradient count as zero."""
    params = list(params)
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if grads:  # torch's fused per-tensor norms (a few kernels for ~1,000 LoRA tensors, not 3 each)
        squares = torch.nn.utils.get_total_norm(grads, 2.0).float().square()
    else:
        squares = torch.zeros((), dtype=torch.float32, device=params[0].device if params else None)
    if group is not None:
        tdist.all_reduce(squares, group=group)
    return squares.sqrt()


def norm_and_clip(params, max_norm: float, group=None) -> torch.Tensor:
    """total_norm of the gradients of `params` (a list); with max_norm > 0 those gradients are then scaled by
    max_norm / (norm + 1e-6) where that is below 1, torch's clip_grad_norm_ rule, in one fused multiply.
    Returns the norm before clipping."""
    norm = total_norm(params, group)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def last_grad_norm(engine) -> float:
    """The norm the engine kept at its last optimizer step (NaN when it kept none)."""
    value = getattr(engine, "pipetrain_grad_norm", None)
    return float(value) if value is not None else math.nan
