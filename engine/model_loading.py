"""Loading the user's model file exactly the way ComfyUI loads it (its detection, its classes)."""
from __future__ import annotations

import torch
from torch import nn

from .config import RunConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    pass


def load_base_model(cfg: RunConfig, device: torch.device) -> nn.Module:
    """Returns ComfyUI's BaseModel (model_base.*) for cfg.model_path on `device`, frozen.

    comfy.sd.load_diffusion_model takes bare diffusion-model files and full checkpoints alike
    (it strips the checkpoint's prefix), and picks the class with ComfyUI's model detection.
    """
    import comfy.sd

    options = {}
    if cfg.memory.base_dtype != "auto":
        options["dtype"] = _DTYPES[cfg.memory.base_dtype]
    try:
        patcher = comfy.sd.load_diffusion_model(cfg.model_path, model_options=options)
    except RuntimeError as e:
        raise ModelLoadError(
            f"ComfyUI does not recognise {cfg.model_path} as a diffusion model ({str(e).splitlines()[0]}). "
            "Pick a diffusion model or checkpoint that ComfyUI's own loaders can load.") from e
    model = patcher.model
    # Out-of-place block forwards for the families whose blocks update the residual in place
    # (Flux family, Hunyuan, LTXV): without them LoRA backward fails. Must precede checkpointing.
    from .patches import ensure_patched

    ensure_patched(model.diffusion_model)
    model.requires_grad_(False)
    model.to(device)
    model.train()
    return model


def latent_channels(model: nn.Module) -> int:
    return int(model.latent_format.latent_channels)
