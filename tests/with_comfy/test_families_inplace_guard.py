"""engine/patches/guard.py: a block that writes into its input stops training with an error naming
the block, before any gradient is computed (the safety net for blocks PipeTrain has no
out-of-place copy of, e.g. a newer ComfyUI's)."""
import pytest
import torch
from torch import nn

import family_configs as fc

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


class _InPlaceBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        x += self.out(self.proj(x))
        return x


def _plain():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


class _Model(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.blocks = nn.ModuleList([_plain(), block])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_unknown_inplace_block_is_named():
    from PipeTrain.engine.patches.guard import InPlaceBlockError, guard_blocks

    model = _Model(_InPlaceBlock())
    assert guard_blocks(model) == 2
    with pytest.raises(InPlaceBlockError, match=r"block 1 \(.*_InPlaceBlock\) updated an input tensor \(2, 4\)"):
        model(torch.randn(2, 4))


def test_out_of_place_block_passes_and_hooks_go_away():
    from PipeTrain.engine.patches.guard import guard_blocks

    model = _Model(_plain())
    guard_blocks(model)
    model(torch.randn(2, 4))
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)


class _OutOfMemoryBlock(nn.Module):
    """Raises CUDA's out-of-memory error on its first call: a stand-in for a GPU running out of memory
    (a CPU cannot), as the fit probe's no-checkpointing pass does on a large model."""

    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(4, 4), nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")
        return self.out(self.proj(x))


def test_block_that_runs_out_of_memory_keeps_no_activation_alive():
    """The guard must not hold the failed block's input (and through its graph every activation before it)
    after the error: the fit probe's next pass needs that memory. Measured on an H100: Wan 14B's probe found
    no mode fitting because the no-checkpointing pass's activations stayed alive."""
    import gc
    import weakref

    from PipeTrain.engine.memory.fit_probe import measure_mode
    from PipeTrain.engine.patches.guard import guard_blocks

    model = _Model(_OutOfMemoryBlock())
    guard_blocks(model)
    made = []
    model.blocks[0].register_forward_hook(lambda module, args, out: made.append(weakref.ref(out)))
    trainable = list(model.parameters())
    x = torch.randn(2, 4)
    peak, _ = measure_mode(model, "off", lambda: model(x).sum().backward(), trainable, torch.device("cpu"))
    assert peak is None  # the pass ran out of memory
    gc.collect()
    assert made and made[0]() is None, "block 0's output (the failed block's input) is still alive"
    peak, _ = measure_mode(model, "on", lambda: model(x).sum().backward(), trainable, torch.device("cpu"))
    assert peak is not None and model.blocks[1].calls > 1  # the next pass trains


@pytest.mark.parametrize("name", ["flux", "ltxv", "hunyuan_video"])
def test_comfyui_inplace_blocks_without_patch_are_caught(comfy, name):
    """ComfyUI's own in-place blocks with none of PipeTrain's forwards installed: the guard reports them."""
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.patches import fixes
    from PipeTrain.engine.patches.guard import InPlaceBlockError, guard_blocks

    family = next(f for f in fc.FAMILIES if f.name == name)
    model = fc.build(family)
    was = fixes.active()
    fixes.uninstall_all()
    try:
        guard_blocks(model.diffusion_model)
        latents, conds = fc.batch(family)
        with pytest.raises(InPlaceBlockError, match="updated an input tensor"):
            DiffusionObjective(model, seed=0)(latents, conds, [0])
    finally:
        for fix in was:
            fixes.install(fix)
