"""ComfyUI's own custom-node loader imports the pack: the server gets the engine's config, data,
cache-writing and launch modules, never a rank-only package (train, memory, patches, models) and
never DeepSpeed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "engine"


RANK_ONLY_PACKAGES = ("train", "memory", "patches", "models")


@pytest.mark.core
def test_the_comfyui_server_loads_only_what_it_needs(comfy_root):
    """ComfyUI's own custom-node loader imports the pack: no rank-only engine package, no DeepSpeed."""
    code = (
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from engine.launch.comfy_bootstrap import import_comfy\n"
        f"import_comfy({comfy_root!r}, force_cpu=True)\n"
        "for name in [m for m in sys.modules if m == 'engine' or m.startswith('engine.')]:\n"
        "    del sys.modules[name]  # the bootstrap's own import: only the pack's modules count below\n"
        "import nodes\n"
        f"assert asyncio.run(nodes.load_custom_node({str(REPO)!r}))\n"
        "files = sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})\n"
        f"print('\\n'.join(f for f in files if f.startswith({str(ENGINE)!r})))\n"
        "print('deepspeed' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    loaded = {Path(f).relative_to(ENGINE).parts[0] for f in lines[:-1]}
    assert {"config", "data", "cache", "launch", "events.py"} <= loaded, loaded
    assert not loaded & set(RANK_ONLY_PACKAGES), sorted(loaded & set(RANK_ONLY_PACKAGES))
    assert lines[-1] == "False"  # DeepSpeed is imported by the ranks only
