"""The engine's cache mode (`python -m engine cache --config cache.json`): the CacheLatents node's
encoding, headless and on N ranks.

Real parts throughout: the tiny VAE/CLIP files loaded by ComfyUI's loaders in each rank, two gloo
ranks started by DeepSpeed's launcher, the node in-process with the same files, and the training
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
from PipeTrain.engine.cache_config import MODEL_FOLDERS, CacheConfig, model_file  # noqa: E402
import PipeTrain.engine.cache_store as store  # noqa: E402
from PipeTrain.engine.cache_format import CACHE_FOLDER, MANIFEST, CachedDataset  # noqa: E402
from PipeTrain.engine.config import ConfigError  # noqa: E402
from test_awkward_datasets import png_bytes  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def files(demo_base) -> dict:
    models = Path(demo_base["base_dir"]) / "models"
    return {"vae": str(models / "vae" / demo_base["vae"]), "clip": str(models / "text_encoders" / demo_base["clip"])}


@pytest.fixture(scope="module")
def encoders(files):
    from tools.tiny_assets import load_tiny_encoders

    return load_tiny_encoders(files["vae"], files["clip"])


def node_cache(folder: Path, encoders):
    """The CacheLatents node's cache of `folder` (in-process, one thread as each rank has: CPU matmuls
    round differently with other thread counts)."""
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (out,) = PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False)
    finally:
        torch.set_num_threads(threads)
    return out


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
    assert "1 image(s) could not be decoded and are left out of the cache" in out
    assert "image_000_damaged.png is damaged or unsupported" in out
    (cache_dir,) = (folder / CACHE_FOLDER).iterdir()
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

    # a second run over the unchanged set (and the node's cache) encodes nothing and rewrites the same manifest
    before, manifest = snapshot(cache_dir), (cache_dir / MANIFEST).read_bytes()
    out = run_cache(write_config(tmp_path, comfy_root, files, processes=2))
    assert "5 item(s) reused, 0 linked from the previous cache, 0 encoded" in out
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
    assert f"{5 - len(lost)} item(s) reused, 0 linked from the previous cache, {len(lost)} encoded" in out
    assert (Path(node.cache_dir) / MANIFEST).read_bytes() == manifest


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
    cfg = CacheConfig.from_dict(base, str(tmp_path))  # relative folders are read against the config's folder
    assert cfg.dataset.folders[0].path == str(folder) and cfg.clip == (files["clip"],)
    # a bare name is also looked up the way ComfyUI lists models: <models>/vae/<name>
    (tmp_path / "models" / "vae").mkdir(parents=True)
    shutil.copyfile(files["vae"], tmp_path / "models" / "vae" / "listed.safetensors")
    assert model_file("listed.safetensors", str(folder), str(tmp_path / "models"), MODEL_FOLDERS["vae"]) == \
        str(tmp_path / "models" / "vae" / "listed.safetensors")

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**base, "clip": "missing-clip.safetensors"}))
    proc = subprocess.run([sys.executable, "-m", "engine", "cache", "--config", str(bad)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "error: clip: the file" in proc.stderr
    assert "PipeTrain cache:" not in proc.stdout  # stopped before any rank started
