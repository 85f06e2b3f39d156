"""MiniMax H3 (comfy.ldm.minimax.model.MiniMaxH3Model, ComfyUI 0.33+) as pipeline stage layers.

Mirrors BaseModel._apply_model and MiniMaxH3Model._forward of ComfyUI 0.33.0 for what the engine trains:
the packed latent (video + audio streams, `latent_shapes`) unpacked, one packed sequence of the text (refined
by extra_conds already), the audio rows and the video rows (PackedLayout: text, audio, video), each segment
modulated by its row of the timestep table (video at t = 1 - sigma, audio on its own shifted schedule, text
runs by their token tags), and the final layer on the two target streams, packed again. Batch 1 (as upstream).
An audio stream carried at the sampler's audio_scale (the objective sets model.latent_shapes, as the sampler
does) is taken back to its own scale before the embedding and the audio output turned back after the head, as
MiniMaxH3Model.forward does around _forward.
Refused (pipeline_stages 1 trains them): keyframes, references, conditioning noise augmentation and denoise
masks.
Tensors passed between stages: the sequence h [S, hidden] (no batch dim, as upstream), the timestep table,
the rope table, and integer tensors: the modulation segments (start, stop, row), the two target segments
and the latent sizes; the audio stream at its own scale and (audio_scale, the audio sigma) in float64 (empty at scale 1);
plus xt and sigma for calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from .common import (BlockLayer, EmbedLayer, HeadLayer, apply_model_start, block_list_layers, host_class,
                     keep_in_graph, refuse_unhandled, require_text)

_HANDLED = {"c_crossattn", "latent_shapes", "minimax_payload"}
_PAYLOAD = {"text_token_tags", "seed", "audio_scale", "layout"}  # what a cached text-to-video item gives
_TAGS = {"text": 1, "video": 0, "audio": 2}  # modality tag of each segment kind (upstream's seg_tag)


def _integers(rows, device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device).reshape(len(rows), -1)


def _sigmas(dm, timestep, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma_v, sigma_a) from the model's timestep (sigma x 1000): the video stream's sigma and the audio
    stream's on its own shifted schedule, computed as upstream computes them."""
    from comfy.ldm.minimax.model import time_shift_sigma

    shift_v = float(options.get("minimax_h3_sigma_shift_video", dm.sigma_shift_video))
    shift_a = float(options.get("minimax_h3_sigma_shift_audio", dm.sigma_shift_audio))
    sigma_v = (timestep.flatten()[0] / 1000.0).float().clamp(min=1e-6)
    return sigma_v, time_shift_sigma(sigma_v, shift_v, shift_a)


def _modulation(layout, t_v: float, t_a: float, tags) -> tuple[list[float], list[tuple[int, int, int]], list]:
    """(the distinct timesteps, the (start, stop, row) modulation segments, the video and audio target
    segments) as _forward makes them for a layout of text, audio and video only: row = 3 x the timestep's
    index + the modality tag; a text span splits into runs of equal token tags."""
    seg_t = {"text": t_v, "video": t_v, "audio": t_a}
    unique_t = sorted({t_v, t_a} | {seg_t[kind] for _, _, kind in layout.segments})
    t_row = {t: i for i, t in enumerate(unique_t)}
    segments = []
    for a, b, kind in layout.segments:
        base = t_row[seg_t[kind]] * 3
        if kind == "text" and tags is not None:
            values, start = tags.view(-1).tolist(), 0
            for i in range(1, b - a + 1):
                if i == b - a or values[i] != values[start]:
                    segments.append((a + start, a + i, base + int(values[start])))
                    start = i
        else:
            segments.append((a, b, base + _TAGS[kind]))
    targets = [(a, b, t_row[seg_t[kind]]) for kind in ("video", "audio") for a, b, k in layout.segments if k == kind]
    return unique_t, segments, targets


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        parts = [dm.video_patch_proj, dm.audio_patch_proj] + ([] if dm.use_adaln_curves else [dm.time_embedder])
        super().__init__(base, parts)

    def forward(self, inputs):
        import comfy.ldm.common_dit
        import comfy.model_management
        import comfy.utils
        from comfy.ldm.minimax import model as minimax

        from ..train.objective import transformer_options

        xt, sigma, context, tags, shapes, audio_scale = inputs
        base, dm = self._refs
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)
        sizes = shapes.tolist()
        video_x, audio_x = comfy.utils.unpack_latents(xc, [torch.Size(sizes[:5]), torch.Size(sizes[5:])])
        sigma_v, sigma_a = _sigmas(dm, t, transformer_options(sigma))
        own, audio = torch.zeros(0, device=xt.device), audio_scale[:0]
        if float(audio_scale[0]) != 1.0:  # MiniMaxH3Model.forward: the stream's own latent from the carried one
            own = audio_x = audio_x * (sigma_a / sigma_v).to(audio_x.dtype)
            audio = torch.cat([audio_scale, sigma_a.to(audio_scale.dtype).view(1)])
        # MiniMaxH3Model._forward up to the blocks
        orig = video_x.shape[2:]
        video_x = comfy.ldm.common_dit.pad_to_patch_size(video_x, dm.patch_size)
        device, dtype = video_x.device, context.dtype
        latent_t, lat_h, lat_w = video_x.shape[2:]
        layout = minimax.PackedLayout(context.shape[1], latent_t, lat_h, lat_w, audio_x.shape[-1])
        t_v, t_a = float(1.0 - sigma_v), float(1.0 - sigma_a)
        unique_t, segments, targets = _modulation(layout, t_v, t_a, tags if tags.numel() else None)
        video_embed = dm.video_patch_proj(minimax.patchify_video(video_x.to(torch.float32), dm.patch_size)).to(dtype)
        audio_embed = dm.audio_patch_proj(minimax.pack_audio(audio_x.to(torch.float32))).to(dtype)
        text = context[0]
        if text.shape[-1] != dm.hidden_size:
            text = dm.token_refiner(dm.condition_proj(text), transformer_options=transformer_options(sigma))
        h = torch.empty(layout.seq_len, dm.hidden_size, dtype=dtype, device=device)
        for a, b, kind in layout.segments:
            h[a:b] = {"text": text, "audio": audio_embed, "video": video_embed}[kind]
        t_vals = torch.tensor(unique_t, dtype=torch.float32, device=device)
        if dm.use_adaln_curves:
            table = comfy.model_management.cast_to(dm.adaln_t_table, device=device)
            pos = t_vals.clamp(0.0, 1.0) * (table.shape[0] - 1)
            i0 = pos.floor().long().clamp(max=table.shape[0] - 2)
            t_emb = torch.lerp(table[i0], table[i0 + 1], (pos - i0).unsqueeze(1))
        else:
            t_emb = dm.time_embedder(t_vals).to(dtype)
        rope = minimax.rope_rotation_table(dm.rope_freqs(layout.position_ids, device), dtype)
        frames = _integers([[latent_t, lat_h, lat_w, *orig]], device)
        return h, t_emb, rope, _integers(segments, device), _integers(targets, device), frames, own, audio, xt, sigma


