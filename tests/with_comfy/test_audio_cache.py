"""Video + audio items for LTX 2.x (`LTXAV`, ComfyUI 0.33+): CacheLatents' audio_vae.

- The cached row equals what ComfyUI's own nodes give the sampler for the same clip: the video through Load
  Video's audio (VideoFromFile.get_components), LTXV Audio VAE Encode, LTXV Concat AV Latent, and the sampler's
  packing (comfy.utils.pack_latents), with `latent_shapes` for BaseModel._apply_model.
- What a clip's sound needed is in the report: no track (cached as silence), another rate, mono, 5.1.
- A tiny LTXAV trains on the cached row: its loss falls, and the audio part of the row reaches the loss.

The audio VAE is a tiny LTX 2.x audio VAE written as LTX checkpoints hold it and loaded by Load LTXV Audio
VAE itself; the video VAE is ComfyUI's TAEHV with random weights (tests/tiny_encoders.py).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from media_writers import write_video
from pack import load_pack
from test_video_dataset import encoders  # noqa: F401 - the fixture

load_pack()
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402

pytestmark = pytest.mark.core
SIZE, FRAMES, FPS = 64, 9, 25  # 9 frames at 25 fps: a 0.36 s clip


@pytest.fixture(scope="module")
def audio_vae(encoders, tmp_path_factory):  # noqa: F811
    """The tiny LTX audio VAE, loaded by ComfyUI's Load LTXV Audio VAE node from models/checkpoints."""
    try:
        importlib.import_module("comfy.ldm.lightricks.vae.audio_vae")
        loader = importlib.import_module("comfy_extras.nodes_lt_audio").LTXVAudioVAELoader
    except ImportError:
        pytest.skip("this ComfyUI has no LTX audio VAE (comfy.ldm.lightricks.vae.audio_vae: ComfyUI 0.33+)")
    import folder_paths
    from tiny_encoders import write_tiny_ltx_audio_vae

    folder = tmp_path_factory.mktemp("checkpoints")
    write_tiny_ltx_audio_vae(folder / "ltx_audio_vae.safetensors")
    folder_paths.add_model_folder_path("checkpoints", str(folder))
    return loader.execute("ltx_audio_vae.safetensors").args[0]


def _tone(seconds: float, rate: int, channels: int) -> np.ndarray:
    """[channels, samples] float: a different pitch per channel, so channel order and mixing show."""
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)]).astype(np.float32)


def write_av(path, seconds_audio: float, rate: int, channels: int, frames: int = FRAMES):
    """A lossless video (FFV1, write_video's frames) with a PCM audio track in Matroska."""
    import av

    write_video(path.with_suffix(".tmp.mkv"), frames, size=(SIZE, SIZE), fps=FPS)
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[channels]
    with av.open(str(path.with_suffix(".tmp.mkv"))) as src, av.open(str(path), "w", format="matroska") as out:
        video = out.add_stream_from_template(src.streams.video[0])
        sound = out.add_stream("pcm_f32le", rate=rate, layout=layout)
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = video
                out.mux(packet)
        wave = _tone(seconds_audio, rate, channels)
        for start in range(0, wave.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave[:, start:start + 1024]), format="fltp",
                                               layout=layout)
            frame.sample_rate = rate
            for packet in sound.encode(frame):
                out.mux(packet)
        for packet in sound.encode():
            out.mux(packet)
    path.with_suffix(".tmp.mkv").unlink()
    return path


def _cache(folder, encoders, audio_vae, gpus: int = 1, prompt=None, unique_id=None, **load):  # noqa: F811
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    video_vae, _, clip = encoders
    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=SIZE, repeats=1, video_frames=FRAMES,
                                          **load)
    return PipeTrainCacheLatents().encode(spec, video_vae, clip, False, audio_vae=audio_vae, gpus=gpus, prompt=prompt,
                                          unique_id=unique_id)


