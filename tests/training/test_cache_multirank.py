"""The engine's cache mode (`python -m engine cache --config cache.json`): the CacheLatents node's
encoding, headless and on N ranks.

Real parts throughout: the tiny VAE/CLIP files loaded by ComfyUI's loaders in each rank, two gloo
ranks started by the per-node launcher, the node in-process with the same files, and the training
engine reading the result.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pack import load_pack  # tests/pack.py: the repo as the package ComfyUI makes of it

load_pack()
from engine_runs import make_config, run_to_end  # noqa: E402
from PipeTrain.engine.config.cache import MODEL_FOLDERS, CacheConfig, model_file  # noqa: E402
import PipeTrain.engine.cache.shards as store  # noqa: E402
from PipeTrain.engine.cache.format import CACHE_FOLDER, MANIFEST  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset
from PipeTrain.engine.config.checks import ConfigError  # noqa: E402
from dataset_files import png_bytes  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
PENULTIMATE, LAST = "clip_vision_output.penultimate_hidden_states", "clip_vision_output.last_hidden_state"


@pytest.fixture(scope="module")
def files(demo_base) -> dict:
    models = Path(demo_base["base_dir"]) / "models"
    return {"vae": str(models / "vae" / demo_base["vae"]), "clip": str(models / "text_encoders" / demo_base["clip"])}


@pytest.fixture(scope="module")
def encoders(files):
    from tools.tiny_assets import load_tiny_encoders

    return load_tiny_encoders(files["vae"], files["clip"])


def node_cache(folder: Path, encoders, **options):
    """The CacheLatents node's cache of `folder` (in-process, one thread as each rank has: CPU matmuls
    round differently with other thread counts); options: the node's optional inputs."""
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (out,) = PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False,
                                               **options)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def clip_vision_file(comfy_root, tmp_path_factory) -> str:
    """A CLIP-vision file with seeded random weights that ComfyUI's loader (comfy.clip_vision.load, what
    Load CLIP Vision runs) accepts. It picks a bundled config by the number of layers it finds, so no tiny
    file loads: this is its smallest layout, ViT-L/14 at 224 px (0.3 B parameters, 581 MiB in fp16)."""
    from family_configs import init_weights
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy
    from safetensors.torch import save_file

    import_comfy(comfy_root)
    import comfy.clip_vision

    config = Path(comfy.clip_vision.__file__).parent / "clip_vision_config_vitl.json"
    model = comfy.clip_vision.ClipVisionModel(str(config))
    init_weights(model.model, seed=0)
    path = tmp_path_factory.mktemp("clip_vision") / "vit_l_random.safetensors"
    save_file({k: v.contiguous() for k, v in model.model.state_dict().items()}, str(path))
    return str(path)


@pytest.fixture
def folder(tmp_path) -> Path:
    """5 images (two sharing a caption, cached by different ranks), one empty file the scan rejects, and
    one that passes the scan but fails to decode (item 1: rank 1's on 2 ranks)."""
    from tools.tiny_assets import write_tiny_dataset

    folder = tmp_path / "set"
    write_tiny_dataset(str(folder), n=5, size=64, seed=3)
    (folder / "image_004.txt").write_text((folder / "image_001.txt").read_text())  # a repeated caption
    (folder / "empty.png").write_bytes(b"")
    (folder / "image_000_damaged.png").write_bytes(png_bytes(64, 64, 8, 2, idat=b"\x78\x9c" + os.urandom(300)))
    return folder


def write_config(tmp_path: Path, comfy_root: str, files: dict, processes: int, **extra) -> Path:
    path = tmp_path / f"cache-{processes}.json"
    data = {"comfyui_root": comfy_root, "dataset": {"folders": ["set"], "resolution": 64},  # relative to the config
            "vae": files["vae"], "clip": files["clip"], "processes": processes, **extra}
    path.write_text(json.dumps(data))
    return path


