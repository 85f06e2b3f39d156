#!/usr/bin/env bash
# The second ComfyUI that CI tests: .venv-0.33/ with ComfyUI 0.33.0's requirements and a writable
# copy of ../shared/comfyui-0.33.0 in .comfyui/ComfyUI-0.33.0/. Prints that folder (COMFYUI_PATH).
#   COMFYUI_PATH="$(bash scripts/bootstrap_033.sh)" .venv-0.33/bin/python -m pytest -m core
exec bash "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh" --comfyui 0.33.0 "$@"
