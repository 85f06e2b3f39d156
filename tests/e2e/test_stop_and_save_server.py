"""Stop & save through a real ComfyUI server: POST /pipetrain/finish with the Train Pipeline node's id ends its
run after the current step as a finished run, so the node returns normally and the rest of the graph (Save LoRA,
the test samplers) runs; the prompt completes without an error. A node with no run training gets a 404. With
Wan 2.2 Experts one after the other, each press ends the expert run training at that moment."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import requests

from engine_runs import engine_processes
from tools.demo import demo_prompt, training_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]

TOTAL = 100_000  # only Stop & save ends these runs within the tests' time


def _run_dir(demo_base, run_name: str) -> Path:
    return Path(demo_base["base_dir"]) / "output" / "pipetrain" / run_name


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def _wait_for(comfy_server, run_dir: Path, kind: str = "step", timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(e.get("event") == kind for e in _events(run_dir)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {kind} event in {run_dir} within {timeout} s:\n{comfy_server.log_tail()}")


def _finish(comfy_server, node: str) -> requests.Response:
    return requests.post(f"{comfy_server.url}/pipetrain/finish", json={"node": node}, timeout=30)


def test_stop_and_save_ends_the_run_as_finished_and_the_graph_goes_on(comfy_server, demo_base):
    name = "stop_and_save"
    prompt = demo_prompt(demo_base, steps=TOTAL, processes=2, run_name=name)
    train_id = next(k for k, v in prompt.items() if v["class_type"] == "PipeTrainTrainPipeline")
    next(v["inputs"] for v in prompt.values() if v["class_type"] == "PipeTrainSaveLoRA")["name"] = name
    # the graph's Sample Grid needs a sample of the run: one every 2 steps
    next(v["inputs"] for v in prompt.values() if v["class_type"] == "PipeTrainTrainOptions")["sample_every"] = 2
    assert _finish(comfy_server, train_id).status_code == 404  # nothing runs yet
    prompt_id = comfy_server.queue(prompt)
    run_dir = _run_dir(demo_base, name)
    _wait_for(comfy_server, run_dir, "sample")

    answer = _finish(comfy_server, train_id)
    assert answer.status_code == 200 and answer.json() == {"ok": True, "run": name}, answer.text
    entry = comfy_server.wait(prompt_id, timeout=300)  # returns normally: no interrupt, no error
    jobs = requests.get(f"{comfy_server.url}/api/jobs", timeout=30)
    if jobs.status_code != 404:  # ComfyUI 0.33+ lists the job as completed (a Cancel is listed as cancelled)
        assert {job["id"]: job["status"] for job in jobs.json()["jobs"]}.get(prompt_id) == "completed", jobs.text

    done = [e for e in _events(run_dir) if e["event"] == "done"]
    assert len(done) == 1 and done[0]["total"] == TOTAL, done
    step = done[0]["step"]
    assert 0 < step < TOTAL
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any(t.startswith(f"{name}: ended early at {step}/{TOTAL} steps") and
               f"stopped by Stop & save at step {step} of {TOTAL}: this step's LoRA is the final one" in t
               for t in texts), texts
    assert f"saved pipetrain/{name}.safetensors" in texts, texts  # Save LoRA ran ...
    assert (Path(demo_base["base_dir"]) / "models" / "loras" / "pipetrain" / f"{name}.safetensors").is_file()
    assert comfy_server.image_paths(entry), "the test samplers after training did not run"  # ... and so did they
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step{step:06d}"
    assert not engine_processes(str(run_dir)), "a training process outlived Stop & save"
    state = requests.get(f"{comfy_server.url}/pipetrain/run_state", params={"node": train_id}, timeout=30).json()
    assert state["status"] == "done", state["status"]

    gone = _finish(comfy_server, train_id)  # its run has ended
    assert gone.status_code == 404 and "has no PipeTrain run training now" in gone.json()["error"], gone.text
    assert _finish(comfy_server, "no-such-node").status_code == 404
    assert requests.post(f"{comfy_server.url}/pipetrain/finish", data="not json", timeout=30).status_code == 404


def test_stop_and_save_of_a_wan_experts_pair_ends_the_expert_training_now(comfy_server, demo_base):
    low = "pipetrain-tiny-unet-low-noise.safetensors"  # the tiny UNet stands in for both experts
    models = Path(demo_base["base_dir"]) / "models" / "diffusion_models"
    if not (models / low).exists():
        shutil.copyfile(models / demo_base["unet"], models / low)
    name = "stop_and_save_pair"
    prompt = training_prompt(demo_base, steps=TOTAL, processes=1, run_name=name)
    train_id = next(k for k, v in prompt.items() if v["class_type"] == "PipeTrainTrainPipeline")
    node = prompt[train_id]["inputs"]
    for key in ("model", "clip", "vae"):  # model_name is the high-noise expert; no samples: faster
        node.pop(key, None)
    node["sample_prompts"] = ""
    prompt["30"] = {"class_type": "PipeTrainWanExperts",
                    "inputs": {"low_noise_model": low, "boundary": 0.875, "order": "one_after_the_other"}}
    node["experts"] = ["30", 0]
    prompt_id = comfy_server.queue(prompt)
    for half in ("high_noise", "low_noise"):  # one press each: the run training at that moment ends
        _wait_for(comfy_server, _run_dir(demo_base, f"{name}_{half}"))
        answer = _finish(comfy_server, train_id)
        assert answer.status_code == 200 and answer.json()["run"] == f"{name}_{half}", answer.text
    entry = comfy_server.wait(prompt_id, timeout=300)
    text = next(o["text"][0] for o in entry["outputs"].values() if o.get("text"))
    for half in ("high_noise", "low_noise"):
        run_dir = _run_dir(demo_base, f"{name}_{half}")
        step = next(e["step"] for e in _events(run_dir) if e["event"] == "done")
        assert f"stopped by Stop & save at step {step} of {TOTAL}" in text, text
        assert (run_dir / "lora" / "lora_final.safetensors").is_file()
        assert not engine_processes(str(run_dir))
