"""Two LoadDataset nodes chained through add_to, at different resolutions, in a real ComfyUI server:
Cache Latents caches each on its own, Train Pipeline trains one sample stream of both (POST /prompt)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import requests

from tools.comfy_server import ComfyError
from tools.demo import training_prompt
from tools.tiny_dataset import write_tiny_dataset

pytestmark = [pytest.mark.slow]


def _chained(demo_base, tmp_path, run_name: str, second: dict) -> tuple[dict, dict]:
    """The demo's training graph with its dataset (a copy) joined by a second LoadDataset node."""
    prompt = training_prompt(demo_base, steps=7, processes=1, run_name=run_name, batch_size=2, sample_prompts="")
    ids = {v["class_type"]: k for k, v in prompt.items()}
    first = tmp_path / "first"
    shutil.copytree(demo_base["dataset"], first, ignore=shutil.ignore_patterns(".pipetrain_cache"))
    prompt[ids["PipeTrainLoadDataset"]]["inputs"]["folders"] = str(first)
    prompt["90"] = {"class_type": "PipeTrainLoadDataset",
                    "inputs": {"resolution": 128, "repeats": 2, "add_to": [ids["PipeTrainLoadDataset"], 0], **second}}
    prompt[ids["PipeTrainCacheLatents"]]["inputs"]["dataset"] = ["90", 0]
    return prompt, ids


def test_two_chained_datasets_at_two_resolutions_cache_apart_and_train_in_one_stream(comfy_server, demo_base,
                                                                                      tmp_path):
    second = tmp_path / "second"
    write_tiny_dataset(str(second), n=3, size=128, seed=5)
    prompt, ids = _chained(demo_base, tmp_path, "chained", {"folders": str(second)})
    entry = comfy_server.run(prompt, timeout=600)
    report = entry["outputs"][ids["PipeTrainCacheLatents"]]["text"]
    assert any(line.startswith("dataset 1 (first): ") for line in report), report
    assert any(line.startswith("dataset 2 (second): ") and "encoded" in line for line in report), report
    assert entry["outputs"]["90"]["text"][0].startswith("dataset 2 (second) joins 1 dataset(s)")

    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "chained"
    run = json.loads((run_dir / "run.json").read_text())
    caches = [run["cache_dir"], *run["more_cache_dirs"]]
    assert len(caches) == 2
    assert Path(caches[0]).parent == tmp_path / "first" / ".pipetrain_cache"
    assert Path(caches[1]).parent == second / ".pipetrain_cache"
    shapes = [json.loads((Path(c) / "manifest.json").read_text())["latent_shape"] for c in caches]
    assert [s[-2:] for s in shapes] == [[8, 8], [16, 16]]  # 64 px and 128 px through the tiny VAE (/8)

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "started")
    # one epoch: 8 images of the first (repeats 1) + 3 of the second x 2 repeats, in runs of 2 of one dataset
    # only; 7 steps of batch 2 train every position of it, so every item of both datasets trained
    assert started["samples"] == 8 + 3 * 2 and started["total"] == 7
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 7 and all(math.isfinite(x) for x in losses)
    assert any(e["event"] == "done" for e in events)


def test_a_folder_in_both_chained_datasets_is_refused_before_anything_is_cached(comfy_server, demo_base, tmp_path):
    prompt, ids = _chained(demo_base, tmp_path, "chained_twice", {"folders": str(tmp_path / "first")})
    with pytest.raises(ComfyError, match="each folder may belong to one dataset only"):
        comfy_server.run(prompt, timeout=300)
    assert not (tmp_path / "first" / ".pipetrain_cache").exists()


def test_chained_datasets_cache_on_two_processes_each(comfy_server, demo_base, tmp_path):
    """Cache Latents' gpus input: each chained dataset is encoded by the engine's cache mode on its own."""
    second = tmp_path / "second"
    write_tiny_dataset(str(second), n=3, size=128, seed=6)
    prompt, ids = _chained(demo_base, tmp_path, "chained_gpus", {"folders": str(second)})
    prompt[ids["PipeTrainCacheLatents"]]["inputs"]["gpus"] = 2
    prompt[ids["PipeTrainTrainPipeline"]]["inputs"]["batch_size"] = 256  # stops right after caching
    prompt_id = comfy_server.queue(prompt)
    with pytest.raises(ComfyError, match="batch_size is 256"):
        comfy_server.wait(prompt_id, timeout=600)
    history = requests.get(f"{comfy_server.url}/history/{prompt_id}", timeout=30).json()[prompt_id]
    report = history["outputs"][ids["PipeTrainCacheLatents"]]["text"]
    for name, count in (("first", 8), ("second", 3)):
        assert any(line.startswith(f"dataset {1 if name == 'first' else 2} ({name}): encoded on 2 processes: ")
                   and f"{count} encoded" in line for line in report), report
        assert len(list((tmp_path / name / ".pipetrain_cache").glob("*/manifest.json"))) == 1
