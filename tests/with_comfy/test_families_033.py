"""The families only ComfyUI 0.33 and later have train a LoRA on the engine's generic path, and the
saved LoRA loads through ComfyUI's own loader (tests/family_harness.py; configs and conditioning in
tests/family_configs_033.py). On a host without a family (ComfyUI 0.3.75) its tests skip, naming
what the host lacks ("ComfyUI 0.3.75 has no comfy.supported_models.Krea2").

Modes: Krea 2 t2i and edit (reference latents with the "index" and "index_timestep_zero" reference
methods); Anima t2i with the T5 token ids and weights its text encoder adds (outside inference mode
ComfyUI runs the LLM adapter inside the model, so the cache must hand them over; checked through a
real cache below); Flux 2 Klein t2i and edit (two reference latents); Ernie-Image t2i; Ideogram 4 t2i,
unpadded (ComfyUI drops the all-ones text mask) and padded (the mask reaches the model); MiniMax H3 t2i
and t2v (one and two latent frames), with an audio stream of no frames, the latent packed as ComfyUI's
sampler packs its video + audio pair (docs/supported-models.md says what audio + video still needs).

Detection (comfy.model_detection, 0.33.0): for Krea 2, Anima, Flux 2 Klein and MiniMax H3 it reads
every width from a tiny state dict, and the tiny configs are exactly what it detects (the tiny files load
through comfy.sd.load_diffusion_model as those classes, same weights). Ernie-Image's detection returns only
{"image_model": "ernie"}, so a file always builds the class defaults (hidden 4096, 36 layers): its
tiny config goes through comfy.supported_models.ErnieImage instead. Ideogram 4's returns the input width
and the depth only, and its class pins the other widths: the tiny ones go in after its constructor
(Family.make). Every training test builds its model through comfy.supported_models.<Class>(config)
.get_model({}), as tests/with_comfy/test_families.py does.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import family_configs as fc
import family_configs_033 as f33
import family_harness

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.fixture(autouse=True)
def _probe_each_mode():
    """Every test probes its own blocks: a verdict of another mode's call (Krea 2's reference methods
    share the cache's conditioning keys) is not reused, and nothing of ours stays installed."""
    from PipeTrain.engine.patches import fixes, verdicts

    fixes.uninstall_all()
    verdicts._MEMO.clear()
    yield
    fixes.uninstall_all()


def _require(family: fc.Family) -> None:
    """Skip unless the host has what the family needs (its supported_models class; Klein: its text encoder)."""
    from PipeTrain.engine.patches import comfy_version

    path = f33.NEEDS.get(family.group, f"comfy.supported_models.{family.supported}")
    module, _, attr = path.rpartition(".")
    try:
        present = hasattr(importlib.import_module(module), attr)
    except ImportError:
        present = False
    if not present:
        pytest.skip(f"ComfyUI {comfy_version()} has no {path}")


def _family(name: str) -> fc.Family:
    return next(f for f in f33.FAMILIES if f.name == name)


@pytest.mark.parametrize("family", f33.FAMILIES, ids=[f.name for f in f33.FAMILIES])
def test_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):
    _require(family)
    family_harness.check(family, family_harness.run_family(family, tmp_path))


def _denoised(model, family):
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options

    latents, conds = fc.batch(family)
    prepared = DiffusionObjective(model, seed=0, **family.train).prepare(latents, conds, [0])
    with torch.no_grad():
        return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                                 **prepared.kwargs)


@pytest.mark.parametrize("family", f33.FAMILIES, ids=[f.name for f in f33.FAMILIES])
def test_the_forwards_the_probe_picks_give_upstreams_output(comfy, family):
    """Whatever the probe installs (0.33.0: nothing for Krea 2 and Ideogram 4, the comfy-kitchen backward
    for Anima's Cosmos blocks and Ernie-Image's rope, flux-layers 0.33 for Klein, minimax-mod 0.33 with
    the comfy-kitchen backward for MiniMax H3), the model's output is ComfyUI's own training-mode
    output, bit for bit."""
    from PipeTrain.engine import patches
    from trainable import make_trainable

    _require(family)
    patches.set_training_mode(True)  # upstream's training-mode math is the reference
    upstream = _denoised(fc.build(family), family)
    model = fc.build(family)
    chosen = make_trainable(model, *fc.batch(family))
    assert torch.equal(_denoised(model, family), upstream), chosen


