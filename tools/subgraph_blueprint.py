"""Regenerate "subgraphs/PipeTrain Train LoRA.json", the "Train LoRA" subgraph blueprint, from the image example workflow.

    .venv/bin/python -m tools.subgraph_blueprint          (COMFYUI_PATH or .comfyui/ComfyUI)

ComfyUI (0.3.75 and 0.33: app/subgraph_manager.py) lists every custom node pack's `subgraphs/*.json` at
GET /global_subgraphs, and the frontend shows each in the node library under its file name; dropping one on
the canvas adds a single node that expands into the graph inside it. The blueprint folds the training chain
of example_workflows/train_lora_then_test.json (Load Dataset -> Cache Latents, Configure LoRA, Memory
Options, Train Options -> Train Pipeline -> Save LoRA; same node types, ids and widget values) into one node.
Its inputs are the graph's MODEL, CLIP and VAE and the settings a first run changes (EXPOSED); its outputs
are Save LoRA's (the MODEL with the LoRA applied, and the LoRA's name).

The file is in the frontend's workflow format for blueprints: one subgraph node at the root and the inner
graph under "definitions": {"subgraphs": [...]}. Each inner node lists its inputs the way the frontend saves
them (sockets, then widgets, each in /object_info's input_order) with a value for every widget, so this needs
a running server's /object_info: it starts one over the demo's tiny files. Values the example leaves out (it
was saved before those inputs existed) are the inputs' defaults.
"""
from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example_workflows" / "train_lora_then_test.json"
BLUEPRINT = REPO / "subgraphs" / "PipeTrain Train LoRA.json"  # the frontend lists it by file name
TITLE = "PipeTrain Train LoRA"
DESCRIPTION = ("Train a LoRA on a folder of images with .txt captions, then save it: PipeTrain's Load Dataset, "
               "Cache Latents, Configure LoRA, Memory Options, Train Options, Train Pipeline and Save LoRA in one "
               "node. Connect your model's MODEL (its loader, or LoRA loaders after it: the LoRA trains on top of them), "
               "CLIP and VAE. Open the node to change any other setting.")
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
# The example's node ids in the order the frontend runs them (its "order"), and in columns left to right.
INNER = (4, 6, 7, 23, 5, 8, 9)
COLUMNS = ((4, 6, 7), (5, 23), (8,), (9,))
GAP, WIDGET_ROW, SOCKET_ROW = 60, 24, 20  # px between nodes; what a widget row and a socket row add
# Subgraph inputs: (name, label or None, type, the inner (node id, input name) it feeds).
SOCKETS = [("model", None, "MODEL", [(8, "model"), (9, "model")]),
           ("clip", None, "CLIP", [(5, "clip"), (8, "clip")]),
           ("vae", None, "VAE", [(5, "vae"), (8, "vae")])]
EXPOSED = [("dataset_folder", None, [(4, "folders")]),
           ("caption_prefix", "trigger / caption_prefix", [(4, "caption_prefix")]),
           ("steps", None, [(8, "steps")]),
           ("rank", None, [(6, "rank")]),
           ("lora_name", None, [(9, "name")])]
OUTPUTS = [("model", "MODEL", (9, 0)), ("lora_name", "STRING", (9, 1))]
INPUT_NODE, OUTPUT_NODE = -10, -20


def input_kind(spec: list) -> str:
    """An input's type as the frontend saves it: COMBO for a list of choices."""
    return "COMBO" if isinstance(spec[0], list) else str(spec[0])


def is_widget(spec: list) -> bool:
    options = spec[1] if len(spec) > 1 else {}
    return input_kind(spec) in WIDGET_TYPES and not options.get("forceInput")


def ordered_inputs(info: dict) -> list[tuple[str, list, bool]]:
    """(name, spec, optional) of a node's inputs: sockets, then widgets, each in input_order (the frontend's order)."""
    order = info.get("input_order") or {s: list(info["input"].get(s, {})) for s in ("required", "optional")}
    named = [(name, info["input"][section][name], section == "optional")
             for section in ("required", "optional") for name in order.get(section, [])]
    return [i for i in named if not is_widget(i[1])] + [i for i in named if is_widget(i[1])]


