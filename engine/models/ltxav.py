"""LTX 2.3 / LTX 2.0 audio-video (comfy.ldm.lightricks.av_model.LTXAVModel, the LTXAV class; ComfyUI 0.33+)
as pipeline stage layers.

Mirrors BaseModel._apply_model, LTXAV.process_timestep and LTXAVModel.forward of ComfyUI 0.33.0 for what the
engine trains: the packed latent (video + audio streams, `latent_shapes`) unpacked, the text as extra_conds
leaves it (its connectors already run there, frozen), the frame rate; both streams take the same timestep. The
layers call the model's own steps in _forward's order (`_process_input`, `_prepare_timestep`,
`_prepare_context`, `_prepare_positional_embeddings`, each block, `_process_output`), so what those steps do
on the host is what the stages do. Refused (pipeline_stages 1 trains them, where ComfyUI can): denoise masks,
keyframe guides and their attention entries, reference audio, a text attention mask (LTX 2.x's text encoder
gives none), and a latent without audio frames (ComfyUI's own forward then returns the video alone, which its
calculate_denoised cannot combine with the packed input).

The blocks run engine/patches/ltxav.py's out-of-place forward, which the probe admits (upstream's updates both
streams in place); `layers` refuses a model that was not made trainable, as the LTX-Video adapter does.

Tensors passed between stages: the two streams, the two text contexts, the two cross-attention adaLN prompt
timesteps (LTX 2.3; empty for LTX 2.0), the four rope matrices (video, audio, and the two of the audio-video
cross-attention), the eight modulation rows (`_ROWS`), an integer tensor of sizes (`_sizes`) and xt, sigma
for calculate_denoised. A modulation row the model keeps as a per-frame CompressedTimestep travels as its
compressed data, its patches per frame among the sizes; a rope's split flag travels there too.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (BlockLayer, EmbedLayer, HeadLayer, apply_model_start, block_list_layers, host_class,
                     keep_in_graph, number, number_tensor, or_none, refuse_unhandled, require_text, stage_input)

_FAMILY = "LTX 2.x (LTXAV)"
_HANDLED = {"c_crossattn", "frame_rate", "latent_shapes"}
_NAMES = {"denoise_mask": "a denoise mask", "audio_denoise_mask": "an audio denoise mask",
          "keyframe_idxs": "keyframe guides (keyframe_idxs)", "guide_attention_entries": "guide attention entries",
          "generated_keyframes": "generated keyframes", "ref_audio": "reference audio (ref_audio)",
          "attention_mask": "a text attention mask", "c_concat": "concat channels"}
# The modulation rows in the order they travel: _prepare_timestep's video and audio rows, its four audio-video
# cross-attention rows (audio scale/shift, video scale/shift, a2v gate, v2a gate), the two embedded timesteps.
_ROWS = ("v_timestep", "a_timestep", "a_cross_ss", "v_cross_ss", "a2v_gate", "v2a_gate", "v_embedded", "a_embedded")
_HEAD = ("norm_out", "proj_out", "scale_shift_table", "audio_norm_out", "audio_proj_out", "audio_scale_shift_table")
_TEXT = ("video_embeddings_connector", "audio_embeddings_connector")  # run by extra_conds, not apply_model
_STREAMS = 10  # the tuple's leading tensors: streams, contexts, prompt timesteps, ropes


def _compressed(row) -> tuple[torch.Tensor, int]:
    """(the tensor that travels, its patches per frame): a CompressedTimestep's data, or a plain tensor and 0."""
    from comfy.ldm.lightricks.av_model import CompressedTimestep

    return (row.data, int(row.patches_per_frame)) if isinstance(row, CompressedTimestep) else (row, 0)


def _row(data: torch.Tensor, patches_per_frame: int):
    """_compressed's row back as the model keeps it (CompressedTimestep with the data as its per-frame rows:
    the object _prepare_timestep made, field for field)."""
    if not patches_per_frame:
        return data
    from comfy.ldm.lightricks.av_model import CompressedTimestep

    return CompressedTimestep(data, patches_per_frame, per_frame=True)


def _sizes(t: torch.Tensor) -> tuple[list[int], list[bool], list[int]]:
    """(each row's patches per frame, each rope's split flag, the video latent's shape) from the sizes tensor."""
    values, rows = t.tolist(), len(_ROWS)
    return values[:rows], [bool(v) for v in values[rows:rows + 4]], values[rows + 4:]


