"""Everything PipeTrain's nodes need from the host ComfyUI, in one module.

ComfyUI modules are imported inside functions, so the pack imports outside ComfyUI (tests,
tooling, the Comfy Registry's scanner). Differences between ComfyUI versions (0.3.75 is the
oldest supported) belong here and nowhere else.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("PipeTrain")


def comfyui_root() -> str:
    import folder_paths

    return os.path.dirname(os.path.abspath(folder_paths.__file__))


def filenames(folder: str) -> list[str]:
    """Files ComfyUI lists for a model folder ("loras", "diffusion_models", "checkpoints")."""
    try:
        import folder_paths

        return list(folder_paths.get_filename_list(folder))
    except Exception:  # outside ComfyUI, or a folder name this version does not know
        return []


def gguf_filenames() -> list[str]:
    """The .gguf files under ComfyUI's diffusion_models folders (ComfyUI lists no .gguf; ComfyUI-GGUF's
    `unet_gguf` list is the same files where that pack is installed), as names full_path finds there."""
    try:
        import folder_paths

        roots = folder_paths.get_folder_paths("diffusion_models")
    except Exception:  # outside ComfyUI
        return []
    names: set[str] = set()
    for root in roots:
        for folder, _, files in os.walk(root, followlinks=True):
            names.update(os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/")
                         for f in files if f.lower().endswith(".gguf"))
    return sorted(names)


def full_path(folder: str, name: str) -> str | None:
    import folder_paths

    return folder_paths.get_full_path(folder, name)


def first_folder(folder: str) -> str:
    """The first configured directory of a model folder (where new files go)."""
    import folder_paths

    return folder_paths.get_folder_paths(folder)[0]


def output_directory() -> str:
    import folder_paths

    return folder_paths.get_output_directory()


def input_directory() -> str:
    import folder_paths

    return folder_paths.get_input_directory()


def progress_bar(total: int):
    import comfy.utils

    return comfy.utils.ProgressBar(total)


def __getattr__(name: str):
    # ComfyUI's interrupt exception class, resolved lazily so this module imports outside ComfyUI.
    if name == "InterruptProcessingException":
        import comfy.model_management

        return comfy.model_management.InterruptProcessingException
    raise AttributeError(name)


def raise_if_interrupted() -> None:
    """Raise ComfyUI's own interrupt exception (and clear the flag) if the user pressed Cancel."""
    import comfy.model_management

    comfy.model_management.throw_exception_if_processing_interrupted()


def free_accelerator_memory() -> None:
    """Unload what ComfyUI holds in VRAM so the training ranks get the GPUs.

    ComfyUI 0.33 and later also keep per-stream cast buffers (and, with dynamic VRAM, their
    reservations) until a node finishes; they are dropped here too where the host has them."""
    import comfy.model_management as mm

    mm.unload_all_models()
    reset = getattr(mm, "reset_cast_buffers", None)
    if reset is not None:
        reset()
    mm.soft_empty_cache(True)


def cuda_available() -> bool:
    import comfy.model_management
    import torch

    return torch.cuda.is_available() and not comfy.model_management.cpu_mode()


def load_lora_onto_model(model, lora_path: str, strength: float):
    import comfy.sd
    import comfy.utils

    lora = comfy.utils.load_torch_file(lora_path, safe_load=True)
    patched, _ = comfy.sd.load_lora_for_models(model, None, lora, strength, 0)
    return patched


def ksample(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent):
    """What a KSampler node draws (ComfyUI's nodes.common_ksampler, with its previews and interrupt): the LATENT."""
    import nodes as comfy_nodes  # ComfyUI's nodes.py, loaded by the server before any custom node

    return comfy_nodes.common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent)[0]


def load_diffusion_model(path: str):
    """A diffusion-model file as UNETLoader loads it (a MODEL: ComfyUI's ModelPatcher)."""
    import comfy.sd

    return comfy.sd.load_diffusion_model(path)


def prompt_server():
    """ComfyUI's PromptServer (browser messages, HTTP routes), or None outside a ComfyUI server."""
    try:
        from server import PromptServer

        return PromptServer.instance
    except Exception:  # imported outside ComfyUI, or no server was started (tests, tooling)
        return None


def sampler_names() -> list[str]:
    """ComfyUI's sampler and scheduler names, as KSampler lists them."""
    try:
        import comfy.samplers

        return list(comfy.samplers.KSampler.SAMPLERS)
    except Exception:  # outside ComfyUI
        return ["euler"]


def scheduler_names() -> list[str]:
    try:
        import comfy.samplers

        return list(comfy.samplers.KSampler.SCHEDULERS)
    except Exception:  # outside ComfyUI
        return ["simple"]
