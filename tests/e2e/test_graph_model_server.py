"""Train Pipeline's `model` input through a real ComfyUI server (POST /prompt): connected to the MODEL of a
UNETLoader through a LoraLoaderModelOnly, the run trains that file with that LoRA stack (run.json's model_path
and base_loras, the LoRA's metadata); a node in the chain the training processes cannot rebuild from files
is refused by name before any process starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from random_lora import write_random_lora
from tools.comfy_server import ComfyError
from tools.demo import training_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]


def _train_node(prompt: dict) -> dict:
    return next(n for n in prompt.values() if n["class_type"] == "PipeTrainTrainPipeline")


def _stacked_prompt(demo_base, run_name: str, lora_name: str) -> dict:
    prompt = training_prompt(demo_base, steps=2, processes=1, run_name=run_name)
    unet = next(k for k, n in prompt.items() if n["class_type"] == "UNETLoader")
    prompt["91"] = {"class_type": "LoraLoaderModelOnly",
                    "inputs": {"model": [unet, 0], "lora_name": lora_name, "strength_model": 0.7}}
    _train_node(prompt)["inputs"]["model"] = ["91", 0]
    return prompt


@pytest.fixture(scope="module")
def downloaded_lora(demo_base) -> str:
    models = Path(demo_base["base_dir"]) / "models"
    folder = models / "loras" / "downloaded"
    folder.mkdir(parents=True, exist_ok=True)
    write_random_lora(str(models / "diffusion_models" / demo_base["unet"]), folder / "style.safetensors")
    return "downloaded/style.safetensors"


def test_the_graphs_model_and_lora_stack_are_what_trains(comfy_server, demo_base, downloaded_lora):
    comfy_server.run(_stacked_prompt(demo_base, "graph_model_run", downloaded_lora), timeout=600)
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "graph_model_run"
    cfg = json.loads((run_dir / "run.json").read_text())
    models = Path(demo_base["base_dir"]) / "models"
    assert Path(cfg["model_path"]) == models / "diffusion_models" / demo_base["unet"]
    assert cfg["base_loras"] == [{"path": str(models / "loras" / downloaded_lora), "strength": 0.7}]
    with safe_open(str(run_dir / "lora" / "lora_final.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["pipetrain_base_loras"]) == [["style.safetensors", 0.7]]


def test_a_model_patch_the_processes_cannot_rebuild_is_refused_before_training(comfy_server, demo_base,
                                                                               downloaded_lora):
    prompt = _stacked_prompt(demo_base, "graph_model_refused", downloaded_lora)
    prompt["92"] = {"class_type": "ModelSamplingDiscrete",
                    "inputs": {"model": ["91", 0], "sampling": "eps", "zsnr": False}}
    _train_node(prompt)["inputs"]["model"] = ["92", 0]
    with pytest.raises(ComfyError, match="Train Pipeline's model comes through ModelSamplingDiscrete, which the "
                                         "training processes cannot rebuild"):
        comfy_server.run(prompt, timeout=300)
    assert not (Path(demo_base["base_dir"]) / "output" / "pipetrain" / "graph_model_refused").exists()
