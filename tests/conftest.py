"""Shared fixtures: where ComfyUI is, a demo base directory with tiny models, a running server.

Tests import the repository's packages (`engine.*`, `tools.*`, or the pack as `PipeTrain.*`) and
the helpers `comfy_server` and `pack` (this folder; pytest puts it on sys.path because tests/ has
no __init__.py).
"""
from __future__ import annotations

import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The repository root is the pack; a bare `pytest` (unlike `python -m pytest`) would not see it.
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from tools.comfy_server import ComfyServer  # noqa: E402
from pack import load_pack  # noqa: E402

# Register the repository as package `PipeTrain`, the way ComfyUI imports it, so test modules can
# `import PipeTrain.nodes.*` at the top (tests/pack.py). A broken node module must not take the
# tests that do not import it down with it: they still run, and those that do fail on import.
try:
    load_pack()
except Exception as exc:  # noqa: BLE001
    import warnings

    warnings.warn(f"the PipeTrain package did not import: {exc!r}")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (real ComfyUI server, training runs)")
    config.addinivalue_line("markers", "core: the core suite, also run on the second ComfyUI (scripts/test.sh: "
                            "ComfyUI 0.33.0 with `-m core`)")


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    """A report as pytest-xdist's workers send it (scripts/test.sh), with every string UTF-8 encodable. A test
    of file names that are not UTF-8 captures them as surrogate escapes (os.fsdecode), and the workers' channel
    refuses such a string: the whole run would stop. They are shown as backslash escapes instead."""
    return _utf8_safe((yield))


def _utf8_safe(value):
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_utf8_safe(v) for v in value)
    return value


@pytest.fixture(scope="session")
def comfy_root() -> str:
    """The ComfyUI source tree: $COMFYUI_PATH, else <repo>/.comfyui/ComfyUI (scripts/bootstrap.sh)."""
    root = os.path.abspath(os.environ.get("COMFYUI_PATH") or os.path.join(REPO_ROOT, ".comfyui", "ComfyUI"))
    if not os.path.isfile(os.path.join(root, "main.py")):
        pytest.fail(f"No ComfyUI at {root}. Run scripts/bootstrap.sh (or set COMFYUI_PATH to a ComfyUI "
                    "folder); these tests need a real ComfyUI and are never skipped.", pytrace=False)
    return root


@pytest.fixture(scope="session")
def comfy(comfy_root):
    """ComfyUI importable as `comfy` (engine.launch.comfy_bootstrap.import_comfy); a test file may define its own."""
    from engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.fixture(scope="session")
def demo_base(comfy_root, tmp_path_factory) -> dict:
    """A ComfyUI base dir with the tiny UNet/VAE/CLIP and the 8-image demo dataset.

    The dict of tools.tiny_assets.write_demo_base: file names ("unet", "vae", "clip"), absolute
    "dataset" folder and "base_dir".
    """
    from engine.launch.comfy_bootstrap import import_comfy
    from tools.tiny_assets import write_demo_base

    import_comfy(comfy_root)  # before tiny_assets needs comfy.*: the fixture's root is the one used
    return write_demo_base(str(tmp_path_factory.mktemp("comfy-base")))


@pytest.fixture(scope="session")
def comfy_server(comfy_root, demo_base):
    """A real ComfyUI server (CPU) over demo_base with this repository linked in as custom node."""
    # One OpenMP thread unless the caller chose: on a busy 2-core machine two threads stalled on
    # each other behind other processes and one 4-step 64x64 sample took 7 s instead of 0.2 s.
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    server = ComfyServer(comfy_root, demo_base["base_dir"], env={"OMP_NUM_THREADS": threads})
    server.start()
    yield server
    server.stop()
