"""The model in a training process: loading.py loads the user's file exactly the way ComfyUI does,
and the pipeline adapters, one file per model family, are registered here by name (one line each).

An adapter cuts ComfyUI's diffusion model into a sequential list of stage layers
(embed -> blocks -> head) for DeepSpeed's PipelineModule. Each layer takes and returns a tuple of
tensors; the first takes `first_stage_inputs(prepared)`, the last returns ComfyUI's denoised
prediction, exactly as `BaseModel.apply_model` would (tests/*/test_pipeline*.py prove it per adapter, and
engine/models/stage_check.py checks it again at the start of every pipelined run, on the host ComfyUI).
Where ComfyUI versions differ, an adapter follows what the host's objects have (a block's options,
a model's methods or settings), not a version number.
Each adapter also names its default stage cut (`partition`: DeepSpeed's "uniform" or "parameters").
What adapters share lives once: common.py (every adapter's base layers, refusals and helpers),
flux_family.py (Flux.1 and FLUX.2's layers, Chroma's unpatchify), cosmos_family.py (both Cosmos
adapters) and references.py (reference latents: Flux, Qwen-Image-Edit, HunyuanVideo).
Models without an adapter still train through the generic path with pipeline_stages = 1.
"""
from __future__ import annotations

from ..config.checks import ConfigError
from .auraflow import AuraFlowAdapter
from .chroma import ChromaAdapter
from .cosmos import CosmosAdapter
from .cosmos_predict2 import CosmosPredict2Adapter
from .ernie_image import ErnieImageAdapter
from .flux import FluxAdapter
from .flux2 import Flux2Adapter
from .hidream import HiDreamAdapter
from .hunyuan_video import HunyuanVideoAdapter
from .ideogram4 import Ideogram4Adapter
from .krea2 import Krea2Adapter
from .ltxav import LTXAVAdapter
from .ltxv import LTXVAdapter
from .lumina import LuminaAdapter
from .minimax_h3 import MiniMaxH3Adapter
from .omnigen2 import OmniGen2Adapter
from .qwen_image import QwenImageAdapter
from .sd3 import SD3Adapter
from .unet import UNetAdapter
from .wan import WanAdapter

ADAPTERS = {
    WanAdapter.name: WanAdapter,
    FluxAdapter.name: FluxAdapter,
    Flux2Adapter.name: Flux2Adapter,
    HunyuanVideoAdapter.name: HunyuanVideoAdapter,
    UNetAdapter.name: UNetAdapter,
    ChromaAdapter.name: ChromaAdapter,
    QwenImageAdapter.name: QwenImageAdapter,
    LuminaAdapter.name: LuminaAdapter,
    OmniGen2Adapter.name: OmniGen2Adapter,
    SD3Adapter.name: SD3Adapter,
    AuraFlowAdapter.name: AuraFlowAdapter,
    HiDreamAdapter.name: HiDreamAdapter,
    LTXVAdapter.name: LTXVAdapter,
    CosmosPredict2Adapter.name: CosmosPredict2Adapter,
    CosmosAdapter.name: CosmosAdapter,
    ErnieImageAdapter.name: ErnieImageAdapter,  # ComfyUI 0.33+
    Ideogram4Adapter.name: Ideogram4Adapter,  # ComfyUI 0.33+
    Krea2Adapter.name: Krea2Adapter,  # ComfyUI 0.33+
    MiniMaxH3Adapter.name: MiniMaxH3Adapter,  # ComfyUI 0.33+
    LTXAVAdapter.name: LTXAVAdapter,  # ComfyUI 0.33+
}


def adapter_for(base_model):
    for adapter in ADAPTERS.values():
        if adapter.matches(base_model):
            return adapter()
    raise ConfigError(
        f"pipeline_stages > 1 is not available yet for {type(base_model).__name__} models (adapters exist for: "
        f"{', '.join(ADAPTERS)}). Set pipeline_stages to 1: it trains on every GPU with data parallelism.")
