"""Pipeline parallelism: the model cut into stages over GPUs, data parallel over the rest.

The world of N ranks is a grid of `pipeline_stages` x (N / pipeline_stages) data-parallel
replicas. DeepSpeed's PipelineEngine runs the micro-batches of one optimizer step through the
stages (train_batch); our part is the layer list (engine/models/<family>.py), the data each
replica feeds, and gathering what trained (the LoRA, or a full fine-tune's block weights), which is spread
over the stages, into one file.

DeepSpeed trap (GPU-BASELINE.md): with a LoRA and no ZeRO, its PipelineEngine only runs with
torch-style backward enabled, and then non-last stages would divide gradients by the
accumulation steps a second time (the loss the last stage backpropagates is already divided).
`build_engine` switches that second division off; tests/training/test_pipeline.py compares pipelined
gradients with single-process ones at gas 1, 4 and 8, which catches any such scaling error.
"""
from __future__ import annotations

import sys
from typing import Iterator

import torch
import torch.distributed as tdist

from ..config.checks import ConfigError, split_points
from ..config.rules import data_parallel_size
from ..config.run import RunConfig
from ..patches import deepspeed as ds_patches
from .distributed import deepspeed_config
from .grad_norm import norm_and_clip
from .objective import DiffusionObjective
from .sample_order import SampleStream, collate


def build_engine(cfg: RunConfig, model, objective: DiffusionObjective, optimizer_factory, scheduler_factory,
                 dataset=None, device: torch.device | None = None):
    """The PipelineEngine for this rank's stage. Returns (engine, adapter).

    dataset (with device): the cache, whose first item the stage layers are checked on against
    ComfyUI's apply_model before anything is cut (engine/models/stage_check.py); a mismatch is refused."""
    import deepspeed

    from ..models import adapter_for

    stages = cfg.memory.pipeline_stages
    replicas = data_parallel_size(tdist.get_world_size(), stages)  # refuses a world the stages do not divide
    adapter = adapter_for(model)
    layers = [_BoundarySafe(layer) for layer in adapter.layers(model)]
    if dataset is not None:
        from ..models.stage_check import check_stage_layers

        check_stage_layers(adapter, model, layers, objective, dataset, device or torch.device("cpu"))
    parts, cut = stage_bounds(cfg.memory.pipeline_split, stages, len(layers)), "memory.pipeline_split"
    if parts is None:
        parts, cut = default_bounds(adapter.partition, stages, len(layers)), _CUTS[adapter.partition]
    module = ds_patches.split_pipeline_module()(parts, layers=layers, num_stages=stages,
                                                loss_fn=objective.label_loss,
                                                partition_method="manual" if parts else adapter.partition)
    start, stop = module.parts[module.stage_id], module.parts[module.stage_id + 1]
    print(f"pipeline stage {module.stage_id + 1}/{stages}: layers {start}-{stop - 1} of {len(layers)} ({cut})",
          file=sys.stderr, flush=True)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        fixes = "move memory.pipeline_split so that every stage holds at least one block, or use fewer pipeline_stages"
        if cfg.lora.targets != "all_linear":
            fixes += ", or the 'all_linear' targets"
        what = "trained weights" if cfg.lora.kind == "full" else "LoRA weights"
        raise ConfigError(f"pipeline stage {module.stage_id + 1}/{stages} (layers {start}-{stop - 1} of {len(layers)}) "
                          f"holds no {what} with these targets ({cfg.lora.targets}): {fixes}.")
    optimizer = optimizer_factory(params)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler_factory(optimizer),
                                           config=deepspeed_config(cfg.train))
    ds_patches.stage_backward(engine)
    group = engine.grid.get_pipe_parallel_group()  # this replica's stages: the norm over all of its weights
    ds_patches.own_norm_and_clip(engine, lambda: norm_and_clip(params, cfg.train.grad_clip, group))
    ds_patches.skip_lone_replica_allreduce(engine, replicas)
    return engine, adapter


_CUTS = {"uniform": "the same number of layers per stage", "parameters": "balanced by parameter count"}


def stage_bounds(split: str, stages: int, layer_count: int) -> list[int] | None:
    """DeepSpeed's `parts` ([0, start of stage 2, ..., layer_count]) from memory.pipeline_split, or
    None for the adapter's own cut (its `partition`). Transformer adapters use DeepSpeed's 'uniform'
    cut, the same number of layers per stage: the blocks of one model cost
    about the same (Flux's double and single blocks do the same matmul work per token although a double
    block holds 2.4x the parameters), so equal layer counts balance the work where a cut by parameter
    count does not: on Flux-dev it left 17 blocks on stage 1 and 40 on stage 2 (docs/benchmarks.md)."""
    points = split_points(split, stages)
    if not points:
        return None
    if points[-1] >= layer_count:
        raise ConfigError(f"memory.pipeline_split {split!r}: this model has {layer_count} pipeline layers (0 = "
                          f"embedding, 1..{layer_count - 2} = blocks, {layer_count - 1} = head), so every split point "
                          f"must be between 1 and {layer_count - 1}. Lower the indices or leave it empty.")
    return [0, *points, layer_count]


