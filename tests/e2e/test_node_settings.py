"""Odd node settings are refused before any training process starts, with a message that names the
setting and the fix: run and LoRA names, GPUs, samples, resume, and the model file against the cache
and the LoRA (checked on the file's header with ComfyUI's own detection)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from PipeTrain.engine.cache.format import CacheSpec
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, SampleSpec, TrainSpec
from PipeTrain.engine.config.checks import check_run_name
from PipeTrain.nodes import preflight
from PipeTrain.nodes.runs import check_resume, new_run_dir
from PipeTrain.nodes.save_lora import safe_lora_target
from tools.comfy_server import ComfyError
from tools.demo import demo_prompt


@pytest.mark.parametrize("name,needle", [
    ("", "run_name is empty"), ("   ", "run_name is empty"), ("a/b", "'/'"), ("..", "names a folder"),
    ("c:x", "':'"), ("run\U0001F600", "ASCII letters"), ("a" * 150, "150 characters long"),
    ("CON", "device name Windows reserves"), ("nul.txt", "starts with 'NUL', a device name"), ("run.", "ends with a dot"),
])
def test_run_names_that_cannot_be_a_folder_everywhere_are_refused(name, needle):
    with pytest.raises(ConfigError, match="run_name") as err:
        check_run_name(name)
    assert needle in str(err.value)


def test_a_taken_run_name_never_touches_the_old_run(tmp_path):
    first = new_run_dir(str(tmp_path), "lora_2024")
    (first / "run.json").write_text("old")
    again = new_run_dir(str(tmp_path), "lora_2024")
    assert again.name == "lora_2024_2" and (first / "run.json").read_text() == "old"
    long = "b" * 100
    new_run_dir(str(tmp_path), long)
    taken = new_run_dir(str(tmp_path), long)
    assert taken.name == "b" * 98 + "_2"
    check_run_name(taken.name)  # the engine re-validates run.json's run_name: the suffix must keep it valid


@pytest.mark.parametrize("name,needle", [
    ("", "it is empty"), (" .safetensors", "it is empty"), ("x.", "ends with a dot"), ("CON", "device name"),
    ("people/aux", "device name"), ("b" * 300, "300 characters long"), ("a*b", "'*'"), ("../x", "not allowed"),
])
def test_lora_names_a_folder_cannot_hold_are_refused(tmp_path, name, needle):
    with pytest.raises(ConfigError, match="LoRA name") as err:
        safe_lora_target(str(tmp_path), name)
    assert needle in str(err.value)


def test_a_lora_name_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / "pipetrain" / "style.safetensors").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is a folder"):
        safe_lora_target(str(tmp_path), "style")
    assert safe_lora_target(str(tmp_path), "people/anna") == (tmp_path / "pipetrain" / "people" /
                                                               "anna.safetensors").resolve()


def test_gpu_settings_are_checked_before_launch(monkeypatch):
    with pytest.raises(ConfigError, match="lists GPU 0 more than once"):
        LaunchSpec(num_gpus=2, gpu_ids="0,0").validate()
    monkeypatch.setattr(preflight.compat, "cuda_available", lambda: False)
    with pytest.raises(ConfigError, match="gpu_ids is '7' but this ComfyUI runs without a CUDA GPU"):
        preflight.check_devices(LaunchSpec(num_gpus=1, gpu_ids="7"))
    with pytest.raises(ConfigError, match="num_gpus is 4096 .* CPU core"):
        preflight.check_devices(LaunchSpec(num_gpus=4096))
    assert preflight.check_devices(LaunchSpec(num_gpus=2)) is False
    import torch

    monkeypatch.setattr(preflight.compat, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"gpu_ids '1,7' asks for GPU\(s\) \[7\] but this machine shows 2"):
        preflight.check_devices(LaunchSpec(num_gpus=2, gpu_ids="1,7"))
    with pytest.raises(ConfigError, match=r"num_gpus 3 asks for GPU\(s\) \[2\]"):
        preflight.check_devices(LaunchSpec(num_gpus=3))
    assert preflight.check_devices(LaunchSpec(num_gpus=2, gpu_ids="1,0")) is True


def test_sample_sizes_off_the_latent_grid_are_refused(tmp_path):
    prompts = tmp_path / "prompts.safetensors"
    prompts.write_bytes(b"x")
    with pytest.raises(ConfigError, match="100x64 is not a multiple of 8.*96x64"):
        SampleSpec(every=5, prompts_file=str(prompts), width=100, height=64).validate()
    sixteen = preflight.Detected("WAN22_T2V", 48, downscale=16)
    with pytest.raises(ConfigError, match="steps of 16 pixels.*512x512"):
        preflight.check_sample_size(SampleSpec(width=520, height=512), sixteen, "wan22.safetensors")
    preflight.check_sample_size(SampleSpec(width=520, height=512), None, "unknown.ckpt")  # 8 = the default ratio


def test_resume_refuses_what_the_checkpoint_cannot_continue(tmp_path):
    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step000012")
    (run / "run.json").write_text(json.dumps({"model_path": "/m/a.safetensors", "lora": {
        "rank": 8, "targets": "attention", "target_regex": ""}}))

    def cfg(steps, model, rank):
        return RunConfig(run_name="r", run_dir=str(run), comfyui_root="/c", model_path=model, cache_dir="/d",
                         lora=LoraSpec(rank=rank), train=TrainSpec(steps=steps))
    with pytest.raises(ConfigError, match="already at step 12 and steps is 12.*raise steps above 12"):
        check_resume(run, cfg(12, "/m/a.safetensors", 8))
    with pytest.raises(ConfigError, match="model a.safetensors -> b.safetensors; lora rank 8 -> 4"):
        check_resume(run, cfg(20, "/other/b.safetensors", 4))
    check_resume(run, cfg(20, "/m/a.safetensors", 8))
    assert (run / "run.json").read_text().startswith("{")  # a refused resume leaves the run as it was


@pytest.fixture(scope="module")
def files(demo_base, tmp_path_factory):
    """The demo UNet (SD1.5 layout, 4 latent channels), its VAE, and a tiny Wan 2.1 (16 channels)."""
    import tiny_wan

    models = Path(demo_base["base_dir"]) / "models"
    wan = tiny_wan.write_model(tmp_path_factory.mktemp("wan") / "wan.safetensors")
    wan_i2v = tiny_wan.write_model(tmp_path_factory.mktemp("wan") / "wan_i2v.safetensors", i2v=True)
    return {"unet": str(models / "diffusion_models" / demo_base["unet"]),
            "vae": str(models / "vae" / demo_base["vae"]), "wan": str(wan), "wan_i2v": str(wan_i2v)}


def _cache(tmp_path, channels: int, vae_class: str = "TAESD") -> CacheSpec:
    (tmp_path / "manifest.json").write_text(json.dumps({"encoders": {"vae": {"class": vae_class}}}))
    return CacheSpec(str(tmp_path), "f", 8, (channels, 8, 8))


def test_comfyui_detection_on_the_header_finds_family_and_channels(files):
    unet, wan = preflight.detect(files["unet"]), preflight.detect(files["wan"])
    assert (unet.family, unet.latent_channels, unet.downscale) == ("SD15", 4, 8)
    assert (wan.family, wan.latent_channels) == ("WAN21_T2V", 16)
    assert "input_blocks.1.1.transformer_blocks.0.attn1.to_q" in unet.widths
    with pytest.raises(preflight.NotADiffusionModel):
        preflight.detect(files["vae"])


def test_model_cache_and_lora_mismatches_are_named(files, tmp_path):
    sd_cache = _cache(tmp_path, 4)
    assert preflight.check_model("unet", files["unet"], LoraSpec(rank=16), {"cache": sd_cache}).family == "SD15"
    with pytest.raises(ConfigError, match="does not recognise this file as a diffusion model"):
        preflight.check_model("taesd.safetensors", files["vae"], LoraSpec(), {"cache": sd_cache})
    with pytest.raises(ConfigError) as err:
        preflight.check_model("wan.safetensors", files["wan"], LoraSpec(), {"cache": None, "eval_cache": sd_cache})
    assert all(s in str(err.value) for s in ("eval_cache holds 4-channel latents made with the VAE TAESD",
                                             "WAN21_T2V", "16-channel"))
    with pytest.raises(ConfigError, match=r"rank 1024 is larger than any layer .* \(at most 320\)"):
        preflight.check_model("unet", files["unet"], LoraSpec(rank=1024), {"cache": sd_cache})
    with pytest.raises(ConfigError, match="target_regex 'zzz' matches no layer name"):
        preflight.check_model("unet", files["unet"], LoraSpec(target_regex="zzz"), {"cache": sd_cache})
    preflight.check_model("unet", files["unet"], LoraSpec(target_regex=r"attn2\.to_(k|v)$"), {"cache": sd_cache})
    with pytest.raises(ConfigError, match="timestep_shift is 3 but model_name 'unet' is a SD15 model"):
        preflight.check_model("unet", files["unet"], LoraSpec(), {"cache": sd_cache}, timestep_shift=3.0)
    assert not preflight.detect(files["wan"]).no_shift  # a flow model takes a shift


def test_objective_settings_the_model_cannot_use_are_refused_before_launch(files, tmp_path):
    from PipeTrain.engine.config.objective import ObjectiveSpec
    from PipeTrain.nodes.objective_options import PipeTrainObjectiveOptions

    sd_cache, wan_cache = _cache(tmp_path, 4), None
    (spec,) = PipeTrainObjectiveOptions().configure(3.5, False, 0.5, 1.15, 1.0, "huber", 0.5, 5.0, False)
    assert spec == ObjectiveSpec(guidance=3.5, loss="huber", huber_delta=0.5, min_snr_gamma=5.0)
    with pytest.raises(ConfigError, match="no delta"):
        PipeTrainObjectiveOptions().configure(1.0, False, 0.5, 1.15, 1.0, "mse", 0.5, 0.0, False)
    for path, cache, objective, needle in (
            (files["unet"], sd_cache, ObjectiveSpec(guidance=3.5), "without a guidance input"),
            (files["unet"], sd_cache, ObjectiveSpec(resolution_shift=True), "turn resolution_shift off"),
            (files["wan"], wan_cache, ObjectiveSpec(min_snr_gamma=5.0), "set min_snr_gamma to 0")):
        with pytest.raises(ConfigError, match=needle):
            preflight.check_model("m", path, LoraSpec(), {"cache": cache}, objective=objective)
    preflight.check_model("m", files["unet"], LoraSpec(), {"cache": sd_cache},
                          objective=ObjectiveSpec(min_snr_gamma=5.0, debiased_estimation=True))


def test_a_resume_without_objective_options_keeps_the_runs(tmp_path):
    from PipeTrain.engine.config.objective import ObjectiveSpec
    from PipeTrain.engine.config.revisions import record
    from PipeTrain.nodes.runs import resumed_objective

    old = {"run_name": "r", "run_dir": str(tmp_path), "lora": {"rank": 4}, "train": {"steps": 2}}
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert resumed_objective(tmp_path) == ObjectiveSpec(guidance=0.0)  # from before the settings: as it trained
    record(tmp_path, {**old, "objective": {"loss": "smooth_l1", "guidance": 2.0}}, 0)
    assert resumed_objective(tmp_path) == ObjectiveSpec(loss="smooth_l1", guidance=2.0)


def test_a_cache_from_another_text_encoder_is_named_before_launch(files, tmp_path):
    import tiny_detected

    unet = preflight.detect(files["unet"])
    assert unet.context_width == 768  # the demo UNet's cross-attention input, as ComfyUI reads it
    wide = tiny_detected.write_cache(tmp_path / "wide", latent=(4, 8, 8), text_width=1024, items=1)
    spec = CacheSpec(wide, "f", 1, (4, 8, 8))
    with pytest.raises(ConfigError, match="cache holds 1024-wide text conditioning, but model_name 'unet' is a "
                                          "SD15 model that takes 768-wide"):
        preflight.check_model("unet", files["unet"], LoraSpec(), {"cache": spec})
    fits = tiny_detected.write_cache(tmp_path / "fits", latent=(4, 8, 8), text_width=768, items=1)
    preflight.check_model("unet", files["unet"], LoraSpec(), {"cache": CacheSpec(fits, "f", 1, (4, 8, 8))})


def test_a_start_image_the_model_cannot_read_is_refused(files, tmp_path):
    """A video cache with first-frame conditioning in one image-to-video style (engine/cache/first_frame.py)
    trains only models of the families that read that style; a text-to-video model reads none."""
    def cache(style: str) -> CacheSpec:
        folder = tmp_path / style
        folder.mkdir(exist_ok=True)
        encoders = {"vae": {"class": "TAEHV"}, "first_frame_conditioning": True,
                    **({"first_frame_style": style} if style != "wan_concat" else {})}  # as cache_identity writes it
        (folder / "manifest.json").write_text(json.dumps({"encoders": encoders}))
        return CacheSpec(str(folder), "f", 1, (16, 3, 8, 8))

    with pytest.raises(ConfigError, match=r"cache holds first-frame conditioning \(wan_concat\) that model_name "
                                          "'wan.safetensors' cannot use: a WAN21_T2V model takes no start image"):
        preflight.check_model("wan.safetensors", files["wan"], LoraSpec(), {"cache": cache("wan_concat")})
    with pytest.raises(ConfigError, match="set Cache Latents' first_frame_style to 'wan_concat'"):
        preflight.check_model("i2v", files["wan_i2v"], LoraSpec(), {"cache": cache("clean_first_frame")})
    assert preflight.check_model("i2v", files["wan_i2v"], LoraSpec(), {"cache": cache("wan_concat")}).family == \
        "WAN21_I2V"
    # Wan 2.2 A14B's I2V expert has no image embedder: detected as WAN21_T2V, told apart by its 36 input channels
    import comfy.supported_models
    import tiny_wan
    from safetensors.torch import save_file

    expert = comfy.supported_models.WAN21_T2V(dict(tiny_wan.WAN_CONFIG, in_dim=36)).get_model({}).diffusion_model
    save_file({k: v.contiguous() for k, v in expert.state_dict().items()}, str(tmp_path / "expert.safetensors"))
    found = preflight.check_model("expert", str(tmp_path / "expert.safetensors"), LoraSpec(),
                                  {"cache": cache("wan_concat")})
    assert (found.family, found.in_channels) == ("WAN21_T2V", 36)


@pytest.mark.slow
def test_objective_options_reach_run_json_through_the_graph(comfy_server, demo_base):
    prompt = demo_prompt(demo_base, steps=1, processes=1, run_name="objective_node")
    prompt = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6", "7", "8", "23"}}
    prompt["30"] = {"class_type": "PipeTrainObjectiveOptions", "inputs": {
        "guidance": 1.0, "resolution_shift": False, "base_shift": 0.5, "max_shift": 1.15, "sigmoid_scale": 1.0,
        "loss": "smooth_l1", "huber_delta": 0.25, "min_snr_gamma": 5.0, "debiased_estimation": True}}
    prompt["8"]["inputs"].update(sample_prompts="", objective=["30", 0])
    comfy_server.run(prompt, timeout=300)
    run_json = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "objective_node" / "run.json"
    objective = json.loads(run_json.read_text(encoding="utf-8"))["objective"]
    assert (objective["loss"], objective["huber_delta"], objective["min_snr_gamma"],
            objective["debiased_estimation"]) == ("smooth_l1", 0.25, 5.0, True)


@pytest.mark.slow
def test_the_node_refuses_a_vae_picked_as_the_model_before_any_run_folder(comfy_server, demo_base):
    base = Path(demo_base["base_dir"])
    picked = base / "models" / "diffusion_models" / "pipetrain-vae-picked-as-model.safetensors"
    shutil.copy(base / "models" / "vae" / demo_base["vae"], picked)
    prompt = demo_prompt(demo_base, steps=1, processes=1, run_name="vae_as_model")
    prompt = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6", "7", "8", "23"}}
    prompt["8"]["inputs"].update(model_name=picked.name, sample_prompts="")
    del prompt["8"]["inputs"]["model"]  # the file picked by name, not the graph's model
    try:
        with pytest.raises(ComfyError, match="does not recognise this file as a diffusion model"):
            comfy_server.run(prompt, timeout=300)
    finally:
        picked.unlink()
    assert not (base / "output" / "pipetrain" / "vae_as_model").exists()


def test_warmup_longer_than_the_run_is_refused():
    from PipeTrain.engine.config.sections import TrainSpec

    with pytest.raises(ConfigError, match="warmup_steps 1000 is more than steps 100"):
        TrainSpec(steps=100, warmup_steps=1000).validate()
    TrainSpec(steps=100, warmup_steps=100).validate()
    TrainSpec(steps=0, epochs=2.0, warmup_steps=1000).validate()  # with epochs the step count is known later


def test_continuing_a_lora_of_another_rank_is_refused_at_configure(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    from PipeTrain.nodes import configure_lora

    lora = tmp_path / "old.safetensors"
    save_file({"diffusion_model.a.lora_A.weight": torch.zeros(8, 32), "diffusion_model.a.lora_B.weight":
               torch.zeros(32, 8)}, str(lora))
    monkeypatch.setattr(configure_lora.compat, "full_path", lambda folder, name: str(lora))
    node = configure_lora.PipeTrainConfigureLoRA()
    with pytest.raises(ConfigError, match="start_from LoRA 'old.safetensors' has rank 8 but rank is 16"):
        node.configure(16, 0.0, 0.0, "attention", "", "old.safetensors", "float32")
    (spec,) = node.configure(8, 0.0, 0.0, "attention", "", "old.safetensors", "float32")
    assert spec.init_from == str(lora)


def test_a_pipeline_split_without_stages_says_so_first():
    from PipeTrain.engine.config.sections import MemorySpec

    with pytest.raises(ConfigError, match="pipeline_split is 'a' but pipeline_stages is 1"):
        MemorySpec(pipeline_split="a").validate()
    with pytest.raises(ConfigError, match="'a' is not a list of whole numbers: give 1 layer index"):
        MemorySpec(pipeline_split="a", pipeline_stages=2).validate()


def test_a_batch_larger_than_a_pass_over_the_cache_is_refused(tmp_path):
    import tiny_detected

    cache = CacheSpec(tiny_detected.write_cache(tmp_path, latent=(4, 8, 8), text_width=8, items=3), "f", 3, (4, 8, 8))
    with pytest.raises(ConfigError, match="batch_size is 4 but one pass over the cache has 3 images.*batch_size 3"):
        preflight.check_batch(4, cache)
    preflight.check_batch(3, cache)


# Train Pipeline's widget defaults before the rarely changed settings moved to Train Options.
DEFAULTS_BEFORE_THE_MOVE = dict(
    gpu_ids="", backend="auto", timestep_sampling="uniform", timestep_shift=0.0, min_t=0.0, max_t=1.0,
    sample_negative="", sample_every=100, sample_width=512, sample_height=512, sample_steps=20, sample_cfg=1.0,
    sample_seed=0, sample_sampler="euler", sample_scheduler="simple", eval_every=100, eval_before_start=True,
    ema_decay=0.0, ema_start_step=0, accept_changes=False)
ADDED_SINCE = dict(wandb_project="", wandb_run_name="", wandb_mode="online", wandb_entity="", eval_early_stop=0)


@pytest.mark.core
def test_train_options_default_as_train_pipeline_did_and_old_api_prompts_keep_their_settings(comfy_root):
    """Unconnected Train Options = its widget defaults = Train Pipeline's before the move; an API prompt that
    still gives those settings to Train Pipeline gets a Train Options node with them (nodes/legacy_prompts.py)."""
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from PipeTrain.nodes.legacy_prompts import convert_prompt
    from PipeTrain.nodes.save_lora import PipeTrainSaveLoRA
    from PipeTrain.nodes.train_options import PipeTrainTrainOptions, TrainOptions
    from PipeTrain.nodes.train_pipeline import PipeTrainTrainPipeline

    inputs = PipeTrainTrainOptions.INPUT_TYPES()["optional"]
    assert all(len(i[1]["tooltip"]) > 20 for i in inputs.values())
    # the moved settings first, in their old order; then the ones added since (W&B: off by default)
    assert list(inputs)[:len(DEFAULTS_BEFORE_THE_MOVE)] == list(DEFAULTS_BEFORE_THE_MOVE)
    widget_defaults = {name: spec[1]["default"] for name, spec in inputs.items()}
    assert widget_defaults == {**DEFAULTS_BEFORE_THE_MOVE, **ADDED_SINCE}
    assert PipeTrainTrainOptions().configure(**widget_defaults)[0] == TrainOptions(**DEFAULTS_BEFORE_THE_MOVE) == \
        TrainOptions() == PipeTrainTrainOptions().configure()[0]
    train = PipeTrainTrainPipeline.INPUT_TYPES()
    assert not set(inputs) & (set(train["required"]) | set(train["optional"]))
    assert train["optional"]["options"][0] == "PIPETRAIN_TRAIN_OPTIONS"

    old = {"5": {"class_type": "PipeTrainCacheLatents", "inputs": {}},
           "8": {"class_type": "PipeTrainTrainPipeline", "inputs": {"steps": 5, "cache": ["5", 0], "sample_every": 4,
                                                                     "min_t": 0.1, "gpu_ids": "1"}}}
    convert_prompt(old)
    assert old["8"]["inputs"] == {"steps": 5, "cache": ["5", 0], "options": ["8_pipetrain_options", 0]}
    added = old["8_pipetrain_options"]
    assert added["class_type"] == "PipeTrainTrainOptions"
    assert PipeTrainTrainOptions().configure(**added["inputs"])[0] == TrainOptions(sample_every=4, min_t=0.1,
                                                                                    gpu_ids="1")
    connected = {"8": {"class_type": "PipeTrainTrainPipeline", "inputs": {"sample_every": 4, "options": ["9", 0]}},
                 "9": {"class_type": "PipeTrainTrainOptions", "inputs": {"sample_every": 20, "sample_seed": 42}}}
    convert_prompt(connected)  # what Train Pipeline is given by name wins over the connected node's value
    copy = connected[connected["8"]["inputs"]["options"][0]]["inputs"]
    assert (copy["sample_every"], copy["sample_seed"], connected["9"]["inputs"]["sample_every"]) == (4, 42, 20)

    assert all(len(inputs[n][1]["tooltip"]) > 40 for n in ("ema_decay", "ema_start_step"))
    save = PipeTrainSaveLoRA.INPUT_TYPES()["optional"]
    assert list(save)[-2:] == ["weights", "model_low_noise"] and save["weights"][0] == ["plain", "ema", "best"]
    with pytest.raises(ConfigError, match="ema_decay is 1.0"):
        TrainSpec(ema_decay=1.0).validate()