def test_cached_row_is_what_comfyuis_ltx_nodes_give_the_sampler(encoders, audio_vae, tmp_path):  # noqa: F811
    import comfy.utils
    from comfy_api.latest import InputImpl
    from comfy_extras.nodes_lt import LTXVConcatAVLatent
    from comfy_extras.nodes_lt_audio import LTXVAudioVAEEncode

    from PipeTrain.engine.data.video import load_video

    video_vae = encoders[0]
    path = write_av(tmp_path / "clip.mkv", 1.0, 48000, 2)  # a second of 48 kHz stereo under a 0.36 s video
    cache, _, _ = _cache(tmp_path, encoders, audio_vae)
    item = CachedDataset(cache.cache_dir)[0]

    audio = InputImpl.VideoFromFile(str(path)).get_components().audio  # what Load Video gives: the whole track
    seconds = FRAMES / FPS  # the cache keeps what plays under the clip (a Trim Audio node's job in a graph)
    audio = dict(audio, waveform=audio["waveform"][..., :round(seconds * audio["sample_rate"])])
    audio_latent = LTXVAudioVAEEncode.execute(audio=audio, audio_vae=audio_vae).args[0]
    pixels = torch.from_numpy(load_video(str(path), (SIZE, SIZE), FRAMES))
    video_latent = {"samples": video_vae.encode(pixels)}
    joint = LTXVConcatAVLatent.execute(video_latent=video_latent, audio_latent=audio_latent).args[0]["samples"]
    row, shapes = comfy.utils.pack_latents(joint.unbind())  # what the sampler hands the model
    assert [list(s) for s in shapes] == item["extras"]["latent_shapes"]
    assert shapes[1][2] > 1  # the audio stream has frames
    torch.testing.assert_close(item["latent"], row[0])


def test_report_names_silent_resampled_mono_and_mixed_down_items(encoders, audio_vae, tmp_path):  # noqa: F811
    from PIL import Image

    write_video(tmp_path / "no_sound.mkv", FRAMES, size=(SIZE, SIZE), fps=FPS)
    write_av(tmp_path / "mono.mkv", 0.36, 16000, 1)
    write_av(tmp_path / "surround.mkv", 0.36, 48000, 6)
    Image.new("RGB", (SIZE, SIZE), "red").save(tmp_path / "still.png")
    cache, lines, rows = _cache(tmp_path, encoders, audio_vae)
    reasons = {reason: (count, names) for reason, count, names in rows}
    assert reasons["audio_silent"][0] == 2 and set(reasons["audio_silent"][1]) == {"no_sound.mkv", "still.png"}
    assert reasons["audio_mono"] == (1, ("mono.mkv",))
    assert reasons["audio_mixed_down"] == (1, ("surround.mkv (6 channels)",))
    assert set(reasons["audio_resampled"][1]) == {"mono.mkv (16000 Hz)", "surround.mkv (48000 Hz)"}
    text = "\n".join(lines)
    assert "cached as silence" in text and "no_sound.mkv" in text and "5.1" not in text
    data = CachedDataset(cache.cache_dir)
    for i in range(len(data)):  # every item is a packed pair whose audio stream has frames
        shapes = data[i]["extras"]["latent_shapes"]
        assert len(shapes) == 2 and shapes[1][2] >= 1
        assert data[i]["latent"].numel() == sum(int(np.prod(s[1:])) for s in shapes)


def test_settings_that_cannot_pack_are_refused(encoders, audio_vae, tmp_path):  # noqa: F811
    from PipeTrain.engine.cache.format import CacheError
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    write_video(tmp_path / "a.mkv", FRAMES, size=(SIZE, SIZE), fps=FPS)
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=SIZE, repeats=1, video_frames=FRAMES)
    with pytest.raises(CacheError, match="audio_vae takes first_frame_style 'clean_first_frame'.*not 'wan_concat'"):
        PipeTrainCacheLatents().encode(spec, encoders[0], encoders[2], False, first_frame_conditioning=True,
                                       audio_vae=audio_vae)


def test_image_to_video_packs_the_first_frame_mask_as_the_sampler_does(encoders, audio_vae, tmp_path):  # noqa: F811
    """first_frame_style clean_first_frame with audio_vae (LTX 2.x image-to-video): the cached denoise_mask is
    the pair's noise mask as LTXV Concat AV Latent makes it (the audio's all ones) and the sampler packs it
    (prepare_mask to each stream's latent, pack_latents); the row is the text-to-video one."""
    import comfy.sampler_helpers
    import comfy.utils
    from comfy_extras.nodes_lt import LTXVConcatAVLatent

    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    write_av(tmp_path / "clip.mkv", 0.36, 16000, 2)
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=SIZE, repeats=1, video_frames=FRAMES)
    cache, _, _ = PipeTrainCacheLatents().encode(spec, encoders[0], encoders[2], False, first_frame_conditioning=True,
                                                 first_frame_style="clean_first_frame", audio_vae=audio_vae)
    item = CachedDataset(cache.cache_dir)[0]
    video_shape, audio_shape = (torch.Size(s) for s in item["extras"]["latent_shapes"])
    n = video_shape.numel()
    video = {"samples": item["latent"][..., :n].reshape(video_shape),
             "noise_mask": torch.ones((1, 1, *video_shape[2:]))}
    video["noise_mask"][:, :, :1] = 0.0  # LTXV Img To Video's mask at strength 1: the first latent frame kept
    audio = {"samples": item["latent"][..., n:].reshape(audio_shape)}
    joint = LTXVConcatAVLatent.execute(video_latent=video, audio_latent=audio).args[0]
    masks = [comfy.sampler_helpers.prepare_mask(m, s, "cpu") for m, s in zip(joint["noise_mask"].unbind(),
                                                                              (video_shape, audio_shape))]
    want, _ = comfy.utils.pack_latents(masks)
    torch.testing.assert_close(item["extras"]["denoise_mask"], want[0])
    assert want[0, 0, :n].min() == 0 and want[0, 0, n:].min() == 1  # kept frame in the video, all audio noised


