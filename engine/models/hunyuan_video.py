"""HunyuanVideo 1.0, HunyuanImage 2.1 and HunyuanVideo 1.5 (all run comfy.ldm.hunyuan_video.model.
HunyuanVideo in ComfyUI 0.3.75) as pipeline stage layers.

Mirrors BaseModel._apply_model + HunyuanVideo._forward/forward_orig of ComfyUI 0.3.75 for the base
models model_base.HunyuanVideo (+ I2V, Skyreels I2V), HunyuanImage21 (+ Refiner) and HunyuanVideo15
(+ SR distilled). Conditioning reproduced: the text context (token refiner), pooled CLIP vector (y),
embedded guidance, concat channels (c_concat: the I2V / 1.5 image-to-video / refiner inputs), ByT5
glyph tokens (txt_byt5), CLIP-vision tokens (clip_fea), HunyuanVideo's guiding frame
(guiding_frame_index: per-token-range modulation) and reference latent (ref_latent). The distilled
"meanflow" next-step embedding (time_r_in) needs the sampler's schedule; training has none
(engine.train.objective.transformer_options), so ComfyUI skips it, and so does this (disable_time_r is
then moot). Refused: attention masks (padded text) and ControlNet.

The joint sequence's order follows the host: ComfyUI 0.3.x puts the image tokens first (its double
blocks carry `flipped_img_txt`), 0.33 and later the text tokens first (no such flag); `_image_first`
decides from the host's blocks, and the rope table, the joint sequence and the head's slice follow.

Tensors passed between stages:
  double-block stages: img (reference tokens, then target tokens), txt, vec, pe, xt, sigma, refs
  single-block stages: x (= cat(img, txt) or cat(txt, img)), vec, pe, xt, sigma, refs
`vec` is [B, D], or [B, 2, D] with a guiding frame, whose per-token-range modulation dims each layer
derives from xt's shape. `refs` is a [B, 1 + reference tokens] float tensor whose width tells the
head where the target tokens start (its values are unused), so no integer crosses a stage.
"""
from __future__ import annotations

import torch
from torch import nn

from ..train.objective import transformer_options
from . import references
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    keep_in_graph,
    or_none,
    refuse_unhandled,
    require_final_layer,
    stage_input,
    two_stream_layers,
)

# The kwargs of model.extra_conds this adapter reproduces; anything else means a variant it does not.
_HANDLED = {"c_crossattn", "y", "guidance", "c_concat", "txt_byt5", "clip_fea", "guiding_frame_index",
            "ref_latent", "disable_time_r"}
_INPUTS = ("y", "guidance", "c_concat", "txt_byt5", "clip_fea", "guiding_frame_index", "ref_latent")


def _image_first(dm) -> bool:
    """Whether forward_orig puts the image tokens before the text tokens: 0.3.x's double blocks say so
    with `flipped_img_txt`; a host whose double block takes no such option always puts text first.
    A model without double blocks is judged by the host's block class."""
    if len(dm.double_blocks):
        return bool(getattr(dm.double_blocks[0], "flipped_img_txt", False))
    import inspect

    from comfy.ldm.flux.layers import DoubleStreamBlock

    return "flipped_img_txt" in inspect.signature(DoubleStreamBlock.__init__).parameters


def _joint(img, txt, image_first: bool):
    return torch.cat((img, txt) if image_first else (txt, img), 1)


