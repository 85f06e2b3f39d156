"""Pipeline parallelism for Wan 2.2 TI2V 5B image-to-video: the latent's noise mask keeps the start
frame clean and WAN22.process_timestep gives every frame its own timestep; the Wan adapter's stage
layers reproduce apply_model bit for bit, with the same LoRA gradients."""
from __future__ import annotations

import adapter_checks as ac
import family_configs as fc
import torch
from trainable import ensure_trainable

_TI2V = next(f for f in fc.FAMILIES if f.name == "wan22_5b_ti2v")
_T2V = next(f for f in fc.FAMILIES if f.name == "wan22_5b")


def _prepared(family, model, seed: int = 3):
    from PipeTrain.engine.train.objective import DiffusionObjective

    latents, conds = fc.batch(family)
    prepared = DiffusionObjective(model, seed=seed).prepare(latents, conds, list(range(latents.shape[0])))
    return ensure_trainable(model, prepared)


def test_ti2v_stage_layers_equal_comfyui_forward(comfy):
    model = fc.build(_TI2V)
    prepared = _prepared(_TI2V, model)
    assert "denoise_mask" in prepared.kwargs
    ac.assert_layers_equal_reference(model, prepared, "wan", contiguous=False)
    # The mask reaches the model: without it every frame shares one timestep and the output changes.
    with torch.no_grad():
        masked = ac.reference(model, prepared)
        prepared.kwargs.pop("denoise_mask")
        plain = ac.reference(model, prepared)
        assert torch.equal(ac.run_layers(model, prepared, "wan", contiguous=False), plain)
    assert (masked - plain).abs().max() > 1e-4


def test_t2v_5b_stage_layers_equal_comfyui_forward(comfy):
    model = fc.build(_T2V)
    ac.assert_layers_equal_reference(model, _prepared(_T2V, model), "wan", contiguous=False)


def test_ti2v_lora_gradients_equal_comfyui(comfy):
    model = fc.build(_TI2V)
    _, lora = ac.with_lora(model)
    prepared = _prepared(_TI2V, model)
    ac.assert_same_lora_grads(*ac.lora_grads(model, prepared, lora, "wan", contiguous=False))


def test_a14b_i2v_expert_stage_layers_equal_comfyui_forward(comfy):
    """Wan 2.2 A14B's image-to-video expert: the Wan 2.1 classes with 36 input channels (start-frame
    concat latents and mask) and no CLIP vision tokens."""
    family = next(f for f in fc.FAMILIES if f.name == "wan22_a14b_low_i2v")
    model = fc.build(family)
    prepared = _prepared(family, model)
    assert "c_concat" in prepared.kwargs and "clip_fea" not in prepared.kwargs
    ac.assert_layers_equal_reference(model, prepared, "wan", contiguous=False)
