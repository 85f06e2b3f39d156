"""Both Wan 2.2 experts in one Train Pipeline (PipeTrain Wan 2.2 Experts on its experts input), through a real ComfyUI
server (POST /prompt) and real training processes: each half trains its own file on its own side of the boundary,
Save LoRA writes the named pair and applies each LoRA to its expert for two KSamplerAdvanced; at_the_same_time runs
the halves side by side on two groups of processes; what a pair cannot take is refused before any folder is made.

The tiny demo UNet stands in for both experts (the low-noise one is a copy under another name): what is tested is
the pair's plumbing, which does not depend on the architecture; the noise range itself is the engine's
train.min_t/max_t (tests/with_comfy/test_objective.py)."""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest

from engine_runs import engine_processes
from tools.comfy_server import ComfyError, ComfyInterrupted
from tools.demo import training_prompt

pytestmark = [pytest.mark.slow, pytest.mark.core]

LOW = "pipetrain-tiny-unet-low-noise.safetensors"


@pytest.fixture(scope="module")
def low_expert(demo_base) -> str:
    models = Path(demo_base["base_dir"]) / "models" / "diffusion_models"
    shutil.copyfile(models / demo_base["unet"], models / LOW)
    return LOW


def _pair_prompt(demo_base, run_name: str, order: str = "one_after_the_other", steps: int = 4, processes: int = 1,
                 boundary: float = 0.875, **train) -> dict:
    prompt = training_prompt(demo_base, steps=steps, processes=processes, run_name=run_name, **train)
    node = next(n["inputs"] for n in prompt.values() if n["class_type"] == "PipeTrainTrainPipeline")
    for name in ("model", "clip", "vae"):  # model_name is the high-noise expert; no samples: faster
        node.pop(name, None)
    node["sample_prompts"] = ""
    prompt["30"] = {"class_type": "PipeTrainWanExperts",
                    "inputs": {"low_noise_model": LOW, "boundary": boundary, "order": order}}
    node["experts"] = ["30", 0]
    return prompt


def _run(demo_base, name: str) -> Path:
    return Path(demo_base["base_dir"]) / "output" / "pipetrain" / name


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def _two_stage(prompt: dict, key: str, high: list, low: list, prefix: str, boundary_step: int = 5) -> None:
    """ComfyUI's Wan 2.2 template shape: the high-noise model from step 0 to the boundary step, leaving the noise
    left for the low-noise model, which ends the schedule."""
    prompt[f"{key}a"] = {"class_type": "KSamplerAdvanced", "inputs": {
        "model": high, "add_noise": "enable", "noise_seed": 42, "steps": 10, "cfg": 1.0, "sampler_name": "euler",
        "scheduler": "normal", "positive": ["40", 0], "negative": ["41", 0], "latent_image": ["42", 0],
        "start_at_step": 0, "end_at_step": boundary_step, "return_with_leftover_noise": "enable"}}
    prompt[f"{key}b"] = {"class_type": "KSamplerAdvanced", "inputs": {
        "model": low, "add_noise": "disable", "noise_seed": 42, "steps": 10, "cfg": 1.0, "sampler_name": "euler",
        "scheduler": "normal", "positive": ["40", 0], "negative": ["41", 0], "latent_image": [f"{key}a", 0],
        "start_at_step": boundary_step, "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
    prompt[f"{key}c"] = {"class_type": "VAEDecode", "inputs": {"samples": [f"{key}b", 0], "vae": ["2", 0]}}
    prompt[f"{key}d"] = {"class_type": "SaveImage", "inputs": {"images": [f"{key}c", 0], "filename_prefix": prefix}}


def test_one_after_the_other_trains_each_expert_on_its_side_and_saves_a_pair_that_samples(
        comfy_server, demo_base, low_expert, comfy_root):
    prompt = _pair_prompt(demo_base, "experts_seq", boundary=0.8)
    models = Path(demo_base["base_dir"]) / "models"
    prompt["31"] = {"class_type": "UNETLoader", "inputs": {"unet_name": LOW, "weight_dtype": "default"}}
    prompt["32"] = {"class_type": "PipeTrainSaveLoRA", "inputs": {
        "run": ["8", 0], "name": "experts_seq", "overwrite": False, "model": ["1", 0], "strength": 1.0,
        "weights": "plain", "model_low_noise": ["31", 0]}}
    prompt["40"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "a red circle", "clip": ["3", 0]}}
    prompt["41"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["3", 0]}}
    prompt["42"] = {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}
    # each saved file through ComfyUI's own LoRA loader, by the name Save LoRA gave it
    for key, model, name in (("33", ["1", 0], "pipetrain/experts_seq_high_noise.safetensors"),
                             ("34", ["31", 0], "pipetrain/experts_seq_low_noise.safetensors")):
        prompt[key] = {"class_type": "LoraLoaderModelOnly",
                       "inputs": {"model": model, "lora_name": name, "strength_model": 1.0}}
    _two_stage(prompt, "50", ["1", 0], ["31", 0], "experts/base")
    _two_stage(prompt, "51", ["32", 0], ["32", 2], "experts/both_loras")
    _two_stage(prompt, "52", ["33", 0], ["31", 0], "experts/high_lora")
    _two_stage(prompt, "53", ["1", 0], ["34", 0], "experts/low_lora")
    # the LoRA loaders list the pair's files only once Save LoRA has written them: queue the training part first
    train_only = {k: v for k, v in prompt.items() if k not in {"33", "34"} and not k.startswith(("52", "53"))}
    entry = comfy_server.run(train_only, timeout=600)

    high, low = _run(demo_base, "experts_seq_high_noise"), _run(demo_base, "experts_seq_low_noise")
    for run_dir, (lo, hi), model in ((high, (0.8, 1.0), demo_base["unet"]), (low, (0.0, 0.8), LOW)):
        cfg = json.loads((run_dir / "run.json").read_text())
        assert (cfg["train"]["min_t"], cfg["train"]["max_t"]) == (lo, hi), run_dir.name
        assert Path(cfg["model_path"]) == models / "diffusion_models" / model
        assert _events(run_dir, "done")[-1]["step"] == 4
    # one after the other: the low-noise run started after the high-noise one had finished
    assert _events(low, "started")[0]["time"] >= _events(high, "done")[-1]["time"]
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any(t.startswith("experts_seq_high_noise: trained 4/4") and "experts_seq_low_noise: trained 4/4" in t
               for t in texts), texts
    assert "saved pipetrain/experts_seq_high_noise.safetensors and pipetrain/experts_seq_low_noise.safetensors" \
        in texts, texts
    for half in ("high_noise", "low_noise"):
        assert (models / "loras" / "pipetrain" / f"experts_seq_{half}.safetensors").is_file()

    first = comfy_server.image_paths(entry)
    entry = comfy_server.run(prompt, timeout=600)  # the same training is cached: only the new samplers run
    images = {Path(p).name.split("_0")[0]: Path(p).read_bytes() for p in first + comfy_server.image_paths(entry)}
    assert set(images) == {"base", "both_loras", "high_lora", "low_lora"}, images.keys()
    for name in ("both_loras", "high_lora", "low_lora"):
        assert images[name] != images["base"], f"{name}: the LoRA did not change the sampled image"
    _assert_every_key_loads(comfy_root, models, [models / "loras" / "pipetrain" / f"experts_seq_{h}.safetensors"
                                                 for h in ("high_noise", "low_noise")])



