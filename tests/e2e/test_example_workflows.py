"""The edit, video, best-step and Wan 2.2 experts example workflows, run as shipped: their API twins (example_workflows/api/) go
through POST /prompt to a real ComfyUI server, train a LoRA on the demo's random-init files
(tools/tiny_families.py: a Flux Kontext and a HunyuanVideo that ComfyUI's own loaders detect; the demo UNet
with a held-out eval set for the best step; the demo UNet twice for the Wan pair's plumbing), save it, and
sample with it. The image workflow is
tests/e2e/test_comfy_e2e.py's."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from tools.comfy_server import PACK_NAME
from tools.tiny_assets import write_demo_base

pytestmark = [pytest.mark.slow, pytest.mark.core]
REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / "example_workflows"


@pytest.fixture(scope="module")
def assets(demo_base) -> dict:
    """The demo base with the edit and video workflows' files added (the server lists new files)."""
    return write_demo_base(demo_base["base_dir"], extras=("edit", "video", "experts"))


def _workflow(name: str, files: dict, run_name: str, steps: int) -> dict:
    """The API twin as shipped, with the test's absolute dataset folders, run name and step count."""
    prompt = json.loads((WORKFLOWS / "api" / f"{name}_api.json").read_text(encoding="utf-8"))
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_type["UNETLoader"]["unet_name"] == files["unet"] and by_type["VAELoader"]["vae_name"] == files["vae"]
    by_type["PipeTrainLoadDataset"]["folders"] = files["dataset"]
    by_type["PipeTrainTrainPipeline"].update(steps=steps, run_name=run_name)
    by_type["PipeTrainSaveLoRA"].update(name=run_name, overwrite=True)
    return prompt


def _outputs(server, entry: dict, run_name: str, base: str) -> dict[str, Path]:
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert f"saved pipetrain/{run_name}.safetensors" in texts, texts
    assert (Path(base) / "models" / "loras" / "pipetrain" / f"{run_name}.safetensors").is_file()
    saved = {Path(p).name.split("_0")[0]: Path(p) for p in server.image_paths(entry)}  # and the loss plot's preview
    assert {"with_lora", "without_lora"} <= set(saved), list(saved)
    return {name: saved[name] for name in ("with_lora", "without_lora")}


def _cached_shapes(dataset: str) -> dict[str, list[int]]:
    """Tensor shapes of the first item of the dataset's latent cache (CacheLatents' output: shard files
    whose tensors are named "<item index>/<key>", engine/cache/shards.py)."""
    from safetensors import safe_open

    first = sorted(Path(dataset).glob(".pipetrain_cache/*/shards/*.safetensors"))[0]
    with safe_open(str(first), "pt") as f:
        keys = sorted(f.keys())
        item = keys[0].split("/", 1)[0]
        return {k.split("/", 1)[1]: list(f.get_slice(k).get_shape()) for k in keys if k.split("/", 1)[0] == item}


def test_edit_workflow_trains_and_the_lora_changes_the_edit(comfy_server, assets):
    files = assets["edit"]
    prompt = _workflow("train_edit_lora_then_test", files, "example_edit", steps=4)
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_type["PipeTrainLoadDataset"]["control_folder"] == Path(files["control"]).name
    assert by_type["LoadImage"]["image"] == files["image"]
    entry = comfy_server.run(prompt, timeout=600)
    images = _outputs(comfy_server, entry, "example_edit", assets["base_dir"])
    # Trained as an edit model: each target's latent with its control image's as ReferenceLatent.
    shapes = _cached_shapes(files["dataset"])
    assert shapes["latent"] == shapes["cond.reference_latents.0"] == [16, 8, 8], shapes
    assert images["with_lora"].read_bytes() != images["without_lora"].read_bytes(), "the LoRA did not change the edit"


def test_video_workflow_trains_and_the_lora_changes_the_video(comfy_server, assets):
    files = assets["video"]
    prompt = _workflow("train_video_lora_then_test", files, "example_video", steps=6)
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_type["PipeTrainLoadDataset"]["video_frames"] == files["frames"]
    entry = comfy_server.run(prompt, timeout=600)
    videos = _outputs(comfy_server, entry, "example_video", assets["base_dir"])
    assert _cached_shapes(files["dataset"])["latent"] == [16, 2, 8, 8]  # 5 frames -> 2 latent frames of 8x8
    from PIL import Image

    for name, path in videos.items():  # animated WebPs with every decoded frame
        with Image.open(path) as im:
            assert getattr(im, "n_frames", 1) == files["frames"], name
    assert videos["with_lora"].read_bytes() != videos["without_lora"].read_bytes(), "the LoRA did not change the video"


