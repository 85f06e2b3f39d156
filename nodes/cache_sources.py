"""The files behind CacheLatents' VAE, CLIP and CLIP-vision inputs, read from the queued graph.

Caching on several GPUs runs the engine's cache mode (`python -m engine cache`, engine/cache/cli.py):
every rank loads the encoders itself, from files. This module follows each input's link in the API
prompt ComfyUI queued back to the loader node that made it and returns what that loader loaded, as
the cache config names it. Only loaders whose output is the file as it is are followed; anything in
between (CLIP Set Last Layer, a LoRA loader, a custom node) is refused by name, because the ranks
could not rebuild it. The ranks also compare the encoders' identity with the graph's
(CacheConfig.expect_identity), so a loader that does more than its name says is caught as well.
"""
from __future__ import annotations

from typing import Any

from ..engine.config.checks import ConfigError
from .graph_links import linked, named_file

# loader class -> {output index: (what it gives, [(input name, model folder), ...])}
LOADERS: dict[str, dict[int, tuple[str, tuple[tuple[str, str], ...]]]] = {
    "VAELoader": {0: ("vae", (("vae_name", "vae"),))},
    "CLIPLoader": {0: ("clip", (("clip_name", "text_encoders"),))},
    "DualCLIPLoader": {0: ("clip", (("clip_name1", "text_encoders"), ("clip_name2", "text_encoders")))},
    "TripleCLIPLoader": {0: ("clip", tuple((f"clip_name{i}", "text_encoders") for i in (1, 2, 3)))},
    "QuadrupleCLIPLoader": {0: ("clip", tuple((f"clip_name{i}", "text_encoders") for i in (1, 2, 3, 4)))},
    "CheckpointLoaderSimple": {1: ("checkpoint", (("ckpt_name", "checkpoints"),)),
                               2: ("checkpoint", (("ckpt_name", "checkpoints"),))},
    "CLIPVisionLoader": {0: ("clip_vision", (("clip_name", "clip_vision"),))},
    "LTXVAudioVAELoader": {0: ("audio_vae", (("ckpt_name", "checkpoints"),))},  # ComfyUI 0.33+
}
# the kinds each CacheLatents input takes (audio_vae: Load LTXV Audio VAE's checkpoint, or a VAELoader's file)
TAKES = {"vae": ("vae", "checkpoint"), "clip": ("clip", "checkpoint"), "clip_vision": ("clip_vision",),
         "audio_vae": ("audio_vae", "vae")}
FOLLOWED = ", ".join(LOADERS)


def _source(prompt: dict, node_id: str, input_name: str) -> tuple[str, dict, int]:
    """(class, node, output index) of the node feeding `input_name` of node `node_id`."""
    found = linked(prompt, node_id, input_name)
    if found is None:
        raise ConfigError(f"CacheLatents' {input_name} is not linked to a node in the queued graph, so gpus above 1 "
                          "cannot tell which file to load on each GPU: set gpus to 1.")
    _, node, output = found
    return str(node.get("class_type")), node, output


def _files(kind: str, node: dict, names: tuple[tuple[str, str], ...]) -> list[str]:
    out = []
    for input_name, folder in names:
        name, path = named_file(node, input_name, folder)
        if path is None:
            raise ConfigError(f"CacheLatents' {kind} comes from a {node.get('class_type')} whose {input_name} "
                              f"{name!r} is not a file in ComfyUI's models/{folder} folder, so the GPU processes "
                              "cannot load it: pick a file there, or set gpus to 1.")
        out.append(path)
    return out


def encoder_files(prompt: Any, node_id: Any, with_clip_vision: bool, with_audio_vae: bool = False) -> dict[str, Any]:
    """The cache config's encoder settings (vae, clip, clip_type, checkpoint, clip_vision, audio_vae) for the
    CacheLatents node `node_id` of the queued `prompt`."""
    if not isinstance(prompt, dict) or node_id is None:
        raise ConfigError("gpus above 1 needs the queued graph to find the encoder files, and ComfyUI did not pass it "
                          "(the node was called outside a queued prompt): set gpus to 1.")
    found: dict[str, Any] = {}
    inputs = ("vae", "clip") + (("clip_vision",) if with_clip_vision else ()) + (("audio_vae",) if with_audio_vae else ())
    for input_name in inputs:
        cls, node, output = _source(prompt, node_id, input_name)
        given = LOADERS.get(cls, {}).get(output)
        if given is None or given[0] not in TAKES[input_name]:
            raise ConfigError(f"CacheLatents' {input_name} comes from {cls}, which the GPU processes cannot rebuild "
                              f"from files: connect it straight from a loader ({FOLLOWED}), or set gpus to 1 to "
                              "cache with the graph's own encoders.")
        kind, names = given
        files = _files(input_name, node, names)
        if kind == "checkpoint":
            if found.get("checkpoint", files[0]) != files[0]:
                raise ConfigError("CacheLatents' vae and clip come from two different checkpoints: give the GPU "
                                  "processes one, or set gpus to 1.")
            found["checkpoint"] = files[0]
        elif kind == "clip":
            found["clip"] = files
            found["clip_type"] = str((node.get("inputs") or {}).get("type", "stable_diffusion"))
        else:  # a VAELoader feeding audio_vae gives the audio VAE
            found[input_name] = files[0]
    return found
