"""Pipeline adapters: one file per model family, registered here by name (one line each).

An adapter cuts ComfyUI's diffusion model into a sequential list of stage layers
(embed -> blocks -> head) for DeepSpeed's PipelineModule. Each layer takes and returns a tuple of
tensors; the first takes `first_stage_inputs(prepared)`, the last returns ComfyUI's denoised
prediction, exactly as `BaseModel.apply_model` would (tests/test_pipeline.py proves it per adapter).
Each adapter also names its default stage cut (`partition`: DeepSpeed's "uniform" or "parameters").
Models without an adapter still train through the generic path with pipeline_stages = 1.
"""
from __future__ import annotations

from ..config import ConfigError
from .chroma import ChromaAdapter
from .flux import FluxAdapter
from .qwen_image import QwenImageAdapter
from .unet import UNetAdapter
from .wan import WanAdapter

ADAPTERS = {
    WanAdapter.name: WanAdapter,
    FluxAdapter.name: FluxAdapter,
    UNetAdapter.name: UNetAdapter,
    ChromaAdapter.name: ChromaAdapter,
    QwenImageAdapter.name: QwenImageAdapter,
}


def adapter_for(base_model):
    for adapter in ADAPTERS.values():
        if adapter.matches(base_model):
            return adapter()
    raise ConfigError(
        f"pipeline_stages > 1 is not available yet for {type(base_model).__name__} models (adapters exist for: "
        f"{', '.join(ADAPTERS)}). Set pipeline_stages to 1: it trains on every GPU with data parallelism.")
