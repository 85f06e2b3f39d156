"""The objective's handling of mode-specific conditioning and of train.min_t/max_t, on real
ComfyUI classes and a real cache file (engine/cache/format.py)."""
import pytest
import torch

import family_configs as fc
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.sections import TrainSpec

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def _family(name):
    return next(f for f in fc.FAMILIES if f.name == name)


@pytest.mark.parametrize("lo,hi", [(0.5, 0.5), (0.9, 0.2), (-0.1, 0.5), (0.2, 1.5)])
def test_bad_noise_range_names_the_setting(lo, hi):
    with pytest.raises(ConfigError, match="train.min_t/max_t"):
        TrainSpec(min_t=lo, max_t=hi).validate()


@pytest.mark.parametrize("name,lo,hi", [("wan22_a14b_high", 0.875, 1.0), ("wan21_t2v", 0.0, 0.875),
                                        ("flux", 0.3, 0.6), ("sdxl", 0.2, 0.4)])
@pytest.mark.parametrize("sampling", ["uniform", "logit_normal"])
def test_noise_range_bounds_the_noise_level(comfy, name, lo, hi, sampling):
    """Flow models (Wan: shift 8, Flux: mu 1.15): sigma itself in [min_t, max_t]. A discrete eps model
    (SDXL): the schedule position, so sigma between the schedule's sigmas at those positions."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    family = _family(name)
    model = fc.build(family)
    latents, conds = fc.batch(family)
    objective = DiffusionObjective(model, seed=0, timestep_sampling=sampling, t_range=(lo, hi))
    sigmas = torch.stack([objective.prepare(latents, conds, [i]).sigma[0] for i in range(400)])
    ms = model.model_sampling
    if name == "sdxl":
        lo_s, hi_s = float(ms.percent_to_sigma(1 - lo)), float(ms.percent_to_sigma(1 - hi))
    else:
        lo_s, hi_s = lo, min(hi, 1 - 1e-3)
    tol = 1e-3 * max(1.0, hi_s)
    assert sigmas.min() >= lo_s - tol and sigmas.max() <= hi_s + tol
    # the range is covered, not collapsed onto one end
    assert sigmas.max() - sigmas.min() > 0.5 * (hi_s - lo_s)
    full = DiffusionObjective(model, seed=0, timestep_sampling=sampling)
    inside = [s for s in (full.prepare(latents, conds, [i]).sigma[0] for i in range(400)) if lo_s <= s <= hi_s]
    # same distribution inside the range as the full draw restricted to it (medians within 25% of the range)
    assert abs(torch.stack(inside).median() - sigmas.median()) < 0.25 * (hi_s - lo_s)


def test_first_frame_stays_clean_and_out_of_the_loss(comfy):
    """Wan 2.2 TI2V: the latent noise mask keeps frame 0 clean in xt, gives the model per-frame
    timesteps (0 on frame 0) and leaves frame 0 out of the loss."""
    from PipeTrain.engine.train.objective import DiffusionObjective, native_loss

    family = _family("wan22_5b_ti2v")
    model = fc.build(family)
    latents, conds = fc.batch(family)
    p = DiffusionObjective(model, seed=0).prepare(latents, conds, [0])
    assert torch.equal(p.xt[:, :, 0], p.x0[:, :, 0]) and not torch.equal(p.xt[:, :, 1], p.x0[:, :, 1])
    timestep = model.process_timestep(model.model_sampling.timestep(p.sigma), x=p.xt,
                                      denoise_mask=p.kwargs["denoise_mask"])
    assert timestep.shape == (1, 3) and timestep[0, 0] == 0 and timestep[0, 1] > 0
    wrong_first_frame = p.x0.clone()
    wrong_first_frame[:, :, 0] += 10.0
    assert native_loss(wrong_first_frame, p.x0, p.scale, p.weight) == 0
    assert native_loss(p.x0 + 1.0, p.x0, p.scale, p.weight) > 0


def test_cached_edit_and_i2v_conds_round_trip_through_the_cache(comfy, tmp_path):
    """Lists (reference_latents) and objects (clip_vision_output) stored as flat tensor keys of a real
    cache file give the apply_model kwargs the in-memory ComfyUI values give."""
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec
    from PipeTrain.engine.train.objective import DiffusionObjective

    for name, flat in [("flux_kontext", lambda e: {"reference_latents.0": e["reference_latents"][0]}),
                       ("qwen_image_edit", lambda e: {f"reference_latents.{i}": r
                                                      for i, r in enumerate(e["reference_latents"])}),
                       ("wan21_i2v", lambda e: {"clip_vision_output.penultimate_hidden_states":
                                                e["clip_vision_output"]["penultimate_hidden_states"]})]:
        family = _family(name)
        model = fc.build(family)
        latents, conds = fc.batch(family)
        extras = conds[0]["extras"]
        others = {k: v for k, v in extras.items() if k not in ("reference_latents", "clip_vision_output")}
        # as ComfyUI hands them to the cache writer: every tensor with its batch dim of 1
        stored = {k: (v.unsqueeze(0) if torch.is_tensor(v) else v) for k, v in {**others, **flat(extras)}.items()}
        cache = tmp_path / name
        write_item(cache, 0, latents, conds[0]["cross_attn"].unsqueeze(0), stored, "a.png", "a", 1)
        write_manifest(cache, "0" * 16, DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64),
                       [{"file": "items/000000.safetensors", "source": "a.png", "repeats": 1}],
                       list(family.latent), ["cross_attn"], {"test": name})
        dataset = CachedDataset(cache)
        got_latents, got_conds, _ = collate(dataset, SampleStream([1], seed=0), [0], torch.device("cpu"))
        objective = DiffusionObjective(model, seed=0)
        want = objective.prepare(latents, conds, [0])
        got = objective.prepare(got_latents, got_conds, [0])
        assert want.kwargs.keys() == got.kwargs.keys()
        for k in want.kwargs:
            a, b = want.kwargs[k], got.kwargs[k]
            if isinstance(a, list):
                assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), k
            elif torch.is_tensor(a):
                assert torch.equal(a, b), k
            else:
                assert a == b, k


def test_extras_comfyui_keeps_unbatched_stay_unbatched(comfy, tmp_path):
    """A cond tensor without a batch dim of 1 (e.g. token ids [L], which newer ComfyUI models' extra_conds
    unsqueeze themselves) is stored as-is and reaches extra_conds as-is; the others get their batch dim back."""
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.train.conditioning import extra_conds_params
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec

    ids = torch.arange(6)
    write_item(tmp_path / "c", 0, torch.zeros(1, 16, 8, 8), torch.zeros(1, 6, 48),
               {"t5xxl_ids": ids, "pooled_output": torch.ones(1, 32)}, "a.png", "a", 1)
    write_manifest(tmp_path / "c", "0" * 16, DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64),
                   [{"file": "items/000000.safetensors", "source": "a.png", "repeats": 1}], [16, 8, 8],
                   ["cross_attn"], {"test": "unbatched"})
    latents, conds, _ = collate(CachedDataset(tmp_path / "c"), SampleStream([1], seed=0), [0], torch.device("cpu"))
    params = extra_conds_params(conds[0], latents.ndim)
    assert torch.equal(params["t5xxl_ids"], ids)
    assert params["pooled_output"].shape == (1, 32) and params["cross_attn"].shape == (1, 6, 48)
