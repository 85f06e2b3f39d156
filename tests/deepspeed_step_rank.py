"""One gloo rank for tests/training/test_deepspeed_step.py: a small MLP trained by DeepSpeed's engine as the
train loop builds it (engine/train/loop.py's build_trainer: engine/train/distributed.py's config,
own_norm_and_clip, skip_lone_replica_allreduce). Prints, as one JSON line: the weights after the steps, the gradient norm of
each step and how many times DeepSpeed's gradient all-reduce ran.

    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=... python tests/deepspeed_step_rank.py MAX_NORM
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch

STEPS, GRAD_ACCUM, LR = 3, 2, 1e-2


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's own micro-batch: the data-parallel replicas see different samples."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def loss_of(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (net(x) - y).square().mean()


def main(max_norm: float) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from engine.train import distributed as dist
    from engine.train.loop import build_trainer

    dist.init("cpu")
    rank = dist.rank()
    net = model()
    params = list(net.parameters())
    optimizer = torch.optim.AdamW(params, lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    cfg = SimpleNamespace(train=SimpleNamespace(batch_size=4, grad_accum=GRAD_ACCUM, grad_clip=max_norm),
                          launch=SimpleNamespace(backend="deepspeed"))
    engine = build_trainer(cfg, net, optimizer, schedule, params)
    reduce, reduced = engine.buffered_allreduce_fallback, []

    def counted_reduce(*args, **kwargs):
        reduced.append(1)
        return reduce(*args, **kwargs)

    engine.buffered_allreduce_fallback = counted_reduce
    norms = []
    for step in range(STEPS):
        for micro in range(GRAD_ACCUM):
            engine.backward(loss_of(engine, *batch(step, micro, rank)))
            engine.step()
        norms.append(float(engine.pipetrain_grad_norm))
    print(json.dumps({"rank": rank, "norms": norms, "allreduces": len(reduced),
                      "weights": [p.detach().flatten().tolist() for p in params]}), flush=True)
    dist.leave()


if __name__ == "__main__":
    main(float(sys.argv[1]))