@pytest.mark.parametrize("first_frame", ["", "clean_first_frame"])
def test_a_tiny_ltxav_trains_on_the_cached_row(encoders, audio_vae, tmp_path, first_frame):  # noqa: F811
    """The cached item as the training loop batches it (engine/train/sample_order.py), through the engine's
    LoRA and objective on a tiny LTX 2.3 (16 video channels, as the test VAE gives; 8 x 16 audio), text to
    video and image to video (the kept first frame stays clean and out of the loss)."""
    import family_configs as fc
    import family_configs_033_more as more
    from trainable import make_trainable

    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.latent_fit import packed_latent_missing
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import batch_items

    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    write_av(tmp_path / "clip.mkv", 0.36, 16000, 2)
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=SIZE, repeats=1, video_frames=FRAMES)
    cache, _, _ = PipeTrainCacheLatents().encode(spec, encoders[0], encoders[2], False,
                                                 first_frame_conditioning=bool(first_frame),
                                                 first_frame_style=first_frame or "wan_concat", audio_vae=audio_vae)
    latents, conds = batch_items([CachedDataset(cache.cache_dir)[0]], torch.device("cpu"))
    family = fc.Family("ltxav_cached", "LTXAV", dict(more.LTXAV.recipe, in_channels=16), tuple(latents.shape[1:]),
                       more.LTXAV.text_width, "t2v")
    model = fc.build(family)
    assert packed_latent_missing(type(model).__name__, conds[0]["extras"]) is None
    conds[0]["cross_attn"] = torch.randn(fc.T, family.text_width, generator=torch.Generator().manual_seed(1))
    conds[0]["extras"]["unprocessed_ltxav_embeds"] = True  # the test CLIP is no Gemma: text of LTX 2.3's width
    make_trainable(model, latents, conds)
    inject_lora(model.diffusion_model, LoraSpec(rank=4))
    objective = DiffusionObjective(model, seed=0)
    opt = torch.optim.Adam(lora_parameters(model.diffusion_model), lr=5e-3)
    losses = []
    for _ in range(5):
        loss = objective(latents, conds, [0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    batch = objective.prepare(latents, conds, [0])
    if first_frame:  # the kept first latent frame: clean in the model's input, weight 0 in the loss
        kept = batch.weight[0, 0] == 0
        assert kept.any() and torch.equal(batch.xt[0, 0][kept], batch.x0[0, 0][kept])
    else:
        assert batch.weight is None
    video = int(np.prod(conds[0]["extras"]["latent_shapes"][0][1:]))
    louder = latents.clone()
    louder[..., video:] += 1.0  # only the audio stream changes
    with torch.no_grad():
        assert abs(objective(louder, conds, [0]).item() - objective(latents, conds, [0]).item()) > 1e-4


def test_the_headless_cache_mode_packs_the_sound_on_two_processes(encoders, audio_vae, comfy_root, tmp_path):  # noqa: F811
    """`python -m engine cache` with "audio_vae" (the LTX checkpoint's file) on 2 processes writes the rows the
    node writes, and says what it did with each clip's sound."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import comfy.utils
    from tiny_encoders import write_tiny_ltx_audio_vae
    from tools.tiny_assets import write_tiny_clip

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "set").mkdir()
    write_av(tmp_path / "set" / "tone.mkv", 0.36, 16000, 2)
    write_video(tmp_path / "set" / "quiet.mkv", FRAMES, size=(SIZE, SIZE), fps=FPS)
    comfy.utils.save_torch_file(encoders[0].first_stage_model.state_dict(), str(tmp_path / "video_vae.safetensors"))
    write_tiny_clip(str(tmp_path / "clip.safetensors"), seed=0)  # the fixture's CLIP
    write_tiny_ltx_audio_vae(tmp_path / "ltx_audio_vae.safetensors")
    config = tmp_path / "cache.json"
    config.write_text(json.dumps({"comfyui_root": comfy_root, "processes": 2, "vae": "video_vae.safetensors",
                                  "clip": "clip.safetensors", "audio_vae": "ltx_audio_vae.safetensors",
                                  "dataset": {"folders": ["set"], "resolution": SIZE, "video_frames": FRAMES}}))
    proc = subprocess.run([sys.executable, "-m", "engine", "cache", "--config", str(config)], cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "cached as silence" in out and "quiet.mkv" in out
    (tmp_path / "node").mkdir()  # the node caches copies of the same files (another folder: its own cache)
    for name in ("tone.mkv", "quiet.mkv"):
        (tmp_path / "node" / name).write_bytes((tmp_path / "set" / name).read_bytes())
    cache, _, _ = _cache(tmp_path / "node", encoders, audio_vae)
    node = CachedDataset(cache.cache_dir)
    rows = {node[i]["source"]: node[i] for i in range(len(node))}
    (folder,) = [p for p in (tmp_path / "set" / ".pipetrain_cache").iterdir() if p.is_dir()]
    headless = CachedDataset(str(folder))
    assert sorted(headless[i]["source"] for i in range(len(headless))) == sorted(rows) == ["quiet.mkv", "tone.mkv"]
    for i in range(len(headless)):
        item = headless[i]
        assert item["extras"]["latent_shapes"] == rows[item["source"]]["extras"]["latent_shapes"]
        torch.testing.assert_close(item["latent"], rows[item["source"]]["latent"])


def test_the_node_on_two_processes_loads_the_audio_vae_behind_it_and_caches_what_one_caches(
        encoders, audio_vae, tmp_path):  # noqa: F811
    """CacheLatents with gpus 2: the ranks load the audio VAE file of the Load LTXV Audio VAE node feeding
    audio_vae (as they load vae and clip from their loaders), and the rows equal a one-process cache's; an
    audio_vae the ranks cannot rebuild is refused before any starts."""
    import comfy.utils
    import folder_paths
    from PipeTrain.engine.config.checks import ConfigError
    from tools.tiny_assets import write_tiny_clip

    models = tmp_path / "models"
    for folder in ("vae", "text_encoders"):
        (models / folder).mkdir(parents=True)
        folder_paths.add_model_folder_path(folder, str(models / folder))
    comfy.utils.save_torch_file(encoders[0].first_stage_model.state_dict(), str(models / "vae" / "video_vae.safetensors"))
    write_tiny_clip(str(models / "text_encoders" / "clip.safetensors"), seed=0)  # the fixture's CLIP
    graph = {"9": {"class_type": "PipeTrainCacheLatents", "inputs": {"vae": ["1", 0], "clip": ["2", 0],
                                                                     "audio_vae": ["3", 0]}},
             "1": {"class_type": "VAELoader", "inputs": {"vae_name": "video_vae.safetensors"}},
             "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip.safetensors", "type": "stable_diffusion"}},
             "3": {"class_type": "LTXVAudioVAELoader", "inputs": {"ckpt_name": "ltx_audio_vae.safetensors"}}}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        write_av(tmp_path / name / "tone.mkv", 0.36, 16000, 2)
        write_video(tmp_path / name / "quiet.mkv", FRAMES, size=(SIZE, SIZE), fps=FPS)
    one, _, _ = _cache(tmp_path / "one", encoders, audio_vae)
    two, lines, _ = _cache(tmp_path / "two", encoders, audio_vae, gpus=2, prompt=graph, unique_id="9")
    assert any(line.startswith("encoded on 2 processes: ") for line in lines), lines
    a, b = CachedDataset(one.cache_dir), CachedDataset(two.cache_dir)
    rows = {b[i]["source"]: b[i] for i in range(len(b))}
    assert sorted(rows) == ["quiet.mkv", "tone.mkv"] and len(a) == 2
    for i in range(len(a)):
        assert a[i]["extras"]["latent_shapes"] == rows[a[i]["source"]]["extras"]["latent_shapes"]
        torch.testing.assert_close(a[i]["latent"], rows[a[i]["source"]]["latent"])
    graph["4"] = {"class_type": "LTXVAudioVAEDecode", "inputs": {}}  # not a loader: the ranks could not rebuild it
    graph["9"]["inputs"]["audio_vae"] = ["4", 0]
    with pytest.raises(ConfigError, match="audio_vae comes from LTXVAudioVAEDecode, which the GPU processes cannot"):
        _cache(tmp_path / "one", encoders, audio_vae, gpus=2, prompt=graph, unique_id="9")
