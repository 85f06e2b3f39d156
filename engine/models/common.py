"""Pieces the pipeline adapters share: the base classes of the first, the block and the last stage
layer, the order of a two-stream model's layers, the refusals of conditioning an adapter does not
reproduce, the start of ComfyUI's BaseModel._apply_model, the stage tuple's stand-ins for an absent
input or a Python number, the per-block transformer_options, patch-grid sizes, the additive text
mask, and keeping unused stage inputs in the graph. Only what is the same code in more than one
adapter lives here; what mirrors a family's own ComfyUI function stays in that family's file.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options


class EmbedLayer(nn.Module):
    """Base of an adapter's first stage layer. It owns only `embedders` (so DeepSpeed places and counts
    just them on this stage) and model_sampling; the base model and its diffusion model are
    self._refs, plain references kept out of the module tree. join: whether the layer hands on one
    joint token sequence (a model without two-stream blocks)."""

    def __init__(self, base, embedders, join: bool = False):
        super().__init__()
        self.embedders = nn.ModuleList(embedders)
        self.model_sampling = base.model_sampling
        self._refs = (base, base.diffusion_model)
        self.join = join


class BlockLayer(nn.Module):
    """Base of a stage layer that runs one of the model's blocks. It owns the block (so DeepSpeed places
    it on this stage); index and total place it among the blocks of its kind (for block_options);
    join: the last two-stream block, which hands on one joint sequence; the diffusion model, where a
    layer needs it, is self._dm[0], a plain reference kept out of the module tree."""

    def __init__(self, block, index: int = 0, total: int = 1, join: bool = False, dm=None):
        super().__init__()
        self.block = block
        self.index, self.total, self.join = index, total, join
        self._dm = (dm,)

    def options(self, sigma, block_type: str) -> dict:
        """block_options for this block (block_type: ComfyUI's "double" or "single")."""
        return block_options(sigma, block_type, self.index, self.total)


class HeadLayer(nn.Module):
    """Base of an adapter's last stage layer. It owns the diffusion model's parts named in `owned` (its
    final layer) and model_sampling; the diffusion model is self._dm[0], a plain reference kept out of
    the module tree (for its unpatchify and sizes)."""

    owned: tuple[str, ...] = ("final_layer",)

    def __init__(self, base):
        super().__init__()
        dm = base.diffusion_model
        for name in self.owned:
            setattr(self, name, getattr(dm, name))
        self.model_sampling = base.model_sampling
        self._dm = (dm,)


def two_stream_layers(base, embed, double, single, head, doubles, singles) -> list[nn.Module]:
    """The stage layers of a model whose two-stream (double) blocks run before its one-stream (single)
    blocks: the embedding, each double block (the last joins the streams into one sequence; without
    double blocks the embedding does), each single block, the head. The block layer classes take
    BlockLayer's arguments."""
    dm = base.diffusion_model
    doubles, singles = list(doubles), list(singles)
    return [embed(base, join=not doubles),
            *[double(b, i, len(doubles), join=i == len(doubles) - 1, dm=dm) for i, b in enumerate(doubles)],
            *[single(b, i, len(singles), dm=dm) for i, b in enumerate(singles)],
            head(base)]


def block_list_layers(base, embed, block, head, blocks) -> list[nn.Module]:
    """The stage layers of a model with one list of blocks: the embedding, each block (BlockLayer's
    arguments, with the diffusion model), the head."""
    blocks = list(blocks)
    return [embed(base), *[block(b, i, len(blocks), dm=base.diffusion_model) for i, b in enumerate(blocks)],
            head(base)]


def host_class(module: str, name: str):
    """The host ComfyUI's class `name` in `module`, or None where the host has no such family (a ComfyUI
    older than it): an adapter of a newer family then matches no model."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def refuse_unhandled(kwargs, handled, family: str, supports: str, names: dict | None = None) -> None:
    """A ConfigError naming every kwarg of model.extra_conds outside `handled` (as `names` describes
    it, else by its key): what the adapter does not reproduce, which pipeline_stages 1 trains."""
    extra = sorted(set(kwargs) - set(handled))
    if extra:
        named = sorted({(names or {}).get(k, k) for k in extra})
        raise ConfigError(f"pipeline_stages > 1 for {family} supports {supports}; this run also needs "
                          f"{', '.join(named)}. Set pipeline_stages to 1 for this model.")


def require_text(kwargs, family: str) -> None:
    """A ConfigError when the cached conditioning has no text (cross_attn), which the adapter needs."""
    if kwargs.get("c_crossattn") is None:
        raise ConfigError(f"pipeline_stages > 1 for {family} needs text conditioning (cross_attn) in the cached "
                          "dataset. Re-cache it with a text encoder, or set pipeline_stages to 1.")


def require_integer_mask(mask, family: str) -> None:
    """A ConfigError for a float text attention mask: the adapter sends the integer one the text encoder
    makes (no gradient crosses for it) and converts it as the model's forward does."""
    if mask is not None and torch.is_floating_point(mask):
        raise ConfigError(f"pipeline_stages > 1 for {family} needs the text encoder's integer attention mask; "
                          "this dataset holds a float one. Re-cache it, or set pipeline_stages to 1.")


def require_final_layer(dm, family: str, part: str = "final_layer") -> None:
    """A ConfigError for a diffusion model loaded without its last layer (`part`)."""
    if not hasattr(dm, part):
        raise ConfigError(f"this {family} model has no final layer: pipeline_stages > 1 needs the full model.")


def apply_model_start(base, sigma, xt, context, concat=None):
    """BaseModel._apply_model of ComfyUI 0.3.75 up to process_timestep: (xc, t, context, dtype), where
    xc is the scaled input (with the concat channels, if any) in the model's dtype, t the timestep
    before the model's process_timestep (callers pass it their extra conds) and context the text on
    xc's device."""
    import comfy.model_management

    ms = base.model_sampling
    xc = ms.calculate_input(sigma, xt)
    if concat is not None:
        xc = torch.cat([xc, comfy.model_management.cast_to_device(concat, xc.device, xc.dtype)], dim=1)
    dtype = base.manual_cast_dtype or base.get_dtype()
    xc = xc.to(dtype)
    t = ms.timestep(sigma).float()
    return xc, t, comfy.model_management.cast_to_device(context, xc.device, dtype), dtype


def stage_input(value, xt) -> torch.Tensor:
    """A stage's inputs are a fixed tuple of tensors (no None): an empty [B, 0] tensor stands for an
    absent one; or_none turns it back."""
    return xt.new_zeros((xt.shape[0], 0)) if value is None else value


def integer_input(value, xt) -> torch.Tensor:
    """stage_input for an integer input (a text mask, segment ids): an empty integer [B, 0] stand-in. DeepSpeed
    expects a gradient for every float tensor a stage receives and none for integers, which a later stage may
    leave unused."""
    return torch.zeros((xt.shape[0], 0), dtype=torch.long, device=xt.device) if value is None else value


def or_none(t: torch.Tensor):
    """stage_input's stand-in (any empty tensor) back as None, as ComfyUI's forward takes an absent input."""
    return None if t.numel() == 0 else t


def number_tensor(value, name: str, device, optional: bool = True) -> torch.Tensor:
    """A Python number (a CONDConstant such as a frame rate) as a stage input: [value] in float64, which
    holds any Python float exactly; None (where the input is optional) as an empty tensor."""
    if value is None and optional:
        return torch.zeros(0, dtype=torch.float64, device=device)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"the {name} conditioning must be a number, not {type(value).__name__}: set "
                          "pipeline_stages to 1, or cache the dataset with a plain number for it.")
    return torch.tensor([float(value)], dtype=torch.float64, device=device)


