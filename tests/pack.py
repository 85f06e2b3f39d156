"""Import the repository as the package ComfyUI would make of it (custom_nodes/PipeTrain).

The node modules use package-relative imports (`from ..engine import ...`), exactly as they run
inside ComfyUI, so tests import them as `PipeTrain.nodes.*` (and engine code as
`PipeTrain.engine.*`, so exception classes are the same objects on both sides).
"""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "PipeTrain"


def load_pack():
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACKAGE, REPO / "__init__.py",
                                                      submodule_search_locations=[str(REPO)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        spec.loader.exec_module(module)
    return sys.modules[PACKAGE]