def test_resume_continues_both_halves_of_the_pair(comfy_server, demo_base, low_expert):
    """After the test above: the pair at 4 steps, resumed by naming either half, trains both to 6."""
    high, low = _run(demo_base, "experts_seq_high_noise"), _run(demo_base, "experts_seq_low_noise")
    if not (high / "checkpoints" / "latest").is_file():
        comfy_server.run(_pair_prompt(demo_base, "experts_seq", boundary=0.8), timeout=600)
    prompt = _pair_prompt(demo_base, "experts_seq", boundary=0.8, steps=6, resume="experts_seq_low_noise")
    comfy_server.run(prompt, timeout=600)
    for run_dir in (high, low):
        assert [e["step"] for e in _events(run_dir, "started")][-1] == 4, run_dir.name
        assert _events(run_dir, "done")[-1]["step"] == 6
    assert not _run(demo_base, "experts_seq_2_high_noise").exists()
    with pytest.raises(ComfyError, match="both runs of the pair experts_seq already reached 6 steps.*raise steps"):
        comfy_server.run(_pair_prompt(demo_base, "experts_seq", boundary=0.8, steps=6, resume="experts_seq_high_noise"),
                         timeout=300)


def _assert_every_key_loads(comfy_root, models: Path, files: list[Path]) -> None:
    from engine.launch.comfy_bootstrap import import_comfy
    import_comfy(comfy_root)
    import comfy.lora
    import comfy.sd
    import comfy.utils

    model = comfy.sd.load_diffusion_model(str(models / "diffusion_models" / LOW))  # both experts: one layout
    for file in files:
        lora = comfy.utils.load_torch_file(str(file), safe_load=True)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger().addHandler(handler)
        try:
            patches = comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(model.model, {}))
        finally:
            logging.getLogger().removeHandler(handler)
        unmatched = [r.getMessage() for r in records if "not loaded" in r.getMessage()]
        assert not unmatched, (file.name, unmatched[:5])
        assert len(patches) == sum(1 for k in lora if k.endswith(".lora_A.weight")) > 0