_ONE_PER_CLASS = [f for f in f33.FAMILIES
                  if f.name in ("krea2", "anima", "flux2_klein", "ernie_image", "ideogram4", "minimax_h3_t2i")]


@pytest.mark.parametrize("family", _ONE_PER_CLASS, ids=[f.name for f in _ONE_PER_CLASS])
def test_detection_of_the_tiny_state_dict(comfy, family, tmp_path):
    """Krea 2, Anima, Flux 2 Klein, MiniMax H3: detected as the class with exactly the tiny config, and the saved
    file loads through ComfyUI's loader with the same weights. Ernie-Image, Ideogram 4: detected as their
    class, reading no width (Ernie) or only the input width and depth (Ideogram 4) from the tensors."""
    import comfy.model_detection
    import comfy.sd
    from safetensors.torch import save_file

    _require(family)
    state = fc.build(family).diffusion_model.state_dict()
    detected = comfy.model_detection.detect_unet_config(state, "")
    assert type(comfy.model_detection.model_config_from_unet(state, "")).__name__ == family.supported
    if family.supported in f33.PARTLY_DETECTED:
        assert detected == {k: family.config[k] for k in f33.PARTLY_DETECTED[family.supported]}, detected
        return
    assert detected == family.config
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    loaded = comfy.sd.load_diffusion_model(str(path)).model
    assert type(loaded.model_config).__name__ == family.supported
    got = loaded.diffusion_model.state_dict()
    assert set(got) == set(state)
    for key, value in state.items():
        assert torch.equal(got[key].float(), value.float()), key


def _anima_text_encoder_output(caption: str):
    """(cross_attn, extras) as CacheLatents gets them from an Anima CLIP (engine/cache/items.py:
    clip.encode_from_tokens_scheduled), from ComfyUI's own Anima tokenizer and AnimaTEModel code,
    with the Qwen3-0.6B forward replaced by random hidden states (AnimaTEModel adds the T5 ids and
    weights after it)."""
    import comfy.text_encoders.anima as anima
    from comfy import sd1_clip

    class _Hidden(sd1_clip.SD1ClipModel):
        def encode_token_weights(self, token_weight_pairs):
            n = len(token_weight_pairs["qwen3_06b"][0])
            gen = torch.Generator().manual_seed(n)
            return torch.randn(1, n, 1024, generator=gen), None, {"attention_mask": torch.ones(1, n, dtype=torch.long)}

    class _Encoder(anima.AnimaTEModel, _Hidden):  # AnimaTEModel's super() is _Hidden
        pass
    cond, pooled, extras = _Encoder.__new__(_Encoder).encode_token_weights(
        anima.AnimaTokenizer().tokenize_with_weights(caption))
    return cond, {"pooled_output": pooled, **extras}


