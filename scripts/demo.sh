#!/usr/bin/env bash
# The main job: train a LoRA on a tiny generated model + dataset through a real ComfyUI server
# (2 DeepSpeed processes; CPU when there is no GPU), then sample with and without it.
#
#   bash scripts/demo.sh                                  ComfyUI 0.3.75 in .venv/ (the bootstrap's defaults)
#   PIPETRAIN_VENV=.venv-0.33 COMFYUI_PATH=DIR bash scripts/demo.sh    another ComfyUI, in its own venv
#
# PIPETRAIN_VENV (relative to the repository root, or absolute) is the venv the bootstrap prepares
# for that ComfyUI and the one the demo runs in; without it both use .venv/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMFY="$(bash "$ROOT/scripts/bootstrap.sh")"
VENV="${PIPETRAIN_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
cd "$ROOT"
export COMFYUI_PATH="$COMFY"
exec "$VENV/bin/python" -m tools.demo "$@"
