"""HiDream-I1 (comfy.ldm.hidream.model.HiDreamImageTransformer2DModel) as pipeline stage layers.

Mirrors BaseModel._apply_model + HiDreamImageTransformer2DModel._forward of ComfyUI 0.3.75 for
text-to-image: conditioning = T5 context, the Llama hidden states (`conditioning_llama3`
-> encoder_hidden_states_llama3, all layers) and the pooled CLIP vector (y, required: HiDream's
time embedding adds it unconditionally). Refused: the E1 edit input (image_cond, concatenated
along the width), anything else extra_conds may add (concat channels, ...), ControlNet.

Every block reads its own projected Llama layer (llama_layers[i] through caption_projection[i]),
and the text in front of the double blocks already holds the last block's one. The embedding
projects them all once (as _forward does) and they travel stacked as `llama` [B, blocks, L, D];
block i reads row i. The MoE feed-forwards route tokens by data; nothing about routing crosses.

Tensors passed between stages:
  double-block stages: img (image tokens), text (T5 + last Llama layer, trimmed after each block),
                       llama, adaln (time + pooled embedding), rope, xt, sigma
  single-block stages: x (= cat(img, text)), llama, adaln, rope, xt, sigma
  into the head:       x, adaln, xt, sigma
The image tokens come first; their count follows from xt's shape, so no integer crosses a stage.
Outputs that are slices are made contiguous (DeepSpeed sends them as they are).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    patches,
    refuse_unhandled,
    two_stream_layers,
)

_HANDLED = {"c_crossattn", "y", "encoder_hidden_states_llama3"}


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        # the embedders and the text projections; join: only when the model has no double blocks
        super().__init__(base, [dm.t_embedder, dm.p_embedder, dm.x_embedder, dm.caption_projection], join)

    def forward(self, inputs):
        import comfy.ldm.common_dit
        from comfy.model_base import convert_tensor
        from einops import repeat

        xt, sigma, context, y, llama3 = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)
        y, llama3 = convert_tensor(y, dtype, xc.device), convert_tensor(llama3, dtype, xc.device)

        # _forward, up to the blocks
        hidden = comfy.ldm.common_dit.pad_to_patch_size(xc, (dm.patch_size, dm.patch_size))
        batch = hidden.shape[0]
        timesteps = dm.t_embedder(dm.expand_timesteps(t, batch, hidden.device), hidden.dtype)
        adaln = timesteps + dm.p_embedder(y)
        hidden, _, img_sizes = dm.patchify(hidden, dm.max_seq, None)
        ph, pw = img_sizes[0]
        img_ids = torch.zeros(ph, pw, 3, device=hidden.device)
        img_ids[..., 1] = img_ids[..., 1] + torch.arange(ph, device=hidden.device)[:, None]
        img_ids[..., 2] = img_ids[..., 2] + torch.arange(pw, device=hidden.device)[None, :]
        img_ids = repeat(img_ids, "h w c -> b (h w) c", b=batch)
        hidden = dm.x_embedder(hidden)
        per_layer = llama3.movedim(1, 0)
        llama = [dm.caption_projection[i](per_layer[k]).view(batch, -1, hidden.shape[-1])
                 for i, k in enumerate(dm.llama_layers)]
        t5 = dm.caption_projection[-1](context).view(batch, -1, hidden.shape[-1])
        txt_ids = torch.zeros(batch, t5.shape[1] + llama[-1].shape[1] + llama[0].shape[1], 3,
                              device=img_ids.device, dtype=img_ids.dtype)
        rope = dm.pe_embedder(torch.cat((img_ids, txt_ids), dim=1))
        text = torch.cat([t5, llama[-1]], dim=1)
        llama = torch.stack(llama, dim=1)
        if self.join:
            return torch.cat([hidden, text], dim=1), llama, adaln, rope, xt, sigma
        return hidden, text, llama, adaln, rope, xt, sigma


class _Double(BlockLayer):
    def __init__(self, block, index: int, total: int, join: bool, dm):
        super().__init__(block, index, total, join)
        self.last = join and not len(dm.single_stream_blocks)  # the head comes next

    def forward(self, inputs):
        img, text, llama, adaln, rope, xt, sigma = inputs
        length = text.shape[1]  # _forward's initial_encoder_hidden_states_seq_len
        img, text = self.block(image_tokens=img, image_tokens_masks=None,
                               text_tokens=torch.cat([text, llama[:, self.index]], dim=1), adaln_input=adaln,
                               rope=rope, transformer_options=transformer_options(sigma))
        text = text[:, :length]
        if self.last:  # no single blocks follow: the head reads neither the Llama states nor rope
            return torch.cat([img, text], dim=1), adaln, xt, sigma
        if self.join:  # the single blocks run on one sequence, image tokens first
            return torch.cat([img, text], dim=1), llama, adaln, rope, xt, sigma
        return img, text.contiguous(), llama, adaln, rope, xt, sigma


class _Single(BlockLayer):
    def __init__(self, block, index: int, total: int, dm):
        super().__init__(block, index, total)
        self.row = len(dm.double_stream_blocks) + index  # its Llama layer: the blocks count on from the double ones
        self.last = index == total - 1

    def forward(self, inputs):
        x, llama, adaln, rope, xt, sigma = inputs
        length = x.shape[1]  # _forward's hidden_states_seq_len
        x = self.block(image_tokens=torch.cat([x, llama[:, self.row]], dim=1), image_tokens_masks=None,
                       text_tokens=None, adaln_input=adaln, rope=rope,
                       transformer_options=transformer_options(sigma))
        x = x[:, :length].contiguous()
        if self.last:
            return x, adaln, xt, sigma
        return x, llama, adaln, rope, xt, sigma


class _Head(HeadLayer):
    def forward(self, inputs):
        x, adaln, xt, sigma = inputs
        dm = self._dm[0]
        ph, pw = patches(xt.shape[-2], dm.patch_size), patches(xt.shape[-1], dm.patch_size)
        out = self.final_layer(x[:, :ph * pw], adaln)  # _forward drops the text tokens behind the image's
        out = -dm.unpatchify(out, [[ph, pw]] * out.shape[0])[:, :, :xt.shape[-2], :xt.shape[-1]]
        return self.model_sampling.calculate_denoised(sigma, out.float(), xt)


class HiDreamAdapter:
    name = "hidream"
    partition = "uniform"  # blocks of about equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.hidream.model
        import comfy.model_base

        return (type(base_model) is comfy.model_base.HiDream
                and type(base_model.diffusion_model) is comfy.ldm.hidream.model.HiDreamImageTransformer2DModel)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "HiDream", "text-to-image only",
                         {"image_cond": "an edit image (HiDream E1, concat_latent_image)", "c_concat": "concat channels"})
        missing = [name for key, name in (("c_crossattn", "cross_attn (T5)"), ("y", "pooled_output"),
                                          ("encoder_hidden_states_llama3", "conditioning_llama3"))
                   if kw.get(key) is None]
        if missing:
            raise ConfigError(f"HiDream needs {', '.join(missing)} in the cached conditioning, and this dataset has "
                              "none. Re-cache it with HiDream's text encoders (QuadrupleCLIPLoader).")
        return prepared.xt, prepared.sigma, kw["c_crossattn"], kw["y"], kw["encoder_hidden_states_llama3"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        doubles, singles = len(dm.double_stream_blocks), len(dm.single_stream_blocks)
        if doubles + singles == 0 or len(dm.llama_layers) != doubles + singles:
            raise ConfigError(f"this HiDream model has {doubles + singles} blocks but {len(dm.llama_layers)} Llama "
                              "layer indices; ComfyUI cannot run it either. Use a standard HiDream file.")
        return two_stream_layers(base_model, _Embed, _Double, _Single, _Head, dm.double_stream_blocks,
                                 dm.single_stream_blocks)
