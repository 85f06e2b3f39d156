"""A GGUF diffusion model loaded by ComfyUI's own loader, its linear weights kept quantized.

ComfyUI detects the model from the state dict's keys and shapes and builds it with the `custom_operations`
it is given (comfy.sd.load_diffusion_model_state_dict, 0.3.75 to 0.38). Here that state dict holds:
  - for each 2-D weight in a type engine/models/gguf_dequant.py expands (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
    a zero-byte placeholder of the weight's shape (an expanded scalar) that carries the GGUF tensor;
  - every other tensor as floats: plain ones as stored, other quantized types expanded once by the `gguf`
    package's reference code.
The operations are ComfyUI's `manual_cast` set (weights cast to the input's dtype) with one change: a
Linear that receives a placeholder keeps the GGUF bytes as a buffer (`gguf_weight`, what block swap and
`.to(device)` move) and expands them in its forward, one layer at a time, in the input's dtype. Its
`weight` reads as that expansion, so code that inspects a layer (LoRA injection, DoRA's norms, the block
probe) sees the real weight. A placeholder that reached anything else (a module built outside ComfyUI's
operations, an embedding) is overwritten with its expanded values after loading, so no weight is left at zero.
"""
from __future__ import annotations

import inspect
import sys

import numpy as np
import torch
import torch.nn.functional as F

from .gguf_dequant import dequantize, dequantize_reference, kept_quantized
from .gguf_file import GGUFContents, GGUFError, GGUFTensor, read_gguf

_MARK = "pipetrain_gguf"  # attribute of a placeholder: the GGUFTensor it stands for


def _plain(t: GGUFTensor) -> torch.Tensor:
    if t.qtype == "F16":
        return torch.from_numpy(np.array(t.raw, dtype=np.float16).reshape(t.shape))
    if t.qtype == "F32":
        return torch.from_numpy(np.array(t.raw, dtype=np.float32).reshape(t.shape))
    return dequantize_reference(t.raw, t.qtype, t.shape).to(torch.bfloat16)  # BF16, K-quants, i-quants


def stays_quantized(t: GGUFTensor) -> bool:
    """A 2-D weight in a type expanded at use: it gets a placeholder, for a GGUF Linear to take."""
    return kept_quantized(t.qtype) and len(t.shape) == 2


def _placeholder(t: GGUFTensor) -> torch.Tensor:
    stand_in = torch.zeros((), dtype=torch.bfloat16).expand(t.shape)
    setattr(stand_in, _MARK, t)
    return stand_in


def state_dict(contents: GGUFContents) -> dict[str, torch.Tensor]:
    """What ComfyUI's loader gets: placeholders for the weights kept quantized, floats for the rest."""
    return {t.key: _placeholder(t) if stays_quantized(t) else _plain(t) for t in contents.tensors}


def gguf_operations(landed: list[GGUFTensor]):
    """ComfyUI's manual_cast operations with a Linear that keeps GGUF weights quantized. `landed` collects
    the GGUF tensors a Linear took, so the loader can find placeholders that went elsewhere."""
    import comfy.ops

    base = comfy.ops.manual_cast

    class GGUFLinear(base.Linear):
        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                  error_msgs):
            source = getattr(state_dict.get(prefix + "weight"), _MARK, None)
            if source is not None:
                self.take_quantized(source)
                landed.append(source)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
            if source is not None and prefix + "weight" in unexpected_keys:  # taken above, as gguf_weight
                unexpected_keys.remove(prefix + "weight")

        def take_quantized(self, source: GGUFTensor) -> None:
            if tuple(source.shape) != (self.out_features, self.in_features):
                raise GGUFError(f"GGUF tensor {source.key} has shape {list(source.shape)}, the layer "
                                f"{self.out_features}x{self.in_features}")
            del self._parameters["weight"]
            # not in state_dict(): what is saved and compared is the model's own keys
            self.register_buffer("gguf_weight", torch.from_numpy(np.array(source.raw, dtype=np.uint8)), persistent=False)
            self.gguf_type, self.gguf_shape = source.qtype, tuple(source.shape)

        def _expanded(self, dtype: torch.dtype) -> torch.Tensor:
            return dequantize(self.gguf_weight, self.gguf_type, self.gguf_shape, dtype)

        @property
        def weight(self):
            params, buffers = self.__dict__.get("_parameters", {}), self.__dict__.get("_buffers", {})
            if "weight" in params:
                return params["weight"]
            if "gguf_weight" not in buffers:  # while nn.Linear.__init__ registers the parameter
                raise AttributeError("weight")
            bias = params.get("bias")
            return self._expanded(bias.dtype if bias is not None else torch.bfloat16)

        def forward(self, x, *args, **kwargs):
            if "weight" in self._parameters:
                return super().forward(x, *args, **kwargs)
            bias = self.bias.to(x.dtype) if self.bias is not None else None
            return F.linear(x, self._expanded(x.dtype), bias)

    class GGUFOperations(base):
        Linear = GGUFLinear

    return GGUFOperations


def _fill_stray_placeholders(diffusion_model: torch.nn.Module, contents: GGUFContents,
                             landed: list[GGUFTensor]) -> int:
    """Expand into their parameters the placeholders no GGUF Linear took. Returns how many."""
    taken = {id(t) for t in landed}
    stray = [t for t in contents.tensors if stays_quantized(t) and id(t) not in taken]
    for t in stray:
        try:
            param = diffusion_model.get_parameter(t.key)
        except AttributeError:
            raise GGUFError(f"GGUF tensor {t.key} of {contents.path} has no place in the model ComfyUI built from "
                            "it (ComfyUI converts its keys for this family). Train on the .safetensors file of "
                            "the model instead.") from None
        with torch.no_grad():
            param.copy_(dequantize_reference(t.raw, t.qtype, t.shape).to(param.dtype))
    return len(stray)


def quantized_bytes(diffusion_model: torch.nn.Module) -> tuple[int, int]:
    """(layers kept quantized, their bytes) in a loaded model."""
    buffers = [b for name, b in diffusion_model.named_buffers() if name.endswith("gguf_weight")]
    return len(buffers), sum(b.numel() for b in buffers)


def load_gguf_patcher(path: str, model_options: dict):
    """ComfyUI's ModelPatcher for a GGUF file, as comfy.sd.load_diffusion_model gives one for a safetensors file."""
    import comfy.sd

    contents = read_gguf(path)
    kinds = ", ".join(f"{k} x{v}" for k, v in sorted(contents.type_counts().items()))
    landed: list[GGUFTensor] = []
    options = dict(model_options, custom_operations=gguf_operations(landed))
    extra = {"disable_dynamic": True} if "disable_dynamic" in inspect.signature(
        comfy.sd.load_diffusion_model_state_dict).parameters else {}
    patcher = comfy.sd.load_diffusion_model_state_dict(state_dict(contents), model_options=options, **extra)
    if patcher is None:
        raise GGUFError(f"ComfyUI does not recognise the model in {path} (architecture "
                        f"{contents.architecture or 'not named'}; tensors {kinds}). Pick a GGUF file of a diffusion "
                        "model ComfyUI loads as .safetensors.")
    stray = _fill_stray_placeholders(patcher.model.diffusion_model, contents, landed)
    layers, nbytes = quantized_bytes(patcher.model.diffusion_model)
    expanded = stray + sum(1 for t in contents.tensors if t.quantized and not stays_quantized(t))
    print(f"PipeTrain: GGUF {path} ({kinds}): {layers} linear layers kept quantized ({nbytes / 2**20:.1f} MiB), "
          f"{expanded} quantized weights expanded at load", file=sys.stderr, flush=True)  # in the rank's log
    return patcher
