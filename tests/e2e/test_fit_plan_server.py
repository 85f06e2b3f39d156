"""Memory plan 'fit' through a real ComfyUI server (POST /prompt, as the browser sends it): the Memory Options
node's plan inputs reach the ranks, and Train Pipeline's text says what the plan chose and its prediction."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.demo import demo_prompt

pytestmark = pytest.mark.slow


def _node(prompt: dict, class_type: str) -> dict:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def test_a_fit_plan_is_chosen_on_the_ranks_and_shown_by_train_pipeline(comfy_server, demo_base):
    prompt = demo_prompt(demo_base, steps=2, processes=1, run_name="fit_plan")
    keep = {"1", "2", "3", "4", "5", "6", "7", "8", "23"}  # up to Train Pipeline: no Save LoRA, no samplers
    prompt = {k: v for k, v in prompt.items() if k in keep}
    _node(prompt, "PipeTrainMemoryOptions").update(plan="fit", vram_gib=8.0, vram_margin=0.1)
    entry = comfy_server.run(prompt, timeout=600)
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any("trained 2/2 steps" in t and "fit to VRAM (8.0 GiB per GPU, 10% kept free" in t
               and "predicted peak" in t and "s/step" in t for t in texts), texts
    events = [json.loads(line) for line in
              (Path(demo_base["base_dir"]) / "output" / "pipetrain" / "fit_plan" / "events.jsonl").read_text().splitlines()]
    plans = [e for e in events if e["event"] == "memory_plan"]
    assert len(plans) == 1 and plans[0]["chosen"]["checkpointing"] == "off", plans  # 8 GiB: far more than needed
    assert [e["step"] for e in events if e["event"] == "memory_plan_check"] == [1]
