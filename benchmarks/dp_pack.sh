#!/usr/bin/env bash
# Build what benchmarks/diffusion_pipe_side.py needs on a GPU machine with no network, beside the
# payload of benchmarks/gpu_pack.sh (carry .whl and .device):
#
#   bash benchmarks/dp_pack.sh DIFFUSION_PIPE_GIT_DIR HUNYUANVIDEO_GIT_DIR [COMMIT]
#     (COMMIT: diffusion-pipe's, default 8f83dbf2; HunyuanVideo at the commit diffusion-pipe pins)
#
# Writes (ignored folders):
#   .device/diffusion-pipe.tar.xz  diffusion-pipe at COMMIT as diffusion-pipe/, with its
#                                  submodules/HunyuanVideo filled in; submodules/ComfyUI is left empty:
#                                  diffusion_pipe_side.py --comfy links a ComfyUI tree there
#   .device/dp-wheels/*.whl        the packages diffusion-pipe imports that the GPU image and the
#                                  PipeTrain payload lack (diffusers and its importlib_metadata, toml)
# On the GPU machine, after benchmarks/gpu_setup.sh:
#   tar -C /tmp -xJf .device/diffusion-pipe.tar.xz
#   python3 -m pip install -q --no-index --no-deps --target /tmp/dp-site .device/dp-wheels/*.whl
#   PYTHONPATH=/tmp/dp-site:$PYTHONPATH python3 benchmarks/diffusion_pipe_side.py --dp /tmp/diffusion-pipe --comfy $COMFY_075 ...
set -euo pipefail
cd "$(dirname "$0")/.."
DP=${1:?diffusion-pipe git directory}
HV=${2:?HunyuanVideo git directory}
COMMIT=${3:-8f83dbf2}
mkdir -p .device/dp-wheels
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/diffusion-pipe"
# every file whose content the git directory holds (a partial mirror may lack large tokenizer files of
# other models: never read by the Flux and Wan runs)
git --git-dir="$DP" ls-tree -r "$COMMIT" | while read -r _ kind hash path; do
    [ "$kind" = blob ] && git --git-dir="$DP" cat-file -e "$hash" 2>/dev/null && printf '%s\n' "$path"
done > "$stage/files"
git --git-dir="$DP" archive "$COMMIT" -- $(cat "$stage/files") | tar -C "$stage/diffusion-pipe" -xf -
# the HunyuanVideo commit diffusion-pipe pins (its text-encoder and constant modules are imported)
hv_commit=$(git --git-dir="$DP" ls-tree "$COMMIT" submodules/HunyuanVideo | awk '{print $3}')
mkdir -p "$stage/diffusion-pipe/submodules/HunyuanVideo"
git --git-dir="$HV" archive "$hv_commit" hyvideo | tar -C "$stage/diffusion-pipe/submodules/HunyuanVideo" -xf -
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - diffusion-pipe \
    | xz -6 -T1 > .device/diffusion-pipe.tar.xz
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .device/dp-wheels diffusers==0.42.1 importlib_metadata==10.2.0 toml==0.10.2
echo "diffusion-pipe $COMMIT with HunyuanVideo $hv_commit"
ls -l .device/diffusion-pipe.tar.xz .device/dp-wheels