def number(t: torch.Tensor):
    """number_tensor's value back as the Python number ComfyUI passes (or None)."""
    return None if t.numel() == 0 else t.reshape(-1)[0].item()


def block_options(sigma, block_type: str, index: int, total: int) -> dict:
    """What a block sees in ComfyUI: the caller's transformer_options (the engine's: sigmas) plus the keys
    the forward writes before each block. A fresh dict per call: models write into it."""
    return {**transformer_options(sigma), "block_type": block_type, "block_index": index, "total_blocks": total}


def with_img_slice(options: dict, x: torch.Tensor, image_tokens: int) -> dict:
    """options plus the `img_slice` ComfyUI 0.33+ hands a Flux-style single block: where the tokens
    after the text start and end in the joint sequence x (hosts that do not set it never read it)."""
    return {**options, "img_slice": [x.shape[1] - image_tokens, x.shape[1]]}


def patch_grid(h: int, w: int, patch: int) -> tuple[int, int]:
    """The rows and columns of patch x patch cells of an h x w latent in the Flux-code models, the last
    ones padded (process_img: rounded to the nearest whole patch count)."""
    return (h + patch // 2) // patch, (w + patch // 2) // patch


def patch_tokens(h: int, w: int, patch: int) -> int:
    """Tokens of an h x w latent cut into patch x patch cells, the last ones padded (process_img)."""
    rows, columns = patch_grid(h, w, patch)
    return rows * columns


def patches(size: int, patch: int) -> int:
    """Patches along a side of `size` after ComfyUI's pad_to_patch_size (which pads up to whole ones)."""
    return -(-size // patch)


def additive_mask(mask: torch.Tensor, dtype) -> torch.Tensor:
    """An integer text mask (1 keep, 0 drop) as the additive one attention takes: 0 or -max of dtype."""
    return (mask - 1).to(dtype) * torch.finfo(dtype).max


def keep_in_graph(out: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
    """out + 0.0 * (the sum of every tensor in `unused`): DeepSpeed sends a gradient back for every float
    tensor a stage receives, so the inputs a head does not use stay in the graph (exactly zero
    contribution) and a head-only stage works."""
    total = unused[0].sum().float()
    for t in unused[1:]:
        total = total + t.sum().float()
    return out + 0.0 * total
