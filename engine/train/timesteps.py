"""Where a training sample's noise level comes from: a draw t in (0, 1) (1 = pure noise), then the
model's schedule maps t to sigma.

    uniform        t ~ U(lo, hi)
    logit_normal   t = sigmoid(s * z), z ~ N(0, 1), s = objective.sigmoid_scale (1: SD3's logit-normal)
                   restricted to [lo, hi] by inverse-CDF sampling (the shape inside the range is kept)

Flux-style schedules (ComfyUI's ModelSamplingFlux: Flux, Flux 2, Chroma, Qwen-Image) map t with the
exponent mu: sigma = e^mu / (e^mu + 1/t - 1). With objective.resolution_shift, mu comes from the image's
token count as ComfyUI's ModelSamplingFlux node computes it for a width x height image:
    mu = base_shift + (max_shift - base_shift) * (tokens - 256) / (4096 - 256),
    tokens = width * height / (8 * 8 * 2 * 2) = latent cells / patch cells (its 2x2 patches of 8x latents).
"""
from __future__ import annotations

import math

import torch

from ..config.objective import FLUX_BASE_TOKENS, FLUX_MAX_TOKENS

# Keep timesteps off the exact ends of the schedule, where some samplings are infinite or 0.
T_MIN, T_MAX = 1e-3, 1.0 - 1e-3


def _logit_cdf(bound: float, scale: float) -> torch.Tensor:
    """P(sigmoid(scale * z) <= bound) for z ~ N(0, 1)."""
    b = torch.tensor(min(max(bound, 1e-7), 1 - 1e-7), dtype=torch.float64)
    return torch.distributions.Normal(0.0, 1.0).cdf(torch.logit(b) / scale)


def draw_time(gen: torch.Generator, method: str, lo: float = 0.0, hi: float = 1.0, scale: float = 1.0) -> float:
    """Noise level t in (0, 1) drawn from `gen` (see the module's table); with the full range and scale 1
    the draws are the ones PipeTrain made before the range and the scale existed."""
    if method == "logit_normal":
        if (lo, hi) == (0.0, 1.0):
            t = torch.sigmoid(torch.randn((), generator=gen) * scale).item()
        else:
            c_lo, c_hi = _logit_cdf(lo, scale), _logit_cdf(hi, scale)
            u = c_lo + (c_hi - c_lo) * torch.rand((), generator=gen, dtype=torch.float64)
            t = torch.sigmoid(torch.distributions.Normal(0.0, 1.0).icdf(u) * scale).item()
    else:
        t = lo + (hi - lo) * torch.rand((), generator=gen).item()
    return min(max(t, lo, T_MIN), hi, T_MAX)


def quantile_time(method: str, q: float, lo: float, hi: float, scale: float = 1.0) -> float:
    """The q-quantile of draw_time(method, lo, hi, scale) (its inverse CDF at q)."""
    if method == "logit_normal":
        c_lo, c_hi = _logit_cdf(lo, scale), _logit_cdf(hi, scale)
        t = torch.sigmoid(torch.distributions.Normal(0.0, 1.0).icdf(c_lo + (c_hi - c_lo) * q) * scale).item()
    else:
        t = lo + (hi - lo) * q
    return min(max(t, lo, T_MIN), hi, T_MAX)


def image_tokens(latent_shape: tuple[int, ...], patch: int) -> float:
    """Image tokens of one latent [C, (T,) H, W] cut into patch x patch cells (frames count each)."""
    cells = math.prod(int(d) for d in latent_shape[1:])
    return cells / (patch * patch)


def resolution_mu(tokens: float, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """Flux's mu for an image of `tokens` tokens (ComfyUI's ModelSamplingFlux node, any size: the line
    goes on below 256 and above 4096 tokens as there)."""
    slope = (max_shift - base_shift) / (FLUX_MAX_TOKENS - FLUX_BASE_TOKENS)
    return base_shift + slope * (tokens - FLUX_BASE_TOKENS)


def flux_sigma(t: float, mu: float) -> float:
    """ComfyUI's flux_time_shift(mu, 1, t): the sigma of draw t under exponent mu (0 and 1 stay put)."""
    if t <= 0.0:
        return 0.0
    if t >= 1.0:
        return 1.0
    return math.exp(mu) / (math.exp(mu) + (1.0 / t - 1.0))


def flux_time(sigma: float, mu: float) -> float:
    """The inverse of flux_sigma: the draw t whose sigma is `sigma` under exponent mu."""
    if sigma <= 0.0:
        return 0.0
    if sigma >= 1.0:
        return 1.0
    return 1.0 / (1.0 + math.exp(mu) * (1.0 / sigma - 1.0))
