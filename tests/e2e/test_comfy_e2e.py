"""The six nodes in a real ComfyUI server, driven through POST /prompt like the browser does."""
from __future__ import annotations

import copy
import logging
import shutil
import time
from pathlib import Path

import pytest
import requests

from tools.comfy_server import ComfyError, ComfyInterrupted
from engine_runs import engine_processes
from tools.demo import demo_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]

NODES = ["PipeTrainLoadDataset", "PipeTrainCacheLatents", "PipeTrainConfigureLoRA", "PipeTrainMemoryOptions",
         "PipeTrainObjectiveOptions",
         "PipeTrainTrainPipeline", "PipeTrainSaveLoRA"]


def _node(prompt: dict, class_type: str) -> dict:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def _prompt(demo_base, run_name, steps=20, processes=2, **train):
    prompt = demo_prompt(demo_base, steps=steps, processes=processes, run_name=run_name)
    _node(prompt, "PipeTrainTrainPipeline").update(train)
    _node(prompt, "PipeTrainSaveLoRA")["name"] = run_name
    return prompt


def _training_only(prompt: dict) -> dict:
    """Keep the graph up to TrainPipeline (an output node), dropping SaveLoRA and the samplers."""
    keep = {"1", "2", "3", "4", "5", "6", "7", "8", "23"}
    return {k: v for k, v in prompt.items() if k in keep}


def _run_dir(demo_base, run_name) -> Path:
    return Path(demo_base["base_dir"]) / "output" / "pipetrain" / run_name


def test_nodes_register_with_tooltips(comfy_server):
    assert not comfy_server.import_failed(), comfy_server.log_tail()
    for name in NODES:
        info = comfy_server.object_info(name)
        assert info, f"{name} is not registered:\n{comfy_server.log_tail()}"
        assert info["category"] == "PipeTrain"
        for section in ("required", "optional"):
            for input_name, spec in info["input"].get(section, {}).items():
                assert len(spec) > 1 and spec[1].get("tooltip"), f"{name}.{input_name} has no tooltip"
        assert all(t.startswith("PIPETRAIN_") or t in ("MODEL", "STRING") for t in info["output"])


def test_example_workflow_trains_and_the_lora_changes_the_image(comfy_server, demo_base, comfy_root):
    entry = comfy_server.run(_prompt(demo_base, "e2e"), timeout=600)
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any("trained 20/20 steps" in t for t in texts), texts
    lora_file = Path(demo_base["base_dir"]) / "models" / "loras" / "pipetrain" / "e2e.safetensors"
    assert lora_file.is_file()
    assert any(t == "saved pipetrain/e2e.safetensors" for t in texts), texts

    images = {Path(p).name.split("_0")[0]: Path(p).read_bytes() for p in comfy_server.image_paths(entry)}
    assert images["with_lora"] != images["without_lora"], "the LoRA did not change the sampled image"

    events = (_run_dir(demo_base, "e2e") / "events.jsonl").read_text()
    assert '"world_size": 2' in events

    # ComfyUI's own loader applies every key of the file (it logs the keys it cannot place).
    from engine.launch.comfy_bootstrap import import_comfy
    import_comfy(comfy_root)
    import comfy.lora
    import comfy.sd
    import comfy.utils

    model = comfy.sd.load_diffusion_model(str(Path(demo_base["base_dir"]) / "models" / "diffusion_models" /
                                              demo_base["unet"]))
    lora = comfy.utils.load_torch_file(str(lora_file), safe_load=True)
    key_map = comfy.lora.model_lora_keys_unet(model.model, {})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        patches = comfy.lora.load_lora(lora, key_map)
    finally:
        logging.getLogger().removeHandler(handler)
    unmatched = [r.getMessage() for r in records if "not loaded" in r.getMessage()]
    assert not unmatched, unmatched[:5]
    assert len(patches) == sum(1 for k in lora if k.endswith(".lora_A.weight"))


