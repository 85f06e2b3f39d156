"""Packaging facts a user or the Comfy Registry relies on."""
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from PipeTrain.engine.version import __version__

REPO = Path(__file__).resolve().parents[2]


def test_versions_agree():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["version"] == __version__
    assert meta["project"]["license"] == {"file": "LICENSE"}
    # torch comes with ComfyUI: pinning it here would let pip replace the user's build.
    names = {re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower() for dep in meta["project"]["dependencies"]}
    assert not names & {"torch", "torchvision", "torchaudio"}, names
    assert {"PublisherId", "DisplayName", "Icon"} <= set(meta["tool"]["comfy"])
    assert "GNU GENERAL PUBLIC LICENSE" in (REPO / "LICENSE").read_text()[:200]


def test_pack_imports_outside_comfyui():
    """ComfyUI-free Python can import the package and sees the six nodes."""
    code = ("import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location('PipeTrainX', {str(REPO / '__init__.py')!r}, "
            f"submodule_search_locations=[{str(REPO)!r}]); m = importlib.util.module_from_spec(spec); "
            "sys.modules['PipeTrainX'] = m; spec.loader.exec_module(m); "
            "print(sorted(m.NODE_CLASS_MAPPINGS), m.WEB_DIRECTORY, 'comfy' in sys.modules, 'deepspeed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True).stdout
    assert "PipeTrainTrainPipeline" in out and "./web" in out
    assert out.strip().endswith("False False"), out  # neither ComfyUI nor DeepSpeed imported by registration


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "example_workflows").glob("*.json")))
def test_ui_workflow_matches_its_api_twin(name):
    ui = json.loads((REPO / "example_workflows" / f"{name}.json").read_text())
    api = json.loads((REPO / "example_workflows" / "api" / f"{name}_api.json").read_text())
    assert {str(n["id"]): n["type"] for n in ui["nodes"]} == {k: v["class_type"] for k, v in api.items()}
    api_links = {(src[0], dst, name) for dst, node in api.items() for name, src in node["inputs"].items()
                 if isinstance(src, list)}
    ui_links = set()
    for node in ui["nodes"]:
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                link = next(l for l in ui["links"] if l[0] == inp["link"])
                ui_links.add((str(link[1]), str(node["id"]), inp["name"]))
    assert ui_links == api_links
    assert (REPO / "example_workflows" / f"{name}.jpg").stat().st_size > 10_000
