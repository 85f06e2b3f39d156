"""The start-of-run check that an adapter's stage layers still compute ComfyUI's forward.

An adapter (engine/models/<family>.py) mirrors one ComfyUI version's model forward, and ComfyUI
rewrites those forwards between releases (token order, new norms, new per-block options). A stale
mirror trains silently on a different model. So before DeepSpeed builds the pipeline, the engine
runs the stage layers one after another on one small cached sample (engine/probe_batch.cropped:
at most 16 x 16 latent cells) and compares the prediction with ComfyUI's own `apply_model` on the
same inputs. A difference beyond rounding refuses the run, naming the adapter, the ComfyUI version
and the fix (pipeline_stages 1, which trains through ComfyUI's own forward).

The comparison is in the network's output space: (denoised - a(sigma) * xt) / b(sigma), the part of
the prediction the model computes, so a low noise level does not hide a wrong network.

Cost: two forwards of the probe sample without gradients. A pipelined model is on the CPU at that
point; on a GPU rank the parts outside the blocks go to the GPU and each block visits it only while
it runs (`_visiting`). Only global rank 0 checks; the verdict is broadcast, so every rank stops the
same way.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch

from ..config.checks import ConfigError

# Largest relative difference of the network output (L2 norm) that counts as rounding: the stage
# layers call the very ComfyUI modules apply_model calls, so only layouts and op order differ.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
LOW_PRECISION_TOLERANCE = 2e-2  # float16, bfloat16, fp8 bases computing in those


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, LOW_PRECISION_TOLERANCE)


def _compute_dtype(model) -> torch.dtype:
    """The dtype the model computes in: ComfyUI's manual cast dtype, else its weights' (a model built
    without a dtype reports None: then its first floating parameter's)."""
    dtype = model.manual_cast_dtype or model.get_dtype()
    if dtype is None:
        dtype = next((p.dtype for p in model.diffusion_model.parameters() if p.is_floating_point()), torch.float32)
    return dtype


def probe_batches(objective, dataset, device: torch.device) -> Iterator:
    """Prepared batches (objective.Prepared) of the cache's first item: cropped (probe_batch.cropped),
    then whole, for a model or an adapter that refuses the cut sample."""
    from ..patches.probe_batch import cropped
    from ..train.sample_order import batch_items

    item = dataset[0]
    small = cropped(item)
    for candidate in ((small, item) if small is not item else (item,)):
        latents, conds = batch_items([candidate], device)
        yield objective.prepare(latents, conds, [0])


def run_stages(adapter, layers, prepared):
    """The stage layers one after another, fed contiguous first-stage inputs as the pipeline feeds them."""
    acts = tuple(t.contiguous() for t in adapter.first_stage_inputs(prepared))
    for layer in layers:
        acts = layer(acts)
    return acts


def network_output(model, prepared, denoised: torch.Tensor) -> torch.Tensor:
    """(denoised - a(sigma) xt) / b(sigma): the network's own output behind ComfyUI's denoised."""
    ms = model.model_sampling
    sigma, xt = prepared.sigma, prepared.xt
    offset = ms.calculate_denoised(sigma, torch.zeros_like(xt), xt)
    return (denoised.float() - offset.float()) / prepared.scale.float()


def stage_mismatch(adapter, model, layers, batches, device: torch.device) -> str | None:
    """None when the layers reproduce apply_model on the first batch ComfyUI can run, else the refusal's
    message. A batch apply_model cannot run is skipped; with none left there is nothing to compare."""
    from ..patches.host import comfy_version
    from ..train.objective import transformer_options

    version = comfy_version()
    fix = "Set pipeline_stages to 1 (data parallel on every GPU, through ComfyUI's own forward)."
    last_error = None
    with torch.no_grad(), _visiting(model.diffusion_model, device):
        for prepared in batches:
            try:  # what the adapter refuses (conditioning it does not reproduce) stops the run here already
                adapter.first_stage_inputs(prepared)
            except ConfigError as exc:
                return str(exc)
            try:
                want = model.apply_model(prepared.xt, prepared.sigma,
                                         transformer_options=transformer_options(prepared.sigma), **prepared.kwargs)
            except Exception as exc:  # noqa: BLE001 - ComfyUI cannot run this batch: try the next one
                last_error = exc
                continue
            try:
                got = run_stages(adapter, layers, prepared)
            except ConfigError as exc:
                return str(exc)
            except Exception as exc:  # noqa: BLE001 - the cut sample may not suit the adapter
                last_error = exc
                continue
            if not torch.is_tensor(got) or got.shape != want.shape:
                return (f"pipeline_stages > 1: the {adapter.name} adapter's stage layers return "
                        f"{tuple(got.shape) if torch.is_tensor(got) else type(got).__name__} where ComfyUI "
                        f"{version}'s apply_model returns {tuple(want.shape)}. {fix}")
            ref = network_output(model, prepared, want)
            diff = (network_output(model, prepared, got) - ref).norm() / ref.norm().clamp_min(1e-12)
            limit = tolerance(_compute_dtype(model))
            if not torch.isfinite(diff) or diff > limit:
                return (f"pipeline_stages > 1: the {adapter.name} adapter's stage layers do not compute ComfyUI "
                        f"{version}'s forward for this model: their prediction differs from apply_model's by "
                        f"{float(diff):.3g} (relative, network output), more than rounding ({limit:g}). "
                        f"Training would learn a different model. {fix}")
            print(f"pipeline check: the {adapter.name} stage layers reproduce ComfyUI {version}'s forward (relative "
                  f"difference {float(diff):.2g}, rounding allows {limit:g})", file=sys.stderr, flush=True)
            return None
    if last_error is not None:
        print(f"pipeline check skipped: no probe sample ran through both ComfyUI and the {adapter.name} stage layers "
              f"({type(last_error).__name__}: {last_error})", file=sys.stderr, flush=True)
    return None


def check_stage_layers(adapter, model, layers, objective, dataset, device: torch.device) -> None:
    """Raise a ConfigError on every rank when the layers do not reproduce apply_model (global rank 0
    checks, the others take its verdict)."""
    import torch.distributed as tdist

    distributed = tdist.is_available() and tdist.is_initialized()
    verdict = [None]
    if not distributed or tdist.get_rank() == 0:
        try:
            verdict[0] = stage_mismatch(adapter, model, layers, probe_batches(objective, dataset, device), device)
        except Exception as exc:  # noqa: BLE001 - the other ranks must not wait for a verdict that never comes
            verdict[0] = f"pipeline_stages > 1: the start-of-run check of the {adapter.name} stage layers failed " \
                         f"({type(exc).__name__}: {exc}). Set pipeline_stages to 1 for this model."
    if distributed:
        on = torch.device("cuda", torch.cuda.current_device()) if tdist.get_backend() == "nccl" else None
        tdist.broadcast_object_list(verdict, src=0, device=on)
    if verdict[0]:
        raise ConfigError(verdict[0])


@contextlib.contextmanager
def _visiting(diffusion_model: torch.nn.Module, device: torch.device):
    """The model on `device` for the check: at once where it already is there (or device is the CPU),
    else the parts outside the blocks for the whole check and each block only while it runs; all of it
    back where it was afterwards."""
    from ..memory.blocks import block_roots, blocks

    home = next((p.device for p in diffusion_model.parameters()), device)
    if device.type == "cpu" or home == device:
        yield
        return
    roots = set(block_roots(diffusion_model))
    rest = [m for name, m in diffusion_model.named_children() if name not in roots]
    def arrive(module, args):  # hooks return None: a value would replace the block's inputs / output
        module.to(device)

    def leave(module, args, out):
        module.to(home)

    hooks = []
    for block in blocks(diffusion_model):
        hooks += [block.register_forward_pre_hook(arrive), block.register_forward_hook(leave)]
    own = [t for t in (*diffusion_model._parameters.values(), *diffusion_model._buffers.values()) if t is not None]
    kept = [t.data for t in own]
    try:
        for module in rest:
            module.to(device)
        for t in own:
            t.data = t.data.to(device)
        yield
    finally:
        for h in hooks:
            h.remove()
        for module in rest:
            module.to(home)
        for t, data in zip(own, kept):
            t.data = data
        for block in blocks(diffusion_model):
            block.to(home)
