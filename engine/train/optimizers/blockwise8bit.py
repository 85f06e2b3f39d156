"""Block-wise 8-bit storage for optimizer moments.

A tensor is cut into blocks of BLOCK values; each block keeps one float32 scale (its largest
magnitude) and one byte per value: the index of the nearest entry in a fixed 256-entry codebook of
numbers in [-1, 1]. The codebook is non-linear ("dynamic"): a value is f * 10**-e, where the
exponent e uses some of the bits and the fraction f in (0.1, 1] spreads the rest linearly. Values
near the block's maximum keep ~1.5 % resolution and small ones still span seven decades, which
is what Adam's moments need (their magnitudes differ by orders within a block).
Rounding is to the nearest entry, so a restored state gives bit-identical next steps.
"""
from __future__ import annotations

import torch

BLOCK = 256
_CODEBOOKS: dict[tuple[bool, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def codebook(signed: bool) -> torch.Tensor:
    """The 255 (signed) or 256 (unsigned) sorted code values, float32."""
    value_bits = 7 if signed else 8  # the signed code spends one bit on the sign
    magnitudes = []
    for exponent in range(value_bits):
        steps = 2 ** (value_bits - 1 - exponent)  # fewer fraction bits as the exponent grows
        fraction = 0.1 + 0.9 * torch.arange(1, steps + 1, dtype=torch.float64) / steps
        magnitudes.append(fraction * 10.0 ** -exponent)
    pos = torch.cat(magnitudes)
    values = torch.cat([-pos, torch.zeros(1, dtype=torch.float64), pos]) if signed else \
        torch.cat([torch.zeros(1, dtype=torch.float64), pos])
    return torch.sort(values.float()).values


def _tables(signed: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (signed, device)
    if key not in _CODEBOOKS:
        code = codebook(signed).to(device)
        _CODEBOOKS[key] = (code, (code[1:] + code[:-1]) / 2)  # midpoints: bucketize -> nearest entry
    return _CODEBOOKS[key]


def blocks_for(numel: int) -> int:
    return (numel + BLOCK - 1) // BLOCK


def quantize_(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, signed: bool) -> None:
    """Store float tensor x into `codes` (uint8, blocks*BLOCK) and `scales` (float32, blocks)."""
    code, midpoints = _tables(signed, x.device)
    flat = x.detach().reshape(-1).float()
    padded = torch.zeros(codes.numel(), dtype=torch.float32, device=x.device)
    padded[:flat.numel()] = flat
    padded = padded.view(-1, BLOCK)
    absmax = padded.abs().amax(dim=1)
    scales.copy_(absmax)
    normalised = padded / torch.where(absmax > 0, absmax, torch.ones_like(absmax)).unsqueeze(1)
    codes.copy_(torch.bucketize(normalised.reshape(-1), midpoints).to(torch.uint8))


def dequantize(codes: torch.Tensor, scales: torch.Tensor, like: torch.Tensor, signed: bool) -> torch.Tensor:
    """The float32 tensor (shape of `like`) that `codes` and `scales` stand for."""
    code, _ = _tables(signed, codes.device)
    values = code[codes.long()].view(-1, BLOCK) * scales.unsqueeze(1)
    return values.reshape(-1)[:like.numel()].view(like.shape)
