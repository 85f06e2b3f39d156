"""The training UI's server side in a real ComfyUI: samples decoded into the run folder and the node's
output, the run-state route a reloaded page reads, the run-dir reader nodes, templates and help pages."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import requests
from PIL import Image

from tools.demo import demo_prompt

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NEW_NODES = ["PipeTrainLossPlot", "PipeTrainSampleGrid"]


def _by_type(prompt: dict, class_type: str) -> dict:
    return next(n["inputs"] for n in prompt.values() if n["class_type"] == class_type)


def _image(server, entry: dict, node: str) -> Image.Image:
    (path,) = server.image_paths({"outputs": {node: entry["outputs"][node]}})
    return Image.open(path)


@pytest.fixture(scope="module")
def trained(comfy_server, demo_base):
    """The example workflow up to TrainPipeline plus the two reader nodes: 12 steps, samples every 6,
    the training set also connected as eval set (eval every 6 and before the start), a noise range."""
    prompt = demo_prompt(demo_base, steps=12, processes=1, run_name="ui_run")
    keep = {"1", "2", "3", "4", "5", "6", "7", "8", "19", "20", "21", "22", "23"}
    prompt = {k: v for k, v in prompt.items() if k in keep}
    cache_node = next(k for k, n in prompt.items() if n["class_type"] == "PipeTrainCacheLatents")
    _by_type(prompt, "PipeTrainTrainPipeline").update(sample_every=6, eval_cache=[cache_node, 0], eval_every=6,
                                                      eval_before_start=True, min_t=0.02, max_t=0.98)
    entry = comfy_server.run(prompt, timeout=600)
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "ui_run"
    return entry, run_dir, prompt


def test_samples_are_decoded_into_the_run_folder_and_shown_on_the_node(comfy_server, trained):
    entry, run_dir, _ = trained
    pngs = sorted(p.name for p in (run_dir / "samples").glob("*.png"))
    assert pngs == ["step000006_p0.png", "step000006_p1.png", "step000012_p0.png", "step000012_p1.png"], pngs
    first = Image.open(run_dir / "samples" / "step000012_p0.png")
    assert first.size == (64, 64)
    assert Image.open(run_dir / "samples" / "step000006_p0.png").tobytes() != first.tobytes()
    node_images = entry["outputs"]["8"]["images"]
    assert [i["filename"] for i in node_images] == ["step000012_p0.png", "step000012_p1.png"]
    served = requests.get(comfy_server.url + "/view", params=node_images[0], timeout=30)
    assert served.status_code == 200 and Image.open(io.BytesIO(served.content)).size == (64, 64)
    assert any(p.name.endswith(".samples") for p in (run_dir / "tensorboard").iterdir()), "no TensorBoard images"


def test_eval_and_noise_range_inputs_reach_run_json_and_the_eval_runs(trained):
    _, run_dir, _ = trained
    cfg = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert cfg["eval"] == {"cache_dir": cfg["cache_dir"], "every": 6, "before_start": True, "seed": 0, "early_stop": 0}
    assert (cfg["train"]["min_t"], cfg["train"]["max_t"]) == (0.02, 0.98)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [0, 6, 12] and all(len(e["losses"]) == 5 for e in evals)


def test_run_state_route_replays_the_run_for_a_reloaded_page(comfy_server, trained):
    _, run_dir, _ = trained
    state = requests.get(comfy_server.url + "/pipetrain/run_state", params={"node": "8"}, timeout=30).json()
    assert state["run"] == "ui_run" and state["status"] == "done" and state["total"] == 12
    steps = [e for e in state["events"] if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 13))
    assert [s["step"] for s in state["samples"]] == [6, 12]
    assert all("traceback" not in e for e in state["events"])
    missing = requests.get(comfy_server.url + "/api/pipetrain/run_state", params={"node": "999"}, timeout=30)
    assert missing.status_code == 404 and "no PipeTrain run for node" in missing.json()["error"]


def test_reader_nodes_plot_the_loss_and_grid_the_samples(comfy_server, trained):
    entry, run_dir, prompt = trained
    plot, grid = (_image(comfy_server, entry, key) for key in ("20", "22"))
    assert plot.size == (768, 432)
    assert len(plot.convert("RGB").getcolors(maxcolors=100_000)) > 20, "the plot is (nearly) blank"
    assert grid.width > 2 * 64 and grid.height > 2 * 64  # 2 prompts x 2 sampling steps, with labels
    # The same nodes by run name alone (no TrainPipeline in the graph): what they do after a restart.
    by_name = {"19": prompt["19"], "20": prompt["20"], "21": prompt["21"], "22": prompt["22"]}
    for key in ("19", "21"):
        by_name[key] = {"class_type": prompt[key]["class_type"],
                        "inputs": {**{k: v for k, v in prompt[key]["inputs"].items() if k != "run"},
                                   "run_name": "ui_run"}}
    again = comfy_server.run(by_name, timeout=120)
    plot2, grid2 = (_image(comfy_server, again, key) for key in ("20", "22"))
    assert plot2.tobytes() == plot.tobytes() and grid2.tobytes() == grid.tobytes()


def test_reader_node_errors_name_the_fix(comfy_server, trained):
    from tools.comfy_server import ComfyError

    _, _, prompt = trained
    graph = {"21": {"class_type": "PipeTrainSampleGrid", "inputs": {"run_name": "(the run input)", "max_rows": 4,
                                                                    "cell_size": 64}},
             "22": {"class_type": "PreviewImage", "inputs": {"images": ["21", 0]}}}
    with pytest.raises(ComfyError, match="connect a TrainPipeline's run output"):
        comfy_server.run(graph, timeout=60)


@pytest.mark.core
def test_every_node_has_tooltips_and_a_help_page_and_the_template_is_listed(comfy_server):
    from PipeTrain.nodes import NODE_CLASS_MAPPINGS

    assert set(NEW_NODES) <= set(NODE_CLASS_MAPPINGS)
    for name in NODE_CLASS_MAPPINGS:
        info = comfy_server.object_info(name)
        assert info, f"{name} is not registered:\n{comfy_server.log_tail()}"
        for section in ("required", "optional"):
            for input_name, spec in info["input"].get(section, {}).items():
                assert len(spec) > 1 and spec[1].get("tooltip"), f"{name}.{input_name} has no tooltip"
        doc = requests.get(f"{comfy_server.url}/extensions/PipeTrain/docs/{name}.md", timeout=30)
        assert doc.status_code == 200 and doc.text.startswith("# "), f"no help page for {name}"
        # every input the node has is described on its help page
        for section in ("required", "optional"):
            for input_name in info["input"].get(section, {}):
                assert f"`{input_name}`" in doc.text, f"{name}.md does not describe {input_name}"
    templates = requests.get(comfy_server.url + "/api/workflow_templates", timeout=30).json()
    assert "train_lora_then_test" in templates.get("PipeTrain", []), templates
    thumb = requests.get(comfy_server.url + "/api/workflow_templates/PipeTrain/train_lora_then_test.jpg", timeout=30)
    assert thumb.status_code == 200 and thumb.content[:2] == b"\xff\xd8"
    js = requests.get(comfy_server.url + "/extensions/PipeTrain/chart.js", timeout=30)
    assert js.status_code == 200 and "export function smooth" in js.text
    assert json.loads((REPO / "example_workflows" / "train_lora_then_test.json").read_text())["nodes"]
