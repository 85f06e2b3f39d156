"""Pipeline parallelism for Wan 2.1 image-to-video: concat channels (start frame + mask) and CLIP
vision tokens, as ComfyUI's WAN21 model_base feeds them. The stage layers equal apply_model bit for
bit, and a 2-stage DeepSpeed pipeline (2 gloo processes) trains like one process at gas 1 and 4."""
from __future__ import annotations

import pytest
import torch
from trainable import ensure_trainable

import tiny_wan
from engine_runs import assert_same_lora, pipeline_config, run_all_to_end, stage_layers_forward
from PipeTrain.engine.config.checks import ConfigError


@pytest.fixture(scope="module")
def i2v_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan-i2v")
    model = tiny_wan.write_model(root / "tiny_wan_i2v.safetensors", i2v=True)
    return str(model), tiny_wan.write_cache(root / "data", i2v=True)


def _prepared(model, cache):
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from PipeTrain.engine.train.objective import DiffusionObjective

    dataset = CachedDataset(cache)
    latents, conds, ids = collate(dataset, SampleStream([1] * len(dataset), 3), [0, 1], torch.device("cpu"))
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, ids))


def test_i2v_stage_layers_equal_comfyui_forward(i2v_files):
    import comfy.sd


    model = comfy.sd.load_diffusion_model(i2v_files[0]).model
    assert model.diffusion_model.img_emb is not None, "the tiny file was not detected as Wan i2v"
    prepared = _prepared(model, i2v_files[1])
    assert {"c_concat", "clip_fea"} <= set(prepared.kwargs), sorted(prepared.kwargs)
    with torch.no_grad():
        reference = model.apply_model(prepared.xt, prepared.sigma, transformer_options={}, **prepared.kwargs)
        acts = stage_layers_forward(model, prepared)
        prepared.kwargs["clip_fea"] = prepared.kwargs["clip_fea"].flip(-1)  # other CLIP vision tokens
        moved = model.apply_model(prepared.xt, prepared.sigma, transformer_options={}, **prepared.kwargs)
        moved_acts = stage_layers_forward(model, prepared)
    assert torch.equal(acts, reference) and torch.equal(moved_acts, moved)
    assert (moved - reference).abs().max() > 1e-4, "the CLIP vision tokens must reach the blocks"


def test_i2v_model_without_clip_vision_in_the_cache_is_refused(i2v_files):
    import comfy.sd

    from PipeTrain.engine.models import adapter_for

    model = comfy.sd.load_diffusion_model(i2v_files[0]).model
    adapter = adapter_for(model)
    prepared = _prepared(model, i2v_files[1])
    prepared.kwargs.pop("clip_fea")
    with pytest.raises(ConfigError, match="clip_vision_output"):
        acts = adapter.first_stage_inputs(prepared)
        for layer in adapter.layers(model):
            acts = layer(acts)


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 4])
def test_i2v_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, i2v_files, grad_accum):
    plain, piped = run_all_to_end(pipeline_config(tmp_path / "plain", comfy_root, i2v_files, 1, 1, grad_accum),
                                  pipeline_config(tmp_path / "piped", comfy_root, i2v_files, 2, 2, grad_accum))
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=1e-6)
