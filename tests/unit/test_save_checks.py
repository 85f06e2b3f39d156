"""Train Pipeline's look at the save nodes it feeds (nodes/save_checks.py), before anything trains:
the wrong save node for the adapter, weights the run will not make, and taken Save Model names."""
from __future__ import annotations

import pytest

import PipeTrain.nodes.save_checks as checks
from PipeTrain.engine.config.checks import ConfigError


def _graph(kind: str, **inputs) -> dict:
    return {"8": {"class_type": "PipeTrainTrainPipeline", "inputs": {}},
            "9": {"class_type": kind, "inputs": {"run": ["8", 0], "name": "mine", "overwrite": False, **inputs}}}


@pytest.fixture
def folders(tmp_path, monkeypatch):
    roots = {"loras": tmp_path / "loras", "diffusion_models": tmp_path / "diffusion_models"}
    for root in roots.values():
        (root / "pipetrain").mkdir(parents=True)
    monkeypatch.setattr(checks.compat, "first_folder", lambda kind: str(roots[kind]))
    return roots


def test_the_save_node_must_match_the_adapter(folders):
    with pytest.raises(ConfigError, match="adapter is 'full'.*Connect PipeTrain Save Model instead"):
        checks.check_save_names(_graph(checks.SAVE_LORA), "8", checks.RunOutputs(full=True))
    with pytest.raises(ConfigError, match="trains a LoRA.*Connect PipeTrain Save Lo[Rr]A instead"):
        checks.check_save_names(_graph(checks.SAVE_MODEL), "8", checks.RunOutputs(full=False))
    checks.check_save_names(_graph(checks.SAVE_MODEL), "8", checks.RunOutputs(full=True))
    checks.check_save_names(_graph(checks.SAVE_LORA), "8", checks.RunOutputs())
    checks.check_save_names(_graph(checks.SAVE_MODEL), "7", checks.RunOutputs())  # fed by another Train Pipeline


def test_save_lora_weights_the_run_will_not_make_are_refused(folders):
    with pytest.raises(ConfigError, match="weights is 'ema'.*ema_decay is 0"):
        checks.check_save_names(_graph(checks.SAVE_LORA, weights="ema"), "8", checks.RunOutputs())
    with pytest.raises(ConfigError, match="weights is 'best'.*eval_cache"):
        checks.check_save_names(_graph(checks.SAVE_LORA, weights="best"), "8", checks.RunOutputs())
    checks.check_save_names(_graph(checks.SAVE_LORA, weights="ema"), "8", checks.RunOutputs(ema=True))
    checks.check_save_names(_graph(checks.SAVE_LORA, weights="best"), "8", checks.RunOutputs(eval=True))
    checks.check_save_names(_graph(checks.SAVE_LORA, weights=["3", 0]), "8", checks.RunOutputs())  # wired: later
    with pytest.raises(ConfigError, match="Save Model's weights is 'ema'.*ema_decay is 0"):  # a full fine-tune's EMA
        checks.check_save_names(_graph(checks.SAVE_MODEL, weights="ema"), "8", checks.RunOutputs(full=True))
    checks.check_save_names(_graph(checks.SAVE_MODEL, weights="ema"), "8", checks.RunOutputs(full=True, ema=True))


def test_a_taken_save_model_name_is_found_before_training(folders):
    taken = folders["diffusion_models"] / "pipetrain" / "mine.safetensors"
    taken.write_bytes(b"a model the user made")
    full = checks.RunOutputs(full=True)
    with pytest.raises(ConfigError, match=r"Save Model's name 'mine' is taken: .*mine\.safetensors already exists.*"
                                          r"Nothing was trained"):
        checks.check_save_names(_graph(checks.SAVE_MODEL), "8", full)
    checks.check_save_names(_graph(checks.SAVE_MODEL, overwrite=True), "8", full)
    checks.check_save_names(_graph(checks.SAVE_MODEL, name="free"), "8", full)
    with pytest.raises(ConfigError, match="model name '../up' is not allowed"):
        checks.check_save_names(_graph(checks.SAVE_MODEL, name="../up"), "8", full)
    # a LoRA of the same name does not block a model, nor the other way round
    checks.check_save_names(_graph(checks.SAVE_LORA), "8", checks.RunOutputs())
    assert taken.read_bytes() == b"a model the user made"
