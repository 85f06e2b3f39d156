#!/usr/bin/env bash
# Run PipeTrain's test suite: installs what it needs (scripts/bootstrap.sh), then pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k cache`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMFY="$(bash "$ROOT/scripts/bootstrap.sh")"
cd "$ROOT"
export COMFYUI_PATH="$COMFY"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