def test_anima_t5_ids_and_weights_reach_the_model_through_the_cache(comfy, tmp_path):
    """The integer T5 ids and float weights (unbatched [L]; L = 1 for an empty caption) go through a
    real format-2 cache (engine/cache: shards + metadata table) and give the model the kwargs ComfyUI's
    sampler gives it from the in-memory conditioning."""
    import comfy.sampler_helpers
    import comfy.samplers
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.cache.shards import ShardWriter, write_metadata
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import batch_items

    family = _family("anima")
    _require(family)
    captions = ["a photo of (a cat:1.2)", ""]
    encoded = [_anima_text_encoder_output(c) for c in captions]
    assert encoded[0][1]["t5xxl_ids"].dtype == torch.int32 and encoded[0][1]["t5xxl_weights"].max() == 1.2
    assert encoded[1][1]["t5xxl_ids"].shape == (1,)
    latent = torch.randn(1, *family.latent, generator=torch.Generator().manual_seed(0))
    cache = tmp_path / "cache"
    writer = ShardWriter(cache)
    for i, (cond, extras) in enumerate(encoded):
        assert write_item(writer, i, latent, cond, extras, f"{i}.png", captions[i], 1) == []
    writer.flush()
    write_metadata(cache, "0" * 16, DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64), {},
                   lambda i: {"source": f"{i}.png", "repeats": 1})
    dataset = CachedDataset(cache)
    model = fc.build(family)
    objective = DiffusionObjective(model, seed=0)
    for i, (cond, extras) in enumerate(encoded):
        latents, conds = batch_items([dataset[i]], torch.device("cpu"))  # what the training loop's collate does
        prepared = objective.prepare(latents, conds, [0])
        sampler = comfy.samplers.encode_model_conds(
            model.extra_conds, comfy.sampler_helpers.convert_cond([[cond, extras]]), prepared.xt, torch.device("cpu"),
            "positive", latent_image=prepared.x0, denoise_mask=None, seed=0)[0]["model_conds"]
        want = {k: c.process_cond(batch_size=1, area=None).concat([]) for k, c in sampler.items()}
        assert {"t5xxl_ids", "t5xxl_weights", "c_crossattn"} <= set(prepared.kwargs) == set(want)
        for key, value in want.items():
            got = prepared.kwargs[key]
            assert got.dtype == value.dtype and torch.equal(got, value), key


def test_minimax_h3_text_refiner_runs_in_extra_conds_frozen(comfy):
    """MiniMax H3's model_base runs condition_proj + the token refiner inside extra_conds, so the
    objective's prepare() (which calls extra_conds, in grad mode during a step) refines the cached text
    every step. They are outside the block lists, so no LoRA preset reaches them and they stay frozen:
    the refined text carries no autograd graph, and it is what the model's own preprocessing gives."""
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora
    from PipeTrain.engine.train.objective import DiffusionObjective
    from trainable import make_trainable

    family = _family("minimax_h3_t2i")
    _require(family)
    model = fc.build(family)
    dm = model.diffusion_model
    latents, conds = fc.batch(family)
    make_trainable(model, latents, conds)
    targets = inject_lora(dm, LoraSpec(rank=4, targets="all_linear"))
    assert targets and not [t for t in targets if t.startswith(("token_refiner.", "condition_proj"))]
    assert not any(p.requires_grad for n, p in dm.named_parameters() if n.startswith(("token_refiner.", "condition_proj")))
    with torch.enable_grad():
        context = DiffusionObjective(model, seed=0).prepare(latents, conds, [0]).kwargs["c_crossattn"]
    assert context.shape == (1, fc.T, family.config["hidden_size"]) and not context.requires_grad
    with torch.no_grad():
        assert torch.equal(context, dm.preprocess_text_embeds(conds[0]["cross_attn"][None]))


@pytest.mark.parametrize("family", _ONE_PER_CLASS, ids=[f.name for f in _ONE_PER_CLASS])
def test_lora_lands_on_the_block_targets_only(comfy, family):
    """engine.train.lora.inject_lora puts adapters on exactly select_lora_targets' paths, not on the
    prefix modules whose paths end the same way (MiniMax H3's token_refiner.blocks, Anima's
    llm_adapter.blocks: peft's list matching would take them by suffix)."""
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora

    _require(family)
    dm = fc.build(family).diffusion_model
    for targets in ("attention", "all_linear"):
        chosen = inject_lora(dm, LoraSpec(rank=4, targets=targets))
        wrapped = {n.rsplit(".lora_A", 1)[0] for n, _ in dm.named_modules() if n.endswith(".lora_A")}
        assert wrapped == set(chosen), sorted(wrapped ^ set(chosen))[:4]
        dm = fc.build(family).diffusion_model
