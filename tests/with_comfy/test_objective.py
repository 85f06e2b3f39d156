"""The training objective's knobs on real ComfyUI model classes."""
import math

import pytest
import torch

import tiny_wan
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.train.objective import apply_timestep_shift, draw_time, sample_generator


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def test_shift_changes_a_flow_models_noise_levels(comfy):
    model = tiny_wan.build_base_model()
    ms = model.model_sampling
    assert ms.percent_to_sigma(0.5) == pytest.approx(8 * 0.5 / (1 + 7 * 0.5))  # Wan's own shift 8
    multiplier = ms.multiplier
    apply_timestep_shift(model, 1.0)
    assert ms.percent_to_sigma(0.5) == pytest.approx(0.5)
    assert ms.multiplier == multiplier
    apply_timestep_shift(model, 0.0)  # 0 leaves it alone
    assert ms.percent_to_sigma(0.5) == pytest.approx(0.5)


def test_shift_is_refused_for_discrete_schedules(comfy, demo_base):
    import comfy.sd
    from pathlib import Path

    path = Path(demo_base["base_dir"]) / "models" / "diffusion_models" / demo_base["unet"]
    model = comfy.sd.load_diffusion_model(str(path)).model
    with pytest.raises(ConfigError, match="Set timestep_shift to 0"):
        apply_timestep_shift(model, 3.0)


def test_logit_normal_concentrates_in_the_middle():
    def spread(method):
        ts = torch.tensor([draw_time(sample_generator(0, i), method) for i in range(2000)])
        return ((ts > 0.25) & (ts < 0.75)).float().mean().item()
    assert spread("uniform") == pytest.approx(0.5, abs=0.05)
    assert spread("logit_normal") > 0.6


# ---- objective settings (engine/config/objective.py): each formula against hand-computed values ----------


def test_sigmoid_scale_scales_the_logit_normal_draw():
    from PipeTrain.engine.train.timesteps import quantile_time

    z = torch.randn((), generator=sample_generator(4, 2)).item()
    assert draw_time(sample_generator(4, 2), "logit_normal", scale=2.0) == pytest.approx(1 / (1 + math.exp(-2 * z)))
    assert draw_time(sample_generator(4, 2), "logit_normal") == pytest.approx(1 / (1 + math.exp(-z)))  # as before
    # quantiles: the median stays 0.5; the 84.13% quantile (z = 1) is sigmoid(scale)
    assert quantile_time("logit_normal", 0.5, 0.0, 1.0, 2.0) == pytest.approx(0.5)
    assert quantile_time("logit_normal", 0.841345, 0.0, 1.0, 2.0) == pytest.approx(0.880797, abs=1e-5)
    # restricted to [0.5, 1]: the lower bound is the median, so q = 0.5 inside is the 75% quantile (z = 0.6745)
    assert quantile_time("logit_normal", 0.5, 0.5, 1.0, 2.0) == pytest.approx(1 / (1 + math.exp(-2 * 0.674490)),
                                                                              abs=1e-5)


def test_resolution_mu_is_modelsamplingfluxs_line_and_sigma_its_exponent():
    from PipeTrain.engine.train.timesteps import flux_sigma, flux_time, image_tokens, resolution_mu

    assert image_tokens((16, 128, 128), 2) == 4096  # a 1024x1024 Flux image
    assert image_tokens((128, 64, 64), 1) == 4096  # a 1024x1024 Flux 2 image (16x VAE, patch 1)
    assert resolution_mu(256) == pytest.approx(0.5) and resolution_mu(4096) == pytest.approx(1.15)
    assert resolution_mu(1024) == pytest.approx(0.5 + 0.65 * 768 / 3840)  # 512x512: 0.63
    assert resolution_mu(1024, 0.5, 2.02) == pytest.approx(0.5 + 1.52 * 768 / 3840)
    assert flux_sigma(0.5, 3.0) == pytest.approx(0.952574, abs=1e-6)  # timestep_shift 3 on Flux: median 0.953
    assert flux_sigma(0.25, 1.15) == pytest.approx(math.exp(1.15) / (math.exp(1.15) + 3))
    assert flux_time(flux_sigma(0.3, 0.63), 0.63) == pytest.approx(0.3)


