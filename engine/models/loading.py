"""Loading the user's model file exactly the way ComfyUI loads it (its detection, its classes)."""
from __future__ import annotations

import torch
from torch import nn

from ..config.run import RunConfig
from .gguf_base import load_gguf_patcher
from .gguf_file import GGUFError, is_gguf

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class ModelLoadError(RuntimeError):
    pass


def load_base_model(cfg: RunConfig, device: torch.device) -> nn.Module:
    """Returns ComfyUI's BaseModel (model_base.*) for cfg.model_path, frozen, on `device`.

    comfy.sd.load_diffusion_model takes bare diffusion-model files and full checkpoints alike
    (it strips the checkpoint's prefix), and picks the class with ComfyUI's model detection. A
    ComfyUI-quantized file (fp8_scaled: a `scaled_fp8` marker tensor) loads with ComfyUI's scaled
    fp8 ops as it is, whatever base_dtype says for the rest. With block swap the model stays on the
    CPU: engine/memory/options.py moves all but the swapped blocks' weights. The caller then makes the
    blocks trainable (engine.patches.make_trainable) before LoRA and memory options wrap them.
    """
    import inspect

    import comfy.sd

    options = {}
    if cfg.memory.base_dtype != "auto":
        options["dtype"] = _DTYPES[cfg.memory.base_dtype]
    try:
        # Real, assigned tensors in a training process: newer ComfyUI can hand out a dynamic-VRAM
        # patcher, which PipeTrain's own placement (block swap, DeepSpeed) must not meet.
        dynamic = {"disable_dynamic": True} if "disable_dynamic" in inspect.signature(
            comfy.sd.load_diffusion_model).parameters else {}
        if is_gguf(cfg.model_path):  # quantized linears stay quantized (engine/models/gguf_base.py)
            patcher = load_gguf_patcher(cfg.model_path, options)
        else:
            patcher = comfy.sd.load_diffusion_model(cfg.model_path, model_options=options, **dynamic)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from None
    except RuntimeError as e:
        raise ModelLoadError(
            f"ComfyUI does not recognise {cfg.model_path} as a diffusion model ({str(e).splitlines()[0]}). "
            "Pick a diffusion model or checkpoint that ComfyUI's own loaders can load.") from e
    if cfg.base_loras:  # the graph's LoRA stack, merged before the new LoRA (engine/models/base_loras.py)
        from .base_loras import BaseLoraError, merge_base_loras

        if is_quantized_file(patcher.model):
            raise ModelLoadError("base_loras on a quantized (fp8_scaled) model file cannot be merged into its "
                                 "weights: train on the full-precision file (memory base_dtype fp8 quantizes it for "
                                 "training), or remove the LoRA loaders from Train Pipeline's model.")
        try:
            merge_base_loras(patcher, cfg.base_loras)
        except BaseLoraError as e:
            raise ModelLoadError(str(e)) from None
    model = patcher.model
    if options.get("dtype") in FP8 and not is_quantized_file(model):
        keep_high_precision(model, cfg.model_path)
    model.requires_grad_(False)
    if cfg.memory.block_swap == 0:
        model.to(device)
    model.train()
    return model


def is_quantized_file(model: nn.Module) -> bool:
    """Whether ComfyUI loaded the file as a quantized one (fp8_scaled and the like): 0.3.x marks it
    with model_config.scaled_fp8 (fp8_scaled) or layer_quant_config (mixed precision), 0.33 and later with
    model_config.quant_config."""
    config = model.model_config
    return getattr(config, "scaled_fp8", None) is not None or bool(getattr(config, "quant_config", None)) or \
        bool(getattr(config, "layer_quant_config", None))


def fp8_weight_names(diffusion_model: nn.Module) -> set[str]:
    """The parameters an fp8 base keeps in fp8: the weights of the linear layers inside the blocks.

    Everything else (norms, biases, modulation vectors, convolutions, and the embedders and heads
    outside the block lists) is a small share of the weights and sensitive to rounding.
    """
    from ..memory.blocks import block_roots

    roots = tuple(r + "." for r in block_roots(diffusion_model))
    return {f"{name}.weight" for name, m in diffusion_model.named_modules()
            if isinstance(m, nn.Linear) and name.startswith(roots)}


def keep_high_precision(model: nn.Module, path: str) -> int:
    """After an fp8 load, restore every tensor but the block linears' weights from the file in the
    compute dtype (ComfyUI cast them to fp8 on load). Returns how many tensors were restored."""
    import comfy.model_detection
    from safetensors import safe_open

    compute = model.manual_cast_dtype or torch.bfloat16
    keep_fp8 = fp8_weight_names(model.diffusion_model)
    restored = 0
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        prefix = comfy.model_detection.unet_prefix_from_state_dict(dict.fromkeys(keys))
        if not any(k.startswith(prefix) for k in keys):
            prefix = ""
        for name, t in list(model.diffusion_model.named_parameters()) + list(model.diffusion_model.named_buffers()):
            if t.dtype not in FP8 or name in keep_fp8:
                continue
            key = prefix + name
            # A key the file spells differently (diffusers layout): up-cast the fp8 value instead.
            value = f.get_tensor(key) if key in keys else t.detach()
            t.data = value.to(compute).reshape(t.shape)
            restored += 1
    return restored


def latent_channels(model: nn.Module) -> int:
    return int(model.latent_format.latent_channels)
