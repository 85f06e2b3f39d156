"""One harness for every family in tests/family_configs.py, on the engine's own code path:
engine.patches.make_trainable, engine.train.lora.inject_lora (default target preset),
engine.train.objective.DiffusionObjective, engine.memory.blocks, and the engine's LoRA save; then the saved
file through ComfyUI's own LoRA loader (comfy.sd.load_lora_for_models).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

import family_configs as fc
from trainable import make_trainable

STEPS = 5
LR = 5e-3

# apply_model kwargs each mode's cond dict must produce through the model's own extra_conds.
MODE_KWARGS = {
    "flux": {"guidance", "y"},
    "flux_kontext": {"guidance", "ref_latents"},
    "qwen_image_edit": {"ref_latents"},
    "omnigen2": {"ref_latents", "num_tokens"},
    "flux2": {"guidance", "ref_latents"},
    "hunyuan_video": {"guidance", "y"},
    "hunyuan_image21_distilled": {"guidance"},
    "hunyuan_image21_refiner": {"guidance", "c_concat"},
    "hunyuan_video15_i2v": {"c_concat", "clip_fea"},
    "wan21_i2v": {"c_concat", "clip_fea"},
    "wan22_a14b_low_i2v": {"c_concat"},
    "hidream": {"encoder_hidden_states_llama3", "y"},
    "sdxl": {"y"},
    "sd3": {"y"},
    "ltxv": {"attention_mask", "frame_rate"},
    "ltxv_i2v": {"attention_mask", "frame_rate", "denoise_mask"},
    "wan22_5b_ti2v": {"denoise_mask"},
    # ComfyUI 0.33+ families (tests/family_configs_033.py)
    "krea2_edit": {"ref_latents", "ref_latents_method"},
    "krea2_edit_t0": {"ref_latents", "ref_latents_method"},
    "anima": {"t5xxl_ids", "t5xxl_weights"},  # outside inference mode the LLM adapter runs in the model
    "flux2_klein_edit": {"ref_latents"},
    "ideogram4_padded": {"attention_mask"},  # a mask of all ones is dropped by Ideogram4.extra_conds
    # the packed video + audio latent's shapes (BaseModel._apply_model unpacks by them) and H3's own dict
    "minimax_h3_t2i": {"latent_shapes", "minimax_payload"},
    "minimax_h3_t2v": {"latent_shapes", "minimax_payload"},
    "minimax_h3_t2v_audio": {"latent_shapes", "minimax_payload"},
    # more ComfyUI 0.33 classes (tests/family_configs_033_more.py)
    "chroma_radiance": {"guidance"},
    "kandinsky5": {"y", "c_concat"},  # the pooled CLIP output; the video model's zero image + mask channels
    "kandinsky5_image": {"y"},
    "boogu": {"num_tokens"},
    "boogu_edit": {"num_tokens", "ref_latents"},
    "joyimage_edit": {"ref_latents"},
    "mage_flow_edit": {"ref_latents"},
    "ltxav_t2v": {"latent_shapes", "frame_rate"},  # the packed video + audio latent's shapes
    "cogvideox_i2v": {"c_concat"},
    "cogvideox_inpaint": {"c_concat"},
    "wan21_fun_control": {"c_concat"},
    "wan21_camera": {"c_concat"},
    "wan22_camera": {"c_concat"},
    "wan21_vace": {"vace_context", "vace_strength"},
    "flux_schnell": {"y"},
    "flux_fill": {"c_concat", "guidance", "y"},
    "pixart_alpha": {"c_size", "c_ar"},
    "hunyuan_dit": {"encoder_hidden_states_t5", "text_embedding_mask", "text_embedding_mask_t5", "image_meta_size"},
    "hunyuan_dit1": {"encoder_hidden_states_t5", "text_embedding_mask_t5"},
    "mochi": {"attention_mask", "num_tokens"},
    "cascade_c": {"clip_text_pooled", "clip_img"},
    "sd15_ip2p": {"c_concat"},
    "sdxl_refiner": {"y"},
    "sdxl_ip2p": {"c_concat", "y"},
}


# engine.memory.blocks' block lists per model class: the transformer blocks only, never embedders or
# projections kept in ModuleLists (Cosmos 1.0 t_embedder, HiDream caption_projection).
_DOUBLE_SINGLE = ["double_blocks", "single_blocks"]
BLOCK_ROOTS = {
    "SDXL": ["input_blocks", "middle_block", "output_blocks"], "SD3": ["joint_blocks"],
    "AuraFlow": ["double_layers", "single_layers"], "Flux": _DOUBLE_SINGLE, "Chroma": _DOUBLE_SINGLE,
    "HiDream": ["double_stream_blocks", "single_stream_blocks"],
    "Lumina2": ["noise_refiner", "context_refiner", "layers"], "ZImage": ["noise_refiner", "context_refiner", "layers"],
    "QwenImage": ["transformer_blocks"], "HunyuanImage21": _DOUBLE_SINGLE, "HunyuanImage21Refiner": _DOUBLE_SINGLE,
    "Omnigen2": ["noise_refiner", "ref_image_refiner", "context_refiner", "layers"],
    "CosmosT2IPredict2": ["blocks"], "Flux2": _DOUBLE_SINGLE, "LTXV": ["transformer_blocks"],
    "HunyuanVideo": _DOUBLE_SINGLE, "HunyuanVideo15": ["double_blocks"], "CosmosT2V": ["blocks"],
    "WAN21_T2V": ["blocks"], "WAN21_I2V": ["blocks"], "WAN22_T2V": ["blocks"],
    # ComfyUI 0.33+: Krea 2's text-fusion blocks and Anima's LLM-adapter blocks sit one level down
    # (txtfusion.*, llm_adapter.blocks): prefix, not blocks.
    "Krea2": ["blocks"], "Anima": ["blocks"], "ErnieImage": ["layers"], "Ideogram4": ["layers"],
    # MiniMax H3's token refiner (token_refiner.blocks) runs in extra_conds, before the model: prefix too.
    "MiniMaxH3": ["blocks"],
    # More ComfyUI 0.33 classes (tests/family_configs_033_more.py)
    "LongCatImage": _DOUBLE_SINGLE, "ChromaRadiance": _DOUBLE_SINGLE, "JoyImage": ["double_blocks"],
    "Kandinsky5": ["text_transformer_blocks", "visual_transformer_blocks"],
    "Kandinsky5Image": ["text_transformer_blocks", "visual_transformer_blocks"],
    "MageFlow": ["transformer_blocks"], "Lens": ["transformer_blocks"],
    "Boogu": ["noise_refiner", "ref_image_refiner", "context_refiner", "double_stream_layers", "single_stream_layers"],
    "CogVideoX_T2V": ["blocks"], "CogVideoX_I2V": ["blocks"], "CogVideoX_Inpaint": ["blocks"],
    "ZImagePixelSpace": ["noise_refiner", "context_refiner", "layers"],
    **dict.fromkeys(["WAN21_CausalAR_T2V", "WAN21_FunControl2V", "WAN21_Camera", "WAN22_Camera", "WAN21_FlowRVS",
                     "WAN21_SCAIL", "WAN21_SCAIL2", "WAN22_Animate", "WAN_Animate2", "WAN21_HuMo", "WAN22_S2V"],
                    ["blocks"]),
    "WAN21_Vace": ["blocks", "vace_blocks"], "WAN22_WanDancer": ["blocks", "music_encoder"],
    "FluxSchnell": _DOUBLE_SINGLE, "FluxInpaint": _DOUBLE_SINGLE, "PixArtAlpha": ["blocks"], "PixArtSigma": ["blocks"],
    "HunyuanDiT": ["blocks"], "HunyuanDiT1": ["blocks"], "GenmoMochi": ["blocks"],
    "PixelDiTT2I": ["patch_blocks", "pixel_blocks"], "LTXAV": ["transformer_blocks"],
    "Stable_Cascade_C": ["down_blocks", "up_blocks"],
    **dict.fromkeys(["SD15", "SD20", "SD15_instructpix2pix", "SDXLRefiner", "SDXL_instructpix2pix"],
                    ["input_blocks", "middle_block", "output_blocks"]),
}


@dataclass
class Result:
    losses: list
    targets: list
    n_blocks: int
    roots: list  # engine.memory.blocks.block_roots
    kwargs_keys: set
    unloaded: list  # ComfyUI warnings about LoRA keys it did not load
    base_vs_lora: float  # max |output change| from loading the saved LoRA through ComfyUI
    comfy_vs_peft: float  # max |ComfyUI-loaded output - trained peft output|
    scale: float  # max |base output|
    sigmas: list
    checkpoint_error: float  # relative LoRA-gradient difference, checkpointed vs plain


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_family(family: fc.Family, tmp: Path, spec=None) -> Result:
    """spec: the LoraSpec to train (default: rank 4, the default target preset and adapter kind)."""
    import comfy.model_patcher
    import comfy.sd
    from safetensors.torch import load_file

    from PipeTrain.engine.memory.blocks import block_roots, blocks
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters, lora_state_dict, lora_tensors, save_lora
    from PipeTrain.engine.train.objective import DiffusionObjective

    torch.manual_seed(0)
    model = fc.build(family)
    dm = model.diffusion_model
    latents, conds = fc.batch(family)
    make_trainable(model, latents, conds, **family.train)  # as engine/train/loop.py does after loading
    spec = spec or LoraSpec(rank=4)  # default target preset
    targets = inject_lora(dm, spec)
    n_blocks = len(blocks(dm))
    roots = block_roots(dm)
    objective = DiffusionObjective(model, seed=0, **family.train)
    opt = torch.optim.Adam(lora_parameters(dm), lr=LR)
    losses, sigmas = [], []
    for _ in range(STEPS):  # a fixed batch: sample id 0 draws the same noise and timestep each step
        loss = objective(latents, conds, [0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for i in range(8):
        sigmas.append(float(objective.prepare(latents, conds, [i]).sigma[0]))

    prepared = objective.prepare(latents, conds, [0])
    with torch.no_grad():
        trained = _denoised(model, prepared)
    checkpoint_error = _checkpointed_grad_error(model, objective, latents, conds)
    path = tmp / f"{family.name}.safetensors"
    save_lora(path, lora_state_dict(lora_tensors(dm), spec, dm), {"family": family.name})

    fresh = fc.build(family)  # same seed: the base weights the LoRA was trained on
    with torch.no_grad():
        base = _denoised(fresh, prepared)
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(fresh, load_device=cpu, offload_device=cpu)
    catcher = _Warnings()
    logging.getLogger().addHandler(catcher)
    try:
        loaded, _ = comfy.sd.load_lora_for_models(patcher, None, load_file(str(path)), 1.0, 0.0)
    finally:
        logging.getLogger().removeHandler(catcher)
    loaded.patch_model()
    try:
        with torch.no_grad():
            out = _denoised(fresh, prepared)
    finally:
        loaded.unpatch_model()
    return Result(losses=losses, targets=targets, n_blocks=n_blocks, roots=roots, kwargs_keys=set(prepared.kwargs),
                  unloaded=[m for m in catcher.messages if "not loaded" in m.lower()],
                  base_vs_lora=(out - base).abs().max().item(), comfy_vs_peft=(out - trained).abs().max().item(),
                  scale=base.abs().max().item(), sigmas=sigmas, checkpoint_error=checkpoint_error)


def _denoised(model, prepared):
    from PipeTrain.engine.train.objective import transformer_options

    return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                             **prepared.kwargs)


def _checkpointed_grad_error(model, objective, latents, conds) -> float:
    """Relative difference between LoRA gradients with per-block activation checkpointing
    (engine/memory/activation_checkpointing.py over engine.memory.blocks) and without, on the trained model."""
    from PipeTrain.engine.memory.activation_checkpointing import enable_checkpointing
    from PipeTrain.engine.train.lora import lora_parameters

    params = lora_parameters(model.diffusion_model)

    def grads():
        for p in params:
            p.grad = None
        objective(latents, conds, [1]).backward()
        return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in params])

    plain = grads()
    enable_checkpointing(model.diffusion_model, "on")
    checkpointed = grads()
    return ((checkpointed - plain).norm() / plain.norm().clamp_min(1e-12)).item()


def check(family: fc.Family, result: Result) -> None:
    assert result.n_blocks > 0, "engine.memory.blocks found no block list"
    assert result.roots == BLOCK_ROOTS[family.supported], result.roots
    assert result.targets, "the default LoRA preset matched nothing"
    assert all(torch.isfinite(torch.tensor(result.losses))), result.losses
    assert result.losses[-1] < result.losses[0], f"loss did not fall: {result.losses}"
    assert not result.unloaded, result.unloaded
    assert result.base_vs_lora > 1e-4 * max(1.0, result.scale), "the loaded LoRA does not change the output"
    assert result.comfy_vs_peft <= 1e-3 * max(1.0, result.scale), (
        f"ComfyUI's LoRA gives another output than training did ({result.comfy_vs_peft})")
    missing = MODE_KWARGS.get(family.name, set()) - result.kwargs_keys
    assert not missing, f"extra_conds did not produce {missing} from the {family.mode} cond dict"
    assert result.checkpoint_error < 1e-4, f"checkpointed gradients differ by {result.checkpoint_error}"
    lo, hi = family.train.get("t_range", (0.0, 1.0))
    assert all(lo - 1e-3 <= s <= hi + 1e-3 for s in result.sigmas) or not family.train, result.sigmas
