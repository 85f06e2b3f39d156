"""The training view in a real browser: headless Chromium (playwright-core) against a real ComfyUI
server with the pack. Loads the example workflow, presses Run, sees the loss chart fill and a sample
appear (strip and node preview), reloads the page mid-run and sees the chart come back, sees the Stop & save
button offered while it trains, presses Cancel and sees training stop (and the button go), then sees SaveLoRA's returned text in its summary box. The workflow is
opened from ComfyUI's template browser. A workflow saved before Train Options existed is converted on load. Then each example workflow is opened fresh: no two nodes overlap,
before and after its nodes show results, its saved node sizes fit their widgets, no summary box cuts
its text, its multiline boxes are labelled, and its training view shows no other run; where the frontend has
Nodes 2.0 (ComfyUI 0.33's: nodes drawn as Vue components), each again drawn that way: no overlaps, no cut
summary, the training view inside its node. Screenshots: tests/artifacts/<time>/ (kept by CI as artifacts).
The same test runs on each supported ComfyUI (COMFYUI_PATH), so on each one's frontend."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from engine_runs import engine_processes
from tools.node_runtime import node_binary

pytestmark = [pytest.mark.slow, pytest.mark.core]
REPO = Path(__file__).resolve().parents[2]


def test_run_chart_samples_reload_and_cancel_in_the_browser(comfy_server, demo_base):
    node = node_binary()
    assert node, "node >= 20 is not installed: run scripts/ui_deps.sh"
    assert (REPO / "node_modules" / "playwright-core").is_dir(), "playwright-core missing: run scripts/ui_deps.sh"
    artifacts = REPO / "tests" / "artifacts" / time.strftime("%Y%m%d-%H%M%S")
    run_name = f"ui_browser_{int(time.time())}"
    thumbnails = sorted(list(Image.open(p).size) for p in (REPO / "example_workflows").glob("*.jpg"))
    out = subprocess.run([node, str(REPO / "tests" / "ui" / "browser_train.mjs"), comfy_server.url, str(artifacts),
                          run_name, str(len(thumbnails))],
                         capture_output=True, text=True, timeout=480, cwd=REPO)
    lines = out.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    assert out.returncode == 0 and summary.get("ok"), (
        f"browser test failed (screenshots in {artifacts}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}\n"
        f"{comfy_server.log_tail()}")

    assert sorted(summary["templates"]) == thumbnails, summary["templates"]  # all listed, with our thumbnails
    assert summary["training"]["points"] >= 6 and "training" in summary["statuses"]
    assert summary["samples"]["samplesLoaded"] >= 1 and summary["samples"]["preview"] >= 1
    assert summary["reloaded"]["points"] >= summary["samples"]["points"], "the chart did not survive the reload"
    assert summary["cancelSeconds"] < 20, summary
    assert f"set resume to {run_name} (or latest)" in summary["cancelled"]["line"], summary["cancelled"]
    finish = summary["training"]["finish"]  # Stop & save, beside the status line while the run trains
    assert finish["shown"] and finish["enabled"] and "Cancel stops everything" in finish["title"], finish
    assert not summary["cancelled"]["finish"]["shown"], summary["cancelled"]  # gone once the run is cancelled
    assert not summary["internalImportNotices"], summary["internalImportNotices"]  # see also test_ui_chart.py
    text = summary["summaryText"]  # SaveLoRA's returned text, shown in a read-only box, never saved
    assert text["value"] == text["boxText"] == text["expected"] and text["box"] == "TEXTAREA", text
    assert text["readOnly"] and text["inPage"] and text["inside"] and text["serialized"] == 0, text
    assert text["lineHeight"] <= text["boxHeight"] <= 4 * text["lineHeight"], text  # one line, not a big empty box
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / run_name
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "cancelled", events[-3:]
    assert not engine_processes(str(run_dir)), "a training process outlived Cancel"
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert summary["loadedStatus"] == "idle", summary["loadedStatus"]  # not an earlier run of node 8
    legacy = summary["legacy"]  # the old template's values, by name, on Train Pipeline and a new Train Options node
    assert legacy["viewFirst"] == "pipetrain_view" and legacy["strayInputs"] == [] and legacy["linked"], legacy
    assert {k: legacy["train"][k] for k in ("steps", "learning_rate", "batch_size", "num_gpus", "run_name", "resume")} \
        == {"steps": 60, "learning_rate": 0.001, "batch_size": 2, "num_gpus": 2, "run_name": "demo", "resume": "off"}
    assert legacy["train"]["sample_prompts"].startswith("a red circle") and len(legacy["saved"]) == len(legacy["train"])
    assert {k: legacy["options"][k] for k in ("sample_every", "sample_width", "sample_steps", "sample_seed",
                                              "sample_scheduler", "min_t", "max_t", "gpu_ids")} == {
        "sample_every": 20, "sample_width": 64, "sample_steps": 10, "sample_seed": 42, "sample_scheduler": "normal",
        "min_t": 0, "max_t": 1, "gpu_ids": ""}
    assert "sample_every" not in legacy["queued"] and legacy["queued"]["steps"] == 60, legacy["queued"]
    again = legacy["again"]  # saved with the view first on the node and loaded again: the same values
    assert (again["train"], again["options"], again["linked"]) == (legacy["train"], legacy["options"], True), again
    layouts = summary["layouts"]
    assert sorted(layouts) == sorted(p.stem for p in (REPO / "example_workflows").glob("*.json"))
    for name, lay in layouts.items():
        assert lay["loaded"]["overlaps"] == [] and lay["after"]["overlaps"] == [], (name, lay)
        assert lay["tooSmall"] == [] and lay["after"]["cut"] == [], (name, lay)
        assert lay["loaded"]["status"] == "idle", (name, lay["loaded"])
        assert {"folders", "sample_prompts"} <= set(lay["boxLabels"]), (name, lay["boxLabels"])
        for part in ("left", "right"):
            assert (artifacts / f"07_layout_{name}_{part}.png").stat().st_size > 10_000, (name, part)
    nodes2 = summary["nodes2"]  # Nodes 2.0 (Vue nodes), where the frontend has it (ComfyUI 0.33's); else None
    if nodes2 is not None:
        assert sorted(nodes2) == sorted(layouts)
        for name, lay in nodes2.items():
            assert lay["loaded"]["overlaps"] == [] and lay["after"]["overlaps"] == [], (name, lay)
            assert lay["after"]["cut"] == [] and lay["loaded"]["status"] == "idle", (name, lay)
            shown = lay["loaded"]["view"]  # the training view inside its node's box: status line and chart
            assert shown["node"] and shown["inside"] and shown["chartHeight"] > 50, (name, shown)
            assert shown["line"] == "not started", (name, shown)
            for part in ("left", "right"):
                assert (artifacts / f"09_nodes2_{name}_{part}.png").stat().st_size > 10_000, (name, part)
    failed = summary["failedView"]  # a failed run: its error and the log's last lines on the node
    assert failed["status"] == "failed" and failed["shown"], failed
    assert "CUDA out of memory (a test message)" in failed["error"] and "Traceback" in failed["error"], failed
    assert failed["queued"] == "queued" and failed["afterPrompt"] == "failed", failed  # reset, then shown again
    for name in ("08_failed.png", "02_chart.png", "03_samples.png", "04_after_reload.png", "05_cancelled.png", "06_summary.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