def _modulation_dims(dm, vec, xt):
    """forward_orig's (modulation_dims, modulation_dims_txt): set only with a guiding frame, when the
    first frame's tokens get their own modulation row."""
    if vec.ndim != 3:
        return None, None
    frame_tokens = (xt.shape[-1] // dm.patch_size[-1]) * (xt.shape[-2] // dm.patch_size[-2])
    return [(0, frame_tokens, 0), (frame_tokens, None, 1)], [(0, None, 1)]


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        names = ("img_in", "time_in", "vector_in", "guidance_in", "txt_in", "byt5_in", "time_r_in", "vision_in",
                 "cond_type_embedding")
        # join: only when the model has no double blocks
        super().__init__(base, [getattr(dm, n) for n in names if getattr(dm, n, None) is not None], join)
        self.image_first = _image_first(dm)

    def forward(self, inputs):
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor

        xt, sigma, context, *extra = inputs
        base, dm = self._refs
        # An empty tensor stands for "absent" (first_stage_inputs keeps the tuple fixed).
        y, guidance, concat, byt5, clip_fea, frame_index, ref = (or_none(t) for t in extra)

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context, concat)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        y, guidance, byt5, clip_fea, frame_index, ref = (None if v is None else convert_tensor(v, dtype, device)
                                                         for v in (y, guidance, byt5, clip_fea, frame_index, ref))
        opts = transformer_options(sigma)

        # HunyuanVideo._forward
        bs = xc.shape[0]
        if len(dm.patch_size) == 3:
            img_ids = dm.img_ids(xc)
            txt_ids = torch.zeros((bs, context.shape[1], 3), device=device, dtype=xc.dtype)
        else:
            img_ids = dm.img_ids_2d(xc)
            txt_ids = torch.zeros((bs, context.shape[1], 2), device=device, dtype=xc.dtype)

        # HunyuanVideo.forward_orig, up to the blocks (time_r_in: see the module docstring)
        initial_shape = list(xc.shape)
        img = dm.img_in(xc)
        vec = dm.time_in(timestep_embedding(t, 256, time_factor=1.0).to(img.dtype))
        ref_tokens = 0
        if ref is not None:
            ref_ids = dm.img_ids(ref)
            ref = dm.img_in(ref)
            ref_tokens = ref.shape[1]
            img = torch.cat([ref, img], dim=-2)
            ref_ids[..., 0] = -1
            ref_ids[..., 2] += (initial_shape[-1] // dm.patch_size[-1])
            img_ids = torch.cat([ref_ids, img_ids], dim=-2)
        if frame_index is not None:
            token_replace_vec = dm.time_in(timestep_embedding(frame_index, 256, time_factor=1.0))
            if dm.vector_in is not None:
                vec_ = dm.vector_in(y[:, :dm.params.vec_in_dim])
                vec = torch.cat([(vec_ + token_replace_vec).unsqueeze(1), (vec_ + vec).unsqueeze(1)], dim=1)
            else:
                vec = torch.cat([token_replace_vec.unsqueeze(1), vec.unsqueeze(1)], dim=1)
        elif dm.vector_in is not None:
            vec = vec + dm.vector_in(y[:, :dm.params.vec_in_dim])
        if dm.params.guidance_embed and guidance is not None:
            vec = vec + dm.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))

        txt = dm.txt_in(context, t, None, transformer_options=opts)
        if dm.cond_type_embedding is not None:
            cond_emb = dm.cond_type_embedding(torch.zeros_like(txt[:, :, 0], device=txt.device, dtype=torch.long))
            txt = txt + cond_emb.to(txt.dtype)
        if dm.byt5_in is not None and byt5 is not None:
            byt5 = dm.byt5_in(byt5)
            if dm.cond_type_embedding is not None:
                cond_emb = dm.cond_type_embedding(torch.ones_like(byt5[:, :, 0], device=byt5.device, dtype=torch.long))
                txt = torch.cat((byt5 + cond_emb.to(byt5.dtype), txt), dim=1)  # byt5 first for HunyuanVideo 1.5
            else:
                txt = torch.cat((txt, byt5), dim=1)
            txt_ids = torch.cat((txt_ids, txt_ids.new_zeros((bs, byt5.shape[1], txt_ids.shape[-1]))), dim=1)
        if clip_fea is not None:
            vision = dm.vision_in(clip_fea)
            if dm.cond_type_embedding is not None:
                vision = vision + dm.cond_type_embedding(
                    2 * torch.ones_like(vision[:, :, 0], dtype=torch.long, device=vision.device))
            txt = torch.cat((vision.to(txt.dtype), txt), dim=1)
            txt_ids = torch.cat((txt_ids, txt_ids.new_zeros((bs, vision.shape[1], txt_ids.shape[-1]))), dim=1)
        ids = (img_ids, txt_ids) if self.image_first else (txt_ids, img_ids)
        pe = dm.pe_embedder(torch.cat(ids, dim=1))
        marker = references.marker(xt, ref_tokens)
        if self.join:
            return _joint(img, txt, self.image_first), vec, pe, xt, sigma, marker
        return img, txt, vec, pe, xt, sigma, marker


