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


def host_module(name: str):
    """The host ComfyUI's module `name`, or the test skipped, naming the ComfyUI version that lacks it."""
    import importlib

    from PipeTrain.engine.patches import comfy_version

    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"ComfyUI {comfy_version()} has no {name}")


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


def first_call(fam: fc.Family, cls_name: str):
    """(block, args, kwargs): the first block of class `cls_name` and the inputs the model's forward gives
    it (engine.patches.probe.capture, on the objective's training input), with ComfyUI's own forwards."""
    from PipeTrain.engine.patches import set_training_mode
    from PipeTrain.engine.patches.probe import capture
    from PipeTrain.engine.patches.trainable import first_blocks
    from PipeTrain.engine.train.objective import DiffusionObjective

    set_training_mode(True)
    model = fc.build(fam)
    latents, conds = fc.batch(fam)
    block = next(b for cls, b in first_blocks(model.diffusion_model).items() if cls.__name__ == cls_name)
    objective = DiffusionObjective(model, seed=0, **fam.train)
    got = capture(lambda: objective(latents, conds, [0]), {type(block): block})[type(block)]
    return got.block, got.args, got.kwargs


def lora_grads(fam: fc.Family) -> dict[str, dict[str, torch.Tensor]]:
    """{"off": ..., "on": ...}: every LoRA weight's gradient of one objective step, plain and under the
    engine's per-block checkpointing (peft LoRA on every block linear, as `trained_model` makes it)."""
    grads = {}
    for mode in ("off", "on"):
        model, objective, batch = trained_model(fam, checkpointing=mode)
        objective(*batch, [0]).backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.diffusion_model.named_parameters() if p.grad is not None}
    return grads


def run_block(block, args, kwargs) -> tuple[list[torch.Tensor], bool]:
    """(the block's float outputs on copies of args / kwargs under no grad, whether it left the copies
    as they were)."""
    from PipeTrain.engine.patches.probe import _map, _tensors

    args, kwargs = _map(args, lambda t: t.clone()), _map(kwargs, lambda t: t.clone())
    kept = [t.clone() for t in _tensors((args, kwargs))]
    with torch.no_grad():
        out = block(*args, **kwargs)
    untouched = all(torch.equal(a, b) for a, b in zip(_tensors((args, kwargs)), kept))
    return [o for o in _tensors(out) if o.is_floating_point()], untouched


def cast_floats(obj, dtype):
    """obj with every floating-point tensor inside it cast to dtype."""
    from PipeTrain.engine.patches.probe import _map

    return _map(obj, lambda t: t.to(dtype) if t.is_floating_point() else t)


def ours_and_upstreams(block, args, kwargs, fix_name: str, training: bool):
    """(our fix's outputs, upstream's outputs, whether ours left its inputs as they were) for one block
    call, with ComfyUI's training flag and the block's train/eval mode set to `training`."""
    from PipeTrain.engine.patches import fixes, set_training_mode

    block.train(training)
    set_training_mode(training)
    try:
        want, _ = run_block(block, args, kwargs)
        fixes.install(next(f for f in fixes.all_fixes() if f.name == fix_name))
        got, untouched = run_block(block, args, kwargs)
    finally:
        set_training_mode(True)
    return got, want, untouched
