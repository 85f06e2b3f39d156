"""Host time of a training micro-batch on the CPU: the released depth of a model at a narrow width.

    COMFYUI_PATH=... python benchmarks/host_time.py --models sdxl,flux_dev --repeats 3
    COMFYUI_PATH=... python benchmarks/host_time.py --models sdxl --trainers plain,deepspeed,deepspeed_stock

A launch-bound GPU step (SDXL at batch 1, docs/benchmarks.md) costs what the host spends per op, not the
FLOPs. Here ComfyUI's own class is built at its released block structure (every block, every linear:
SDXL's 739 LoRA layers, Flux-dev's 304) but narrow widths and a small latent, so the CPU's time is mostly
that per-op cost. For each model it prints the forward + backward time and the number of aten calls
(each a kernel launch or more on a GPU), without LoRA and with LoRA rank 32 on every block linear (the
engine's own layer, engine/patches/peft.py), and the optimizer step (AdamW + clipping). --trainers picks
who steps the LoRA rows: `plain` (PlainTrainer), `deepspeed` (DeepSpeed's engine as the train loop sets it
up: engine/train/loop.py's build_trainer, one gloo rank) and `deepspeed_stock` (DeepSpeed's engine with its
own clipping and gradient all-reduce, as before engine/patches/deepspeed.py turned them off). One micro-batch
per step: DeepSpeed's all-reduce runs at the end of its backward (the forward + backward columns), its
clipping in the optimizer step. Figures are this CPU's: compare rows of one run.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import setup  # noqa: E402

NARROW = {  # config keys over the released shape: widths only, every block count kept
    "sdxl": (dict(model_channels=64, num_head_channels=16, context_dim=64), dict(text_dim=64), 128),
    "flux_dev": (dict(hidden_size=64, num_heads=2, axes_dim=[8, 12, 12], context_in_dim=64),
                 dict(text_dim=64, text_tokens=32), 128),
}


def measure(name: str, lora: bool, repeats: int, trainer_kind: str = "plain") -> dict:
    from model_shapes import SHAPES, build
    from shape_cond import sample_cond
    from shape_files import random_state
    from PipeTrain.engine.config.sections import LoraSpec, TrainSpec
    from PipeTrain.engine.patches.trainable import make_trainable
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.optim import build_scheduler
    from PipeTrain.engine.train.optimizers import build_optimizer

    config, fields, size = NARROW[name]
    shape = SHAPES[name]
    shape = replace(shape, config={**shape.config, **config}, **fields)
    model = build(shape, device="cpu")
    model.diffusion_model.load_state_dict({k: v.float() for k, v in random_state(model.diffusion_model).items()})
    cond, latents = sample_cond(shape, size=size), torch.randn((1, *shape.latent(size, 1)))
    objective = DiffusionObjective(model, seed=0)
    make_trainable(model.diffusion_model, lambda: objective(latents, [cond], [0]), device=torch.device("cpu"))
    model.diffusion_model.requires_grad_(False)
    if lora:
        inject_lora(model.diffusion_model, LoraSpec(rank=32, targets="all_linear"))
        params = lora_parameters(model.diffusion_model)
    else:  # one trained tensor, the first block's: backward runs through every block as with a LoRA
        params = [next(p for n, p in model.diffusion_model.named_parameters() if n.endswith("weight"))]
        params[0].requires_grad_(True)
    train = TrainSpec(steps=100, learning_rate=1e-4, batch_size=1, seed=0)
    optimizer = build_optimizer("adamw", params, train)
    trainer = make_trainer(trainer_kind, objective, optimizer, build_scheduler(optimizer, train, 100), params, train)

    def forward_backward():
        trainer.backward(trainer(latents, [cond], [0]))

    forward_backward()
    trainer.step()  # warm-up: first calls allocate
    passes, steps = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        forward_backward()
        passes.append(time.perf_counter() - started)
        started = time.perf_counter()
        trainer.step()
        steps.append(time.perf_counter() - started)
    calls = [aten_calls(forward_backward), aten_calls(trainer.step)]
    return {"model": name, "lora": len(params) if lora else 0, "trainer": trainer_kind,
            "fwd_bwd_ms": statistics.median(passes) * 1000, "aten_calls": calls[0],
            "step_ms": statistics.median(steps) * 1000, "step_aten_calls": calls[1]}


def aten_calls(run) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def make_trainer(kind: str, objective, optimizer, scheduler, params, train):
    """What steps the weights: PlainTrainer, DeepSpeed's engine as the train loop builds it, or DeepSpeed's
    engine with its own clipping and all-reduce (`deepspeed_stock`); one gloo rank for the DeepSpeed ones."""
    from PipeTrain.engine.train import distributed as dist
    from PipeTrain.engine.train.loop import build_trainer

    backend = "plain" if kind == "plain" else "deepspeed"
    if backend == "deepspeed" and not torch.distributed.is_initialized():
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                           "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
            os.environ.setdefault(key, value)
        dist.init("cpu")
    train = replace(train, grad_accum=1)
    if kind != "deepspeed_stock":
        cfg = SimpleNamespace(train=train, launch=SimpleNamespace(backend=backend))
        return build_trainer(cfg, objective, optimizer, scheduler, params)
    import deepspeed

    config = {**dist.deepspeed_config(train), "gradient_clipping": train.grad_clip}
    return deepspeed.initialize(model=objective, optimizer=optimizer, lr_scheduler=scheduler, config=config)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="sdxl,flux_dev", help=", ".join(NARROW))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainers", default="plain", help="who steps the LoRA rows: plain, deepspeed, deepspeed_stock")
    args = parser.parse_args()
    setup()
    torch.set_num_threads(1)  # the host's one launching thread
    rows = []
    for name in args.models.split(","):
        rows.append(measure(name, False, args.repeats))
        rows += [measure(name, True, args.repeats, kind) for kind in args.trainers.split(",")]
    print("| model (released depth, narrow) | LoRA tensors | trainer | forward + backward ms | aten calls | "
          "optimizer step ms | its aten calls |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        step = f"{r['step_ms']:.1f} | {r['step_aten_calls']:,}" if r["lora"] else "- | -"
        trainer = r["trainer"] if r["lora"] else "-"
        print(f"| {r['model']} | {r['lora']} | {trainer} | {r['fwd_bwd_ms']:.1f} | {r['aten_calls']:,} | {step} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
