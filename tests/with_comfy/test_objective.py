"""The training objective's knobs on real ComfyUI model classes."""
import pytest
import torch

import tiny_wan
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.train.objective import apply_timestep_shift, draw_time, sample_generator


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def test_shift_changes_a_flow_models_noise_levels(comfy):
    model = tiny_wan.build_base_model()
    ms = model.model_sampling
    assert ms.percent_to_sigma(0.5) == pytest.approx(8 * 0.5 / (1 + 7 * 0.5))  # Wan's own shift 8
    multiplier = ms.multiplier
    apply_timestep_shift(model, 1.0)
    assert ms.percent_to_sigma(0.5) == pytest.approx(0.5)
    assert ms.multiplier == multiplier
    apply_timestep_shift(model, 0.0)  # 0 leaves it alone
    assert ms.percent_to_sigma(0.5) == pytest.approx(0.5)


def test_shift_is_refused_for_discrete_schedules(comfy, demo_base):
    import comfy.sd
    from pathlib import Path

    path = Path(demo_base["base_dir"]) / "models" / "diffusion_models" / demo_base["unet"]
    model = comfy.sd.load_diffusion_model(str(path)).model
    with pytest.raises(ConfigError, match="Set timestep_shift to 0"):
        apply_timestep_shift(model, 3.0)


def test_logit_normal_concentrates_in_the_middle():
    def spread(method):
        ts = torch.tensor([draw_time(sample_generator(0, i), method) for i in range(2000)])
        return ((ts > 0.25) & (ts < 0.75)).float().mean().item()
    assert spread("uniform") == pytest.approx(0.5, abs=0.05)
    assert spread("logit_normal") > 0.6