class _Double(BlockLayer):  # self._dm[0]: the diffusion model, for its patch size
    def __init__(self, block, index: int, total: int, join: bool, dm):
        super().__init__(block, index, total, join, dm)
        self.image_first = _image_first(dm)

    def forward(self, inputs):
        img, txt, vec, pe, xt, sigma, refs = inputs
        dims, dims_txt = _modulation_dims(self._dm[0], vec, xt)
        img, txt = self.block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=None, modulation_dims_img=dims,
                              modulation_dims_txt=dims_txt,
                              transformer_options=self.options(sigma, "double"))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return _joint(img, txt, self.image_first), vec, pe, xt, sigma, refs
        return img, txt, vec, pe, xt, sigma, refs


class _Single(BlockLayer):
    def forward(self, inputs):
        x, vec, pe, xt, sigma, refs = inputs
        dims, _ = _modulation_dims(self._dm[0], vec, xt)
        x = self.block(x, vec=vec, pe=pe, attn_mask=None, modulation_dims=dims,
                       transformer_options=self.options(sigma, "single"))
        return x, vec, pe, xt, sigma, refs


class _Head(HeadLayer):
    def __init__(self, base):
        super().__init__(base)
        self.image_first = _image_first(base.diffusion_model)

    def forward(self, inputs):
        x, vec, pe, xt, sigma, refs = inputs
        dm = self._dm[0]
        p = dm.patch_size
        shape = [s // q for s, q in zip(xt.shape[-len(p):], p)]
        tokens = shape[0] * shape[1] * (shape[2] if len(shape) == 3 else 1)
        # forward_orig keeps the target tokens: [references, target, text] image first (0.3.x), else
        # [text, references, target]
        start = refs.shape[1] - 1 if self.image_first else x.shape[1] - tokens
        img = x[:, start:start + tokens]
        dims, _ = _modulation_dims(dm, vec, xt)
        out = self.final_layer(img, vec, modulation_dims=dims)
        out = out.reshape([out.shape[0]] + shape + [dm.out_channels] + p)
        if out.ndim == 8:
            out = out.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(xt.shape[0], dm.out_channels, *xt.shape[2:5])
        else:
            out = out.permute(0, 3, 1, 4, 2, 5).reshape(xt.shape[0], dm.out_channels, *xt.shape[2:4])
        # pe and refs: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), pe, refs)


def _base_classes():
    import comfy.model_base as mb

    return (mb.HunyuanVideo, mb.HunyuanVideoI2V, mb.HunyuanVideoSkyreelsI2V, mb.HunyuanImage21,
            mb.HunyuanImage21Refiner, mb.HunyuanVideo15, mb.HunyuanVideo15_SR_Distilled)


class HunyuanVideoAdapter:
    name = "hunyuan_video"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.hunyuan_video.model

        return (type(base_model) in _base_classes()
                and type(base_model.diffusion_model) is comfy.ldm.hunyuan_video.model.HunyuanVideo)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "HunyuanVideo / HunyuanImage 2.1 / HunyuanVideo 1.5",
                         "text, image and reference-latent conditioning",
                         {"attention_mask": "an attention mask (padded text: cache captions unpadded)",
                          "control": "a ControlNet"})
        xt = prepared.xt
        return (xt, prepared.sigma, kw["c_crossattn"], *(stage_input(kw.get(k), xt) for k in _INPUTS))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        require_final_layer(dm, "HunyuanVideo")
        return two_stream_layers(base_model, _Embed, _Double, _Single, _Head, dm.double_blocks, dm.single_blocks)
