"""The web extension: its pure drawing/smoothing module (web/chart.js), unit-tested under node, and
its imports, which stay on the frontend's public extension API (scripts/app.js and scripts/api.js)."""
from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from tools.node_runtime import node_binary

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "web"
# ComfyUI serves WEB_DIRECTORY at /extensions/<pack folder>/ and its frontend's modules at /scripts/.
SERVED_AT = "/extensions/PipeTrain/"
PUBLIC_MODULES = {"/scripts/app.js", "/scripts/api.js"}
# `import x from "m"`, `import "m"`, `export {x} from "m"`, `import("m")` (comments stripped first).
IMPORT_RE = re.compile(r"""\b(?:import|export)\b[^;"'`()]*?\bfrom\s*(["'`])(.+?)\1"""
                       r"""|\bimport\s*(["'`])(.+?)\3|\bimport\s*\(\s*(["'`])(.+?)\5""", re.S)
COMMENT_RE = re.compile(r"/\*.*?\*/|(?<![:\"'])//[^\n]*", re.S)


def module_specifiers(source: str) -> list[str]:
    text = COMMENT_RE.sub("", source)
    return [m.group(2) or m.group(4) or m.group(6) for m in IMPORT_RE.finditer(text)]


def frontend_imports_outside_public_api(source: str, web_path: str) -> list[str]:
    """What the file web/<web_path> loads that is neither its own pack's file nor scripts/app.js or
    scripts/api.js."""
    served = SERVED_AT + web_path
    bad = []
    for spec in module_specifiers(source):
        if not spec.startswith((".", "/")):
            bad.append(spec)  # a bare name or a URL: nothing the frontend documents for extensions
            continue
        target = posixpath.normpath(posixpath.join(posixpath.dirname(served), spec))
        if not (target.startswith(SERVED_AT) or target in PUBLIC_MODULES):
            bad.append(spec)
    if "comfyAPI" in source:
        bad.append("window.comfyAPI (the internal object behind the frontend's module shims)")
    return bad


def test_chart_module_unit_tests_pass_under_node():
    node = node_binary()
    assert node, "node >= 20 is not installed: run scripts/ui_deps.sh"
    out = subprocess.run([node, "--test", str(REPO / "tests" / "ui" / "chart.test.mjs")], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    declared = out.stdout.count("\n# Subtest: ")  # every test in the file ran and passed
    assert declared >= 19 and "# fail 0" in out.stdout and f"# pass {declared}" in out.stdout, out.stdout[-2000:]


def test_web_extension_imports_only_the_public_frontend_modules():
    files = sorted(WEB.rglob("*.js"))
    assert files, "no web/*.js found"
    bad = {}
    for f in files:
        found = frontend_imports_outside_public_api(f.read_text(encoding="utf-8"), f.relative_to(WEB).as_posix())
        if found:
            bad[str(f.relative_to(REPO))] = found
    assert not bad, (f"web/ may import only scripts/app.js and scripts/api.js from the frontend (its public "
                     f"extension API; every other scripts/*.js is internal and may change or vanish): {bad}")
    own = module_specifiers((WEB / "pipetrain.js").read_text(encoding="utf-8"))
    assert "../../scripts/app.js" in own and "./chart.js" in own, own  # the scan sees real imports


def test_the_import_scan_catches_internal_modules():
    # The scan itself: each way of loading an internal module is caught; the allowed forms pass.
    samples = {
        'import { ComfyWidgets } from "../../scripts/widgets.js";': True,
        "import '../../scripts/domWidget.js';": True,
        'const m = await import("../../scripts/utils.js");': True,
        'export { x } from "../../scripts/ui.js";': True,
        'import { y } from "../other_pack/thing.js";': True,
        'import { z } from "lodash";': True,
        "const w = window.comfyAPI.widgets;": True,
        'import { app } from "../../scripts/app.js";\nimport { api } from "../../scripts/api.js";': False,
        'import { f } from "./chart.js"; // not "../../scripts/widgets.js"': False,
    }
    for source, flagged in samples.items():
        assert bool(frontend_imports_outside_public_api(source, "pipetrain.js")) == flagged, source
    # From a subfolder, ../../scripts/app.js is no longer the frontend's app.js.
    assert frontend_imports_outside_public_api('import { app } from "../../scripts/app.js";', "sub/view.js")
