"""Pipeline parallelism for FLUX.2 [klein] (the `flux2` adapter, ComfyUI 0.33+): the stage layers, run one
after another, equal ComfyUI's apply_model bit for bit and give the same LoRA gradients for text to image and
editing with two reference latents; a 2-stage pipeline of real DeepSpeed gloo ranks trains like one process.

Klein is ComfyUI's Flux2 class without a guidance embedding, fed a Qwen3 text (3 hidden-state layers stacked)
with its attention mask, which Flux2.extra_conds drops (it keeps a mask only for attention-mask images), so the
adapter sees what it sees for Flux 2 Dev. The tiny config (tests/family_configs_033.py) is what 0.33.0's
detection reads from a tiny file, so the 2-process run loads a real file with ComfyUI's loader. On a ComfyUI
without the Klein text encoder (0.3.75) the tests skip and say so.
"""
from __future__ import annotations

import family_configs as fc
import family_configs_033 as f33
import pytest
import torch
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference, assert_pipelined_like_plain,
                            assert_same_lora_grads, lora_grads, two_process_runs, with_lora)
from trainable import ensure_trainable, host_module

pytestmark = pytest.mark.core

_KLEIN = next(f for f in f33.FAMILIES if f.name == "flux2_klein")
_EDIT = next(f for f in f33.FAMILIES if f.name == "flux2_klein_edit")


def _host_has_klein():
    module, _, attr = f33.NEEDS["Flux 2 Klein"].rpartition(".")
    if not hasattr(host_module(module), attr):
        pytest.skip(f"this ComfyUI has no {f33.NEEDS['Flux 2 Klein']}")


@pytest.fixture(autouse=True)
def _klein(comfy):
    _host_has_klein()


def _prepare(model, family, batch: int = 2):
    """apply_model's inputs for `batch` cached items of the family's mode."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *family.latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, family.text_width), generator=gen), "extras": family.extras(gen)}
             for _ in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


@pytest.mark.parametrize("family", [_KLEIN, _EDIT], ids=["t2i", "edit-two-refs"])
def test_stage_layers_equal_comfyui_forward(family):
    model = fc.build(family)
    prepared = _prepare(model, family)
    assert "attention_mask" not in prepared.kwargs  # Flux2.extra_conds drops the text mask
    assert_layers_equal_reference(model, prepared, "flux2")


@pytest.mark.parametrize("family", [_KLEIN, _EDIT], ids=["t2i", "edit-two-refs"])
def test_stage_layers_give_comfyui_lora_gradients(family):
    model = fc.build(family)
    targets, lora = with_lora(model)
    assert any(t.startswith("double_blocks.") for t in targets) and any(t.startswith("single_blocks.") for t in targets)
    want, got = lora_grads(model, _prepare(model, family), lora, "flux2")
    assert_same_lora_grads(want, got)


@pytest.fixture(scope="module")
def klein_files(comfy, tmp_path_factory):
    """A tiny Klein file, as 0.33.0's detection reads it back, and a cache of text-to-image items (text, mask)."""
    import tiny_detected
    from safetensors.torch import save_file

    _host_has_klein()  # a module fixture is made before the autouse skip above
    root = tmp_path_factory.mktemp("tiny-klein")
    path = root / "tiny_klein.safetensors"
    save_file({k: v.contiguous() for k, v in fc.build(_KLEIN).diffusion_model.state_dict().items()}, str(path))
    mask = torch.ones(tiny_detected.TEXT_TOKENS, dtype=torch.long)  # as Klein's text encoder gives it
    cache = tiny_detected.write_cache(root / "data", latent=_KLEIN.latent, text_width=_KLEIN.text_width,
                                      extras={"pooled_output": None, "attention_mask": mask})
    return str(path), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, klein_files):
    plain, piped = two_process_runs(tmp_path, comfy_root, klein_files)
    assert "pipeline stage 2/2" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