class _Block(BlockLayer):
    def forward(self, inputs):
        from ..train.objective import transformer_options

        h, t_emb, rope, segments, *rest = inputs
        sigma = rest[-1]
        h = self.block(h, t_emb, [tuple(s) for s in segments.tolist()], rope,
                       transformer_options=transformer_options(sigma))
        return (h, t_emb, rope, segments, *rest)


class _Head(HeadLayer):
    owned = ("final_layer",)

    def forward(self, inputs):
        import comfy.utils
        from comfy.ldm.minimax import model as minimax

        h, t_emb, rope, segments, targets, frames, own, audio, xt, sigma = inputs
        dm = self._dm[0]
        video_seg, audio_seg = (tuple(s) for s in targets.tolist())
        latent_t, lat_h, lat_w, orig_t, orig_h, orig_w = frames.tolist()[0]
        v, a = self.final_layer(h, t_emb, video_seg, audio_seg)
        video = minimax.unpatchify_video(v, latent_t, lat_h // 2, lat_w // 2, dm.latents_dim, dm.patch_size)
        video = video[:, :, :orig_t, :orig_h, :orig_w]
        out_a = -minimax.unpack_audio(a).to(rope.dtype)
        if audio.numel():  # MiniMaxH3Model.forward: the carried stream's output from the stream's own
            scale, sigma_a = float(audio[0]), audio[1].float()
            out_a = (1.0 - scale) * own + (1.0 + (scale - 1.0) * sigma_a).to(out_a.dtype) * out_a
        out, _ = comfy.utils.pack_latents([-video.to(rope.dtype), out_a])
        # the rope table: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), rope)


class MiniMaxH3Adapter:
    name = "minimax_h3"
    partition = "uniform"  # identical blocks: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:  # ComfyUI 0.33+
        return type(base_model.diffusion_model) is host_class("comfy.ldm.minimax.model", "MiniMaxH3Model")

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "MiniMax H3", "text to image and video (with audio streams) only",
                         {"denoise_mask": "a denoise mask", "audio_denoise_mask": "an audio denoise mask"})
        require_text(kw, "MiniMax H3")
        payload, shapes = kw.get("minimax_payload") or {}, kw.get("latent_shapes")
        extra = sorted(set(payload) - _PAYLOAD)
        if extra or not shapes or len(shapes) != 2:
            what = ", ".join(extra) or "a latent that is not one video + audio pair"
            raise ConfigError(f"pipeline_stages > 1 for MiniMax H3 supports text to image and video only; this run "
                              f"also needs {what}. Set pipeline_stages to 1 for this model.")
        if prepared.xt.shape[0] != 1:
            raise ConfigError("MiniMax H3 trains one sample at a time (its forward takes batch 1): set batch_size "
                              "to 1 and raise grad_accum instead.")
        tags = payload.get("text_token_tags")
        device = prepared.xt.device
        tags = torch.zeros(0, dtype=torch.long, device=device) if tags is None else tags.to(device)
        return (prepared.xt, prepared.sigma, kw["c_crossattn"], tags,
                torch.tensor([*shapes[0], *shapes[1]], dtype=torch.long, device=device),
                torch.tensor([float(payload.get("audio_scale", 1.0))], dtype=torch.float64, device=device))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        return block_list_layers(base_model, _Embed, _Block, _Head, base_model.diffusion_model.blocks)
