"""Lay the example workflows out so no two nodes overlap in any renderer of the supported ComfyUIs' frontends:
the classic canvas and "Nodes 2.0" (nodes drawn as Vue components, taller and sometimes wider than the canvas
draws them; ComfyUI 0.33's frontend offers it, 0.3.75's has an earlier version).

    .venv/bin/python -m tools.relayout_templates --measure /tmp/075.json
    COMFYUI_PATH=.comfyui/ComfyUI-0.33.0 .venv-0.33/bin/python -m tools.relayout_templates --measure /tmp/033.json
    .venv/bin/python -m tools.relayout_templates --apply /tmp/075.json /tmp/033.json
    .venv/bin/python -m tools.relayout_templates --thumbnails

--measure starts that ComfyUI over the demo's tiny files and measures every node in each renderer its
frontend has, loaded and once it shows a result (tools/measure_templates.mjs). --apply rewrites
example_workflows/*.json: each node's saved size becomes the largest measured (a renderer that needs less
draws it with room to spare), columns (nodes that share an x) keep their order, each node at least GAP_Y
below the one above it, and a column moves right where the one before it grew into it. Nothing else in the
files changes. tests/ui/test_ui_browser.py checks the result in every renderer. --thumbnails then takes each
template's thumbnail (example_workflows/<name>.jpg) from the laid-out file in the real frontend
(tools/template_thumbnails.mjs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TITLE = 30  # LiteGraph.NODE_TITLE_HEIGHT: drawn above node.pos
GAP_Y = TITLE + 30  # from one node's bottom to the next one's position (its title sits in between), as
# tools/ui_workflow.mjs spaces them: room for a loader that grows a line when its file is missing
GAP_X = 50


def relayout(workflow: dict, measured: list[list[dict]]) -> dict:
    """The workflow with sizes and positions for every renderer's measured node sizes (module doc)."""
    sizes = {}  # by id as text (Nodes 2.0 gives node ids as strings)
    for by_id in measured:
        for node_id, (width, height) in by_id.items():
            w, h = sizes.get(str(node_id), (0, 0))
            sizes[str(node_id)] = (max(w, round(width)), max(h, round(height)))
    nodes = workflow["nodes"]
    for node in nodes:
        w, h = sizes.get(str(node["id"]), (0, 0))
        node["size"] = [max(node["size"][0], w), max(node["size"][1], h)]
    columns: dict[float, list[dict]] = {}
    for node in nodes:
        columns.setdefault(node["pos"][0], []).append(node)
    shift, right = 0, None
    for x in sorted(columns):
        column = sorted(columns[x], key=lambda n: n["pos"][1])
        new_x = x + shift
        if right is not None and new_x < right + GAP_X:
            shift += round(right + GAP_X - new_x)
            new_x = x + shift
        bottom = None
        for node in column:
            y = node["pos"][1] if bottom is None else max(node["pos"][1], bottom + GAP_Y)
            node["pos"] = [new_x, y]
            bottom = y + node["size"][1]
        right = max(n["pos"][0] + n["size"][0] for n in column)
    return workflow


def _run_tool(script: str, *args: str, with_image: bool = False) -> str:
    """Run tools/<script> against the ComfyUI at COMFYUI_PATH, started over the demo's tiny files (every
    workflow's, so no combo shows a missing value) with: its URL, [an image of the dataset and its folder,]
    args. Returns its stdout."""
    sys.path.insert(0, str(REPO))
    from tools.comfy_server import ComfyServer
    from tools.demo import comfy_root
    from tools.node_runtime import node_binary
    from tools.tiny_assets import write_demo_base

    with tempfile.TemporaryDirectory(prefix="pipetrain-layout-") as base:
        assets = write_demo_base(base, extras=("edit", "video", "experts"))
        with ComfyServer(str(comfy_root()), base, env={"OMP_NUM_THREADS": "1"}) as server:
            dataset = Path(assets["dataset"])
            image = [sorted(dataset.glob("*.png"))[0].name, dataset.name] if with_image else []
            return subprocess.run([node_binary() or "node", str(REPO / "tools" / script), server.url, *image, *args],
                                  check=True, cwd=REPO, env=dict(os.environ), capture_output=True, text=True).stdout


def _templates() -> list[Path]:
    return sorted((REPO / "example_workflows").glob("*.json"))


def measure(out: Path) -> None:
    """Measure the templates with the ComfyUI at COMFYUI_PATH (its frontend's renderers) into `out` (JSON); the
    image nodes show a dataset image while measured."""
    files = _templates()
    done = _run_tool("measure_templates.mjs", *map(str, files), with_image=True)
    out.write_text(done.strip().splitlines()[-1] + "\n", encoding="utf-8")
    print(f"measured {len(files)} workflow(s) -> {out}")


def thumbnails() -> None:
    """Each template's thumbnail from its saved layout (tools/template_thumbnails.mjs)."""
    print(_run_tool("template_thumbnails.mjs", *map(str, _templates())).strip())


def apply(measurements: list[Path]) -> None:
    """Lay every template out for all the measured renderers (several files: several ComfyUIs' frontends)."""
    measured: dict[str, list] = {}
    for path in measurements:
        for key, sizes in json.loads(path.read_text(encoding="utf-8")).items():
            measured.setdefault(key.split(":", 1)[1], []).append(sizes)
    for path in _templates():
        workflow = relayout(json.loads(path.read_text(encoding="utf-8")), measured.get(path.name, []))
        path.write_text(json.dumps(workflow, indent=2) + "\n", encoding="utf-8")
        print(f"laid out {path.name} for {len(measured.get(path.name, []))} measured renderer(s)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--measure":
        measure(Path(args[1]))
    elif len(args) >= 2 and args[0] == "--apply":
        apply([Path(a) for a in args[1:]])
    elif args == ["--thumbnails"]:
        thumbnails()
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
