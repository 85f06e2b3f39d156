"""Issue 22 items 15 and 16 through a real ComfyUI server (POST /prompt): the dataset report of
LoadDataset and CacheLatents is in the node's ui output and in /history, and a SaveLoRA name that
is taken (overwrite off) stops the run before any training process starts.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from tools.comfy_server import ComfyError
from tools.demo import demo_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]


def _inputs(prompt: dict, class_type: str) -> dict:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def _node_id(prompt: dict, class_type: str) -> str:
    return next(k for k, n in prompt.items() if n["class_type"] == class_type)


def test_dataset_report_is_on_the_nodes_and_in_history(comfy_server, demo_base, tmp_path):
    folder = tmp_path / "reported"
    shutil.copytree(demo_base["dataset"], folder, ignore=shutil.ignore_patterns(".*"))
    (folder / "noise.jpg").write_bytes(os.urandom(500))
    (folder / "typo.txt").write_text("matches no image")
    prompt = demo_prompt(demo_base, steps=1, processes=1, run_name="reported")
    _inputs(prompt, "PipeTrainLoadDataset")["folders"] = str(folder)
    _inputs(prompt, "PipeTrainTrainPipeline")["batch_size"] = 256  # stops in TrainPipeline's checks, after caching
    prompt_id = comfy_server.queue(prompt)
    with pytest.raises(ComfyError, match="batch_size is 256"):
        comfy_server.wait(prompt_id, timeout=300)
    outputs = requests.get(f"{comfy_server.url}/history/{prompt_id}", timeout=30).json()[prompt_id]["outputs"]
    load, cache = outputs[_node_id(prompt, "PipeTrainLoadDataset")], outputs[_node_id(prompt, "PipeTrainCacheLatents")]
    assert load["text"][0].startswith("8 image(s) in 1 folder(s)") and "1 file(s) skipped (1 unreadable)" in load["text"][0]
    assert any("noise.jpg" in line and "cannot be read and are skipped" in line for line in load["text"])
    rows = {row["reason"]: row for row in load["pipetrain_report"]}
    assert rows["unreadable"]["count"] == 1 and str(folder / "noise.jpg") in rows["unreadable"]["first"][0]
    assert rows["caption_unused"] == {"reason": "caption_unused", "count": 1, "first": [str(folder / "typo.txt")]}
    assert "encoded" in cache["text"][0] and "-> " + str(folder / ".pipetrain_cache") in cache["text"][0]
    assert {row["reason"] for row in cache["pipetrain_report"]} >= {"unreadable", "caption_unused"}


def test_a_taken_lora_name_stops_the_run_before_training(comfy_server, demo_base):
    loras = Path(demo_base["base_dir"]) / "models" / "loras" / "pipetrain"
    loras.mkdir(parents=True, exist_ok=True)
    taken = loras / "taken_by_someone.safetensors"
    taken.write_bytes(b"a LoRA the user made")
    prompt = demo_prompt(demo_base, steps=200, processes=1, run_name="taken_name_run")
    save = _inputs(prompt, "PipeTrainSaveLoRA")
    save.update(name="taken_by_someone", overwrite=False)
    start = time.monotonic()
    with pytest.raises(ComfyError) as err:
        comfy_server.run(prompt, timeout=300)
    message = str(err.value)
    assert "(PipeTrainTrainPipeline)" in message and "'taken_by_someone' is taken" in message, message
    assert "turn on SaveLoRA's overwrite" in message and "Nothing was trained" in message
    runs = Path(demo_base["base_dir"]) / "output" / "pipetrain"
    assert not list(runs.glob("taken_name_run*")), "a run folder was made: training started"
    assert taken.read_bytes() == b"a LoRA the user made"
    assert time.monotonic() - start < 120


def test_save_lora_on_a_full_fine_tune_stops_the_run_before_training(comfy_server, demo_base):
    prompt = demo_prompt(demo_base, steps=200, processes=1, run_name="full_into_save_lora")
    _inputs(prompt, "PipeTrainConfigureLoRA")["adapter"] = "full"
    with pytest.raises(ComfyError) as err:
        comfy_server.run(prompt, timeout=300)
    message = str(err.value)
    assert "(PipeTrainTrainPipeline)" in message and "Connect PipeTrain Save Model instead" in message, message
    runs = Path(demo_base["base_dir"]) / "output" / "pipetrain"
    assert not list(runs.glob("full_into_save_lora*")), "a run folder was made: training started"