def run_cache(config: Path, timeout: float = 300) -> str:
    """`python -m engine cache --config ...` from the pack root, as a user types it; returns its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "engine", "cache", "--config", str(config)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def snapshot(cache_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted((cache_dir / "shards").iterdir())}


def header(cache_dir: Path) -> dict:
    """The manifest without what names files (shard files group items by rank: 2 ranks write 2 or more)."""
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    return {k: v for k, v in manifest.items() if k not in ("metadata", "shards")}


@pytest.mark.slow
def test_two_ranks_make_the_nodes_cache_and_training_reads_it(tmp_path, comfy_root, demo_base, files, encoders,
                                                               folder):
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=2))
    assert "6 item(s) on 2 rank(s)" in out and "5 encoded" in out
    # both kinds of broken file are named: the one the scan rejects and the one that fails to decode (rank 1's)
    assert "empty.png is empty (0 bytes)" in out
    assert "1 image(s) could not be used and are left out of the cache" in out
    assert "image_000_damaged.png is damaged or unsupported" in out
    (cache_dir,) = [p for p in (folder / CACHE_FOLDER).iterdir() if p.is_dir()]  # beside: file_digests.json
    engine_copy = tmp_path / "engine-cache"
    shutil.move(cache_dir, engine_copy)  # out of the way, so the node finds nothing to reuse

    node = node_cache(folder, encoders)
    assert Path(node.cache_dir) == cache_dir and node.count == 5  # same fingerprint folder: same encoder identity
    assert header(engine_copy) == header(cache_dir)
    node_ds, engine_ds = CachedDataset(cache_dir), CachedDataset(engine_copy)
    columns = [c for c in store.COLUMNS if c != "shard"]
    assert node_ds.table.select_columns(columns).to_list() == engine_ds.table.select_columns(columns).to_list()
    for i in range(len(node_ds)):
        item_n, item_e = node_ds[i], engine_ds[i]
        assert item_n.keys() == item_e.keys() and item_n["extras"].keys() == item_e["extras"].keys()
        for key in ("latent", "cross_attn"):
            assert torch.equal(item_e[key], item_n[key]), f"item {i} {key}"
        for key, value in item_n["extras"].items():
            assert torch.equal(item_e["extras"][key], value) if torch.is_tensor(value) else item_e["extras"][key] == value

    # a second run over the unchanged set (and the node's cache) encodes nothing and leaves every file as it is
    before, manifest = snapshot(cache_dir), (cache_dir / MANIFEST).read_bytes()
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=2))
    assert "5 item(s) reused, 0 copied from the previous cache, 0 encoded" in out
    assert snapshot(cache_dir) == before and (cache_dir / MANIFEST).read_bytes() == manifest

    run = run_to_end(make_config(tmp_path / "run", comfy_root, demo_base, str(cache_dir), steps=1, batch_size=1))
    assert len(run.losses()) == 1 and run.losses()[0] == run.losses()[0]  # trained a step on it (no NaN)


def test_one_process_runs_in_place_and_resumes_the_nodes_cache(tmp_path, comfy_root, files, encoders, folder,
                                                                monkeypatch):
    """processes 1 runs without a launcher; it finds a cache the node left partial (a cancelled run:
    one shard and the manifest missing) by the same fingerprint, and encodes only what is missing."""
    monkeypatch.setattr(store, "SHARD_ITEMS", 2)  # shards of 2 items, in the node and (below) in the engine
    monkeypatch.setenv("PIPETRAIN_CACHE_SHARD_ITEMS", "2")
    node = node_cache(folder, encoders)
    manifest = (Path(node.cache_dir) / MANIFEST).read_bytes()
    (Path(node.cache_dir) / MANIFEST).unlink()
    stored = store.scan_shards(node.cache_dir)
    lost = [i for i, name in stored.items() if name == stored[2]]
    (Path(node.cache_dir) / "shards" / stored[2]).unlink()
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=1))
    assert "6 item(s) on 1 rank(s)" in out
    assert f"{5 - len(lost)} item(s) reused, 0 copied from the previous cache, {len(lost)} encoded" in out
    assert (Path(node.cache_dir) / MANIFEST).read_bytes() == manifest


def test_one_process_caches_each_chained_dataset_as_the_node_does(tmp_path, comfy_root, files, encoders, folder):
    """dataset.more: every dataset cached on its own, in its own folder, with the fingerprint the node's chain of
    LoadDataset nodes (add_to) gives it: the node then reuses all of them."""
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset
    from tools.tiny_assets import write_tiny_dataset

    write_tiny_dataset(str(tmp_path / "other"), n=3, size=128, seed=4)
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=1,
                                 dataset={"folders": ["set"], "resolution": 64,
                                          "more": [{"folders": ["other"], "resolution": 128, "caption_prefix": "x, "}]}))
    assert "dataset 1 (set) of 2" in out and "dataset 2 (other) of 2" in out
    assert "6 item(s) on 1 rank(s)" in out and "3 item(s) on 1 rank(s)" in out
    made = {p.parents[2].name: json.loads(p.read_text())
            for p in tmp_path.glob(f"*/{CACHE_FOLDER}/*/{MANIFEST}")}
    assert sorted(made) == ["other", "set"] and made["other"]["latent_shape"][-2:] == [16, 16]
    assert made["other"]["dataset"]["caption_prefix"] == "x, " and "more" not in made["set"]["dataset"]
    (first,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
    (chain,) = PipeTrainLoadDataset().load(folders=str(tmp_path / "other"), resolution=128, repeats=1,
                                           caption_prefix="x, ", add_to=first)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, lines, _ = PipeTrainCacheLatents().encode(chain, encoders[0], encoders[1], regenerate=False)
    finally:
        torch.set_num_threads(threads)
    assert [p.fingerprint for p in spec.parts] == [made["set"]["fingerprint"], made["other"]["fingerprint"]]
    assert any(line.startswith("dataset 2 (other): 3 item(s) reused") for line in lines), lines


@pytest.mark.slow
def test_two_ranks_cache_clip_vision_as_the_node_does(tmp_path, comfy_root, files, encoders, clip_vision_file):
    """clip_vision in the cache config: every rank loads the file with ComfyUI's CLIP-vision loader and
    stores each item's encoding, the tensors the CacheLatents node stores with that model connected."""
    import comfy.clip_vision
    from PipeTrain.engine.data.images import load_image
    from tools.tiny_assets import write_tiny_dataset

    folder = tmp_path / "set"
    write_tiny_dataset(str(folder), n=2, size=64, seed=5)
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=2, clip_vision=clip_vision_file,
                                 clip_vision_crop="none"))
    assert "2 item(s) on 2 rank(s)" in out and "0 copied from the previous cache, 2 encoded" in out  # one per rank
    (cache_dir,) = [p for p in (folder / CACHE_FOLDER).iterdir() if p.is_dir()]  # beside: file_digests.json
    engine_copy = tmp_path / "engine-cache"
    shutil.move(cache_dir, engine_copy)  # out of the way, so the node finds nothing to reuse

    vision = comfy.clip_vision.load(clip_vision_file)  # what Load CLIP Vision gives the node
    node = node_cache(folder, encoders, clip_vision=vision, clip_vision_crop="none")
    # the same folder and manifest: the identity covers the vision model's weights and the crop setting
    assert Path(node.cache_dir) == cache_dir and header(engine_copy) == header(cache_dir)
    assert header(cache_dir)["encoders"]["clip_vision"]["crop"] is False
    node_ds, engine_ds = CachedDataset(cache_dir), CachedDataset(engine_copy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(len(node_ds)):
            stored = engine_ds[i]["extras"]
            for key in (PENULTIMATE, LAST):
                assert torch.equal(stored[key], node_ds[i]["extras"][key]), f"item {i} {key}"
            image = torch.from_numpy(load_image(str(folder / engine_ds[i]["source"]), (64, 64))).unsqueeze(0)
            with torch.no_grad():
                expected = vision.encode_image(image, crop=False)  # CLIPVisionEncode with crop "none"
            torch.testing.assert_close(stored[PENULTIMATE], expected.penultimate_hidden_states[0])
            torch.testing.assert_close(stored[LAST], expected.last_hidden_state[0])
    finally:
        torch.set_num_threads(threads)
    assert engine_ds[0]["extras"][PENULTIMATE].shape == (257, 1024)  # ViT-L/14: class token + 16x16 patches
    assert not torch.equal(engine_ds[0]["extras"][PENULTIMATE], engine_ds[1]["extras"][PENULTIMATE])


def test_config_errors_name_the_setting_before_any_rank_starts(tmp_path, comfy_root, files, folder):
    base = json.loads(write_config(tmp_path, comfy_root, files, processes=2).read_text())

    def error(**change) -> str:
        with pytest.raises(ConfigError) as e:
            CacheConfig.from_dict({**base, **change}, str(tmp_path))
        return str(e.value)

    assert "vae: the file" in error(vae="missing.safetensors") and "models/vae" in error(vae="missing.safetensors")
    assert ", wan," in error(clip_type="no_such_type") and "clip_type" in error(clip_type="no_such_type")
    assert "dataset.folders[0]: the folder" in error(dataset={"folders": ["nowhere"], "resolution": 64})
    assert "resolution is 65" in error(dataset={"folders": ["set"], "resolution": 65})
    assert "unknown setting(s) in the cache config: procesess" in error(procesess=2)
    assert "no text encoder" in error(clip=[])
    assert "gpu_ids lists 1 GPUs but processes is 2" in error(gpu_ids="0")
    missing_vision = error(clip_vision="missing.safetensors")
    assert "clip_vision: the file" in missing_vision and "models/clip_vision" in missing_vision
    assert "clip_vision_crop 'left'" in error(clip_vision=files["vae"], clip_vision_crop="left")
    assert "clip_vision_crop is set but clip_vision is not" in error(clip_vision_crop="none")
    assert "first_frame_style 'wan' is not a first-frame style: use one of wan_concat, start_frame_concat" in error(
        first_frame_conditioning=True, first_frame_style="wan")
    assert "first_frame_style is set but first_frame_conditioning is not" in error(first_frame_style="clean_first_frame")
    assert "control_style 'ref': use 'reference_latents' or 'concat_latent_image'" in error(control_style="ref")
    assert CacheConfig.from_dict({**base, "first_frame_conditioning": True, "first_frame_style": "clean_first_frame"},
                                 str(tmp_path)).first_frame == "clean_first_frame"
    cfg = CacheConfig.from_dict(base, str(tmp_path))  # relative folders are read against the config's folder
    assert cfg.dataset.folders[0].path == str(folder) and cfg.clip == (files["clip"],)
    # a bare name is also looked up the way ComfyUI lists models: <models>/vae/<name>
    (tmp_path / "models" / "vae").mkdir(parents=True)
    shutil.copyfile(files["vae"], tmp_path / "models" / "vae" / "listed.safetensors")
    assert model_file("listed.safetensors", str(folder), str(tmp_path / "models"), MODEL_FOLDERS["vae"]) == \
        str(tmp_path / "models" / "vae" / "listed.safetensors")
    # a CLIP-vision file by name from <comfyui_root>/models/clip_vision, as Load CLIP Vision lists it
    fake_root = tmp_path / "ComfyUI"
    (fake_root / "comfy").mkdir(parents=True)
    shutil.copyfile(Path(comfy_root) / "comfy" / "sd.py", fake_root / "comfy" / "sd.py")
    (fake_root / "models" / "clip_vision").mkdir(parents=True)
    shutil.copyfile(files["vae"], fake_root / "models" / "clip_vision" / "vision.safetensors")
    listed = CacheConfig.from_dict({**base, "comfyui_root": str(fake_root), "clip_vision": "vision.safetensors"},
                                   str(tmp_path))
    assert listed.clip_vision == str(fake_root / "models" / "clip_vision" / "vision.safetensors")
    # a file that is no CLIP-vision model ComfyUI knows is refused by name when a rank loads it
    from PipeTrain.engine.cache.cli import load_clip_vision
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    with pytest.raises(ConfigError, match="clip_vision: .* is not a CLIP-vision model ComfyUI can load"):
        load_clip_vision(listed)

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**base, "clip": "missing-clip.safetensors"}))
    proc = subprocess.run([sys.executable, "-m", "engine", "cache", "--config", str(bad)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "error: clip: the file" in proc.stderr
    assert "PipeTrain cache:" not in proc.stdout  # stopped before any rank started


def test_encoders_other_than_the_expected_ones_stop_before_encoding(tmp_path, comfy_root, files, folder):
    """expect_identity (what CacheLatents with gpus above 1 sets to its graph's encoders): files that load as
    other encoders stop the command before any item is encoded."""
    config = write_config(tmp_path, comfy_root, files, processes=1, expect_identity='{"vae":"another"}')
    proc = subprocess.run([sys.executable, "-m", "engine", "cache", "--config", str(config)], cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the encoders loaded from the files are not the ones expected" in proc.stderr
    assert 'expected {"vae":"another"}' in proc.stderr and "gpus 1" in proc.stderr
    assert not (folder / CACHE_FOLDER).exists()