def test_the_best_step_workflow_saves_the_step_with_the_lowest_eval_loss_and_grids_the_saved_steps(comfy_server,
                                                                                                     demo_base):
    from safetensors.torch import load_file

    prompt = json.loads((WORKFLOWS / "api" / "train_pick_best_step_api.json").read_text(encoding="utf-8"))
    loads = {n["inputs"]["folders"]: n["inputs"] for n in prompt.values() if n["class_type"] == "PipeTrainLoadDataset"}
    assert set(loads) == {Path(demo_base["dataset"]).name, Path(demo_base["eval_dataset"]).name}
    for folder in (demo_base["dataset"], demo_base["eval_dataset"]):
        loads[Path(folder).name]["folders"] = folder
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_type["PipeTrainTrainPipeline"]["eval_cache"] != by_type["PipeTrainTrainPipeline"]["cache"]
    assert by_type["PipeTrainSaveLoRA"]["weights"] == "best"
    by_type["PipeTrainTrainPipeline"].update(steps=30, run_name="example_best")  # saves and evals every 10
    by_type["PipeTrainSaveLoRA"].update(name="example_best", overwrite=True)
    entry = comfy_server.run(prompt, timeout=600)
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "example_best"
    history = json.loads((run_dir / "best.json").read_text(encoding="utf-8"))["history"]
    assert [e["step"] for e in history] == [0, 10, 20, 30], history
    saved = [e for e in history if e["file"]]
    best = min(saved, key=lambda e: e["eval_loss"])
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert f"saved pipetrain/example_best.safetensors (best eval step, {best['file']})" in texts, (texts, history)
    written = load_file(str(Path(demo_base["base_dir"]) / "models" / "loras" / "pipetrain" / "example_best.safetensors"))
    source = load_file(str(run_dir / "lora" / best["file"]))
    assert written.keys() == source.keys() and all(written[k].equal(source[k]) for k in source)
    assert "3 saved step(s) x 3 strength(s) of run example_best" in texts, texts
    paths = {Path(p).parent.name + "/" + Path(p).name.split("_0")[0]: p for p in comfy_server.image_paths(entry)}
    from PIL import Image

    cell, label, header, gap = 128, 70, 24, 4  # nodes/plot_draw.py grid_image at cell_size 128, 64-px samples
    grid = Image.open(paths["pipetrain_best_step_demo/lora_grid"])
    assert grid.size == (label + 3 * (cell + gap), header + 3 * (cell + gap)), grid.size
    assert Image.open(paths["pipetrain_best_step_demo/with_best_lora"]).size == (64, 64)


def test_the_wan_experts_workflow_trains_a_pair_and_samples_with_both_experts(comfy_server, assets):
    prompt = json.loads((WORKFLOWS / "api" / "train_wan22_experts_then_test_api.json").read_text(encoding="utf-8"))
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    low = assets["experts"]["low_noise"]
    assert by_type["PipeTrainWanExperts"]["low_noise_model"] == low
    assert sorted(n["inputs"]["unet_name"] for n in prompt.values() if n["class_type"] == "UNETLoader") == sorted(
        [by_type["PipeTrainTrainPipeline"]["model_name"], low])
    by_type["PipeTrainLoadDataset"]["folders"] = assets["dataset"]
    by_type["PipeTrainTrainPipeline"].update(steps=4, run_name="example_experts")
    by_type["PipeTrainSaveLoRA"].update(name="example_experts", overwrite=True)
    stages = [n["inputs"] for n in prompt.values() if n["class_type"] == "KSamplerAdvanced"]
    assert len(stages) == 4 and {s["end_at_step"] for s in stages if s["add_noise"] == "enable"} == {5}
    entry = comfy_server.run(prompt, timeout=900)
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    pair = "saved pipetrain/example_experts_high_noise.safetensors and pipetrain/example_experts_low_noise.safetensors"
    assert pair in texts, texts
    runs = Path(assets["base_dir"]) / "output" / "pipetrain"
    high = by_type["PipeTrainTrainPipeline"]["model_name"]
    for half, model, noise in (("high_noise", high, (0.875, 1.0)), ("low_noise", low, (0.0, 0.875))):
        cfg = json.loads((runs / f"example_experts_{half}" / "run.json").read_text(encoding="utf-8"))
        assert Path(cfg["model_path"]).name == model and (cfg["train"]["min_t"], cfg["train"]["max_t"]) == noise
    saved = {Path(p).name.split("_0")[0]: Path(p) for p in comfy_server.image_paths(entry)}
    assert saved["with_lora"].read_bytes() != saved["without_lora"].read_bytes(), "the pair changed nothing"