class _Embed(EmbedLayer):
    """Owns every part of the model outside the blocks, the head and the text connectors."""

    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [m for n, m in dm.named_children() if n not in ("transformer_blocks", *_HEAD, *_TEXT)])
        for name, p in dm.named_parameters(recurse=False):  # LTX 2.3's keyframe marker, where the file has one
            if name not in _HEAD:
                setattr(self, name, p)

    def forward(self, inputs):
        import comfy.utils

        xt, sigma, context, frame_rate, shapes = inputs
        base, dm = self._refs
        xc, t, context, _ = apply_model_start(base, sigma, xt, context)
        v_t, a_t = base.process_timestep(t, x=xt)
        sizes = shapes.tolist()
        x = comfy.utils.unpack_latents(xc, [sizes[:5], sizes[5:]])
        # LTXAVModel.forward, then LTXBaseModel._forward up to the blocks
        batch, dtype = x[0].shape[0], x[0].dtype
        merged = {**transformer_options(sigma), "a_timestep": a_t}
        x, coords, extra = dm._process_input(x, None, None, **merged)
        merged.update(extra)
        (v_ts, a_ts, cross, v_prompt, a_prompt), embedded, _ = dm._prepare_timestep(v_t, batch, dtype, **merged)
        (v_context, a_context), _ = dm._prepare_context(context, batch, x, None)
        (v_pe, v_cross_pe), (a_pe, a_cross_pe) = dm._prepare_positional_embeddings(coords, number(frame_rate), dtype)
        ropes = (v_pe, a_pe, v_cross_pe, a_cross_pe)  # each (matrix, split flag)
        rows, per_frame = zip(*[_compressed(r) for r in (v_ts, a_ts, *cross, *embedded)])
        info = [*per_frame, *[int(split) for _, split in ropes], *extra["orig_shape"]]
        prompts = (stage_input(v_prompt, xt), stage_input(a_prompt, xt))  # empty for LTX 2.0 (no prompt adaLN)
        # the contexts are views of one tensor (split along its width): each travels as a tensor of its own
        return (*x, v_context.contiguous(), a_context.contiguous(), *prompts, *[matrix for matrix, _ in ropes], *rows,
                torch.tensor(info, dtype=torch.long, device=xt.device), xt, sigma)


class _Block(BlockLayer):
    def forward(self, inputs):
        vx, ax, v_context, a_context, v_prompt, a_prompt, v_pe, a_pe, v_cross_pe, a_cross_pe = inputs[:_STREAMS]
        sizes, sigma = inputs[-3], inputs[-1]
        per_frame, split, _ = _sizes(sizes)
        v_ts, a_ts, a_ss, v_ss, a2v, v2a, _, _ = (_row(r, n) for r, n in zip(inputs[_STREAMS:-3], per_frame))
        # attention_mask: first_stage_inputs refuses a text mask; self_attention_mask: only guide entries make one
        vx, ax = self.block((vx, ax), v_context=v_context, a_context=a_context, attention_mask=None,
                            v_timestep=v_ts, a_timestep=a_ts, v_pe=(v_pe, split[0]), a_pe=(a_pe, split[1]),
                            v_cross_pe=(v_cross_pe, split[2]), a_cross_pe=(a_cross_pe, split[3]),
                            v_cross_scale_shift_timestep=v_ss, a_cross_scale_shift_timestep=a_ss,
                            v_cross_gate_timestep=a2v, a_cross_gate_timestep=v2a,
                            transformer_options=transformer_options(sigma), self_attention_mask=None,
                            v_prompt_timestep=or_none(v_prompt), a_prompt_timestep=or_none(a_prompt))
        return (vx, ax, *inputs[2:])


class _Head(HeadLayer):
    owned = _HEAD

    def forward(self, inputs):
        import comfy.utils

        vx, ax, *unused = inputs[:_STREAMS]
        rows, (sizes, xt, sigma) = inputs[_STREAMS:-3], inputs[-3:]
        per_frame, _, video_shape = _sizes(sizes)
        embedded = [_row(r, n) for r, n in zip(rows[-2:], per_frame[-2:])]
        out = self._dm[0]._process_output([vx, ax], embedded, None, orig_shape=video_shape)
        out, _ = comfy.utils.pack_latents(out)
        # the contexts, prompt timesteps, ropes and block rows: unused here, kept in the graph for DeepSpeed
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), *unused, *rows[:-2])


class LTXAVAdapter:
    name = "ltxav"
    partition = "uniform"  # identical blocks: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:  # ComfyUI 0.33+
        return (type(base_model) is host_class("comfy.model_base", "LTXAV")
                and type(base_model.diffusion_model) is host_class("comfy.ldm.lightricks.av_model", "LTXAVModel"))

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, _FAMILY, "text to video with its audio stream", _NAMES)
        require_text(kw, _FAMILY)
        shapes = [list(s) for s in kw.get("latent_shapes") or []]
        if [len(s) for s in shapes] != [5, 4] or shapes[1][2] == 0:
            raise ConfigError(f"{_FAMILY} trains on ComfyUI's packed video + audio latent with audio frames (the "
                              f"stream shapes `latent_shapes`: a video and an audio latent); this item has {shapes}. "
                              "Cache the video with its audio latent (a clip without sound as silence): without "
                              "audio frames ComfyUI's own forward cannot take the packed latent either.")
        xt = prepared.xt
        rate = number_tensor(kw.get("frame_rate", 25), "frame_rate", xt.device, optional=False)
        return (xt, prepared.sigma, kw["c_crossattn"], rate,
                torch.tensor([*shapes[0], *shapes[1]], dtype=torch.long, device=xt.device))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        from ..patches.trainable import is_trainable, stale_blocks

        dm = base_model.diffusion_model
        if not is_trainable(dm) or stale_blocks(dm):
            raise ConfigError(f"{_FAMILY}'s blocks must be made trainable first (engine.patches.make_trainable, "
                              "before activation checkpointing wraps them): ComfyUI's block updates its streams in "
                              "place, which gives wrong gradients.")
        return block_list_layers(base_model, _Embed, _Block, _Head, dm.transformer_blocks)
