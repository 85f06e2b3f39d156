"""The web extension's pure drawing/smoothing module (web/chart.js), unit-tested under node."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tools.node_runtime import node_binary

REPO = Path(__file__).resolve().parent.parent


def test_chart_module_unit_tests_pass_under_node():
    node = node_binary()
    assert node, "node >= 20 is not installed: run scripts/ui_deps.sh"
    out = subprocess.run([node, "--test", str(REPO / "tests" / "ui" / "chart.test.mjs")], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "# fail 0" in out.stdout and "# pass 11" in out.stdout, out.stdout[-2000:]
