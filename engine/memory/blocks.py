"""Finding the repeated blocks of any ComfyUI diffusion model, without per-family code.

Block lists are ModuleLists (Flux `double_blocks`, Wan `blocks`, UNet `input_blocks`),
ModuleDicts (Cosmos 1.0 `blocks`), or the UNet's middle block, a Sequential subclass.
Plain nn.Sequential children are embedders and heads, not blocks; so are ModuleLists whose items
are single projections or norms (see _holds_blocks).
"""
from __future__ import annotations

from torch import nn

from ..linear_layers import is_linear


def _is_timestep_sequential(module: nn.Module) -> bool:
    # UNet containers (TimestepEmbedSequential) subclass nn.Sequential; embedders use it plainly.
    return isinstance(module, nn.Sequential) and type(module) is not nn.Sequential


def _holds_blocks(container: nn.Module) -> bool:
    # A ModuleList/ModuleDict of transformer blocks: every item has several linear layers. Models
    # also keep embedders and projections in ModuleLists (Cosmos 1.0 `t_embedder`, HiDream's 49
    # `caption_projection` layers, lists of norms): those run in the prefix and are not blocks, and
    # counting them would put them into block swap's schedule and the block LoRA targets.
    items = list(container.values() if isinstance(container, nn.ModuleDict) else container)
    return bool(items) and all(_is_timestep_sequential(item)  # UNet levels (a level may be just a conv)
                               or sum(is_linear(m) for m in item.modules()) >= 2 for item in items)


def block_roots(diffusion_model: nn.Module) -> list[str]:
    """Names of the model's direct children that hold its blocks."""
    return [name for name, child in diffusion_model.named_children()
            if (isinstance(child, (nn.ModuleList, nn.ModuleDict)) and _holds_blocks(child))
            or _is_timestep_sequential(child)]


def blocks(diffusion_model: nn.Module) -> list[nn.Module]:
    """The modules whose forward ComfyUI calls once per block, in model order.

    UNet: ComfyUI iterates a TimestepEmbedSequential's children itself (forward_timestep_embed)
    and never calls the container's forward, so the children are the blocks there.
    """
    out = []
    for root in block_roots(diffusion_model):
        container = getattr(diffusion_model, root)
        if _is_timestep_sequential(container):
            items = [container]
        elif isinstance(container, nn.ModuleDict):
            items = list(container.values())
        else:
            items = list(container)
        for block in items:
            out.extend(block.children() if _is_timestep_sequential(block) else [block])
    return out
