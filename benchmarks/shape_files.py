"""Random-weight model files for a benchmark shape (model_shapes.py): a file ComfyUI's loader detects as the
released model, with weights drawn the same way every time (a seed), so no benchmark needs a download."""
from __future__ import annotations

from pathlib import Path

from model_shapes import Shape, build, file_metadata


def random_state(diffusion_model, seed: int = 0) -> dict:
    """bf16 random values (on the CPU) for every tensor of the model's state dict, by write_random's rule."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.RMSNorm)
    scales = {f"{m}.weight" for m, mod in diffusion_model.named_modules() if isinstance(mod, norms)}
    state = {}
    for name, p in diffusion_model.state_dict().items():
        if p.ndim >= 2:
            t = torch.randn(p.shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(0.02)
        elif name.endswith("inv_freq"):  # rope frequencies a file carries (MiniMax H3): theta 10000's
            t = 1.0 / 10000.0 ** (torch.arange(p.shape[0], device=device, dtype=torch.float32) / p.shape[0])
        else:
            scale = name in scales or "norm" in name
            t = (torch.ones if scale else torch.zeros)(p.shape, dtype=torch.bfloat16, device=device)
        state[name] = t.cpu()
    return state


def write_random(shape: Shape, path: str | Path, seed: int = 0) -> int:
    """Write a bf16 random-init diffusion-model file ComfyUI detects as `shape`; returns the parameter count.

    Matrices ~ N(0, 0.02), norm scales 1, other vectors 0. Norm scales are the weights of normalisation
    modules, also those not named "norm" (the UNets' GroupNorms are `in_layers.0`, `out.0`, ...: a zero
    scale there makes the output a constant and every LoRA gradient zero). Drawn on the GPU when there
    is one (a 12B model takes minutes to draw on a CPU).
    """
    from safetensors.torch import save_file

    state = random_state(build(shape).diffusion_model, seed)
    count = sum(t.numel() for t in state.values())
    tmp = Path(f"{path}.tmp")
    save_file(state, str(tmp), metadata=file_metadata(shape))
    tmp.replace(path)
    return count
