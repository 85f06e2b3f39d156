"""Pipeline parallelism (LTX 2.3 / LTX 2.0 audio-video adapter, LTXAV, ComfyUI 0.33+): the stage layers, run one
after another, equal ComfyUI's apply_model bit for bit and give the same LoRA gradients, also checkpointed (+ CPU
offload), for text to video with its audio stream on LTX 2.3's block (cross-attention adaLN, gated attention, the
text connectors run by extra_conds) and LTX 2.0's; other inputs are refused, naming the fix; a model whose blocks
could still run ComfyUI's in-place forward is refused; a 2-stage pipeline of real DeepSpeed gloo ranks trains like
one plain process.

Built from ComfyUI's own classes with the tiny configs of tests/family_configs_033_more.py (LTXAV and _LTXAV_20),
made trainable as the engine does (the blocks' in-place updates replaced, engine/patches/ltxav.py). The 2-process
run loads a tiny LTX 2.3 file with ComfyUI's own loader: 0.33.0's detection reads the tiny widths from the file's
`config` metadata (as it reads a released file's), and the cache holds packed video + audio rows with their
`latent_shapes`, as Cache Latents writes them with an audio VAE.
On ComfyUI 0.3.75, which has no LTXAV, the tests skip and say so.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference, assert_layers_refused,
                            assert_lora_grads_equal_reference, assert_only_adapter, assert_pipelined_like_plain,
                            assert_refused, run_layers, two_process_runs)
from trainable import ensure_trainable, host_module

pytestmark = pytest.mark.core

VIDEO = (128, 2, 2, 2)  # the video latent [C, T, H, W]; the audio latent is [8, frames, 16 bins]


@pytest.fixture(autouse=True)
def _host_has_ltxav(comfy):
    host_module("comfy.ldm.lightricks.av_model")


def _model(version: str = "2.3", **changes):
    """ComfyUI's LTXAV model at the tiny LTX 2.3 config (or LTX 2.0's, `_LTXAV_20`), seed 0."""
    import comfy.supported_models
    import family_configs_033_more as more

    config = {"2.3": more.LTXAV.config, "2.0": fc.host_config(more._LTXAV_20)}[version]
    model = comfy.supported_models.LTXAV(dict(config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 1, video=VIDEO, audio_frames: int = 3, frame_rate=None):
    """apply_model's inputs for cached items: the packed video + audio latent with its `latent_shapes`, the text
    from the dual projection (LTX 2.3: flagged unprocessed, so extra_conds runs the connectors), a frame rate."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    shapes = [torch.Size((1, *video)), torch.Size((1, 8, audio_frames, 16))]
    latents = torch.randn((batch, 1, sum(s.numel() for s in shapes)), generator=gen)
    dm = model.diffusion_model
    width = dm.cross_attention_dim + dm.audio_cross_attention_dim  # what LTX 2.x's text encoder projects to
    conds = []
    for _ in range(batch):
        extras = {"latent_shapes": shapes}
        if dm.cross_attention_adaln:  # LTX 2.3
            extras["unprocessed_ltxav_embeds"] = True
        if frame_rate is not None:
            extras["frame_rate"] = frame_rate
        conds.append({"cross_attn": torch.randn((fc.T, width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {  # case: (version, model config changes, _prepare arguments)
    "ltx23-t2v": ("2.3", {}, {}),
    "ltx23-two-items": ("2.3", {}, {"batch": 2}),
    "ltx23-one-frame-one-cell": ("2.3", {}, {"video": (128, 1, 1, 1), "audio_frames": 1}),  # per-frame rows
    "ltx23-frame-rate-23.976": ("2.3", {}, {"frame_rate": 24000 / 1001}),
    "ltx23-three-blocks": ("2.3", {"num_layers": 3}, {"video": (128, 3, 2, 3), "audio_frames": 5}),
    "ltx20-t2v": ("2.0", {}, {}),
    "ltx20-two-items": ("2.0", {}, {"batch": 2, "frame_rate": 24.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    version, changes, cond = CASES[case]
    model = _model(version, **changes)
    assert_layers_equal_reference(model, _prepare(model, **cond), "ltxav")


@pytest.mark.parametrize("version", ["2.3", "2.0"])
def test_text_audio_and_frame_rate_reach_both_streams(version):
    """The text, the audio latent and the frame rate change the prediction; the audio latent changes the video
    stream's and the video latent the audio stream's (the audio-video cross-attention runs in the stages)."""
    model = _model(version)
    video = torch.Size((1, *VIDEO)).numel()  # the video stream comes first in the packed latent
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        other = _prepare(model)
        other.kwargs["c_crossattn"] = other.kwargs["c_crossattn"] + 1.0
        assert (run_layers(model, other) - base).abs().max() > 1e-4
        assert (run_layers(model, _prepare(model, frame_rate=12.0)) - base).abs().max() > 1e-4
        for moved, watched in ((slice(video, None), slice(0, video)), (slice(0, video), slice(video, None))):
            other = _prepare(model)
            other.xt[..., moved] += 1.0
            assert (run_layers(model, other)[..., watched] - base[..., watched]).abs().max() > 1e-4


@pytest.mark.parametrize("version", ["2.3", "2.0"])
@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(checkpointing, version):
    """With a LoRA on every block linear (the audio stream's and the audio-video cross-attention's too), backward
    through the layers gives apply_model's loss and gradients, also with the engine's activation checkpointing
    (+ CPU offload) around every block."""
    roots = ["transformer_blocks.0.attn1.", "transformer_blocks.1.audio_attn1.", "transformer_blocks.0.audio_ff.",
             "transformer_blocks.1.audio_to_video_attn.", "transformer_blocks.0.video_to_audio_attn."]
    assert_lora_grads_equal_reference(_model(version), lambda m: _prepare(m, batch=2), "ltxav", roots,
                                      checkpointing=checkpointing)


def test_unsupported_ltxav_inputs_are_refused():
    """Image-to-video masks, keyframe guides, reference audio, a text mask, a latent without audio frames and a
    conditioning without text get a ConfigError that names the fix."""
    model = _model()
    fix = "pipeline_stages to 1"
    assert_refused(model, _prepare(model), f"a denoise mask.*{fix}", denoise_mask=torch.ones(1))
    assert_refused(model, _prepare(model), f"keyframe guides.*{fix}", keyframe_idxs=torch.zeros(1, 3, 4, 2))
    assert_refused(model, _prepare(model), f"guide attention entries.*{fix}", guide_attention_entries=[{}])
    assert_refused(model, _prepare(model), f"reference audio.*{fix}", ref_audio={"tokens": torch.zeros(1, 2, 128)})
    assert_refused(model, _prepare(model), f"text attention mask.*{fix}", attention_mask=torch.ones(1, fc.T))
    assert_refused(model, _prepare(model), "with audio frames.*silence", latent_shapes=[torch.Size((1, *VIDEO))])
    no_audio = [torch.Size((1, *VIDEO)), torch.Size((1, 8, 0, 16))]
    assert_refused(model, _prepare(model), "with audio frames.*silence", latent_shapes=no_audio)
    assert_refused(model, _prepare(model), "cross_attn", c_crossattn=None)


def test_blocks_running_comfyui_in_place_forward_are_refused():
    """A model that was not made trainable (engine.patches.make_trainable) could still run ComfyUI's in-place
    block forward: the adapter refuses to cut it."""
    from PipeTrain.engine import patches
    from PipeTrain.engine.models import adapter_for

    model, fresh = _model(), _model()
    _prepare(model)  # probes and installs what the blocks need
    assert not patches.is_trainable(fresh.diffusion_model)
    assert_layers_refused(model, fresh, "made trainable first")
    assert len(adapter_for(model).layers(model)) == 4  # embedding, 2 blocks, head


def test_adapter_for_picks_ltxav_and_only_it():
    """LTX-Video's adapter takes none of these (LTXAVModel subclasses its LTXVModel), this one no other family."""
    assert_only_adapter([_model(), _model("2.0")], "ltxav", (f for f in fc.FAMILIES))



@pytest.fixture(scope="module")
def ltxav_files(comfy, tmp_path_factory):
    """A tiny LTX 2.3 file (its config in the file's `config` metadata, where 0.33.0's detection reads it) and a
    cache of packed video + audio rows with the text of the dual projection."""
    import json

    import family_configs_033_more as more
    import tiny_detected
    from safetensors.torch import save_file

    host_module("comfy.ldm.lightricks.av_model")  # a module fixture is made before the autouse skip above
    root = tmp_path_factory.mktemp("tiny-ltxav")
    path = root / "tiny_ltxav.safetensors"
    state = {k: v.contiguous() for k, v in _model().diffusion_model.state_dict().items()}
    save_file(state, str(path), metadata={"config": json.dumps({"transformer": more.LTXAV.config})})
    shapes = [[1, *VIDEO], [1, 8, 3, 16]]
    row = (1, sum(torch.Size(s).numel() for s in shapes))
    cache = tiny_detected.write_cache(root / "data", latent=row, text_width=96,
                                      extras={"latent_shapes": shapes, "unprocessed_ltxav_embeds": True})
    return str(path), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, ltxav_files, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each (the CompressedTimestep rows, the rope matrices and the integer sizes
    among the stage inputs): the same losses, gradient norms and saved LoRA as one plain process."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread per rank in both runs (a busy 2-core machine)
    plain, piped = two_process_runs(tmp_path, comfy_root, ltxav_files)
    assert "pipeline stage 2/2" in piped.log()
    # checked against apply_model before DeepSpeed built the stages (engine/models/stage_check.py)
    assert "pipeline check: the ltxav stage layers reproduce ComfyUI" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