def test_the_losses_and_their_weights():
    from PipeTrain.engine.train.losses import element_loss, native_loss

    e = torch.tensor([0.25, -0.5, 2.0, -3.0])
    assert element_loss(e).tolist() == pytest.approx([0.0625, 0.25, 4.0, 9.0])
    assert element_loss(e, "huber", 1.0).tolist() == pytest.approx([0.03125, 0.125, 1.5, 2.5])
    assert element_loss(e, "huber", 0.5).tolist() == pytest.approx([0.03125, 0.125, 0.875, 1.375])
    assert element_loss(e, "smooth_l1", 0.5).tolist() == pytest.approx([0.0625, 0.25, 1.75, 2.75])
    # two samples of 2 cells; native error = (denoised - x0) / scale; per-sample weights and a mask
    x0 = torch.zeros(2, 1, 1, 2)
    denoised = torch.tensor([[[[0.5, 4.0]]], [[[-1.0, 0.0]]]])
    scale = torch.full((2, 1, 1, 1), 2.0)  # err = [[0.25, 2.0], [-0.5, 0.0]]
    assert native_loss(denoised, x0, scale, kind="huber").item() == pytest.approx((0.03125 + 1.5 + 0.125) / 4)
    weights = torch.tensor([0.5, 2.0])
    assert native_loss(denoised, x0, scale, sample_weight=weights).item() == pytest.approx(
        (0.5 * (0.0625 + 4.0) + 2.0 * 0.25) / 4)
    mask = torch.tensor([[[[1.0, 0.0]]], [[[1.0, 1.0]]]])
    assert native_loss(denoised, x0, scale, mask, weights, "smooth_l1", 0.5).item() == pytest.approx(
        (0.5 * 0.0625 + 2.0 * 0.25) / 3)


def test_snr_weights_for_eps_and_v():
    from PipeTrain.engine.train.losses import snr_weights

    sigma = torch.tensor([0.5, 0.25])  # SNR 4 and 16
    assert snr_weights(sigma, 1.0, False, 5.0).tolist() == pytest.approx([1.0, 5 / 16])
    assert snr_weights(sigma, 1.0, True, 5.0).tolist() == pytest.approx([4 / 5, 5 / 17])
    assert snr_weights(sigma, 1.0, False, debiased=True).tolist() == pytest.approx([0.5, 0.25])
    assert snr_weights(sigma, 1.0, True, debiased=True).tolist() == pytest.approx([2 / 5, 4 / 17])
    assert snr_weights(sigma, 1.0, False, 5.0, True).tolist() == pytest.approx([0.5, 5 / 64])
    assert snr_weights(sigma, 1.0, False).tolist() == [1.0, 1.0]


@pytest.mark.core
def test_guidance_reaches_the_models_guidance_input(comfy):
    import tiny_flux

    from PipeTrain.engine.config.objective import ObjectiveSpec
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.objective_checks import check_objective

    model = tiny_flux.build_base_model()
    latents, conds = tiny_flux.conds(2, guidance=2.5)  # e.g. Kontext's cached FluxGuidance 2.5
    seen = []
    model.diffusion_model.guidance_in.register_forward_hook(lambda m, args, out: seen.append(args[0]))

    def guidance_fed(spec):
        seen.clear()
        DiffusionObjective(model, seed=0, objective=spec)(latents, conds, [0, 1])
        (embedded,) = seen
        return embedded

    from comfy.ldm.flux.layers import timestep_embedding

    assert torch.allclose(guidance_fed(ObjectiveSpec()), timestep_embedding(torch.tensor([1.0, 1.0]), 256))
    assert torch.allclose(guidance_fed(ObjectiveSpec(guidance=4.0)), timestep_embedding(torch.tensor([4.0] * 2), 256))
    assert torch.allclose(guidance_fed(ObjectiveSpec(guidance=0.0)), timestep_embedding(torch.tensor([2.5] * 2), 256))
    no_key = [{**c, "extras": {k: v for k, v in c["extras"].items() if k != "guidance"}} for c in conds]
    seen.clear()
    DiffusionObjective(model, seed=0, objective=ObjectiveSpec(guidance=0.0))(latents, no_key, [0, 1])
    assert torch.allclose(seen[0], timestep_embedding(torch.tensor([3.5] * 2), 256))  # ComfyUI's default

    plain = tiny_flux.build_base_model(guidance_embed=False)  # no guidance input (like Flux 2 Klein)
    check_objective(plain, ObjectiveSpec())
    kw = DiffusionObjective(plain, seed=0, objective=ObjectiveSpec()).prepare(latents[:1], conds[:1], [0]).kwargs
    assert kw["guidance"].tolist() == [2.5]  # left as cached: the model does not read it
    with pytest.raises(ConfigError, match="has no guidance input .* set guidance to 1"):
        check_objective(plain, ObjectiveSpec(guidance=3.5))


