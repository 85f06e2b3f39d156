"""Flux.1 text-to-image (comfy.ldm.flux.model.Flux: dev, schnell and other plain Flux.1 files) as
pipeline stage layers.

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75 for the t2i path, and
what 0.33 added where the host's model has it: a text norm before txt_in (`txt_norm`), text
position ids on the axes `params.txt_ids_dims` names (0.3.75: the 4th axis of 4-axis models), the
single blocks' `img_slice` option. Its reference method "index_timestep_zero" (a second, zero
timestep for the reference tokens) is refused. Covered:
conditioning = T5 context, pooled CLIP vector (y) and, for guidance-distilled files, the guidance
value, and Kontext reference latents (ref_latents, any ref_latents_method). Refused until they are
added here: Fill/inpaint concat channels, attention masks, ControlNet, and the other families built
on the Flux blocks (Chroma, Flux.2, HunyuanVideo), which have their own base-model classes and do
not match. Each block gets what forward_orig hands it: the caller's transformer_options (the
engine's: sigmas) plus the block keys (common.block_options).

Tensors passed between stages:
  double-block stages: img (target tokens, then reference tokens), txt, vec, pe, xt, sigma, refs
  single-block stages: x (= cat(txt, img)), vec, pe, xt, sigma, refs
The head needs xt and sigma for ComfyUI's calculate_denoised. `refs` is a [B, 1 + reference tokens]
float tensor whose width tells the head how many reference tokens follow the target's (its values
are unused), so the head finds the target tokens without an integer crossing a stage.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    block_options,
    keep_in_graph,
    or_none,
    patch_tokens,
    refuse_unhandled,
    stage_input,
    with_img_slice,
)

# The kwargs of model.extra_conds this adapter reproduces; anything else means a variant it does not.
_HANDLED = {"c_crossattn", "y", "guidance", "ref_latents", "ref_latents_method"}
_REF_METHODS = ("offset", "index", "uxo")  # as codes for the first stage; ComfyUI treats unknown names as offset
_REFUSED_METHODS = ("index_timestep_zero",)  # ComfyUI 0.33+: per-token-range modulation of the references


def _txt_ids_dims(dm) -> list[int]:
    """The rope axes that carry the text token position: the host's own setting (0.33 and later), or
    0.3.75's rule (the 4th axis of Flux 2's four)."""
    dims = getattr(dm.params, "txt_ids_dims", None)
    if dims is not None:
        return list(dims)
    return [3] if len(dm.params.axes_dim) == 4 else []


def _join(img, txt):
    """The step between the double and the single blocks in forward_orig."""
    if img.dtype == torch.float16:
        img = torch.nan_to_num(img, nan=0.0, posinf=65504, neginf=-65504)
    return torch.cat((txt, img), 1)


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool, modulation=()):
        dm = base.diffusion_model
        embedders = [dm.img_in, dm.time_in, dm.txt_in, *modulation]  # modulation: Flux.2's shared layers
        if getattr(dm, "txt_norm", None) is not None:
            embedders.append(dm.txt_norm)
        if dm.params.guidance_embed:
            embedders.append(dm.guidance_in)
        if dm.vector_in is not None:
            embedders.append(dm.vector_in)
        super().__init__(base, embedders, join)  # join: only when the model has no double blocks

    def forward(self, inputs):
        img, txt, vec, pe, xt, sigma, marker = self.embed(inputs)
        if self.join:
            return _join(img, txt), vec, pe, xt, sigma, marker
        return img, txt, vec, pe, xt, sigma, marker

    def embed(self, inputs):
        """Flux._forward and forward_orig up to the blocks (Flux.1 and Flux.2): img, txt, vec, pe, xt,
        sigma and the reference marker."""
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor

        xt, sigma, context, y, guidance, method, *refs = inputs
        base, dm = self._refs
        # An empty y / guidance stands for "absent" (first_stage_inputs keeps the tuple fixed).
        y, guidance = or_none(y), or_none(guidance)

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        y = None if y is None else convert_tensor(y, dtype, device)
        guidance = None if guidance is None else convert_tensor(guidance, dtype, device)

        # Flux._forward
        opts = transformer_options(sigma)  # the engine's: no rope_options
        img, img_ids = dm.process_img(xc, transformer_options=opts)
        img, img_ids, ref_tokens = _add_references(dm, img, img_ids, xc, [convert_tensor(r, dtype, device) for r in refs],
                                                   _ref_method(dm, int(method.reshape(-1)[0])), opts)
        txt_ids = torch.zeros((xc.shape[0], context.shape[1], len(dm.params.axes_dim)), device=device,
                              dtype=torch.float32)
        for axis in _txt_ids_dims(dm):  # the text position on these rope axes
            txt_ids[:, :, axis] = torch.linspace(0, context.shape[1] - 1, steps=context.shape[1], device=device,
                                                 dtype=torch.float32)

        # Flux.forward_orig, up to the blocks
        img = dm.img_in(img)
        vec = dm.time_in(timestep_embedding(t, 256).to(img.dtype))
        if dm.params.guidance_embed and guidance is not None:
            vec = vec + dm.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        if dm.vector_in is not None:
            if y is None:
                y = torch.zeros((img.shape[0], dm.params.vec_in_dim), device=img.device, dtype=img.dtype)
            vec = vec + dm.vector_in(y[:, :dm.params.vec_in_dim])
        if getattr(dm, "txt_norm", None) is not None:
            context = dm.txt_norm(context)
        txt = dm.txt_in(context)
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        marker = torch.zeros((xt.shape[0], 1 + ref_tokens), device=device, dtype=torch.float32)
        return img, txt, vec, pe, xt, sigma, marker


def _ref_method(dm, code: int) -> str:
    return getattr(dm.params, "default_ref_method", "offset") if code < 0 else _REF_METHODS[code]


def _add_references(dm, img, img_ids, xc, refs, method, opts):
    """Flux._forward's reference-latent loop: the reference tokens appended after the target's."""
    p = dm.patch_size
    h_len, w_len = (xc.shape[-2] + p // 2) // p, (xc.shape[-1] + p // 2) // p
    h = w = index = 0
    before = img.shape[1]
    for ref in refs:
        if method == "index":
            index += dm.params.ref_index_scale
            h_offset = w_offset = 0
        elif method == "uxo":
            index = 0
            h_offset, w_offset = h_len * p + h, w_len * p + w
            h += ref.shape[-2]
            w += ref.shape[-1]
        else:
            index, h_offset, w_offset = 1, 0, 0
            if ref.shape[-2] + h > ref.shape[-1] + w:
                w_offset = w
            else:
                h_offset = h
            h = max(h, ref.shape[-2] + h_offset)
            w = max(w, ref.shape[-1] + w_offset)
        # 0.33+ hands the references the caller's options too (0.3.75 none); the engine's hold no rope_options
        kontext, kontext_ids = dm.process_img(ref, index=index, h_offset=h_offset, w_offset=w_offset,
                                              transformer_options=opts)
        img = torch.cat([img, kontext], dim=1)
        img_ids = torch.cat([img_ids, kontext_ids], dim=1)
    return img, img_ids, img.shape[1] - before


def single_options(sigma, index: int, total: int, x, xt, refs, patch: int) -> dict:
    """A single block's options: block_options plus forward_orig's `img_slice` (the target and
    reference tokens after the text)."""
    image = patch_tokens(*xt.shape[-2:], patch) + refs.shape[1] - 1
    return with_img_slice(block_options(sigma, "single", index, total), x, image)


class _Double(nn.Module):
    def __init__(self, block, index: int, total: int, join: bool):
        super().__init__()
        self.block = block
        self.index, self.total, self.join = index, total, join

    def forward(self, inputs):
        img, txt, vec, pe, xt, sigma, refs = inputs
        img, txt = self.block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=None,
                              transformer_options=block_options(sigma, "double", self.index, self.total))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return _join(img, txt), vec, pe, xt, sigma, refs
        return img, txt, vec, pe, xt, sigma, refs


class _Single(nn.Module):
    def __init__(self, block, index: int, total: int, patch: int):
        super().__init__()
        self.block = block
        self.index, self.total, self.patch = index, total, patch

    def forward(self, inputs):
        x, vec, pe, xt, sigma, refs = inputs
        x = self.block(x, vec=vec, pe=pe, attn_mask=None,
                       transformer_options=single_options(sigma, self.index, self.total, x, xt, refs, self.patch))
        return x, vec, pe, xt, sigma, refs


class _Head(HeadLayer):
    def forward(self, inputs):
        from einops import rearrange

        x, vec, pe, xt, sigma, refs = inputs
        dm = self._dm[0]
        p = dm.patch_size
        h_orig, w_orig = xt.shape[-2:]
        h_len, w_len = (h_orig + p // 2) // p, (w_orig + p // 2) // p
        img_tokens = h_len * w_len
        end = x.shape[1] - (refs.shape[1] - 1)  # text tokens, target tokens, reference tokens
        img = x[:, end - img_tokens:end]  # forward_orig drops the text tokens, _forward the references
        out = self.final_layer(img, vec)  # vec is vec_orig: plain Flux has no global modulation
        out = rearrange(out, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=h_len, w=w_len, ph=p, pw=p)
        out = out[:, :, :h_orig, :w_orig]
        # pe and refs: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), pe, refs)


def stage_layers(base_model, embed, double, single, head) -> list[nn.Module]:
    """forward_orig's order (Flux.1 and Flux.2, each with its own layer classes): the embedding, the
    double blocks (the last joins the streams), the single blocks, the head."""
    dm = base_model.diffusion_model
    doubles, singles = len(dm.double_blocks), len(dm.single_blocks)
    return [embed(base_model, join=doubles == 0),
            *[double(b, i, doubles, join=i == doubles - 1) for i, b in enumerate(dm.double_blocks)],
            *[single(b, i, singles, dm.patch_size) for i, b in enumerate(dm.single_blocks)],
            head(base_model)]


def stage_inputs(prepared, family: str) -> tuple[torch.Tensor, ...]:
    """The first stage's inputs of a Flux-code model (Flux.1 and Flux.2 take the same conditioning):
    xt, sigma, context, y, guidance, reference method code, reference latents."""
    kw = prepared.kwargs
    refuse_unhandled(kw, _HANDLED, family, "text-to-image and reference latents only",
                     {"c_concat": "concat channels (Flux Fill / inpaint)", "attention_mask": "an attention mask"})
    xt = prepared.xt
    method = kw.get("ref_latents_method")  # absent: the model's default; unknown names act as offset
    if method in _REFUSED_METHODS:
        from ..patches.host import comfy_version

        raise ConfigError(f"pipeline_stages > 1 for {family} does not reproduce the reference method {method!r} "
                          f"of ComfyUI {comfy_version()} (a zero timestep for the reference tokens). Set "
                          "pipeline_stages to 1 for this model, or use another ref_latents_method.")
    code = torch.tensor([-1 if method is None else _REF_METHODS.index(method) if method in _REF_METHODS else 0],
                        device=xt.device)
    # An absent pooled vector or guidance (FluxDisableGuidance) travels as common.stage_input's stand-in.
    return (xt, prepared.sigma, kw["c_crossattn"], stage_input(kw.get("y"), xt), stage_input(kw.get("guidance"), xt),
            code, *(kw.get("ref_latents") or ()))


class FluxAdapter:
    name = "flux"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.flux.model
        import comfy.model_base

        # Exact classes: Chroma and Flux.2 subclass model_base.Flux but feed the blocks differently.
        if type(base_model) is not comfy.model_base.Flux:
            return False
        dm = base_model.diffusion_model
        return type(dm) is comfy.ldm.flux.model.Flux and not dm.params.global_modulation

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        return stage_inputs(prepared, "Flux")

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if dm.img_in.weight.shape[1] != dm.params.in_channels * dm.patch_size ** 2 or \
                dm.params.in_channels > dm.params.out_channels:
            raise ConfigError("pipeline_stages > 1 is not available for Flux Fill / inpaint / control-LoRA models "
                              "(extra input channels). Set pipeline_stages to 1 for this model.")
        return stage_layers(base_model, _Embed, _Double, _Single, _Head)
