"""Activation checkpointing keeps the RNG state only for blocks that draw random numbers
(engine/memory/activation_checkpointing.py): with a LoRA dropout, recompute must replay the forward's dropout masks,
so checkpointed gradients equal plain ones; without dropout nothing needs replaying."""
from __future__ import annotations

import pytest
import torch
import tiny_flux
from engine_runs import loss_and_lora_grads, trainable_lora
from PipeTrain.engine.config.sections import LoraSpec


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def _grads(dropout: float, checkpointing: bool, seed: int = 11):
    from PipeTrain.engine.memory.blocks import blocks
    from PipeTrain.engine.memory.activation_checkpointing import draws_random_numbers, enable_checkpointing
    from PipeTrain.engine.train.lora import inject_lora
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options
    from trainable import make_trainable

    torch.manual_seed(0)  # LoRA A's initial values
    model = tiny_flux.build_base_model()
    latents, conds = tiny_flux.conds(2)
    make_trainable(model, latents, conds)
    inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear", dropout=dropout))
    model.train()
    assert all(draws_random_numbers(b) == (dropout > 0) for b in blocks(model.diffusion_model))
    lora = trainable_lora(model)
    if checkpointing:
        enable_checkpointing(model.diffusion_model, "on")
    prepared = DiffusionObjective(model, seed=3).prepare(latents, conds, [0, 1])
    torch.manual_seed(seed)  # the dropout masks
    return loss_and_lora_grads(model, prepared, lora, lambda: model.apply_model(
        prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma), **prepared.kwargs))


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_checkpointed_gradients_equal_plain_ones(comfy, dropout):
    plain_loss, plain = _grads(dropout, checkpointing=False)
    loss, grads = _grads(dropout, checkpointing=True)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain.keys() and all(g is not None and g.abs().sum() > 0 for g in plain.values())
    for name in plain:
        torch.testing.assert_close(grads[name], plain[name], rtol=1e-6, atol=1e-9, msg=name)


def test_dropout_is_active_in_these_runs(comfy):
    """Guard for the test above: another dropout draw gives other gradients, so a recompute that
    drew new masks would be caught."""
    _, first = _grads(0.5, checkpointing=False, seed=11)
    _, other = _grads(0.5, checkpointing=False, seed=12)
    assert any(not torch.allclose(first[n], other[n]) for n in first)
