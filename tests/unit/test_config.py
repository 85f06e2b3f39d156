"""RunConfig: round trip, and errors that name the setting and the fix."""
import json

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec


def _valid(tmp_path):
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"x")
    comfy = tmp_path / "ComfyUI"
    (comfy / "comfy").mkdir(parents=True, exist_ok=True)
    (comfy / "comfy" / "sd.py").write_text("")
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "manifest.json").write_text("{}")
    return RunConfig(run_name="r1", run_dir=str(tmp_path / "run"), comfyui_root=str(comfy), model_path=str(model),
                     cache_dir=str(cache))


def test_round_trip_through_json(tmp_path):
    cfg = _valid(tmp_path)
    path = tmp_path / "run.json"
    cfg.save(path)
    assert RunConfig.load(path) == cfg
    assert not list(tmp_path.glob(".run.json.tmp*")), "atomic write left its temp file"


def test_frozen(tmp_path):
    cfg = _valid(tmp_path)
    with pytest.raises(Exception):
        cfg.run_name = "other"


@pytest.mark.parametrize("section,change,needle", [
    ("lora", {"rank": 0}, "lora.rank"),
    ("lora", {"targets": "everything"}, "attention, attention_mlp, all_linear"),
    ("lora", {"target_regex": "("}, "not a valid regular expression"),
    ("memory", {"pipeline_stages": 0}, "memory.pipeline_stages"),
    ("train", {"steps": 0, "epochs": 0.0}, "set steps"),
    ("train", {"scheduler": "exp"}, "constant, linear, cosine"),
    ("launch", {"num_gpus": 2, "gpu_ids": "0"}, "make them agree"),
    ("launch", {"num_gpus": 1, "gpu_ids": "a"}, "comma-separated"),
])
def test_bad_values_name_the_setting(tmp_path, section, change, needle):
    data = _valid(tmp_path).to_dict()
    data[section].update(change)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        RunConfig.from_dict(data)


def test_unknown_and_mistyped_keys(tmp_path):
    data = _valid(tmp_path).to_dict()
    data["train"]["learning_rat"] = 1e-4
    with pytest.raises(ConfigError, match="learning_rat"):
        RunConfig.from_dict(data)
    data = _valid(tmp_path).to_dict()
    data["train"]["steps"] = "100"
    with pytest.raises(ConfigError, match="train.steps must be a whole number"):
        RunConfig.from_dict(data)


@pytest.mark.parametrize("section,key,needle", [
    ("", "model_path", "model file .*nope does not exist: pick a file"),
    ("", "comfyui_root", "comfyui_root .*nope is not a ComfyUI folder"),
    ("", "cache_dir", r"cache .*nope is incomplete \(no manifest.json\): run CacheLatents again"),
    ("lora", "init_from", "lora.init_from: the LoRA file .*nope does not exist"),
    ("sample", "prompts_file", "sample.prompts_file .*nope' does not exist: re-queue"),
    ("eval", "cache_dir", "eval.cache_dir .*nope is incomplete .*disconnect eval_cache"),
])
def test_missing_files_are_found_by_check_files_not_by_validation(tmp_path, section, key, needle):
    """validate() reads no file (it runs wherever a config is built); check_files() runs at each boundary."""
    data = _valid(tmp_path).to_dict()
    part = data[section] if section else data
    part[key] = str(tmp_path / "nope")
    if section == "sample":
        part["every"] = 5
    cfg = RunConfig.from_dict(data)  # builds and validates
    with pytest.raises(ConfigError, match=needle):
        cfg.check_files()
    _valid(tmp_path).check_files()  # every file there: passes


def test_a_run_json_from_before_loads_even_where_its_files_are_gone(tmp_path):
    """A run.json of an older PipeTrain (checkpointing as a boolean, no eval / cluster / noise range / block
    swap settings) loads as it is; that its model is not on this machine is check_files' to say."""
    old = {"run_name": "old_run", "run_dir": "/gone/run", "comfyui_root": "/gone/ComfyUI",
           "model_path": "/gone/model.safetensors", "cache_dir": "/gone/cache", "resume": False, "version": 1,
           "lora": {"rank": 8, "alpha": 0.0, "dropout": 0.0, "targets": "attention", "target_regex": "",
                    "init_from": ""},
           "memory": {"activation_checkpointing": True, "optimizer": "adamw", "pipeline_stages": 1},
           "train": {"steps": 50, "learning_rate": 1e-4, "batch_size": 1, "grad_accum": 1, "seed": 0},
           "launch": {"num_gpus": 1, "gpu_ids": "", "backend": "deepspeed"}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(old))
    cfg = RunConfig.load(path)
    assert cfg.memory.activation_checkpointing == "on" and cfg.eval.cache_dir == "" and cfg.train.max_t == 1.0
    with pytest.raises(ConfigError, match="/gone/model.safetensors does not exist"):
        cfg.check_files()


def test_gpus_must_divide_into_stages(tmp_path):
    data = _valid(tmp_path).to_dict()
    data["launch"]["num_gpus"], data["memory"]["pipeline_stages"] = 3, 2
    with pytest.raises(ConfigError, match="divisible by pipeline_stages"):
        RunConfig.from_dict(data)
    data["launch"]["backend"], data["launch"]["num_gpus"] = "plain", 1
    with pytest.raises(ConfigError, match="divisible|needs DeepSpeed"):
        RunConfig.from_dict(data)


def test_version_mismatch(tmp_path):
    data = _valid(tmp_path).to_dict()
    data["version"] = 99
    with pytest.raises(ConfigError, match="re-create the run"):
        RunConfig.from_dict(json.loads(json.dumps(data)))


def test_alpha_defaults_to_rank():
    assert LoraSpec(rank=8).effective_alpha == 8.0
    assert LoraSpec(rank=8, alpha=4).effective_alpha == 4.0
    assert MemorySpec().pipeline_stages == 1 and TrainSpec().steps > 0
    assert LaunchSpec(num_gpus=2, gpu_ids="3,5").device_ids() == [3, 5]
