"""API-format prompts written before Train Options existed give its settings (sample_every, gpu_ids, min_t...)
to Train Pipeline by name. ComfyUI would drop those unknown inputs silently and train with the defaults, so
POST /prompt converts them first (an on_prompt handler): they move into a Train Options node added to the
prompt and connected to Train Pipeline's `options` input. UI workflows are converted in web/pipetrain.js."""
from __future__ import annotations

import dataclasses

from . import compat
from .train_options import OPTION_NAMES, TrainOptions

TRAIN_NODE = "PipeTrainTrainPipeline"
OPTIONS_NODE = "PipeTrainTrainOptions"


def convert_prompt(prompt: dict) -> dict:
    """`prompt` (node id -> {"class_type", "inputs"}) with every Train Pipeline's old-style settings moved
    into a Train Options node of its own (a copy of the one connected, if any, with them on top: what is
    given by name wins); changed in place and returned."""
    for node_id, node in list(prompt.items()):
        if not isinstance(node, dict) or node.get("class_type") != TRAIN_NODE:
            continue
        inputs = node.get("inputs") or {}
        moved = {name: inputs.pop(name) for name in OPTION_NAMES if name in inputs}
        if not moved:
            continue
        base = dataclasses.asdict(TrainOptions())
        linked = inputs.get("options")
        if linked is not None:  # a connected Train Options node too: a copy of it with these values on top
            source = prompt.get(str(linked[0])) if isinstance(linked, list) and linked else None
            if not isinstance(source, dict) or source.get("class_type") != OPTIONS_NODE:
                compat.log.warning("[PipeTrain] node %s: %s given to Train Pipeline are ignored: its options input "
                                   "is connected to another node.", node_id, ", ".join(sorted(moved)))
                continue
            base = {**base, **(source.get("inputs") or {})}
        options_id = _free_id(prompt, f"{node_id}_pipetrain_options")
        prompt[options_id] = {"class_type": OPTIONS_NODE, "inputs": {**base, **moved},
                              "_meta": {"title": "PipeTrain Train Options (from an older prompt)"}}
        inputs["options"] = [options_id, 0]
    return prompt


def _free_id(prompt: dict, wanted: str) -> str:
    candidate, n = wanted, 1
    while candidate in prompt:
        n += 1
        candidate = f"{wanted}_{n}"
    return candidate


def _on_prompt(json_data: dict) -> dict:
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    if isinstance(prompt, dict):
        convert_prompt(prompt)
    return json_data


def register() -> None:
    server = compat.prompt_server()
    if server is None or getattr(server, "_pipetrain_legacy_prompts", False):
        return
    server.add_on_prompt_handler(_on_prompt)
    server._pipetrain_legacy_prompts = True