def default_value(spec: list):
    options = spec[1] if len(spec) > 1 else {}
    if "default" in options:
        return options["default"]
    choices = spec[0] if isinstance(spec[0], list) else options.get("options", [])
    return choices[0] if choices else None


def _uuid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"pipetrain/subgraphs/train_lora/{name}"))


def build(example: dict, object_info: dict) -> dict:
    """The blueprint: example's training nodes, with their widget values, inside one subgraph node."""
    nodes = {n["id"]: n for n in example["nodes"] if n["id"] in INNER}
    links: list[dict] = []

    def link(origin: tuple[int, int], target: tuple[int, int], kind: str) -> int:
        links.append({"id": len(links) + 1, "origin_id": origin[0], "origin_slot": origin[1],
                      "target_id": target[0], "target_slot": target[1], "type": kind})
        return len(links)

    inner = {}
    for order, node_id in enumerate(INNER):
        saved = nodes[node_id]
        ordered = ordered_inputs(object_info[saved["type"]])
        widgets = [name for name, spec, _ in ordered if is_widget(spec)]
        values = list(saved.get("widgets_values") or [])
        if len(values) > len(widgets):
            raise ValueError(f"{saved['type']} in {EXAMPLE.name} has {len(values)} widget values for {len(widgets)} widgets")
        values += [default_value(spec) for name, spec, _ in ordered if is_widget(spec)][len(values):]
        inputs = []
        for name, spec, optional in ordered:
            entry = {"localized_name": name, "name": name, **({"shape": 7} if optional else {}), "type": input_kind(spec)}
            inputs.append({**entry, **({"widget": {"name": name}} if is_widget(spec) else {}), "link": None})
        info = object_info[saved["type"]]
        outputs = [{"localized_name": name, "name": name, "type": kind, "links": []}
                   for name, kind in zip(info["output_name"], info["output"])]
        inner[node_id] = {"id": node_id, "type": saved["type"], "pos": [0, 0], "size": _size(saved, inputs, outputs),
                          "flags": {}, "order": order, "mode": 0, "inputs": inputs, "outputs": outputs,
                          "properties": {"Node name for S&R": saved["type"]}, "widgets_values": values}

    x = 0
    for ids in COLUMNS:
        y = 0
        for node_id in ids:
            inner[node_id]["pos"] = [x, y]
            y += inner[node_id]["size"][1] + GAP
        x += max(inner[i]["size"][0] for i in ids) + GAP
    right = x

    def slot(node_id: int, name: str) -> int:
        return next(i for i, inp in enumerate(inner[node_id]["inputs"]) if inp["name"] == name)

    for origin_id, origin_slot, target_id, target_slot, kind in (tuple(l[1:6]) for l in example["links"]):
        if origin_id in INNER and target_id in INNER:  # the example's slots: its nodes list fewer inputs
            name = nodes[target_id]["inputs"][target_slot]["name"]
            connect = link((origin_id, origin_slot), (target_id, slot(target_id, name)), kind)
            inner[target_id]["inputs"][slot(target_id, name)]["link"] = connect
            inner[origin_id]["outputs"][origin_slot]["links"].append(connect)

    sub_inputs, outer_inputs, outer_values = [], [], []
    for index, (name, label, kind, targets) in enumerate(
            SOCKETS + [(n, lab, None, t) for n, lab, t in EXPOSED]):
        ids = []
        for node_id, input_name in targets:
            target = inner[node_id]["inputs"][slot(node_id, input_name)]
            kind = kind or target["type"]
            target["link"] = link((INPUT_NODE, index), (node_id, slot(node_id, input_name)), kind)
            ids.append(target["link"])
        widget = kind in WIDGET_TYPES
        labelled = {"label": label} if label else {}
        sub_inputs.append({"id": _uuid(f"input/{name}"), "name": name, "type": kind, "linkIds": ids,
                           "localized_name": name, **labelled, "pos": [-100, 20 + 20 * index]})
        outer_inputs.append({"localized_name": name, "name": name, **labelled, "type": kind,
                             **({"widget": {"name": name}} if widget else {}), "link": None})
        if widget:
            node_id, input_name = targets[0]
            widgets = [i["name"] for i in inner[node_id]["inputs"] if "widget" in i]
            outer_values.append(inner[node_id]["widgets_values"][widgets.index(input_name)])

    sub_outputs, outer_outputs = [], []
    for index, (name, kind, (node_id, out_slot)) in enumerate(OUTPUTS):
        connect = link((node_id, out_slot), (OUTPUT_NODE, index), kind)
        inner[node_id]["outputs"][out_slot]["links"].append(connect)
        sub_outputs.append({"id": _uuid(f"output/{name}"), "name": name, "type": kind, "linkIds": [connect],
                            "localized_name": name, "pos": [right + 20, 20 + 20 * index]})
        outer_outputs.append({"localized_name": name, "name": name, "type": kind, "links": []})
    for node in inner.values():
        for out in node["outputs"]:
            out["links"] = out["links"] or None  # the frontend saves an unconnected output's links as null

    subgraph_id = _uuid("subgraph")
    n_in = len(sub_inputs)
    subgraph = {
        "id": subgraph_id, "version": 1,
        "state": {"lastGroupId": 0, "lastNodeId": max(inner), "lastLinkId": len(links), "lastRerouteId": 0},
        "revision": 0, "config": {}, "name": TITLE,
        "inputNode": {"id": INPUT_NODE, "bounding": [-200, 0, 120, 40 + 20 * n_in]},
        "outputNode": {"id": OUTPUT_NODE, "bounding": [right, 0, 120, 40 + 20 * len(sub_outputs)]},
        "inputs": sub_inputs,
        "outputs": sub_outputs, "widgets": [],
        "nodes": [inner[i] for i in INNER],
        "groups": [], "links": links, "extra": {}, "category": "PipeTrain", "description": DESCRIPTION,
    }
    outer = {"id": 1, "type": subgraph_id, "pos": [0, 0], "size": [340, 40 + 24 * len(outer_values) + 20 * n_in],
             "flags": {}, "order": 0, "mode": 0, "inputs": outer_inputs, "outputs": outer_outputs,
             "properties": {"proxyWidgets": [["-1", n] for n, _, _ in EXPOSED]},
             "widgets_values": outer_values, "title": TITLE}
    return {"revision": 0, "last_node_id": 1, "last_link_id": 0, "nodes": [outer], "links": [],
            "version": 0.4, "definitions": {"subgraphs": [subgraph]}, "extra": {"BlueprintDescription": DESCRIPTION}}