@pytest.mark.core
def test_resolution_shift_draws_flux_sigmas_at_the_images_mu(comfy):
    import tiny_flux

    from PipeTrain.engine.config.objective import ObjectiveSpec
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.timesteps import flux_sigma

    model = tiny_flux.build_base_model()
    for size, mu in ((32, 0.5), (64, 0.5 + 0.65 * 768 / 3840)):  # 256 and 1024 tokens (patch 2)
        latents, conds = tiny_flux.conds(1, latent=(16, size, size))
        objective = DiffusionObjective(model, seed=7, objective=ObjectiveSpec(resolution_shift=True))
        gen = sample_generator(7, 3)
        torch.randn((16, size, size), generator=gen)  # the sample's noise comes first
        t = draw_time(gen, "uniform")
        sigma = objective.prepare(latents, conds, [3]).sigma.item()
        assert sigma == pytest.approx(flux_sigma(t, mu), rel=1e-6)
        assert sigma == pytest.approx(math.exp(mu) / (math.exp(mu) + 1 / t - 1), rel=1e-6)
    ranged = DiffusionObjective(model, seed=7, t_range=(0.2, 0.6), objective=ObjectiveSpec(resolution_shift=True))
    sigmas = [ranged.prepare(latents, conds, [i]).sigma.item() for i in range(50)]
    assert 0.2 - 1e-6 <= min(sigmas) and max(sigmas) <= 0.6 + 1e-6  # min_t/max_t bound sigma itself


@pytest.mark.core
def test_objective_settings_a_model_cannot_use_are_refused(comfy, demo_base):
    import comfy.sd
    from pathlib import Path

    import tiny_flux
    from PipeTrain.engine.config.objective import ObjectiveSpec
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.objective_checks import check_objective

    unet = comfy.sd.load_diffusion_model(
        str(Path(demo_base["base_dir"]) / "models" / "diffusion_models" / demo_base["unet"])).model
    flow = tiny_wan.build_base_model()
    for model, spec, needle in ((flow, ObjectiveSpec(min_snr_gamma=5.0), "set min_snr_gamma to 0"),
                                (flow, ObjectiveSpec(debiased_estimation=True), "debiased_estimation off"),
                                (flow, ObjectiveSpec(resolution_shift=True), "turn resolution_shift off"),
                                (unet, ObjectiveSpec(resolution_shift=True), "Flux-style schedule")):
        with pytest.raises(ConfigError, match=needle):
            check_objective(model, spec)
    check_objective(tiny_flux.build_base_model(), ObjectiveSpec(resolution_shift=True, guidance=3.5))
    spec = ObjectiveSpec(min_snr_gamma=5.0)
    check_objective(unet, spec)
    # SD1.5 is eps: weight min(SNR, 5) / SNR with SNR = 1 / sigma^2, reaching the loss
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    conds = [{"cross_attn": torch.randn(77, 768, generator=torch.Generator().manual_seed(i)), "extras": {}}
             for i in range(2)]
    objective = DiffusionObjective(unet, seed=0, objective=spec)
    batch = objective.prepare(latents, conds, [0, 1])
    snr = 1 / batch.sigma.double() ** 2
    assert batch.sample_weight.tolist() == pytest.approx((torch.clamp(snr, max=5.0) / snr).tolist(), rel=1e-6)
    with torch.no_grad():
        denoised = unet.apply_model(batch.xt, batch.sigma, **batch.kwargs)
        err2 = ((denoised.float() - batch.x0) / batch.scale).pow(2).mean(dim=(1, 2, 3))
        assert objective.loss(denoised, batch).item() == pytest.approx(
            (err2 * batch.sample_weight).mean().item(), rel=1e-5)
        assert objective.label_loss(denoised, objective.labels(batch)).item() == pytest.approx(
            objective.loss(denoised, batch).item(), rel=1e-6)  # the pipeline's last stage computes the same
