"""CFG-augmented training (objective.cfg_augment; diffusion-pipe's MiniMax H3 `cfg`): keep a model that
samples with classifier-free guidance from losing it while it trains.

Each sample is also run, without gradient, on the cache's encoding of the empty caption (ComfyUI's
unconditional prompt). The conditional output is taken as what guidance at scale w would give, and the
prediction the loss compares with the target is the conditional one that guidance came from:

    trained = (cond + (w - 1) * uncond) / w        (guided = uncond + w * (cond_raw - uncond), solved for cond_raw)

so the LoRA learns the data as the guided sampler will see it. The mix is taken of ComfyUI's denoised
predictions, which are affine in the network output with weights summing to 1, so it is the same mix of the
network outputs. w = 1 is off. Needs the empty caption in the cache (Cache Latents stores it when
LoadDataset's caption_dropout is above 0: engine/cache/caption_store.py uncond_missing, checked by the node
and the ranks) and one pipeline stage (engine/config/rules.py).
"""
from __future__ import annotations


def mixed(denoised, uncond, cfg_augment: float):
    """The prediction the loss compares: the conditional one behind guidance at cfg_augment (module doc)."""
    return (denoised + (cfg_augment - 1.0) * uncond.detach()) / cfg_augment