def test_the_five_workflows_are_listed_in_the_template_browser(comfy_server):
    # The template browser's list: GET /api/workflow_templates maps each custom node pack to the .json
    # files directly in its example_workflows/ (the frontend shows <name>.jpg as the thumbnail).
    listed = requests.get(comfy_server.url + "/api/workflow_templates", timeout=30).json()
    names = listed.get(PACK_NAME, [])
    expected = {"train_lora_then_test", "train_edit_lora_then_test", "train_video_lora_then_test",
                "train_pick_best_step", "train_wan22_experts_then_test"}
    assert set(names) == expected, listed  # tests/unit/test_package.py checks each against its API twin
    for name in expected:
        thumb = requests.get(f"{comfy_server.url}/api/workflow_templates/{PACK_NAME}/{name}.jpg", timeout=30)
        assert thumb.status_code == 200 and thumb.content == (WORKFLOWS / f"{name}.jpg").read_bytes(), name


def test_extra_files_are_kept_when_a_later_call_leaves_them_out(assets):
    # demo_base (every test session) calls write_demo_base without extras: the 0.8 GB Flux file
    # written for the edit workflow must stay valid in the stamp, not be rewritten next time.
    base = assets["base_dir"]
    files = [Path(base) / "models" / "diffusion_models" / assets[k]["unet"] for k in ("edit", "video")]
    before = [f.stat().st_mtime_ns for f in files]
    write_demo_base(base)
    again = write_demo_base(base, extras=("edit", "video"))
    assert [f.stat().st_mtime_ns for f in files] == before
    assert again["edit"] == assets["edit"] and again["video"] == assets["video"]


def test_each_workflow_opened_in_the_editor_queues_its_api_twin(comfy_server, assets):
    """What a user gets by opening a template: the real frontend loads the UI file and converts it to the
    prompt it would queue; that prompt must be the API twin the tests above run (same nodes, links and
    widget values), so a node input added or reordered since the export shows up here."""
    from tools.node_runtime import node_binary

    files = sorted(WORKFLOWS.glob("*.json"))
    out = subprocess.run([node_binary() or "node", str(REPO / "tests" / "ui" / "workflow_prompts.mjs"), comfy_server.url,
                          *map(str, files)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    opened = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(opened) == [f.stem for f in files]
    info = requests.get(f"{comfy_server.url}/object_info", timeout=60).json()
    for name, got in opened.items():
        assert got["unknown"] == [], (name, got["unknown"])
        api = json.loads((WORKFLOWS / "api" / f"{name}_api.json").read_text(encoding="utf-8"))
        assert {k: v["class_type"] for k, v in got["output"].items()} == {k: v["class_type"] for k, v in api.items()}
        for node_id, node in got["output"].items():
            twin, spec = api[node_id]["inputs"], info[node["class_type"]]["input"]
            for key, value in node["inputs"].items():
                # The editor also queues the inputs the twin leaves out: they must be at their defaults.
                expected = twin[key] if key in twin else _default(spec, key)
                assert value == expected, (name, node_id, node["class_type"], key, value, expected)
            assert set(twin) <= set(node["inputs"]), (name, node_id, set(twin) - set(node["inputs"]))


def _default(spec: dict, key: str):
    """An input's default as /object_info describes it (a combo without one defaults to its first choice)."""
    for section in ("required", "optional"):
        if key in spec.get(section, {}):
            kind, *options = spec[section][key]
            options = options[0] if options else {}
            if "default" in options:
                return options["default"]
            return kind[0] if isinstance(kind, list) else options.get("options", [None])[0]
    raise AssertionError(f"{key} is not an input of this node")
