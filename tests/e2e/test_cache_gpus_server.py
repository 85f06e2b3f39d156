"""CacheLatents' gpus input through a real ComfyUI server (POST /prompt): above 1, the node finds the
encoder files behind its vae and clip inputs in the queued graph, starts the engine's cache mode on that
many ranks (two gloo CPU processes here), and hands on the cache a one-process run makes: the same
tensors in the same fingerprint folder. A clip the ranks could not rebuild is refused before any starts.
"""
from __future__ import annotations

import shutil

import pytest
import requests
import torch

from tools.comfy_server import ComfyError
from tools.demo import training_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]


def _node(prompt: dict, class_type: str) -> tuple[str, dict]:
    return next((k, n) for k, n in prompt.items() if n["class_type"] == class_type)


def _cache_only(demo_base, folder, gpus: int, run_name: str) -> dict:
    """The demo's training graph on `folder`, stopped by Train Pipeline's batch check right after caching."""
    prompt = training_prompt(demo_base, steps=1, processes=1, run_name=run_name, batch_size=256)
    _node(prompt, "PipeTrainLoadDataset")[1]["inputs"]["folders"] = str(folder)
    _node(prompt, "PipeTrainCacheLatents")[1]["inputs"]["gpus"] = gpus
    return prompt


def _cache_text(server, prompt: dict) -> list[str]:
    prompt_id = server.queue(prompt)
    with pytest.raises(ComfyError, match="batch_size is 256"):
        server.wait(prompt_id, timeout=600)
    outputs = requests.get(f"{server.url}/history/{prompt_id}", timeout=30).json()[prompt_id]["outputs"]
    return outputs[_node(prompt, "PipeTrainCacheLatents")[0]]["text"]


def test_two_gpus_cache_what_one_caches(comfy_server, demo_base, tmp_path):
    from PipeTrain.engine.cache.format import CACHE_FOLDER
    from PipeTrain.engine.cache.reader import CachedDataset

    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        shutil.copytree(demo_base["dataset"], folder, ignore=shutil.ignore_patterns(".*"))
    text_one = _cache_text(comfy_server, _cache_only(demo_base, one, 1, "cache_gpus_one"))
    text_two = _cache_text(comfy_server, _cache_only(demo_base, two, 2, "cache_gpus_two"))
    assert "encoded on" not in " ".join(text_one)
    assert any(line.startswith("encoded on 2 processes: ") and "8 encoded" in line for line in text_two), text_two
    assert text_two[0].startswith("8 item(s) reused, 0 copied"), text_two  # the node read the ranks' cache

    (a,) = [p for p in (one / CACHE_FOLDER).iterdir() if p.is_dir()]
    (b,) = [p for p in (two / CACHE_FOLDER).iterdir() if p.is_dir()]
    assert a.name == b.name  # the same encoder identity and dataset: the same fingerprint
    ds_a, ds_b = CachedDataset(a), CachedDataset(b)
    assert len(ds_a) == len(ds_b) == 8
    by_source = {ds_b[i]["source"]: i for i in range(len(ds_b))}
    for i in range(len(ds_a)):
        item_a = ds_a[i]
        item_b = ds_b[by_source[item_a["source"]]]
        for key in ("latent", "cross_attn"):
            assert torch.equal(item_a[key], item_b[key]), f"{item_a['source']} {key}"


def test_a_clip_the_ranks_cannot_rebuild_is_refused_before_they_start(comfy_server, demo_base, tmp_path):
    folder = tmp_path / "skipped"
    shutil.copytree(demo_base["dataset"], folder, ignore=shutil.ignore_patterns(".*"))
    prompt = _cache_only(demo_base, folder, 2, "cache_gpus_refused")
    clip_id, _ = _node(prompt, "CLIPLoader")
    prompt["90"] = {"class_type": "CLIPSetLastLayer", "inputs": {"clip": [clip_id, 0], "stop_at_clip_layer": -2}}
    _node(prompt, "PipeTrainCacheLatents")[1]["inputs"]["clip"] = ["90", 0]
    with pytest.raises(ComfyError, match="CacheLatents' clip comes from CLIPSetLastLayer, which the GPU processes "
                                         "cannot rebuild from files.*set gpus to 1"):
        comfy_server.wait(comfy_server.queue(prompt), timeout=300)
    assert not (folder / ".pipetrain_cache").exists()  # nothing was encoded
