"""The model a rank trains: ComfyUI's model loaded from the run's file, checked against the cache, made
trainable (the block probe), with the LoRA injected or the blocks unfrozen for a full fine-tune."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..config.run import RunConfig
from ..latent_fit import accepted_channels, packed_latent_missing, wanted_latents
from ..models.loading import ModelLoadError, load_base_model
from ..patches.probe_batch import probe_forward
from ..patches.trainable import make_trainable
from .full_tune import unfreeze_blocks
from .lora import inject_lora
from .objective import DiffusionObjective, apply_timestep_shift
from .objective_checks import check_objective
from .setup_phases import SetupPhases

BLOCK_VERDICTS = ".block-verdicts.json"  # beside the run folders: engine/patches caches its probe verdicts there


def build_model(cfg: RunConfig, dataset, device: torch.device, phases: SetupPhases):
    """(ComfyUI's model, the trained targets). cfg: the run's, or with the fit plan's memory settings.
    Pipelined, the model loads on the CPU; DeepSpeed moves only this rank's stage to its GPU."""
    t = cfg.train
    model = load_base_model(cfg, torch.device("cpu") if cfg.memory.pipeline_stages > 1 else device)
    phases.done("model_load")  # reading the file and building ComfyUI's model on the device
    apply_timestep_shift(model, t.timestep_shift)
    check_objective(model, cfg.objective)  # guidance, resolution shift and SNR weights this model can use
    model.model_sampling.to(device)
    if dataset.latent_shape[0] not in accepted_channels(model.latent_format, dataset.latent_shape):
        raise ModelLoadError(
            f"the cache holds {dataset.latent_shape[0]}-channel latents but {os.path.basename(cfg.model_path)} "
            f"expects {wanted_latents(model.latent_format, dataset.latent_shape)}: cache the dataset with this "
            "model's VAE.")
    packed = packed_latent_missing(type(model).__name__, dataset[0]["extras"])
    if packed:
        raise ModelLoadError(packed)
    # ComfyUI's training flag, and out-of-place block forwards only where the probe finds upstream's
    # in place (engine/patches): before LoRA and the memory options wrap the blocks.
    run_forward, context = probe_forward(DiffusionObjective(model, seed=t.seed), dataset, device)
    make_trainable(model.diffusion_model, run_forward, device=device, context=context,
                   cache_file=Path(cfg.run_dir).parent / BLOCK_VERDICTS)
    phases.done("block_probe")
    torch.manual_seed(t.seed)  # peft draws lora_A's initial values from the global RNG
    targets = (unfreeze_blocks if cfg.lora.kind == "full" else inject_lora)(model.diffusion_model, cfg.lora)
    phases.done("lora")
    return model, targets
