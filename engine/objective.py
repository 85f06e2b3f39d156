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
models it is exactly the velocity MSE |v_pred - (noise - x0)|^2).

Randomness (noise, timestep) comes from a generator seeded by (seed, global sample index), so
a sample gets the same noise whatever the number of processes, and a resumed run repeats an
uninterrupted one exactly.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config import ConfigError

# Keep timesteps off the exact ends of the schedule, where some samplings are infinite or 0.
_T_MIN, _T_MAX = 1e-3, 1.0 - 1e-3


def apply_timestep_shift(model: nn.Module, shift: float) -> None:
    """Override the model's sampling shift for training (0 keeps the one ComfyUI samples with).

    Flow schedules (SD3, AuraFlow, Wan, HunyuanVideo: sigma = shift*t / (1 + (shift-1)*t); Flux-style:
    shift is the exponent mu) take it through their own set_parameters; discrete eps/v schedules
    have no shift.
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


def sample_generator(seed: int, sample_index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + sample_index) % (2**63 - 1))


def draw_time(gen: torch.Generator, method: str) -> float:
    """Noise level t in (0, 1): 1 = pure noise. Uniform, or logit-normal (SD3-style)."""
    if method == "logit_normal":
        t = torch.sigmoid(torch.randn((), generator=gen)).item()
    else:
        t = torch.rand((), generator=gen).item()
    return min(max(t, _T_MIN), _T_MAX)


class DiffusionObjective(nn.Module):
    """Wraps a ComfyUI BaseModel; forward(batch) returns the mean loss over the batch."""

    def __init__(self, base_model: nn.Module, seed: int, timestep_sampling: str = "uniform"):
        super().__init__()
        self.base = base_model
        self.seed = seed
        self.timestep_sampling = timestep_sampling

    def forward(self, latents: torch.Tensor, conds: list[dict[str, Any]], sample_ids: list[int]) -> torch.Tensor:
        batch = self.prepare(latents, conds, sample_ids)
        denoised = self.base.apply_model(batch.xt, batch.sigma, transformer_options={}, **batch.kwargs)
        return native_loss(denoised, batch.x0, batch.scale)

    def prepare(self, latents: torch.Tensor, conds: list[dict[str, Any]], sample_ids: list[int]) -> "Prepared":
        """Everything apply_model and the loss need, drawn reproducibly from the sample ids."""
        model = self.base
        ms = model.model_sampling
        device = latents.device
        x0 = model.process_latent_in(latents.float())
        noise, sigmas = [], []
        for sample_id in sample_ids:
            gen = sample_generator(self.seed, sample_id)
            noise.append(torch.randn(x0.shape[1:], generator=gen))
            t = draw_time(gen, self.timestep_sampling)
            sigmas.append(float(ms.percent_to_sigma(1.0 - t)))
        noise = torch.stack(noise).to(device)
        sigma = torch.tensor(sigmas, dtype=torch.float32, device=device)
        xt = ms.noise_scaling(sigma, noise, x0)
        scale = ms.calculate_denoised(sigma, torch.ones_like(x0), torch.zeros_like(x0))
        return Prepared(xt=xt, sigma=sigma, kwargs=model_kwargs(model, conds, x0, noise), x0=x0, scale=scale)


@dataclass
class Prepared:
    xt: torch.Tensor
    sigma: torch.Tensor
    kwargs: dict[str, Any]
    x0: torch.Tensor
    scale: torch.Tensor  # d(denoised)/d(network output): maps denoised error to native-target error


def native_loss(denoised: torch.Tensor, x0: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    err = (denoised.float() - x0) / scale
    if not torch.isfinite(err).all():
        raise FloatingPointError("the loss is not finite: lower the learning rate or check the model file and cache")
    return err.pow(2).mean()


def model_kwargs(model: nn.Module, conds: list[dict[str, Any]], x0: torch.Tensor, noise: torch.Tensor) -> dict[str, Any]:
    """Turn cached conditioning into apply_model kwargs exactly as ComfyUI's sampler does.

    Mirrors comfy.samplers.encode_model_conds (defaults for width/height/prompt_type) and the
    per-cond `process_cond` + `concat` that batches conditions.
    """
    per_sample = []
    for i, cond in enumerate(conds):
        params = {k: (v.unsqueeze(0) if torch.is_tensor(v) else v) for k, v in cond["extras"].items()}
        params.update(
            cross_attn=cond["cross_attn"].unsqueeze(0),
            device=x0.device,
            noise=noise[i : i + 1],
            latent_image=x0[i : i + 1],
            denoise_mask=None,
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

