"""One training objective for every model ComfyUI loads (eps, v, EDM and flow models alike).

It uses the model's own `model_sampling` the way ComfyUI's samplers do:
    x0    = process_latent_in(vae latent)          (KSampler does this before sampling)
    sigma = model_sampling.percent_to_sigma(p)     (the model's own schedule and shift)
    xt    = model_sampling.noise_scaling(sigma, noise, x0)
    D     = apply_model(xt, sigma, **extra_conds)  (ComfyUI's denoised prediction)
Every prediction type in ComfyUI is affine in the raw network output:
    D = a(sigma) * xt + b(sigma) * output,
so the error in the network's native target space (eps, v, or flow velocity) is (D - x0) / b.
The loss is the MSE of that, which is the usual objective for each family (e.g. for flow
models it is exactly the velocity MSE |v_pred - (noise - x0)|^2); objective.loss picks huber or
smooth L1 instead, min-SNR / debiased estimation weight it per sample (engine/train/losses.py).
The objective settings (engine/config/objective.py) also set the guidance a guidance-distilled model
trains at, the logit-normal scale and Flux's resolution-dependent shift (engine/train/timesteps.py).

Loss masks (LoadDataset's mask_folder, cached at latent size) weight that squared error per
latent cell; the loss is the weighted mean sum(w * err^2) / sum(w) over the batch, so a mask
that is white on half the image gives exactly the mean error of that half, whatever the mask's
area, and black cells contribute nothing (no gradient). Samples without a mask weigh 1.

Randomness (noise, timestep) comes from a generator seeded by (seed, global sample index), so
a sample gets the same noise whatever the number of processes, and a resumed run repeats an
uninterrupted one exactly.
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config.checks import ConfigError
from ..config.objective import ObjectiveSpec
from . import timesteps
from .carried_streams import carried_scale
from .cfg_augment import mixed as cfg_mixed
from .losses import native_loss, snr_weights
from .objective_checks import patch_size, snr_prediction, takes_guidance
from .timesteps import draw_time

__all__ = ["DiffusionObjective", "Prepared", "apply_timestep_shift", "draw_time", "native_loss"]
# Without objective settings (tests, the block probe) the conditioning's own guidance is kept.
CONDITIONING_AS_CACHED = ObjectiveSpec(guidance=0.0)


def apply_timestep_shift(model: nn.Module, shift: float) -> None:
    """Override the model's sampling shift for training (0 keeps the one ComfyUI samples with).

    Flow schedules (SD3, AuraFlow, Wan, HunyuanVideo: sigma = shift*t / (1 + (shift-1)*t)) take it through
    their own set_parameters; on Flux-style schedules (Flux, Flux 2, Chroma, Qwen-Image) it is the exponent
    mu of sigma = e^mu / (e^mu + 1/t - 1), so 3 there is far noisier than SD3's 3 (median sigma 0.953, SD3's
    0.75); discrete eps/v schedules have no shift.
    """
    if shift <= 0:
        return
    ms = model.model_sampling
    setter = getattr(ms, "set_parameters", None)
    params = inspect.signature(setter).parameters if setter else {}
    if "shift" not in params:
        raise ConfigError(f"timestep_shift {shift} cannot be used with {type(model).__name__}: its noise schedule "
                          "has no shift (it is not a flow model). Set timestep_shift to 0.")
    kwargs = {"shift": shift}
    if "multiplier" in params:
        kwargs["multiplier"] = ms.multiplier  # keep the model's timestep scale
    setter(**kwargs)


def transformer_options(sigma: torch.Tensor) -> dict[str, Any]:
    """A fresh transformer_options dict per call (models write into it), with the keys ComfyUI's
    sampler sets that models read: `sigmas` (the current sigma) and `sample_sigmas` (the sampling
    schedule; training has none, so it is empty: HunyuanImage 2.1's distilled "meanflow" model then
    skips its next-step embedding instead of failing with KeyError 'sigmas')."""
    return {"sigmas": sigma, "sample_sigmas": sigma.new_empty(0)}


def sample_generator(seed: int, sample_index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + sample_index) % (2**63 - 1))


def _is_flow(model_sampling) -> bool:
    import comfy.model_sampling

    return isinstance(model_sampling, comfy.model_sampling.CONST)


def _draw_position(model_sampling, sigma: float) -> float:
    """The t in [0, 1] with percent_to_sigma(1 - t) == sigma (bisection: it increases with t)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if float(model_sampling.percent_to_sigma(1.0 - mid)) < sigma:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class DiffusionObjective(nn.Module):
    """Wraps a ComfyUI BaseModel; forward(batch) returns the mean loss over the batch."""

    def __init__(self, base_model: nn.Module, seed: int, timestep_sampling: str = "uniform",
                 t_range: tuple[float, float] = (0.0, 1.0), objective: ObjectiveSpec | None = None):
        super().__init__()
        self.base = base_model
        self.seed = seed
        self.timestep_sampling = timestep_sampling
        self.t_range = (float(t_range[0]), float(t_range[1]))
        self.spec = objective if objective is not None else CONDITIONING_AS_CACHED
        self._u_ranges: dict[float | None, tuple[float, float]] = {}  # draw-space bounds per mu (noise_range)
        self._guidance_noted = False

    def forward(self, latents: torch.Tensor, conds: list[dict[str, Any]], sample_ids: list[int]) -> torch.Tensor:
        batch = self.prepare(latents, conds, sample_ids)
        denoised = self.base.apply_model(batch.xt, batch.sigma, transformer_options=transformer_options(batch.sigma),
                                         **batch.kwargs)
        if batch.uncond_kwargs is not None:  # CFG-augmented training (engine/train/cfg_augment.py)
            with torch.no_grad():
                uncond = self.base.apply_model(batch.xt, batch.sigma,
                                               transformer_options=transformer_options(batch.sigma),
                                               **batch.uncond_kwargs)
            denoised = cfg_mixed(denoised, uncond, self.spec.cfg_augment)
        return self.loss(denoised, batch)

    def loss(self, denoised: torch.Tensor, batch: "Prepared") -> torch.Tensor:
        return native_loss(denoised, batch.x0, batch.scale, batch.weight, batch.sample_weight, self.spec.loss,
                           self.spec.huber_delta)

    @staticmethod
    def labels(batch: "Prepared") -> tuple[torch.Tensor, ...]:
        """What the pipeline's last stage needs for the loss besides the output (label_loss takes them)."""
        sample_weight = batch.sample_weight if batch.sample_weight is not None else torch.ones_like(batch.sigma)
        return (batch.x0, batch.scale, sample_weight) + (() if batch.weight is None else (batch.weight,))

    def label_loss(self, denoised: torch.Tensor, labels: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x0, scale, sample_weight, *weight = labels
        return native_loss(denoised, x0, scale, weight[0] if weight else None,
                           sample_weight if self.spec.snr_weighting else None, self.spec.loss, self.spec.huber_delta)

    def prepare(self, latents: torch.Tensor, conds: list[dict[str, Any]], sample_ids: list[int]) -> "Prepared":
        """Everything apply_model and the loss need, drawn reproducibly from the sample ids."""
        x0 = self.latent_in(latents, conds)
        mu = self.mu(x0)
        lo, hi = self.noise_range(mu)
        noise, sigmas = [], []
        for sample_id in sample_ids:
            gen = sample_generator(self.seed, sample_id)
            # at the model's latent shape, which process_latent_in may change (HunyuanImage 2.1's
            # refiner folds frame pairs into channels: 32 -> 64); the sampler's noise has that shape too
            noise.append(torch.randn(x0.shape[1:], generator=gen))
            sigmas.append(self.sigma_at(draw_time(gen, self.timestep_sampling, lo, hi, self.spec.sigmoid_scale), mu))
        return self._prepare_x0(x0, conds, torch.stack(noise), sigmas)

    def mu(self, x0: torch.Tensor) -> float | None:
        """Flux's exponent for this batch's image size with objective.resolution_shift (one size per batch:
        batches never mix aspect buckets), else None (the schedule's own shift)."""
        if not self.spec.resolution_shift:
            return None
        tokens = timesteps.image_tokens(tuple(x0.shape[1:]), patch_size(self.base))
        return timesteps.resolution_mu(tokens, self.spec.base_shift, self.spec.max_shift)

    def sigma_at(self, t: float, mu: float | None = None) -> float:
        """The sigma of draw t: the model's schedule, or Flux's at exponent mu."""
        if mu is not None:
            return timesteps.flux_sigma(t, mu)
        return float(self.base.model_sampling.percent_to_sigma(1.0 - t))

    def quantile_sigma(self, latents: torch.Tensor, q: float) -> float:
        """The sigma at quantile q of the noise levels this objective trains these (raw) latents at."""
        mu = self.mu(self.base.process_latent_in(latents[:1].float()))
        lo, hi = self.noise_range(mu)
        return self.sigma_at(timesteps.quantile_time(self.timestep_sampling, q, lo, hi, self.spec.sigmoid_scale), mu)

    def noise_shape(self, latents: torch.Tensor) -> torch.Size:
        """The shape of one sample's noise for these cached (raw VAE) latents: the processed latent's."""
        return self.base.process_latent_in(latents[:1].float()).shape[1:]

    def prepare_at(self, latents: torch.Tensor, conds: list[dict[str, Any]], noise: torch.Tensor,
                   sigmas: list[float]) -> "Prepared":
        """prepare() with the noise (at noise_shape) and sigmas given (the eval set's fixed ones,
        engine/train/eval_set.py)."""
        return self._prepare_x0(self.latent_in(latents, conds), conds, noise, sigmas)

    def latent_in(self, latents: torch.Tensor, conds: list[dict[str, Any]]) -> torch.Tensor:
        """process_latent_in of a batch, with the model's `latent_shapes` set from the batch's cached ones first,
        as comfy.samplers does before sampling a packed latent (None for any other): MiniMax H3 carries its audio
        stream scaled by audio_scale only then, in process_latent_in and in the model (extra_conds)."""
        if hasattr(self.base, "latent_shapes"):  # ComfyUI 0.33+
            shapes = (conds[0].get("extras") or {}).get("latent_shapes") if conds else None
            self.base.latent_shapes = None if not shapes else [
                torch.Size((latents.shape[0], *(int(n) for n in shape[1:]))) for shape in shapes]
        return self.base.process_latent_in(latents.float())

    def _prepare_x0(self, x0: torch.Tensor, conds: list[dict[str, Any]], noise: torch.Tensor,
                    sigmas: list[float]) -> "Prepared":
        model = self.base
        ms = model.model_sampling
        device = x0.device
        if noise.shape != x0.shape:
            raise ValueError(f"noise of shape {tuple(noise.shape)} for the latent {tuple(x0.shape)} after the model's "
                             "process_latent_in: draw it at DiffusionObjective.noise_shape")
        noise = noise.to(device)
        sigma = torch.tensor(sigmas, dtype=torch.float32, device=device)
        xt = ms.noise_scaling(sigma, noise, x0)
        # each stream's own-schedule error where the sampler carries one scaled (MiniMax H3's audio)
        scale = carried_scale(model, sigma, ms.calculate_denoised(sigma, torch.ones_like(x0), torch.zeros_like(x0)))
        mask = denoise_mask(conds, x0)
        if mask is not None:  # e.g. image-to-video by a given first frame: what ComfyUI's sampler feeds
            # the kept region (clean for LTXV / Wan 2.2 / Cosmos, noised like the rest for inpainting)
            kept = model.scale_latent_inpaint(x=xt, sigma=sigma, noise=noise, latent_image=x0)
            xt = xt * mask + kept * (1.0 - mask)
        weight = mask
        user_mask = loss_mask(conds, x0)
        if user_mask is not None:  # only the loss: the model sees the whole image
            weight = user_mask if mask is None else mask * user_mask
        sample_weight = None
        if self.spec.snr_weighting:
            sample_weight = snr_weights(sigma, float(getattr(ms, "sigma_data", 1.0)),
                                        snr_prediction(ms) == "v", self.spec.min_snr_gamma,
                                        self.spec.debiased_estimation)
        uncond = None  # the batch on the empty caption, for CFG-augmented training (collate(uncond=True) gives it)
        if self.spec.cfg_augment > 1.0 and all("uncond" in c for c in conds):
            uncond = model_kwargs(model, self._guided([c["uncond"] for c in conds]), x0, noise, mask)
        return Prepared(xt=xt, sigma=sigma, kwargs=model_kwargs(model, self._guided(conds), x0, noise, mask), x0=x0,
                        scale=scale, weight=weight, sample_weight=sample_weight, uncond_kwargs=uncond)

    def _guided(self, conds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """conds with objective.guidance as every item's guidance, for models that take one (guidance 0: as
        cached, else ComfyUI's default for the model)."""
        value = self.spec.guidance
        if value <= 0 or not takes_guidance(self.base):
            return conds
        cached = {c["extras"].get("guidance", "absent") for c in conds}
        if not self._guidance_noted and cached - {"absent", value}:
            self._guidance_noted = True
            shown = ", ".join(sorted(str(v) for v in cached if v != "absent"))
            print(f"objective.guidance {value:g} replaces the guidance cached with the dataset ({shown}); set "
                  "guidance to 0 to train at the cached value.", file=sys.stderr, flush=True)
        return [{**c, "extras": {**c["extras"], "guidance": value}} for c in conds]

    def noise_range(self, mu: float | None = None) -> tuple[float, float]:
        """Bounds in draw space (t before the model's schedule and shift; mu: Flux's resolution exponent)
        for train.min_t/max_t.

        min_t/max_t bound the noise level the model sees: for flow models that is sigma itself
        (xt = (1 - sigma) x0 + sigma noise; Wan 2.2's expert boundary 0.875 is such a sigma), for
        other schedules the schedule position ComfyUI's percent_to_sigma maps from. Draws inside
        the range keep the distribution they have over the whole range (shift, logit-normal).
        """
        if mu not in self._u_ranges:
            lo, hi = self.t_range
            if (lo, hi) == (0.0, 1.0):
                self._u_ranges[mu] = (0.0, 1.0)
            elif mu is not None:  # a Flux-style (flow) schedule: the bounds are sigmas
                self._u_ranges[mu] = (timesteps.flux_time(lo, mu), timesteps.flux_time(hi, mu))
            else:
                ms = self.base.model_sampling
                flow = _is_flow(ms)
                target = (lambda t: t) if flow else (lambda t: float(ms.percent_to_sigma(1.0 - t)))
                self._u_ranges[mu] = (_draw_position(ms, target(lo)), _draw_position(ms, target(hi)))
        return self._u_ranges[mu]


@dataclass
class Prepared:
    xt: torch.Tensor
    sigma: torch.Tensor
    kwargs: dict[str, Any]
    x0: torch.Tensor
    scale: torch.Tensor  # d(denoised)/d(network output): maps denoised error to native-target error
    weight: torch.Tensor | None = None  # loss weight per latent cell (denoise_mask x loss_mask), None = all 1
    sample_weight: torch.Tensor | None = None  # loss weight per sample [B] (min-SNR / debiased), None = all 1
    uncond_kwargs: dict[str, Any] | None = None  # apply_model kwargs on the empty caption (cfg_augment), else None


def denoise_mask(conds: list[dict[str, Any]], x0: torch.Tensor) -> torch.Tensor | None:
    """The latent noise mask of the batch ([B, 1|C, ...] broadcastable to x0; 1 = denoise), from the
    cached `denoise_mask` (ComfyUI's latent `noise_mask`, e.g. Wan22ImageToVideoLatent, LTXVImgToVideo,
    CosmosPredict2ImageToVideoLatent), or None when no item has one."""
    masks = [c["extras"].get("denoise_mask") for c in conds]
    if all(m is None for m in masks):
        return None
    if any(m is None for m in masks):
        raise ValueError("some samples in one batch have a denoise_mask and others not: use batch_size 1")
    out = []
    for m in masks:
        m = m.to(x0.device, torch.float32)
        while m.ndim < x0.ndim - 1:
            m = m.unsqueeze(0)
        if m.ndim == x0.ndim - 1:
            m = m.unsqueeze(0)
        if m.shape[2:] != x0.shape[2:]:
            raise ValueError(f"denoise_mask of shape {tuple(m.shape)} does not match the latent {tuple(x0.shape)}: "
                             "cache the mask at latent size")
        out.append(m[:, :1] if m.shape[1] != x0.shape[1] else m)
    return torch.cat(out)


def loss_mask(conds: list[dict[str, Any]], x0: torch.Tensor) -> torch.Tensor | None:
    """The batch's loss weights [B, 1, (1,) h, w] from the cached `loss_mask` of each sample (the
    dataset's mask images at latent size), 1 for samples without one; None when no sample has one."""
    masks = [c.get("loss_mask") for c in conds]
    if all(m is None for m in masks):
        return None
    shape = (1, 1) + (1,) * (x0.ndim - 4) + tuple(x0.shape[-2:])
    out = []
    for m in masks:
        if m is None:
            out.append(torch.ones(shape, device=x0.device))
            continue
        if tuple(m.shape[-2:]) != tuple(x0.shape[-2:]) or m.numel() != x0.shape[-1] * x0.shape[-2]:
            raise ValueError(f"loss mask of shape {tuple(m.shape)} does not match the latent {tuple(x0.shape)}: "
                             "run CacheLatents with regenerate on")
        out.append(m.to(x0.device, torch.float32).reshape(shape))
    return torch.cat(out)


def model_kwargs(model: nn.Module, conds: list[dict[str, Any]], x0: torch.Tensor, noise: torch.Tensor,
                 mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Turn cached conditioning into apply_model kwargs exactly as ComfyUI's sampler does.

    Mirrors comfy.samplers.encode_model_conds (defaults for width/height/prompt_type) and the
    per-cond `process_cond` + `concat` that batches conditions. engine/train/conditioning.py restores
    the cached dict to what extra_conds expects (batch dims, reference latent lists, CLIP vision).
    """
    from .conditioning import extra_conds_params

    per_sample = []
    for i, cond in enumerate(conds):
        params = extra_conds_params(cond, x0.ndim)
        params.update(
            device=x0.device,
            noise=noise[i : i + 1],
            latent_image=x0[i : i + 1],
            denoise_mask=None if mask is None else mask[i : i + 1],
            seed=0,
        )
        params.setdefault("width", x0.shape[-1] * 8)
        params.setdefault("height", x0.shape[-2] * 8)
        params.setdefault("prompt_type", "positive")
        out = model.extra_conds(**params)
        per_sample.append({k: c.process_cond(batch_size=1, area=None) for k, c in out.items()})
    keys = per_sample[0].keys()
    for other in per_sample[1:]:
        if other.keys() != keys:
            raise ValueError("samples in one batch have different conditioning keys: use batch_size 1")
    kwargs = {}
    for k in keys:
        first = per_sample[0][k]
        rest = [s[k] for s in per_sample[1:]]
        for r in rest:
            if hasattr(first, "can_concat") and not first.can_concat(r):
                raise ValueError(f"conditioning '{k}' differs in shape inside a batch: use batch_size 1 "
                                 "(or captions of similar length)")
        kwargs[k] = first.concat(rest)
    return kwargs
