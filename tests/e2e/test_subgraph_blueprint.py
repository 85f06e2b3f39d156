"""The "Train LoRA" subgraph blueprint ("subgraphs/PipeTrain Train LoRA.json", written by tools/subgraph_blueprint.py) in a
real ComfyUI server: listed by GET /global_subgraphs (app/subgraph_manager.py, which lists every custom node
pack's subgraphs/*.json), still the example workflow's training chain with every current input, and, converted
to an API prompt the way the editor flattens a subgraph node, training through POST /prompt on the demo's tiny
files with its MODEL output sampled against the base model, as the example workflows are
(tests/e2e/test_example_workflows.py). In the real frontend (headless Chromium): flattened into the same prompt,
and found in the node search and added as one node whose exposed inputs reach the inner nodes."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import requests

from test_example_workflows import _outputs
from tools.comfy_server import PACK_NAME
from tools.demo import demo_prompt
from tools.subgraph_blueprint import BLUEPRINT, EXAMPLE, build, input_kind, is_widget, ordered_inputs, render

pytestmark = [pytest.mark.slow, pytest.mark.core]
REPO = Path(__file__).resolve().parents[2]
INPUT_NODE = -10
# The API twin's nodes a blueprint user still has around it: the loaders, and the test prompts, samplers,
# decoders and saves (13 samples with the new LoRA, 16 without).
AROUND = {"1", "2", "3", "10", "11", "12", "13", "14", "15", "16", "17", "18"}


@pytest.fixture(scope="module")
def blueprint() -> dict:
    return json.loads(BLUEPRINT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def object_info(comfy_server) -> dict:
    return requests.get(comfy_server.url + "/object_info", timeout=120).json()


def blueprint_prompt(blueprint: dict, object_info: dict, sockets: dict, values: dict) -> tuple[dict, dict]:
    """The blueprint's inner graph as an API prompt, node ids "<outer id>:<inner id>" as the editor writes them.
    sockets: subgraph input name -> [node id, slot] of what feeds it (a socket left out is unconnected); values:
    the exposed settings to change, by subgraph input name. Returns (prompt, subgraph output name -> [id, slot])."""
    outer = blueprint["nodes"][0]
    (subgraph,) = [s for s in blueprint["definitions"]["subgraphs"] if s["id"] == outer["type"]]
    exposed = [i["name"] for i in outer["inputs"] if "widget" in i]
    assert len(exposed) == len(outer["widgets_values"]) and set(values) <= set(exposed), (exposed, values)
    settings = {**dict(zip(exposed, outer["widgets_values"])), **values}
    links = {link["id"]: link for link in subgraph["links"]}
    prompt = {}
    for node in subgraph["nodes"]:
        assert node["type"] in object_info, f"{node['type']} is not a node of this server"
        ordered = ordered_inputs(object_info[node["type"]])
        widgets = [(name, spec) for name, spec, _ in ordered if is_widget(spec)]
        assert [i["name"] for i in node["inputs"]] == [name for name, _, _ in ordered], node["type"]
        assert len(node["widgets_values"]) == len(widgets), (node["type"], node["widgets_values"], widgets)
        for (name, spec), value in zip(widgets, node["widgets_values"]):
            _check_value(node["type"], name, spec, value)
        inputs = {name: value for (name, _), value in zip(widgets, node["widgets_values"])}
        for inp in node["inputs"]:
            if inp["link"] is None:
                continue
            link = links[inp["link"]]
            assert (link["target_id"], node["inputs"][link["target_slot"]]["name"]) == (node["id"], inp["name"])
            if link["origin_id"] != INPUT_NODE:
                inputs[inp["name"]] = [f"{outer['id']}:{link['origin_id']}", link["origin_slot"]]
                continue
            source = subgraph["inputs"][link["origin_slot"]]["name"]
            if source in settings:
                inputs[inp["name"]] = settings[source]
            elif source in sockets:
                inputs[inp["name"]] = sockets[source]
            else:
                inputs.pop(inp["name"], None)  # an unconnected socket: the editor leaves the input out
        prompt[f"{outer['id']}:{node['id']}"] = {"class_type": node["type"], "inputs": inputs}
    outputs = {}
    for out in subgraph["outputs"]:
        (link,) = [links[i] for i in out["linkIds"]]
        outputs[out["name"]] = [f"{outer['id']}:{link['origin_id']}", link["origin_slot"]]
    return prompt, outputs


def _check_value(node_type: str, name: str, spec: list, value) -> None:
    """A widget value fits its input: one of a combo's choices, a number in range, a bool or a string."""
    kind, options = input_kind(spec), (spec[1] if len(spec) > 1 else {})
    where = f"{node_type}.{name} = {value!r}"
    if kind == "COMBO":
        choices = spec[0] if isinstance(spec[0], list) else options.get("options", [])
        assert value in choices, f"{where} is not one of {choices}"
    elif kind in ("INT", "FLOAT"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
        assert kind == "FLOAT" or float(value).is_integer(), where
        assert options.get("min", value) <= value <= options.get("max", value), f"{where} is out of range {options}"
    else:
        assert isinstance(value, {"BOOLEAN": bool, "STRING": str}[kind]), where


def _content(value):
    """The blueprint without its layout (pos, size, bounding)."""
    if isinstance(value, dict):
        return {k: _content(v) for k, v in value.items() if k not in ("pos", "size", "bounding")}
    return [_content(v) for v in value] if isinstance(value, list) else value


def test_the_blueprint_is_listed_at_global_subgraphs(comfy_server, comfy_root):
    if not (Path(comfy_root) / "app" / "subgraph_manager.py").is_file():
        pytest.skip(f"this ComfyUI ({comfy_root}) has no app.subgraph_manager, the module behind /global_subgraphs")
    listed = requests.get(comfy_server.url + "/global_subgraphs", timeout=30).json()
    ours = {key: e for key, e in listed.items() if e["info"]["node_pack"] == f"custom_nodes.{PACK_NAME}"}
    assert [(e["name"], e["source"]) for e in ours.values()] == [(BLUEPRINT.stem, "custom_node")], listed
    (key,) = ours
    entry = requests.get(f"{comfy_server.url}/global_subgraphs/{key}", timeout=30).json()
    assert entry["data"] == BLUEPRINT.read_text(encoding="utf-8")  # what the editor loads into the node library


def test_the_blueprint_is_the_example_training_chain_with_every_input(blueprint, object_info):
    # Rebuilt from the example workflow and this server's node inputs; a node input added since the blueprint
    # was written shows up here (regenerate it: python -m tools.subgraph_blueprint).
    # Layout (positions, sizes) aside: re-exporting the example moves its nodes, not what the blueprint holds.
    rebuilt = build(json.loads(EXAMPLE.read_text(encoding="utf-8")), object_info)
    assert render(_content(rebuilt)) == render(_content(blueprint)), \
        f"{BLUEPRINT} is stale: run python -m tools.subgraph_blueprint"
    outer = blueprint["nodes"][0]
    assert outer["title"] == BLUEPRINT.stem == "PipeTrain Train LoRA"
    assert [i["name"] for i in outer["inputs"]] == ["model", "clip", "vae", "dataset_folder", "caption_prefix",
                                                    "steps", "rank", "lora_name"]
    assert [o["name"] for o in outer["outputs"]] == ["model", "lora_name"]


def test_the_blueprint_trains_through_post_prompt(comfy_server, demo_base, blueprint, object_info):
    run_name = "blueprint_lora"
    around = {k: v for k, v in demo_prompt(demo_base, steps=6, processes=2, run_name=run_name).items() if k in AROUND}
    inner, outputs = blueprint_prompt(
        blueprint, object_info, sockets={"model": ["1", 0], "clip": ["3", 0], "vae": ["2", 0]},
        values={"dataset_folder": demo_base["dataset"], "caption_prefix": "pipetrain ", "steps": 6,
                "lora_name": run_name})
    prompt = {**around, **inner}
    prompt["13"]["inputs"]["model"] = outputs["model"]  # the with_lora sampler takes the blueprint's MODEL
    by_type = {node["class_type"]: node["inputs"] for node in inner.values()}
    assert by_type["PipeTrainTrainPipeline"]["steps"] == 6 and by_type["PipeTrainConfigureLoRA"]["rank"] == 16
    by_type["PipeTrainSaveLoRA"]["overwrite"] = True  # a second run of the session's server replaces its LoRA

    entry = comfy_server.run(prompt, timeout=600)
    images = _outputs(comfy_server, entry, run_name, demo_base["base_dir"])
    assert images["with_lora"].read_bytes() != images["without_lora"].read_bytes(), "the LoRA did not change the image"
    dataset_id = next(k for k, v in inner.items() if v["class_type"] == "PipeTrainLoadDataset")
    report = entry["outputs"][dataset_id]["text"]
    assert any("prefix 'pipetrain '" in line for line in report), report  # the exposed trigger word reached the dataset
    texts = [t for o in entry["outputs"].values() for t in o.get("text", [])]
    assert any("trained 6/6 steps" in t for t in texts), texts


def test_the_editor_queues_the_blueprint_as_converted_here(comfy_server, blueprint, object_info):
    """The real frontend opens the blueprint (one subgraph node) and flattens it into the prompt it would queue:
    the same nodes, links and widget values as blueprint_prompt's, so the conversion the training test uses is
    the editor's."""
    from tools.node_runtime import node_binary

    out = subprocess.run([node_binary() or "node", str(REPO / "tests" / "ui" / "workflow_prompts.mjs"), comfy_server.url,
                          str(BLUEPRINT)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    opened = json.loads(out.stdout.strip().splitlines()[-1])[BLUEPRINT.stem]
    assert opened["unknown"] == [], opened["unknown"]
    expected, _ = blueprint_prompt(blueprint, object_info, sockets={}, values={})
    got = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in opened["output"].items()}
    assert got == expected


def test_the_blueprint_is_found_in_the_node_search_and_added_as_one_node(comfy_server):
    """A user's path in the real frontend (tests/ui/blueprint_library.mjs): type the blueprint's name in the node
    search, pick it, get one subgraph node with the exposed inputs whose values reach the inner nodes when queued;
    opened, its nodes neither overlap nor cut their widgets. Screenshots: tests/artifacts/<time>/blueprint_*.png."""
    from tools.node_runtime import node_binary

    artifacts = REPO / "tests" / "artifacts" / time.strftime("%Y%m%d-%H%M%S")
    out = subprocess.run([node_binary() or "node", str(REPO / "tests" / "ui" / "blueprint_library.mjs"), comfy_server.url,
                          str(artifacts), BLUEPRINT.stem], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, f"screenshots in {artifacts}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert "Subgraph Blueprints" in found["option"] and found["title"] == BLUEPRINT.stem and found["isSubgraph"], found
    assert found["widgets"] == ["dataset_folder", "caption_prefix", "steps", "rank", "lora_name"], found
    assert found["outputs"] == ["model", "lora_name"], found
    chain = sorted(["PipeTrainLoadDataset", "PipeTrainCacheLatents", "PipeTrainConfigureLoRA", "PipeTrainMemoryOptions",
                    "PipeTrainTrainOptions", "PipeTrainTrainPipeline", "PipeTrainSaveLoRA"])
    assert found["inner"] == chain and found["opened"] == chain, found
    assert found["queued"] == {"disabled": [], "steps": 7, "prefix": "ohwx, "}, found["queued"]
    assert found["overlaps"] == [] and found["tooSmall"] == [], found  # opened: laid out, each node fits its widgets
    for name in ("blueprint_search.png", "blueprint_node.png", "blueprint_inside.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
