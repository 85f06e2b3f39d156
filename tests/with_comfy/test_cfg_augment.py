"""CFG-augmented training (objective.cfg_augment, engine/train/cfg_augment.py) on a tiny Flux through the
engine's objective and LoRA: the loss compares (cond + (w - 1) * uncond) / w with the target, uncond being the
same noised latent on the empty caption, without gradient; w = 1, or a batch without the empty caption, trains
as before. The refusals name the fix before any rank starts."""
from __future__ import annotations

import family_configs as fc
import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.objective import ObjectiveSpec

pytestmark = pytest.mark.core
FLUX = next(f for f in fc.FAMILIES if f.name == "flux")


def _setup(cfg_augment):
    from trainable import make_trainable

    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective

    model = fc.build(FLUX)
    latents, conds = fc.batch(FLUX)
    blank = {"cross_attn": torch.zeros_like(conds[0]["cross_attn"]), "extras": dict(conds[0]["extras"])}
    conds[0]["uncond"] = blank
    make_trainable(model, latents, conds)
    torch.manual_seed(0)  # the same LoRA in every setup
    inject_lora(model.diffusion_model, LoraSpec(rank=4))
    for p in lora_parameters(model.diffusion_model):  # peft starts lora_B at 0: give the LoRA an effect
        torch.nn.init.normal_(p, std=0.02)
    objective = DiffusionObjective(model, seed=0, objective=ObjectiveSpec(cfg_augment=cfg_augment))
    return model, objective, latents, conds, list(lora_parameters(model.diffusion_model))


def _grads(loss, params):
    return torch.autograd.grad(loss, params)


def test_the_loss_mixes_in_the_empty_captions_prediction_without_its_gradient(comfy):
    from PipeTrain.engine.train.losses import native_loss
    from PipeTrain.engine.train.objective import transformer_options

    model, objective, latents, conds, params = _setup(3.0)
    loss = objective(latents, conds, [0])
    batch = objective.prepare(latents, conds, [0])
    assert batch.uncond_kwargs is not None
    options = transformer_options(batch.sigma)
    cond = model.apply_model(batch.xt, batch.sigma, transformer_options=options, **batch.kwargs)
    uncond = model.apply_model(batch.xt, batch.sigma, transformer_options=options, **batch.uncond_kwargs)
    assert (cond - uncond).abs().max() > 1e-4  # the empty caption changes the prediction
    want = native_loss((cond + 2.0 * uncond.detach()) / 3.0, batch.x0, batch.scale)
    torch.testing.assert_close(loss, want)
    for got, expected in zip(_grads(loss, params), _grads(want, params)):
        torch.testing.assert_close(got, expected)
    plain = native_loss(cond, batch.x0, batch.scale)
    assert abs(loss.item() - plain.item()) > 1e-6  # not the plain loss


def test_off_or_without_the_empty_caption_it_trains_as_before(comfy):
    _, off, latents, conds, _ = _setup(1.0)
    assert off.prepare(latents, conds, [0]).uncond_kwargs is None
    _, on, _, _, _ = _setup(3.0)
    bare = [{k: v for k, v in c.items() if k != "uncond"} for c in conds]
    torch.testing.assert_close(on(latents, bare, [0]), off(latents, conds, [0]))


def test_refusals_name_the_fix(tmp_path):
    from PipeTrain.engine.cache.caption_store import uncond_missing
    from PipeTrain.engine.config.rules import check_cfg_augment
    from PipeTrain.engine.config.sections import MemorySpec

    with pytest.raises(ConfigError, match="pipeline_stages is 2.*set cfg_augment to 1"):
        check_cfg_augment(ObjectiveSpec(cfg_augment=4.0), MemorySpec(pipeline_stages=2))
    check_cfg_augment(ObjectiveSpec(cfg_augment=4.0), MemorySpec(pipeline_stages=1))
    with pytest.raises(ConfigError, match="cfg_augment is 0.5"):
        ObjectiveSpec(cfg_augment=0.5).validate()
    message = uncond_missing(4.0, [str(tmp_path)])
    assert message and str(tmp_path) in message and "caption_dropout" in message
    assert uncond_missing(1.0, [str(tmp_path)]) is None
    (tmp_path / "empty_caption.safetensors").write_bytes(b"")
    assert uncond_missing(4.0, [str(tmp_path)]) is None