def default_bounds(partition: str, stages: int, layer_count: int) -> list[int] | None:
    """The adapter's own cut as DeepSpeed's `parts`, or None to let DeepSpeed cut by parameter count.

    'uniform' is DeepSpeed's equal layer counts, unless that leaves a stage holding the embedding or
    the head alone (10 layers on 8 stages: the head would be stage 8's only layer, with no LoRA to
    train); then the blocks are shared out equally and the embedding and head join the first and
    last stage."""
    if partition != "uniform":
        return None
    from deepspeed.runtime.utils import partition_uniform

    parts = list(partition_uniform(layer_count, stages))
    blocks = layer_count - 2  # layer 0 embeds, the last is the head
    if all(stop - start > 1 or 1 <= start <= blocks for start, stop in zip(parts, parts[1:])):
        return parts
    if blocks < stages:
        raise ConfigError(f"pipeline_stages is {stages} but this model has only {blocks} blocks to share out: use at "
                          f"most {blocks} stages.")
    return [0, *[1 + i * blocks // stages for i in range(1, stages)], layer_count]


class _BoundarySafe(torch.nn.Module):
    """A stage layer whose outputs can cross a stage boundary: contiguous, floats in autograd.

    DeepSpeed backpropagates through every float tensor a stage sends and expects a gradient for
    every float tensor a stage receives; tensors computed without grad (rope frequencies, time
    embeddings of a frozen model) would break both. Making them leaves that require grad is free.
    It sends tensors as they are, and the process group refuses a strided view (a patch embedding's
    transpose, say: "input tensor has to be contiguous"); .contiguous() copies only such views.
    """

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, inputs):
        out = self.layer(inputs)
        if torch.is_tensor(out):
            return out.contiguous()
        out = tuple(t.contiguous() for t in out)
        return tuple(t.requires_grad_() if t.is_floating_point() and not t.requires_grad else t for t in out)


def micro_batches(cfg: RunConfig, engine, adapter, objective: DiffusionObjective, dataset, stream: SampleStream,
                  step: int, device: torch.device) -> Iterator[tuple[tuple, tuple]]:
    """The gas micro-batches of one optimizer step for this rank's data-parallel replica.

    Same positions (so the same samples and noise) as the data-parallel path with
    world = number of replicas: a pipelined run repeats a single-process run exactly.
    """
    t = cfg.train
    replica, replicas = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
    for micro in range(t.grad_accum):
        positions = SampleStream.positions(step, micro, replica, replicas, t.grad_accum, t.batch_size)
        latents, conds, ids = collate(dataset, stream, positions, device)
        prepared = objective.prepare(latents, conds, ids)
        inputs = tuple(x.contiguous() for x in adapter.first_stage_inputs(prepared))
        yield inputs, tuple(x.contiguous() for x in objective.labels(prepared))  # what label_loss takes


def gather_weights(module: torch.nn.Module, names: dict[int, str]) -> dict[str, torch.Tensor] | None:
    """Every stage's trained tensors (the LoRA, or a full fine-tune's weights) by name on global rank 0 as CPU
    copies (None elsewhere): gather_tensors of this rank's. A collective: every rank calls it."""
    return gather_tensors({names[id(p)]: p for p in module.parameters() if id(p) in names})


def gather_tensors(mine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Every rank's tensors by name on global rank 0 as CPU copies (None elsewhere), one tensor at a time from
    the first rank that holds it: a full fine-tune's stage (or its EMA) holds gigabytes, which gather_named would
    put on every rank at once. A collective: every rank calls it."""
    listing = [None] * tdist.get_world_size()
    tdist.all_gather_object(listing, {n: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in mine.items()})
    rank = tdist.get_rank()
    on = torch.device("cuda", torch.cuda.current_device()) if tdist.get_backend() == "nccl" else torch.device("cpu")
    out, sent = ({} if rank == 0 else None), set()
    for source, held in enumerate(listing):  # the same order on every rank
        for name, (shape, dtype) in held.items():
            if name in sent:  # a replica of a stage already sent it
                continue
            sent.add(name)
            if source == 0 and rank == 0:
                out[name] = mine[name].detach().to("cpu").contiguous().clone()
            elif rank == source:  # (an EMA kept on the CPU goes through the GPU with NCCL)
                tdist.send(mine[name].detach().to(on).contiguous(), dst=0)
            elif rank == 0:
                buffer = torch.empty(shape, dtype=getattr(torch, dtype), device=on)
                tdist.recv(buffer, src=source)
                out[name] = buffer.to("cpu")
    return out


def gather_named(mine: dict[str, torch.Tensor], everywhere: bool = False) -> dict[str, torch.Tensor] | None:
    """Every rank's tensors by name (each stage's part of the LoRA or its EMA), merged on global rank 0
    (None elsewhere), or on every rank with `everywhere`. A collective: every rank calls it."""
    parts = [None] * tdist.get_world_size()
    tdist.all_gather_object(parts, mine)
    if not everywhere and tdist.get_rank() != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged
