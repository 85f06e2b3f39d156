"""Tiny model configs completed for the ComfyUI that is imported (the host).

A tiny config is written for the oldest ComfyUI PipeTrain supports (0.3.75). Newer ComfyUIs add
required fields to some model parameter dataclasses, which their model detection fills from a real
file's tensors; a config built by hand has to say them itself:

    FluxParams.txt_ids_dims                   Flux.1 / Kontext: [] (no text position ids); Flux 2: [3]
    ChromaParams.txt_ids_dims, .vec_in_dim    [] and None (Chroma has no vector_in)
    ChromaRadianceParams.use_x0, .use_sequential_txt_ids   False (unless the file has the marker keys)
    HunyuanVideoParams.meanflow_sum           True only with a vision_in (HunyuanVideo 1.5)

`host_config` adds such a key only where the host's dataclass has that field (it probes the
dataclass, not a version number), with the value detection gives a real file of the same shape,
so one config builds on 0.3.75 (the fields do not exist there) and on 0.33.0 and later.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

# image_model -> the dataclass its ComfyUI model class reads its keyword arguments into.
_PARAMS = {
    "flux": ("comfy.ldm.flux.model", "FluxParams"),
    "flux2": ("comfy.ldm.flux.model", "FluxParams"),
    "chroma": ("comfy.ldm.chroma.model", "ChromaParams"),
    "chroma_radiance": ("comfy.ldm.chroma_radiance.model", "ChromaRadianceParams"),
    "hunyuan_video": ("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams"),
}
PARAMS_MODELS = frozenset(_PARAMS)  # the image_model values host_config may complete (no import needed)

# field -> what comfy.model_detection writes for it, from the rest of the config (the tensors it
# reads stand for config keys here: vision_in exists iff vision_in_dim is set; Chroma has no vector_in).
_DETECTED: dict[str, Callable[[dict], Any]] = {
    "txt_ids_dims": lambda c: [3] if c.get("image_model") == "flux2" else [],
    "vec_in_dim": lambda c: None,
    "meanflow_sum": lambda c: c.get("vision_in_dim") is not None,
    # Chroma Radiance: x0 prediction and sequential text ids only where the file marks them (__x0__, __sequential__)
    "use_x0": lambda c: False,
    "use_sequential_txt_ids": lambda c: False,
}


def params_fields(image_model: str | None) -> set[str] | None:
    """The field names of the host's parameter dataclass for `image_model`; None where that model
    class takes plain keyword arguments (or the host has no such dataclass)."""
    where = _PARAMS.get(image_model or "")
    if where is None:
        return None
    from .tiny_init import _ensure_comfy

    _ensure_comfy()
    try:
        cls = getattr(importlib.import_module(where[0]), where[1])
    except (ImportError, AttributeError):
        return None
    if not dataclasses.is_dataclass(cls):
        return None
    return {f.name for f in dataclasses.fields(cls)}


def host_config(config: dict) -> dict:
    """`config` plus the detection-filled keys the host's model class has and `config` lacks.
    Keys already in `config` are kept as given. Imports ComfyUI if nothing has yet (tools.tiny_init)."""
    out = dict(config)
    fields = params_fields(out.get("image_model"))
    if fields:
        for name, value in _DETECTED.items():
            if name in fields and name not in out:
                out[name] = value(out)
    return out
