"""Wan 2.2 Experts' settings (nodes/wan_experts.py) and what the save nodes check for a pair (nodes/save_checks.py):
the noise ranges of the two halves, the GPU split of at_the_same_time, and both LoRA names checked before training."""
from __future__ import annotations

import pytest

import PipeTrain.nodes.save_checks as checks
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.nodes.save_lora import pair_names
from PipeTrain.nodes.wan_experts import ExpertsSpec


def test_the_boundary_splits_the_noise_levels_between_the_experts():
    spec = ExpertsSpec(low_noise_model="low.safetensors", boundary=0.9)
    spec.validate()
    assert spec.noise_range("high_noise") == (0.9, 1.0)
    assert spec.noise_range("low_noise") == (0.0, 0.9)
    with pytest.raises(ConfigError, match="boundary is 1.0: use a noise level between 0.01 and 0.99"):
        ExpertsSpec(low_noise_model="low.safetensors", boundary=1.0).validate()
    with pytest.raises(ConfigError, match="order is 'both'"):
        ExpertsSpec(low_noise_model="low.safetensors", order="both").validate()


def test_at_the_same_time_splits_the_gpus_in_two_equal_groups():
    seq = ExpertsSpec(low_noise_model="low")
    assert seq.gpu_groups(3, "0,1,2", True) == ((3, "0,1,2"), (3, "0,1,2"))  # one after the other: all of them, twice
    side = ExpertsSpec(low_noise_model="low", order="at_the_same_time")
    assert side.gpu_groups(4, "3,1,0,2", True) == ((2, "3,1"), (2, "0,2"))
    assert side.gpu_groups(4, "", True) == ((2, "0,1"), (2, "2,3"))  # named: the groups never share a GPU
    assert side.gpu_groups(2, "", False) == ((1, ""), (1, ""))  # CPU processes: a count only
    for odd in (1, 3):
        with pytest.raises(ConfigError, match=f"num_gpus is {odd}: set num_gpus to an even number .* or choose "
                                              "order one_after_the_other"):
            side.gpu_groups(odd, "", True)


def test_both_lora_names_of_a_pair_are_checked_before_training(tmp_path, monkeypatch):
    root = tmp_path / "loras"
    (root / "pipetrain").mkdir(parents=True)
    monkeypatch.setattr(checks.compat, "first_folder", lambda kind: str(root))
    assert pair_names("wan/style.safetensors", True) == ["wan/style_high_noise", "wan/style_low_noise"]
    assert pair_names("style", False) == ["style"]
    graph = {"8": {"class_type": "PipeTrainTrainPipeline", "inputs": {}},
             "9": {"class_type": checks.SAVE_LORA, "inputs": {"run": ["8", 0], "name": "mine", "overwrite": False}}}
    (root / "pipetrain" / "mine.safetensors").write_bytes(b"a plain LoRA of that name")
    checks.check_save_names(graph, "8", checks.RunOutputs(pair=True))  # the pair writes other files
    (root / "pipetrain" / "mine_low_noise.safetensors").write_bytes(b"the user's")
    with pytest.raises(ConfigError, match=r"name 'mine' is taken: .*mine_low_noise\.safetensors already exists.*"
                                          "Nothing was trained"):
        checks.check_save_names(graph, "8", checks.RunOutputs(pair=True))
    graph["9"]["inputs"]["overwrite"] = True
    checks.check_save_names(graph, "8", checks.RunOutputs(pair=True))


def _half(root, name: str, checkpoint: int | None = None, done: int | None = None) -> None:
    import json

    run = root / "pipetrain" / name
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    if checkpoint is not None:
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "latest").write_text(f"step{checkpoint:06d}")
    if done is not None:
        (run / "events.jsonl").write_text(json.dumps({"event": "done", "step": done, "total": done}) + "\n")


def test_resuming_a_pair_continues_each_half_from_where_it_is(tmp_path):
    from PipeTrain.nodes.expert_pair import _resumed_pair

    _half(tmp_path, "p_high_noise", checkpoint=6, done=6)  # finished: kept as it is
    _half(tmp_path, "p_low_noise", checkpoint=2)  # cancelled at step 2: resumed
    dirs, modes = _resumed_pair(str(tmp_path), "p_low_noise", steps=6)
    assert {h: p.name for h, p in dirs.items()} == {"high_noise": "p_high_noise", "low_noise": "p_low_noise"}
    assert modes == {"high_noise": "finished", "low_noise": "resumed"}
    assert _resumed_pair(str(tmp_path), "latest", steps=10)[1] == {"high_noise": "resumed", "low_noise": "resumed"}
    _half(tmp_path, "q_high_noise", checkpoint=3)
    _half(tmp_path, "q_low_noise")  # never started (Cancel during the high-noise run): starts again
    assert _resumed_pair(str(tmp_path), "q", steps=6)[1] == {"high_noise": "resumed", "low_noise": "fresh"}
    with pytest.raises(ConfigError, match="r_low_noise holds no run: pick a run of a pair"):
        _half(tmp_path, "r_high_noise", checkpoint=3)
        _resumed_pair(str(tmp_path), "r_high_noise", steps=6)
    with pytest.raises(ConfigError, match="both runs of the pair p already reached 6 steps"):
        _half(tmp_path / "x", "p_high_noise", checkpoint=6, done=6)
        _half(tmp_path / "x", "p_low_noise", checkpoint=6, done=6)
        _resumed_pair(str(tmp_path / "x"), "p_high_noise", steps=6)
