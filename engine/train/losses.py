"""The loss on the error e in the model's native target space (eps, v or flow velocity; see
engine/train/objective.py), per latent cell, then its weighted mean over the batch.

    mse        e^2
    huber      e^2 / 2                    where |e| <= delta, else delta * (|e| - delta / 2)
    smooth_l1  e^2 / (2 * delta)          where |e| <= delta, else |e| - delta / 2   (= huber / delta)
(huber and smooth_l1 as torch.nn.functional.huber_loss / smooth_l1_loss define them: below delta huber is
half the squared error, above it grows linearly, so outliers pull less.)

Weights: w per latent cell (the denoise and loss masks; None = 1 everywhere) and s per sample (min-SNR /
debiased estimation; None = 1). The loss is sum(s * w * l) / sum(w) (a mean over the cells w covers),
with no mask mean(s * l).

SNR weights for eps / v-prediction models, with SNR = sigma_data^2 / sigma^2 (ComfyUI's EPS schedules,
x_t = x0 + sigma * eps; sigma_data is 1 for SD1.x/SDXL). The weights are of the noise error's
squared loss; the v-error's loss is (SNR + 1) / SNR times it, so in v space they are divided by that:
    min-SNR gamma (Hang et al. 2023)   eps: min(SNR, gamma) / SNR     v: min(SNR, gamma) / (SNR + 1)
    debiased (Yu et al. 2024)          eps: 1 / sqrt(SNR)             v: sqrt(SNR) / (SNR + 1)
Both on: their product.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def element_loss(err: torch.Tensor, kind: str = "mse", delta: float = 1.0) -> torch.Tensor:
    """The loss of each element of the native-target error `err` (the module's table)."""
    if kind == "mse":
        return err.pow(2)
    zero = torch.zeros_like(err)
    if kind == "huber":
        return F.huber_loss(err, zero, reduction="none", delta=delta)
    if kind == "smooth_l1":
        return F.smooth_l1_loss(err, zero, reduction="none", beta=delta)
    raise ValueError(f"unknown loss {kind!r}")


def native_loss(denoised: torch.Tensor, x0: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor | None = None,
                sample_weight: torch.Tensor | None = None, kind: str = "mse", delta: float = 1.0) -> torch.Tensor:
    """The batch's loss from ComfyUI's denoised prediction: err = (denoised - x0) / scale (the native-target
    error), its element_loss, weighted as the module says."""
    err = (denoised.float() - x0) / scale
    if not torch.isfinite(err).all():
        raise FloatingPointError("the loss is not finite: lower the learning rate or check the model file and cache")
    loss = element_loss(err, kind, delta)
    if sample_weight is not None:
        loss = loss * sample_weight.to(loss.device, loss.dtype).view(-1, *(1,) * (loss.ndim - 1))
    if weight is None:
        return loss.mean()
    weight = weight.expand_as(err)
    return (loss * weight).sum() / weight.sum().clamp_min(1.0)


def snr_weights(sigma: torch.Tensor, sigma_data: float, v_prediction: bool, min_snr_gamma: float = 0.0,
                debiased: bool = False) -> torch.Tensor:
    """Per-sample loss weights [B] for sigmas [B] (the module's table); 1 where both are off."""
    snr = (sigma_data / sigma.double()) ** 2
    weight = torch.ones_like(snr)
    if min_snr_gamma > 0:
        weight = weight * torch.clamp(snr, max=min_snr_gamma) / (snr + 1 if v_prediction else snr)
    if debiased:
        weight = weight * (snr.sqrt() / (snr + 1) if v_prediction else 1 / snr.sqrt())
    return weight.float()
