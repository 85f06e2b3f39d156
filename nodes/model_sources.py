"""The model file and LoRA stack behind Train Pipeline's `model` input, read from the queued graph.

The training processes load the model themselves, from files: this follows the `model` link in the
API prompt ComfyUI queued back through LoRA loaders (LoraLoaderModelOnly, LoraLoader) to the loader
of the model file (UNETLoader, CheckpointLoaderSimple), and returns the file and the stack in the
order it is applied (engine/config/base_loras.py). A node in the chain the processes could not
rebuild from files is refused by name, before anything starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..engine.config.base_loras import BaseLora
from ..engine.config.checks import ConfigError
from . import compat
from .graph_links import linked, named_file

MODEL_LOADERS = {"UNETLoader": ("unet_name", "diffusion_models"), "CheckpointLoaderSimple": ("ckpt_name", "checkpoints"),
                 # ComfyUI-GGUF's loaders: their names are files of the diffusion_models folders
                 "UnetLoaderGGUF": ("unet_name", "diffusion_models"),
                 "UnetLoaderGGUFAdvanced": ("unet_name", "diffusion_models")}
LORA_LOADERS = {"LoraLoaderModelOnly": "strength_model", "LoraLoader": "strength_model"}
FOLLOWED = ", ".join([*MODEL_LOADERS, *LORA_LOADERS])


def model_file_names() -> list[str]:
    """The model files Train Pipeline (model_name) and Wan 2.2 Experts (low_noise_model) list: ComfyUI's
    diffusion_models first, GGUF files, then checkpoints."""
    return compat.filenames("diffusion_models") + compat.gguf_filenames() + compat.filenames("checkpoints")


@dataclass(frozen=True)
class ModelSource:
    model_path: str
    loras: tuple[BaseLora, ...]

    def describe(self) -> str:
        stack = "".join(f" + {os.path.basename(lora.path)} at {lora.strength:g}" for lora in self.loras)
        return os.path.basename(self.model_path) + stack


def _linked(prompt: dict, node_id: str, input_name: str, where: str) -> tuple[str, dict, int]:
    found = linked(prompt, node_id, input_name)
    if found is None:
        raise ConfigError(f"{where}'s {input_name} is not linked to a node of the queued graph: connect it, or "
                          "disconnect Train Pipeline's model and pick model_name.")
    return found


def _file(node: dict, input_name: str, folder: str) -> str:
    name, path = named_file(node, input_name, folder)
    if path is None:
        raise ConfigError(f"Train Pipeline's model: {node.get('class_type')}'s {input_name} {name!r} is not a file in "
                          f"ComfyUI's models/{folder} folder (a value wired from another node cannot be followed): "
                          "pick a file there.")
    return path


def model_source(prompt: Any, node_id: Any) -> ModelSource:
    """The file and LoRA stack of the MODEL linked to Train Pipeline `node_id`'s `model` input."""
    if not isinstance(prompt, dict) or node_id is None:
        raise ConfigError("Train Pipeline's model input needs the queued graph to find the model file, and ComfyUI "
                          "did not pass it: disconnect model and pick model_name.")
    loras: list[BaseLora] = []
    source_id, node, output = _linked(prompt, node_id, "model", "Train Pipeline")
    for _ in range(len(prompt)):  # a chain visits each node once at most
        cls = str(node.get("class_type"))
        if cls in LORA_LOADERS and output == 0:
            strength = (node.get("inputs") or {}).get(LORA_LOADERS[cls])
            if not isinstance(strength, (int, float)) or isinstance(strength, bool):
                raise ConfigError(f"Train Pipeline's model: {cls}'s {LORA_LOADERS[cls]} is wired from another node, "
                                  "which cannot be followed: type the strength into the LoRA loader.")
            path = _file(node, "lora_name", "loras")
            if strength != 0:
                loras.insert(0, BaseLora(path=path, strength=float(strength)))  # applied nearest the model first
            source_id, node, output = _linked(prompt, source_id, "model", cls)
            continue
        if cls in MODEL_LOADERS and output == 0:
            input_name, folder = MODEL_LOADERS[cls]
            return ModelSource(model_path=_file(node, input_name, folder), loras=tuple(loras))
        raise ConfigError(f"Train Pipeline's model comes through {cls}, which the training processes cannot rebuild "
                          f"from files: connect the MODEL of a model loader, through LoRA loaders only ({FOLLOWED}), or "
                          "disconnect model and pick model_name.")
    raise ConfigError("Train Pipeline's model: the graph's model links form a loop.")
