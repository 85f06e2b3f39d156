#!/usr/bin/env bash
# The main job: train a LoRA on a tiny generated model + dataset through a real ComfyUI server
# (2 DeepSpeed processes; CPU when there is no GPU), then sample with and without it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMFY="$(bash "$ROOT/scripts/bootstrap.sh")"
cd "$ROOT"
export COMFYUI_PATH="$COMFY"
exec "$ROOT/.venv/bin/python" -m tools.demo "$@"