def _size(saved: dict, inputs: list, outputs: list) -> list[int]:
    """The size the frontend saved in the example, grown by a row per input added since (a widget row is
    WIDGET_ROW high, a socket row SOCKET_ROW) and one widget row to spare (an example edited by hand since it
    was exported may be a row short)."""
    def rows(inps: list, outs: list) -> tuple[int, int]:
        return sum(1 for i in inps if "widget" in i), max(sum(1 for i in inps if "widget" not in i), len(outs))

    (widgets, sockets), (widgets_then, sockets_then) = rows(inputs, outputs), rows(saved["inputs"], saved["outputs"])
    width, height = saved["size"]
    return [width, height + WIDGET_ROW * (widgets - widgets_then + 1) + SOCKET_ROW * (sockets - sockets_then)]


def render(blueprint: dict) -> str:
    return json.dumps(blueprint, indent=2) + "\n"


def main() -> int:
    sys.path.insert(0, str(REPO))
    import requests

    from engine.atomic_files import write_text
    from tools.comfy_server import ComfyServer
    from tools.demo import comfy_root
    from tools.tiny_assets import write_demo_base

    with tempfile.TemporaryDirectory(prefix="pipetrain-blueprint-") as base:
        write_demo_base(base)  # the example's file names, so model_name's choices hold its value
        with ComfyServer(str(comfy_root()), base, env={"OMP_NUM_THREADS": "1"}) as server:
            info = requests.get(server.url + "/object_info", timeout=120).json()
    blueprint = build(json.loads(EXAMPLE.read_text(encoding="utf-8")), info)
    BLUEPRINT.parent.mkdir(exist_ok=True)
    write_text(BLUEPRINT, render(blueprint))
    print(f"wrote {BLUEPRINT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
