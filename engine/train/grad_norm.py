"""The global gradient norm of the trained weights before clipping, once per optimizer step: the
`grad_norm` of each `step` event and TensorBoard's train/grad_norm.

Each engine keeps it as `engine.pipetrain_grad_norm` at its optimizer step, after the gradients are
averaged over the data-parallel replicas and before clipping: the plain backend in PlainTrainer.step,
DeepSpeed's engines through engine/patches/deepspeed.py (record_grad_norm), since DeepSpeed 0.18's own
get_global_grad_norm() is None with a plain torch optimizer in fp32, clipping or not. Pipelined, each
stage holds part of the weights: the squared norms are summed over the stages of a pipeline.
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


def last_grad_norm(engine) -> float:
    """The norm the engine kept at its last optimizer step (NaN when it kept none)."""
    value = getattr(engine, "pipetrain_grad_norm", None)
    return float(value) if value is not None else math.nan
