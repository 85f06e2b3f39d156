"""Regenerate example_workflows/<name>.json (UI format) and <name>.jpg from the API-format twins in api/.

    .venv/bin/python -m tools.export_workflows [NAME ...]   (COMFYUI_PATH or .comfyui/ComfyUI; no NAME: all)

Then lay them out (tools/relayout_templates.py), which also retakes the thumbnails.

Starts ComfyUI headless over a scratch folder holding the demo's tiny files (every workflow's), and lets the real
frontend in headless Chromium convert each `api/<name>_api.json` (tools/ui_workflow.mjs). The API twins
live in api/ because ComfyUI's template browser lists every .json directly in example_workflows/.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(names: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from tools.comfy_server import ComfyServer
    from tools.demo import comfy_root
    from tools.node_runtime import node_binary
    from tools.tiny_assets import write_demo_base

    with tempfile.TemporaryDirectory(prefix="pipetrain-export-") as base:
        write_demo_base(base, extras=("edit", "video", "experts"))  # every workflow's files, so no combo shows a missing value
        with ComfyServer(str(comfy_root()), base, env={"OMP_NUM_THREADS": "1"}) as server:
            for api in sorted((REPO / "example_workflows" / "api").glob("*_api.json")):
                name = api.name[: -len("_api.json")]
                if names and name not in names:
                    continue
                out = REPO / "example_workflows"
                subprocess.run([node_binary() or "node", str(REPO / "tools" / "ui_workflow.mjs"), server.url, str(api),
                                str(out / f"{name}.json"), str(out / f"{name}.jpg")], check=True, cwd=REPO,
                               env=dict(os.environ))
                print(f"wrote {out / name}.json and .jpg")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
