"""ggml's block-quantized weights turned back into floats with torch, on whatever device they are on.

Written from ggml's block layouts (32 weights per block; the block's scale `d` and, for the _1 types, its
minimum `m` as float16; 4-bit values packed two per byte, the low nibbles first; Q5's fifth bits in one
little-endian 32-bit word). These types stay quantized in memory while training and are expanded one
layer at a time when the layer runs (engine/models/gguf_base.py). Every other ggml type (the K-quants,
the i-quants) is expanded once at load by the `gguf` package's own reference code (`dequantize_reference`).
tests/with_comfy/test_gguf_base.py checks each type here against that reference.
"""
from __future__ import annotations

import numpy as np
import torch

# type -> (weights per block, bytes per block)
BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24)}


def kept_quantized(qtype: str) -> bool:
    """True for the types this module expands at use (so the layer keeps only their bytes)."""
    return qtype in BLOCKS


def _halves(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 stored at byte `start` of each block, as float32 [n, 1]."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[n, 16] bytes -> [n, 32] values: the 16 low nibbles, then the 16 high ones."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=1).to(torch.int32)


def _fifth_bits(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The 32 fifth bits of a Q5 block (one little-endian uint32 at `start`) as [n, 32] values of 0 or 16."""
    word = blocks[:, start:start + 4].to(torch.int64)
    word = word[:, 0] | (word[:, 1] << 8) | (word[:, 2] << 16) | (word[:, 3] << 24)
    bits = (word.unsqueeze(1) >> torch.arange(32, device=blocks.device)) & 1
    return (bits << 4).to(torch.int32)


def dequantize(raw: torch.Tensor, qtype: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The weights of `raw` (uint8 bytes of whole blocks, any shape) as a `shape` tensor of `dtype`."""
    per_block, nbytes = BLOCKS[qtype]
    blocks = raw.reshape(-1, nbytes)
    d = _halves(blocks, 0)
    if qtype == "Q8_0":
        values = blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d
    elif qtype == "Q4_0":
        values = (_nibbles(blocks[:, 2:]) - 8).to(torch.float32) * d
    elif qtype == "Q4_1":
        values = _nibbles(blocks[:, 4:]).to(torch.float32) * d + _halves(blocks, 2)
    elif qtype == "Q5_0":
        values = ((_nibbles(blocks[:, 6:]) | _fifth_bits(blocks, 2)) - 16).to(torch.float32) * d
    else:  # Q5_1
        values = (_nibbles(blocks[:, 8:]) | _fifth_bits(blocks, 4)).to(torch.float32) * d + _halves(blocks, 2)
    count = int(np.prod(shape))
    if values.numel() != count:
        raise ValueError(f"{qtype} data holds {values.numel()} weights, the shape {list(shape)} needs {count}")
    return values.reshape(shape).to(dtype)


def dequantize_reference(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Any ggml type as float32 with the `gguf` package's numpy code (plain types: their values)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as np_dequantize

    if qtype == "BF16":  # stored as raw 16-bit words: the top half of a float32
        words = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16
        values = words.view(np.float32)
    elif qtype in ("F32", "F16"):
        values = np.asarray(raw, dtype=np.float32)
    else:
        values = np_dequantize(np.asarray(raw), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(shape))
