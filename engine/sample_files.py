"""The sample files of a run: the encoded prompts the node writes, the latents rank 0 renders.

The node encodes the sample prompts with the graph's CLIP before launch and writes them to
`<run_dir>/samples/prompts.safetensors` (`write_prompts`). Every `sample.every` steps rank 0
renders one latent per prompt (engine/train/samples.py) and writes them as
`<run_dir>/samples/step000100.safetensors` ("latent": [N, C, (T,) h, w], ready for VAE decode),
then emits a `sample` event; the node decodes them with the graph's VAE (`read_samples`).
Shared by the server and the ranks: no ComfyUI import here.

Prompts file layout: "p<i>.cross_attn" and "p<i>.<extra>" per positive prompt, "n.cross_attn" /
"n.<extra>" for the negative; metadata "prompts" (JSON list of the texts) and, per prefix,
"<prefix>.none" (extras whose value was None) and "<prefix>.json" (other JSON-able extras).
Tensors keep their batch dimension of 1, exactly as ComfyUI's CLIP returned them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from .atomic_files import write_safetensors
from .cache.format import read_safetensors, unpack_extras
from .config.checks import ConfigError

SAMPLES_DIR = "samples"
PROMPTS_FILE = "prompts.safetensors"
_NOT_DATA_KEYS = ("hooks",)  # ComfyUI hook objects: sampling-time machinery, not conditioning data


def sample_file(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / SAMPLES_DIR / f"step{step:06d}.safetensors"


def due(every: int, step: int, total: int) -> bool:
    """Whether samples are rendered after `step`: every N steps, and at the last step."""
    return every > 0 and (step % every == 0 or step == total)


# ---- the prompts file (node writes, engine reads) -------------------------------------------

def write_prompts(path: str | os.PathLike, prompts: list[str], positives: list[tuple[torch.Tensor, dict]],
                  negative: tuple[torch.Tensor, dict]) -> Path:
    """Store encoded prompts (ComfyUI's (cond, extras) pairs) atomically; returns the path."""
    if not prompts or len(prompts) != len(positives):
        raise ConfigError("sample prompts: give one prompt per line (at least one), each encoded once.")
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"prompts": json.dumps(prompts)}
    for prefix, (cond, extras) in [(f"p{i}", c) for i, c in enumerate(positives)] + [("n", negative)]:
        tensors[f"{prefix}.cross_attn"] = cond
        none_keys, json_extras = [], {}
        for key, value in extras.items():
            if key in _NOT_DATA_KEYS:
                continue
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.{key}"] = value
            elif value is None:
                none_keys.append(key)
            else:
                try:
                    json_extras[key] = json.loads(json.dumps(value))
                except (TypeError, ValueError):
                    continue  # an object that is not data (e.g. a callable): sampling works without it
        metadata[f"{prefix}.none"] = json.dumps(none_keys)
        metadata[f"{prefix}.json"] = json.dumps(json_extras)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    return write_safetensors(path, tensors, metadata)


def read_prompts(path: str | os.PathLike) -> tuple[list[str], list[list], list]:
    """(texts, positive conditionings, negative conditioning) in ComfyUI's [[cond, extras]] form."""
    try:
        meta, tensors = read_safetensors(path)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ConfigError(f"sample prompts file {path} cannot be read ({e}): re-queue TrainPipeline so it is "
                          "written again, or set sample_every to 0.") from e

    def conditioning(prefix: str) -> list:
        extras = unpack_extras(tensors, prefix, meta.get(f"{prefix}.none", "[]"), meta.get(f"{prefix}.json", "{}"))
        return [[tensors[f"{prefix}.cross_attn"], extras]]

    texts = json.loads(meta.get("prompts", "[]"))
    return texts, [conditioning(f"p{i}") for i in range(len(texts))], conditioning("n")


def write_samples(run_dir: str | os.PathLike, step: int, latents: torch.Tensor, prompts: list[str]) -> Path:
    """Store one step's sample latents [N, ...] atomically; returns the file's path."""
    # a full disk, or SIGTERM's KeyboardInterrupt, leaves no half-written file
    return write_safetensors(sample_file(run_dir, step), {"latent": latents.contiguous()},
                             {"prompts": json.dumps(prompts), "step": str(step)})


def read_samples(path: str | os.PathLike) -> tuple[torch.Tensor, list[str]]:
    """A sample file's latents [N, ...] and the prompt of each."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        return f.get_tensor("latent"), json.loads(meta.get("prompts", "[]"))



def unsupported_reason(pipeline_stages: int) -> str:
    """Why samples cannot be rendered for a run with these settings ("" when they can)."""
    if pipeline_stages > 1:
        return (f"samples during training are not supported with pipeline_stages {pipeline_stages} "
                "(each GPU holds only part of the model); training continues without them. Use pipeline_stages 1, "
                "or test the saved LoRA with a KSampler after training.")
    return ""
