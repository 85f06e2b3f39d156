"""Making a tiny test model trainable the way the engine does (engine/train/loop.py): the block probe
(engine.patches.make_trainable) on one forward, then LoRA, then the memory options."""
from __future__ import annotations

import pytest
import torch

import family_configs as fc


# Fixtures for the patch tests (imported by name into a test module, they apply to all its tests).
@pytest.fixture(scope="module", autouse=True)
def comfy(comfy_root):
    """The host ComfyUI imported, as the engine imports it."""
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.fixture(autouse=True)
def no_fixes_installed():
    """Each test probes its blocks afresh: no cached verdict, and none of our forwards left installed."""
    from PipeTrain.engine.patches import fixes, verdicts

    fixes.uninstall_all()
    verdicts._MEMO.clear()
    yield
    fixes.uninstall_all()


def make_trainable(model, latents, conds, **objective_options) -> dict:
    """engine.patches.make_trainable on ComfyUI BaseModel `model`, probing with this batch."""
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.patches.trainable import make_trainable as probe_and_fix

    objective = DiffusionObjective(model, seed=0, **objective_options)
    return probe_and_fix(model.diffusion_model, lambda: objective(latents, conds, list(range(len(conds)))))


def trained_model(fam: fc.Family, checkpointing: str = "off", rank: int = 4):
    """(model, objective, (latents, conds)) with peft LoRA on every block linear, lora_B drawn at
    random (not peft's zeros, so every LoRA weight gets a gradient), and checkpointing applied."""
    from PipeTrain.engine.memory.activation_checkpointing import enable_checkpointing
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora
    from PipeTrain.engine.train.objective import DiffusionObjective

    model = fc.build(fam)
    latents, conds = fc.batch(fam)
    make_trainable(model, latents, conds, **fam.train)
    model.requires_grad_(False)
    torch.manual_seed(0)
    inject_lora(model.diffusion_model, LoraSpec(rank=rank, targets="all_linear"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.diffusion_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    if checkpointing != "off":
        enable_checkpointing(model.diffusion_model, checkpointing)
    return model, DiffusionObjective(model, seed=0, **fam.train), (latents, conds)


def ensure_trainable(model, prepared):
    """make_trainable once per model, probing with a prepared batch (objective.Prepared); returns it."""
    from PipeTrain.engine.train.objective import transformer_options
    from PipeTrain.engine.patches.trainable import is_trainable, make_trainable as probe_and_fix

    if not is_trainable(model.diffusion_model):
        probe_and_fix(model.diffusion_model, lambda: model.apply_model(
            prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma), **prepared.kwargs))
    return prepared
