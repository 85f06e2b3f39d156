"""ComfyUI models of benchmarks/model_shapes.py run on the meta device: shapes without memory or arithmetic.

    kwargs = meta_kwargs(model, x0, cond)      # apply_model kwargs on meta, through ComfyUI's extra_conds
    with meta_autocast(): model.apply_model(...)  # for code that asks torch.autocast about the input's device
    meta_forward(shape, 1024)                  # the output's shape of one sample at 1024x1024

Used by model_shapes.py's command line (its check of every shape) and flops.py (FLOPs counted on meta).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from model_shapes import Shape, build
from shape_cond import sample_cond


def meta_kwargs(model, x0, cond: dict) -> dict[str, Any]:
    """apply_model kwargs on the meta device for one sample's conditioning (cache form), through the engine's
    model_kwargs (ComfyUI's extra_conds). Built on the CPU (some encode_adm mix in CPU tensors), then moved;
    models that run layers inside extra_conds (MiniMax H3's text refiner) get them on meta from the start."""
    import torch

    from PipeTrain.engine.train.objective import model_kwargs

    on = "meta" if hasattr(model.diffusion_model, "preprocess_text_embeds") else "cpu"
    kwargs = model_kwargs(model, [cond], x0.to(on), torch.zeros_like(x0, device=on))

    def meta(v):  # tensors, and the tensors in lists (not MiniMax H3's latent_shapes, a list of sizes)
        return v.to("meta") if torch.is_tensor(v) else [meta(t) for t in v] if isinstance(v, list) else v

    return {k: meta(v) for k, v in kwargs.items()}


@contextmanager
def meta_autocast():
    """torch.autocast knows no 'meta' device, and ComfyUI code that turns autocast off around a few ops
    (Anima's LLM-adapter rope) asks it for the input's device: for the meta runs here, 'meta' means the CPU's
    autocast (off is off on any device). Only inside the with-block; torch.autocast is restored after it."""
    import torch

    real = torch.autocast

    def autocast(device_type, *args, **kwargs):
        return real("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    torch.autocast = autocast
    try:
        yield
    finally:
        torch.autocast = real


# Families whose forward reads tensor values, which the meta device has not: meta_forward cannot run them.
META_READS_DATA = {"HiDream": "its MoE routing reads the router's scores",
                   "MiniMaxH3": "its forward reads the timestep's value (float(sigma)) to time each segment"}


def meta_forward(shape: Shape, size: int, frames: int = 1) -> tuple[int, ...]:
    """apply_model of `shape` on the meta device with sample_cond at size x size (x frames): every shape
    the widths, latent and conditioning meet must fit, without memory or arithmetic. Returns the output's
    shape. Needs ComfyUI's PyTorch attention (setup(pytorch_attention=True)): its split attention sizes
    chunks by the device's free memory, which meta has not. The families of META_READS_DATA cannot run."""
    import torch

    model = build(shape)
    model.model_sampling.to("meta")
    x0 = torch.zeros((1, *shape.latent(size, frames)))
    with meta_autocast():
        kwargs = meta_kwargs(model, x0, sample_cond(shape, size=size, frames=frames))
        with torch.no_grad():
            out = model.apply_model(x0.to("meta"), torch.full((1,), 0.5, device="meta"), transformer_options={},
                                    **kwargs)
    return tuple(out.shape[1:])
