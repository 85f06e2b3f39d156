"""PipeTrain LoRA Grid through a real ComfyUI server (POST /prompt): after a run that saved steps 2 and 4, the
grid holds one row per saved LoRA and one column per strength, each cell sampled with the graph's model,
prompt and sampler: strength 0 is the same model in every row, strength 1 differs from it and between steps."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tools.demo import demo_prompt, training_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]
CELL, LABEL, HEADER, GAP = 64, 70, 24, 4  # nodes/plot_draw.py grid_image's layout at cell_size 64


def test_the_grid_has_a_row_per_saved_step_and_a_column_per_strength(comfy_server, demo_base):
    prompt = training_prompt(demo_base, steps=4, processes=1, run_name="lora_grid_run", save_every=2,
                             learning_rate=5e-3, sample_prompts="")
    full = demo_prompt(demo_base, steps=4, processes=1, run_name="lora_grid_run")
    for node_id in ("10", "11", "12"):  # the example's prompt, negative prompt and empty latent
        prompt[node_id] = full[node_id]
    prompt["40"] = {"class_type": "PipeTrainLoRAGrid", "inputs": {
        "run": ["8", 0], "model": ["1", 0], "positive": ["10", 0], "negative": ["11", 0], "latent_image": ["12", 0],
        "vae": ["2", 0], "seed": 42, "steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
        "strengths": "0, 1", "max_rows": 4, "cell_size": CELL}}
    prompt["41"] = {"class_type": "SaveImage", "inputs": {"images": ["40", 0], "filename_prefix": "lora_grid"}}
    entry = comfy_server.run(prompt, timeout=600)
    assert entry["outputs"]["40"]["text"] == ["2 saved step(s) x 2 strength(s) of run lora_grid_run"]
    (path,) = comfy_server.image_paths({"outputs": {"41": entry["outputs"]["41"]}})
    grid = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert grid.shape == (HEADER + 2 * (CELL + GAP), LABEL + 2 * (CELL + GAP), 3)

    def cell(row: int, col: int):
        y, x = HEADER + row * (CELL + GAP), LABEL + col * (CELL + GAP)
        return grid[y:y + CELL, x:x + CELL]

    assert np.array_equal(cell(0, 0), cell(1, 0)), "strength 0 is not the same model in every row"
    for row in (0, 1):
        assert np.abs(cell(row, 1) - cell(row, 0)).max() > 8, f"the LoRA of row {row} changed nothing"
    assert np.abs(cell(0, 1) - cell(1, 1)).max() > 0, "the LoRAs of steps 2 and 4 draw the same image"
