"""Out-of-place forward for LTX 2.x's audio-video block (comfy/ldm/lightricks/av_model.py
BasicAVTransformerBlock, the LTXAV class; ComfyUI 0.33+).

The block carries two residual streams, video `vx` and audio `ax`, handed in as a pair, and updates
both in place at each of its steps: self-attention (`addcmul_` with its gate), text cross-attention
(`add_`), the audio-to-video and video-to-audio cross-attention (`addcmul_`), and the feed-forward
(`addcmul_`). Each step's norm and the LoRA on its first linear layers saved the stream it read, so
LoRA backward fails; under per-block checkpointing the block also writes into its own inputs, so the
recompute would start from the updated streams. This forward runs the same steps in the same order,
each on the stream as the previous step left it, writing each update into a new tensor rounded to
the stream's dtype where upstream's in-place op stored it: the output is upstream's, bit for bit.

What it keeps from upstream as it is: the modulation rows (`get_ada_values`, which also expands
LTXAV's per-frame CompressedTimestep), the text cross-attention with or without LTX 2.3's
cross-attention adaLN (`_apply_text_cross_attention`, out of place already), the `run_vx` / `run_ax`
/ `a2v_cross_attn` / `v2a_cross_attn` switches of `transformer_options`, an audio stream of no frames
(its steps and the cross-attention are skipped), and the video norms' two forms: with ComfyUI's
training flag on (PipeTrain always sets it) `rms_norm(x) * (1 + scale) + shift`, with it off the
fused comfy-kitchen `rms_adaln` (no backward; inference only). The audio norms are always the first.
Written against 0.33.0's block; 0.38.1's av_model.py could not be read at its commit, and the copy of
another release the read-only source index holds has the same forward (the probe checks it anyway).
Importing this module needs ComfyUI on sys.path (0.3.75 has no av_model.py; nothing here imports it).
"""
from __future__ import annotations

import comfy.ldm.common_dit
import comfy.model_management
import torch

from .fixes import Fix
from .flux import into

MODULE = "comfy.ldm.lightricks.av_model"


def _norm(x, scale, shift):
    return comfy.ldm.common_dit.rms_norm(x) * (1 + scale) + shift


def _video_norm(x, scale, shift):
    if comfy.model_management.in_training:
        return _norm(x, scale, shift)
    from comfy import quant_ops  # 0.33+ only

    return quant_ops.ck.rms_adaln(x, scale, shift)


def _gated(stream, update, gate):
    """What upstream's stream.addcmul_(update, gate) stores, as a new tensor."""
    return torch.addcmul(stream, update, gate).to(stream.dtype)


def forward_033(self, x, v_context=None, a_context=None, attention_mask=None, v_timestep=None, a_timestep=None,
                v_pe=None, a_pe=None, v_cross_pe=None, a_cross_pe=None, v_cross_scale_shift_timestep=None,
                a_cross_scale_shift_timestep=None, v_cross_gate_timestep=None, a_cross_gate_timestep=None,
                transformer_options=None, self_attention_mask=None, v_prompt_timestep=None, a_prompt_timestep=None):
    opts = transformer_options
    vx, ax = x
    has_audio = ax.numel() > 0
    run_vx = opts.get("run_vx", True)
    run_ax = opts.get("run_ax", True) and has_audio
    run_a2v = run_vx and opts.get("a2v_cross_attn", True) and has_audio
    run_v2a = run_ax and opts.get("v2a_cross_attn", True)
    rows = self.get_ada_values
    video, audio = self.scale_shift_table, self.audio_scale_shift_table

    if run_vx:  # video self-attention, then text cross-attention
        shift, scale = rows(video, vx.shape[0], v_timestep, slice(0, 2))
        out = self.attn1(_video_norm(vx, scale, shift), pe=v_pe, mask=self_attention_mask, transformer_options=opts)
        vx = _gated(vx, out, rows(video, vx.shape[0], v_timestep, slice(2, 3))[0])
        vx = into(vx, self._apply_text_cross_attention(
            vx, v_context, self.attn2, video, getattr(self, "prompt_scale_shift_table", None),
            v_timestep, v_prompt_timestep, attention_mask, opts))

    if run_ax:  # the same for audio
        shift, scale = rows(audio, ax.shape[0], a_timestep, slice(0, 2))
        out = self.audio_attn1(_norm(ax, scale, shift), pe=a_pe, transformer_options=opts)
        ax = _gated(ax, out, rows(audio, ax.shape[0], a_timestep, slice(2, 3))[0])
        ax = into(ax, self._apply_text_cross_attention(
            ax, a_context, self.audio_attn2, audio, getattr(self, "audio_prompt_scale_shift_table", None),
            a_timestep, a_prompt_timestep, attention_mask, opts))

    if run_a2v or run_v2a:  # audio <-> video: rows 0-1 of the 4 scale/shift rows for a2v, 2-3 for v2a
        a_table, v_table = self.scale_shift_table_a2v_ca_audio, self.scale_shift_table_a2v_ca_video
        a_normed = comfy.ldm.common_dit.rms_norm(ax)  # the audio as it is before either direction
        if run_a2v:
            a_scale, a_shift = rows(a_table[:4, :], ax.shape[0], a_cross_scale_shift_timestep)[:2]
            v_scale, v_shift = rows(v_table[:4, :], vx.shape[0], v_cross_scale_shift_timestep)[:2]
            a_scaled = a_normed * (1 + a_scale) + a_shift
            out = self.audio_to_video_attn(_video_norm(vx, v_scale, v_shift), context=a_scaled, pe=v_cross_pe,
                                           k_pe=a_cross_pe, transformer_options=opts)
            vx = _gated(vx, out, rows(v_table[4:, :], vx.shape[0], v_cross_gate_timestep)[0])
        if run_v2a:  # reads the video as a2v left it
            a_scale, a_shift = rows(a_table[:4, :], ax.shape[0], a_cross_scale_shift_timestep)[2:4]
            v_scale, v_shift = rows(v_table[:4, :], vx.shape[0], v_cross_scale_shift_timestep)[2:4]
            a_scaled = a_normed * (1 + a_scale) + a_shift
            out = self.video_to_audio_attn(a_scaled, context=_video_norm(vx, v_scale, v_shift), pe=a_cross_pe,
                                           k_pe=v_cross_pe, transformer_options=opts)
            ax = _gated(ax, out, rows(a_table[4:, :], ax.shape[0], a_cross_gate_timestep)[0])

    if run_vx:  # feed-forwards
        shift, scale = rows(video, vx.shape[0], v_timestep, slice(3, 5))
        vx = _gated(vx, self.ff(_video_norm(vx, scale, shift)), rows(video, vx.shape[0], v_timestep, slice(5, 6))[0])
    if run_ax:
        shift, scale = rows(audio, ax.shape[0], a_timestep, slice(3, 5))
        ax = _gated(ax, self.audio_ff(_norm(ax, scale, shift)), rows(audio, ax.shape[0], a_timestep, slice(5, 6))[0])
    return vx, ax


FIXES = (
    Fix("ltxav-block 0.33", MODULE, ("BasicAVTransformerBlock",), {"BasicAVTransformerBlock.forward": forward_033},
        since="0.33.0", before=None),
)
