"""A GGUF copy of a (tiny) safetensors diffusion model, written with the `gguf` package, and its twin.

    .venv/bin/python -m tools.tiny_gguf MODEL.safetensors OUT.gguf TWIN.safetensors

Every 2-D weight whose rows split into 32-weight blocks is quantized, the types taken in turn from
`TYPES` (so each one the engine keeps quantized appears); everything else is stored as F32, except one
bias in F16. The twin holds exactly the values the GGUF file decodes to (float32), so a model loaded from
the GGUF file must compute what the twin computes. Tensors are stored without the checkpoint prefix, as
the GGUF conversions ComfyUI-GGUF users download are.
"""
from __future__ import annotations

import sys

import numpy as np

TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def write_gguf_copy(source: str, out: str, twin: str, architecture: str = "sd1",
                    types: tuple[str, ...] = TYPES) -> dict[str, str]:
    """Write `out` (GGUF) and `twin` (safetensors) from `source`. Returns key -> stored type."""
    import gguf
    import torch
    from gguf.quants import dequantize, quantize
    from safetensors.torch import load_file, save_file

    tensors = load_file(source)
    writer = gguf.GGUFWriter(out, architecture)
    stored: dict[str, str] = {}
    decoded: dict[str, torch.Tensor] = {}
    turn, f16_done = 0, False
    for key in sorted(tensors):
        values = tensors[key].float().numpy()
        if values.ndim == 2 and values.shape[1] % 32 == 0:
            qtype = gguf.GGMLQuantizationType[types[turn % len(types)]]
            turn += 1
            data = quantize(values, qtype)
            writer.add_tensor(key, data, raw_shape=data.shape, raw_dtype=qtype)
            decoded[key] = torch.from_numpy(np.ascontiguousarray(dequantize(data, qtype).reshape(values.shape)))
            stored[key] = qtype.name
        elif values.ndim == 1 and not f16_done:
            half = values.astype(np.float16)
            writer.add_tensor(key, half)
            decoded[key] = torch.from_numpy(half.astype(np.float32))
            stored[key], f16_done = "F16", True
        else:
            writer.add_tensor(key, values)
            decoded[key] = torch.from_numpy(values.copy())
            stored[key] = "F32"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file({k: v.contiguous() for k, v in decoded.items()}, twin)
    return stored


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kinds = write_gguf_copy(*sys.argv[1:])
    print(", ".join(f"{t} x{list(kinds.values()).count(t)}" for t in sorted(set(kinds.values()))))