def test_cancel_stops_training_within_10_seconds(comfy_server, demo_base):
    prompt = _training_only(_prompt(demo_base, "cancel_me", steps=100_000, checkpoint_every=0))
    prompt_id = comfy_server.queue(prompt)
    events = _run_dir(demo_base, "cancel_me") / "events.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and '"event": "step", "time"' not in (events.read_text() if events.exists() else ""):
        time.sleep(0.2)
    assert events.exists(), comfy_server.log_tail()
    pressed = time.time()
    comfy_server.interrupt()
    with pytest.raises(ComfyInterrupted):
        comfy_server.wait(prompt_id, timeout=60)
    took = time.time() - pressed
    assert took < 10, f"Cancel took {took:.1f} s"
    assert not engine_processes(str(_run_dir(demo_base, "cancel_me"))), "a rank outlived Cancel"
    assert (_run_dir(demo_base, "cancel_me") / "checkpoints" / "latest").is_file(), "Cancel left no checkpoint"
    # A Cancel is ComfyUI's own interrupt, not an error of the node: ComfyUI 0.33+ lists the job as cancelled.
    jobs = requests.get(f"{comfy_server.url}/api/jobs", timeout=30)
    if jobs.status_code != 404:  # ComfyUI 0.3.75 has no jobs API (its history has execution_interrupted)
        status = {job["id"]: job["status"] for job in jobs.json()["jobs"]}
        assert status.get(prompt_id) == "cancelled", status


def test_a_crashing_rank_becomes_a_node_error_with_the_log(comfy_server, demo_base, tmp_path):
    # A private copy of the dataset so the corrupted cache below affects this test only.
    dataset = tmp_path / "crash_dataset"
    shutil.copytree(demo_base["dataset"], dataset, ignore=shutil.ignore_patterns(".pipetrain_cache"))
    prompt = _training_only(_prompt(demo_base, "crash", steps=1, processes=2))
    _node(prompt, "PipeTrainLoadDataset")["folders"] = str(dataset)
    comfy_server.run(prompt, timeout=300)
    for item in dataset.glob(".pipetrain_cache/*/*/*.safetensors"):  # shards/ (format 2) or items/ (format 1)
        item.write_bytes(item.read_bytes()[:64])  # the real fault: damaged cache files
    again = copy.deepcopy(prompt)
    _node(again, "PipeTrainTrainPipeline")["steps"] = 2  # re-runs training; the cache node is reused
    with pytest.raises(ComfyError) as err:
        comfy_server.run(again, timeout=300)
    message = str(err.value)
    assert "training failed (exit code" in message
    assert "cannot be read" in message and "regenerate" in message
    assert "Last lines of train.log" in message


@pytest.mark.parametrize("change,needle", [
    (("PipeTrainLoadDataset", "folders", "no_such_folder_xyz"), "no_such_folder_xyz"),
    (("PipeTrainSaveLoRA", "name", "../escape"), "not allowed"),
    (("PipeTrainTrainPipeline", "run_name", "../x"), "run_name"),
])
def test_bad_inputs_give_clear_errors(comfy_server, demo_base, change, needle):
    prompt = _prompt(demo_base, "bad_inputs", steps=1, processes=1)
    node, key, value = change
    _node(prompt, node)[key] = value
    with pytest.raises(ComfyError, match=needle.replace(".", r"\.")):
        comfy_server.run(prompt, timeout=300)


def test_empty_dataset_folder_is_reported(comfy_server, demo_base, tmp_path):
    empty = tmp_path / "empty_dataset"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here")
    prompt = _prompt(demo_base, "empty", steps=1, processes=1)
    _node(prompt, "PipeTrainLoadDataset")["folders"] = str(empty)
    with pytest.raises(ComfyError, match="empty_dataset"):
        comfy_server.run(prompt, timeout=120)


def test_unknown_model_file_is_refused_before_running(comfy_server, demo_base):
    prompt = _training_only(_prompt(demo_base, "unknown_model", steps=1, processes=1))
    _node(prompt, "PipeTrainTrainPipeline")["model_name"] = "does-not-exist.safetensors"
    with pytest.raises(ComfyError, match="does-not-exist.safetensors"):
        comfy_server.queue(prompt)
