#!/usr/bin/env bash
# Build the payload that benchmarks/gpu_setup.sh unpacks on a GPU machine that has no network
# (python3 3.12 with torch, but no ComfyUI, DeepSpeed, pydantic, datasets, comfy-kitchen ...).
#
#   bash benchmarks/gpu_pack.sh [COMFYUI_0_3_75_DIR] [COMFYUI_0_33_0_DIR]
#     (defaults: .comfyui/ComfyUI and ../shared/comfyui-0.33.0, relative to the repository root)
#
# Writes, in the repository's ignored folders (keep /.whl/ and /.device/ in .git/info/exclude):
#   .device/comfy.tar.xz   both ComfyUI trees as comfy-0.3.75/ and comfy-0.33.0/, stripped of what a
#                          headless benchmark never reads (tests, docs, frontend blueprints, API nodes,
#                          the large tokenizer files of comfy/text_encoders, read only when a text
#                          encoder is built)
#   .whl/*.whl             cp312 manylinux x86_64 / pure wheels of the packages that machine lacks;
#                          comfy-kitchen without its compiled backends (its wheel is 58 MB)
#   .device/comfy_kitchen_cuda_C.abi3.so.xz   comfy-kitchen's CUDA extension (optional: without it
#                          comfy-kitchen runs its Triton/eager backends), unless NO_KITCHEN_CUDA=1
# Needs: network to PyPI, xz, and a Python with pip, wheel, setuptools and torch ($PYTHON, default
# .venv/bin/python) to build the DeepSpeed wheel (sdist only on PyPI; the wheel is pure Python).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:-.comfyui/ComfyUI}
NEW=${2:-../shared/comfyui-0.33.0}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p .whl .device
for d in "$OLD" "$NEW"; do [ -f "$d/comfy/sd.py" ] || { echo "not a ComfyUI folder: $d" >&2; exit 1; }; done

# ---- ComfyUI trees --------------------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
strip_tree() {  # $1 source, $2 destination name
    local dst="$stage/$2"
    mkdir -p "$dst"
    tar -C "$1" --exclude=__pycache__ --exclude='*.pyc' --exclude=.git -cf - . | tar -C "$dst" -xf -
    (cd "$dst" && rm -rf tests tests-unit script_examples blueprints comfy_api_nodes .ci .github \
        .coderabbit.yaml .spectral.yaml .gitattributes .gitignore openapi.yaml CODEOWNERS pytest.ini \
        ./*.md comfy/comfy_types/examples extra_model_paths.yaml)
    # tokenizer data of the text encoders: read when a text encoder is built, never by the benchmarks
    find "$dst/comfy/text_encoders" -type f \( -name 'vocab.json' -o -name 'merges.txt' -o -name 'tokenizer.json' \
        -o -name 'tokenizer.model' -o -name 'vocab.txt' -o -name 'spiece.model' \) -delete
}
strip_tree "$OLD" comfy-0.3.75
strip_tree "$NEW" comfy-0.33.0
grep -q '"0.3.75"' "$stage/comfy-0.3.75/comfyui_version.py" || echo "warning: $OLD is not ComfyUI 0.3.75" >&2
grep -q '"0.33.0"' "$stage/comfy-0.33.0/comfyui_version.py" || echo "warning: $NEW is not ComfyUI 0.33.0" >&2
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - comfy-0.3.75 comfy-0.33.0 \
    | xz -9e -T1 > .device/comfy.tar.xz

# ---- wheels ---------------------------------------------------------------------------------
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# DeepSpeed and what it imports (hjson, pydantic; py-cpuinfo, msgpack, ninja are there); datasets (format 2
# caches) and its dill/multiprocess (pyarrow, pandas, xxhash are there); torchsde + trampoline
# (comfy.k_diffusion.sampling); comfy-aimdo and comfy-kitchen (ComfyUI 0.33 imports both unconditionally)
WHEELS=(hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        typing-extensions==4.16.0 torchsde==0.2.6 trampoline==0.1.2 comfy-aimdo==0.4.13 datasets==5.2.0
        dill==0.4.1 multiprocess==0.70.19)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
[ -f .whl/deepspeed-0.18.4-py3-none-any.whl ] || \
    "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.18.4 -w .whl
have_ck=$(ls .whl/comfy_kitchen-0.2.31-*.whl 2>/dev/null || true)
if [ -z "$have_ck" ] || { [ "${NO_KITCHEN_CUDA:-0}" != 1 ] && [ ! -f .device/comfy_kitchen_cuda_C.abi3.so.xz ]; }; then
    ck=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$ck" comfy-kitchen==0.2.31
    "$PYTHON" -m wheel unpack -d "$ck/u" "$ck"/comfy_kitchen-*.whl >/dev/null
    pkg=$(echo "$ck"/u/comfy_kitchen-*)
    if [ "${NO_KITCHEN_CUDA:-0}" != 1 ]; then
        xz -9e -T1 -c "$pkg/comfy_kitchen/backends/cuda/_C.abi3.so" > .device/comfy_kitchen_cuda_C.abi3.so.xz
    fi
    rm -f "$pkg"/comfy_kitchen/backends/{cuda,hip}/_C.abi3.so
    rm -f .whl/comfy_kitchen-*.whl
    "$PYTHON" -m wheel pack -d .whl "$pkg" >/dev/null
    rm -rf "$ck"
fi
ls -l .whl .device
du -ch .whl .device | tail -1