def test_at_the_same_time_trains_both_halves_side_by_side(comfy_server, demo_base, low_expert):
    prompt = _pair_prompt(demo_base, "experts_side", order="at_the_same_time", steps=30, processes=2)
    entry = comfy_server.run(prompt, timeout=600)
    high, low = _run(demo_base, "experts_side_high_noise"), _run(demo_base, "experts_side_low_noise")
    spans = []
    for run_dir in (high, low):
        started = _events(run_dir, "started")[0]
        assert started["world_size"] == 1, started  # num_gpus 2 -> two groups of one process
        steps = _events(run_dir, "step")
        assert steps[-1]["step"] == 30
        spans.append((steps[0]["time"], steps[-1]["time"]))
    (h0, h1), (l0, l1) = spans
    assert max(h0, l0) < min(h1, l1), f"the halves' steps did not overlap: high {spans[0]}, low {spans[1]}"
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any("experts_side_high_noise: trained 30/30" in t and "experts_side_low_noise: trained 30/30" in t
               for t in texts), texts



def test_cancel_stops_both_halves_side_by_side(comfy_server, demo_base, low_expert):
    prompt = _pair_prompt(demo_base, "experts_cancel", order="at_the_same_time", steps=100_000, processes=2)
    prompt_id = comfy_server.queue(prompt)
    runs = [_run(demo_base, f"experts_cancel_{h}") for h in ("high_noise", "low_noise")]
    deadline = time.time() + 300
    while time.time() < deadline and not all((r / "events.jsonl").is_file() and _events(r, "step") for r in runs):
        time.sleep(0.2)
    pressed = time.time()
    comfy_server.interrupt()
    with pytest.raises(ComfyInterrupted):
        comfy_server.wait(prompt_id, timeout=60)
    assert time.time() - pressed < 15
    for run_dir in runs:
        assert not engine_processes(str(run_dir)), f"a rank of {run_dir.name} outlived Cancel"
        assert _events(run_dir, "cancelled"), f"{run_dir.name} did not stop after a checkpoint"


@pytest.mark.parametrize("case, needle", [
    ("odd", r"order at_the_same_time splits Train Pipeline's num_gpus into two equal groups, and num_gpus is 1: set "
            r"num_gpus to an even number"),
    ("min_t", r"Train Options' min_t/max_t are 0.5/1 while Wan 2.2 Experts is connected.*set min_t to 0 and max_t "
              r"to 1, or disconnect Wan 2.2 Experts"),
    ("model", r"model input and Wan 2.2 Experts are both connected.*Disconnect model"),
    ("bad_low", r"Wan 2.2 Experts, the low-noise run \(pipetrain-tiny-taesd.safetensors, noise 0-0.875, 1 "
                r"process\(es\)\)"),
])
def test_what_a_pair_cannot_take_is_refused_before_any_folder(comfy_server, demo_base, low_expert, case, needle):
    name = f"experts_refused_{case}"
    prompt = _pair_prompt(demo_base, name, order="at_the_same_time" if case == "odd" else "one_after_the_other")
    if case == "min_t":
        options = next(n["inputs"] for n in prompt.values() if n["class_type"] == "PipeTrainTrainOptions")
        options["min_t"] = 0.5
    elif case == "model":
        next(n["inputs"] for n in prompt.values() if n["class_type"] == "PipeTrainTrainPipeline")["model"] = ["1", 0]
    elif case == "bad_low":  # a file ComfyUI lists that is no diffusion model: the second half fails its checks
        vae = Path(demo_base["base_dir"]) / "models" / "vae" / demo_base["vae"]
        shutil.copyfile(vae, Path(demo_base["base_dir"]) / "models" / "diffusion_models" / demo_base["vae"])
        prompt["30"]["inputs"]["low_noise_model"] = demo_base["vae"]
    with pytest.raises(ComfyError, match=needle):
        comfy_server.run(prompt, timeout=300)
    root = _run(demo_base, "")
    assert not list(root.glob(f"{name}*")), "a refused pair made a run folder"


def test_a_missing_low_noise_file_is_named_with_the_fix(monkeypatch):
    import PipeTrain.nodes.expert_pair as pair
    from PipeTrain.engine.config.checks import ConfigError
    from PipeTrain.nodes.wan_experts import ExpertsSpec

    monkeypatch.setattr(pair.compat, "full_path", lambda folder, name: None)
    spec = ExpertsSpec(low_noise_model="wan2.2_low_noise.safetensors")
    inputs = {"model_name": "wan2.2_high_noise.safetensors", "lora": type("L", (), {"kind": "lora"})()}
    with pytest.raises(ConfigError, match="low_noise_model 'wan2.2_low_noise.safetensors' is not in ComfyUI's "
                                          "diffusion_models or checkpoints folders: put the low-noise expert's file "
                                          "there and refresh"):
        pair._refuse_conflicts(spec, inputs, pair.TrainOptions())
