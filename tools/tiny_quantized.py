"""A quantized copy of a (tiny) safetensors diffusion model in ComfyUI's own mixed-precision format.

    .venv-0.33/bin/python -m tools.tiny_quantized MODEL.safetensors OUT.safetensors FORMAT

FORMAT is a key of the host ComfyUI's `comfy.quant_ops.QUANT_ALGOS` (0.3.75: float8_e4m3fn; 0.33.0 also
float8_e5m2, nvfp4, mxfp8, int8_tensorwise, ...). Every 2-D weight the format can hold is quantized with
ComfyUI's own code (`QuantizedTensor.from_float` with the format's layout) and stored as that ComfyUI stores a
quantized layer: its tensors (`weight`, `weight_scale`, ...) and the format, named in a `comfy_quant` JSON per
layer (0.33 and later) or in the file's `_quantization_metadata` (0.3.75), which ComfyUI's detection turns into
the model's quantization config. Needs ComfyUI importable (`comfy` on sys.path).
"""
from __future__ import annotations

import json
import sys


def quantized_layer(weight, fmt: str) -> tuple[dict, bool]:
    """The on-disk tensors of one layer's weight in `fmt`, suffix -> tensor ('weight', 'weight_scale', ...),
    and whether the format is named per layer (a `comfy_quant` tensor, ComfyUI 0.33 and later) rather than in
    the file's `_quantization_metadata` (0.3.75, which later releases still read)."""
    import torch
    from comfy.quant_ops import QUANT_ALGOS, QuantizedTensor

    q = QuantizedTensor.from_float(weight, QUANT_ALGOS[fmt]["comfy_tensor_layout"])
    if not hasattr(q, "state_dict"):  # 0.3.75: fp8 only, the scale in its layout parameters
        return {"weight": q._qdata, "weight_scale": q._layout_params["scale"]}, False
    tensors = q.state_dict("weight")  # ComfyUI 0.33 and later (comfy-kitchen's tensor)
    tensors["comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt}).encode("utf-8")), dtype=torch.uint8)
    return tensors, True


def write_quantized_copy(source: str, out: str, fmt: str, multiple: int = 32, skip: str = "") -> list[str]:
    """Write `out` from `source` with each 2-D `.weight` whose sides are multiples of `multiple` in `fmt`
    (the others, and layers whose name matches the regex `skip`, stay as they are). Formats that pack
    several values per byte change the stored shape, so layers whose width ComfyUI's detection reads must
    be skipped for them (a UNet's cross-attention keys give its context width). Returns the quantized layers."""
    import re

    from safetensors.torch import load_file, save_file

    tensors = load_file(source)
    layers = [k[: -len(".weight")] for k, v in tensors.items()
              if k.endswith(".weight") and v.dim() == 2 and all(s % multiple == 0 for s in v.shape)
              and not (skip and re.search(skip, k))]
    result, in_metadata = {}, {}
    for key, value in tensors.items():
        layer = key[: -len(".weight")] if key.endswith(".weight") else None
        if layer in layers:
            layer_tensors, per_layer = quantized_layer(value.float(), fmt)
            result.update({f"{layer}.{suffix}": t.contiguous() for suffix, t in layer_tensors.items()})
            if not per_layer:
                in_metadata[layer] = {"format": fmt}
        else:
            result[key] = value
    metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": in_metadata})} \
        if in_metadata else None
    save_file(result, out, metadata=metadata)
    return layers


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    print(f"{len(write_quantized_copy(*sys.argv[1:]))} layers quantized")
