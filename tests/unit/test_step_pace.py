"""The server log's ETA (nodes/step_pace.py) equals the node's status line ETA (web/chart.js etaSeconds)
on the same step events, including a first step that waited for loading and compiling."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from PipeTrain.nodes.step_pace import StepPace
from tools.node_runtime import node_binary

CHART = Path(__file__).resolve().parents[2] / "web" / "chart.js"
# (step, event time): step 1 after 40 s of loading + compiling, then about 1.5 s a step, 80 steps in all.
EVENTS = [(1, 1000.0)] + [(s, 1000.0 + 1.5 * (s - 1) + (0.2 if s % 7 == 0 else 0.0)) for s in range(2, 81)]
TOTAL = 200


def _python_etas() -> list:
    pace, out = StepPace(), []
    for step, t in EVENTS:
        pace.add(step, t)
        out.append(pace.eta_seconds(TOTAL))
    return out


def test_the_log_eta_follows_the_recent_pace_not_the_time_since_launch():
    etas = _python_etas()
    assert etas[0] is None  # one step: no pace yet (the old log said elapsed / 1 x 199)
    assert etas[1] == pytest.approx(1.5 * (TOTAL - 2))
    assert etas[-1] == pytest.approx(1.5 * (TOTAL - 80), rel=0.01)


def test_the_log_and_the_node_give_the_same_eta():
    node = node_binary()
    if not node:
        pytest.skip("node >= 20 is not installed (scripts/ui_deps.sh): the node's ETA runs in JavaScript")
    script = (f"import {{ etaSeconds }} from {json.dumps(CHART.as_uri())};\n"
              f"const events = {json.dumps(EVENTS)}; const out = [];\n"
              "for (let i = 0; i < events.length; i++) {\n"
              "  const steps = events.slice(0, i + 1).map(([s, t]) => [s, 1.0, 1e-4, t, null]);\n"
              f"  out.push(etaSeconds(steps, {TOTAL}));\n"
              "}\nconsole.log(JSON.stringify(out));\n")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    js = json.loads(done.stdout)
    assert js[0] is None
    assert [None if v is None else round(v, 6) for v in js] == \
        [None if v is None else round(v, 6) for v in _python_etas()]
