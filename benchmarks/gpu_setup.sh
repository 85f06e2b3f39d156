#!/usr/bin/env bash
# Set up a GPU machine with no network for the benchmarks, from the payload benchmarks/gpu_pack.sh
# builds (carried as the ignored folders .whl and .device). From the repository root:
#
#   . benchmarks/gpu_setup.sh || exit 1                          # bash, sourced: sets them in this shell
#   s=$(bash benchmarks/gpu_setup.sh) && eval "$s" || exit 1     # any shell: it prints the export lines
#   (not `eval "$(bash benchmarks/gpu_setup.sh)"` alone: eval of an empty string hides a failure)
#
# then e.g.  COMFYUI_PATH=$COMFY_033 python3 benchmarks/families_gpu.py --work /tmp/fam ...
#
# - installs .whl/*.whl into $GPU_SITE (default /tmp/site) with --no-deps: never torch, torchvision,
#   numpy or triton (the machine's own stay in use; anything of theirs found there is removed);
# - puts comfy-kitchen's CUDA extension back into it where .device carries it (else comfy-kitchen
#   runs its Triton/eager backends: said on stderr);
# - unpacks .device/comfy.tar.xz to $GPU_COMFY_ROOT (default /tmp): comfy-0.3.75/, comfy-0.33.0/;
# - exports PYTHONPATH=$GPU_SITE:..., COMFY_075, COMFY_033, and keeps NVLink multicast off
#   (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1).
# A second run on a warm machine reuses what the first one unpacked.

_gpu_setup() {
    local site=${GPU_SITE:-/tmp/site} root=${GPU_COMFY_ROOT:-/tmp} py=${PYTHON:-python3}
    [ -d .whl ] && [ -f .device/comfy.tar.xz ] || {
        echo "gpu_setup: run from the repository root, with .whl and .device carried" >&2; return 1; }
    if [ ! -f "$site/.gpu_setup_done" ]; then
        rm -rf "$site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            .whl/*.whl >&2 || { echo "gpu_setup: pip install into $site failed" >&2; return 1; }
        local p
        for p in torch torchvision torchaudio numpy triton nvidia; do  # never shadow the machine's own
            if compgen -G "$site/$p" >/dev/null || compgen -G "$site/$p-*.dist-info" >/dev/null; then
                echo "gpu_setup: removing $p from $site (the machine's own is used)" >&2
                rm -rf "$site/$p" "$site"/"$p"-*.dist-info
            fi
        done
        if [ -f .device/comfy_kitchen_cuda_C.abi3.so.xz ] && [ -d "$site/comfy_kitchen/backends/cuda" ]; then
            "$py" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 22)' .device/comfy_kitchen_cuda_C.abi3.so.xz \
                "$site/comfy_kitchen/backends/cuda/_C.abi3.so" || return 1
            chmod 755 "$site/comfy_kitchen/backends/cuda/_C.abi3.so"
        else
            echo "gpu_setup: no comfy-kitchen CUDA extension carried: its Triton/eager backends run" >&2
        fi
        touch "$site/.gpu_setup_done"
    fi
    if [ ! -f "$root/comfy-0.33.0/.gpu_setup_done" ] || [ ! -f "$root/comfy-0.3.75/.gpu_setup_done" ]; then
        rm -rf "$root/comfy-0.3.75" "$root/comfy-0.33.0"
        "$py" -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="data")' .device/comfy.tar.xz "$root" || return 1
        touch "$root/comfy-0.3.75/.gpu_setup_done" "$root/comfy-0.33.0/.gpu_setup_done"
    fi
    local pp=$site
    case ":${PYTHONPATH:-}:" in *":$site:"*) pp=$PYTHONPATH ;; *) pp=$site${PYTHONPATH:+:$PYTHONPATH} ;; esac
    _GPU_EXPORTS="export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$pp
export COMFY_075=$root/comfy-0.3.75 COMFY_033=$root/comfy-0.33.0
export PYTHONUNBUFFERED=1"
    # what will be imported from where (stderr): torch must be the machine's, the rest from $site
    (eval "$_GPU_EXPORTS"; _GPU_SITE=$site "$py" - >&2 <<'EOF'
import importlib, os, sys
site = os.environ["_GPU_SITE"]
import torch
print(f"gpu_setup: python {sys.version.split()[0]}, torch {torch.__version__} from {os.path.dirname(torch.__file__)}, "
      f"cuda {torch.cuda.is_available()}")
if torch.__file__.startswith(site):
    sys.exit("gpu_setup: torch comes from " + site)
for name in ("deepspeed", "pydantic", "hjson", "datasets", "torchsde", "comfy_aimdo", "comfy_kitchen"):
    try:
        m = importlib.import_module(name)
        path = getattr(m, "__file__", None) or next(iter(m.__path__))  # comfy_aimdo: a namespace package
        where = "payload" if path.startswith(site) else os.path.dirname(path)
        print(f"gpu_setup: {name} {getattr(m, '__version__', '')} ({where})")
    except Exception as e:
        print(f"gpu_setup: {name} does not import: {e!r}")
try:
    from comfy_kitchen.backends import cuda as ck_cuda
    print(f"gpu_setup: comfy-kitchen CUDA extension loaded: {ck_cuda._EXT_AVAILABLE} {ck_cuda._EXT_ERROR or ''}")
except Exception as e:
    print(f"gpu_setup: comfy-kitchen CUDA backend: {e!r}")
EOF
    ) || return 1
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then  # sourced
    _gpu_setup && eval "$_GPU_EXPORTS"
else
    set -o pipefail
    _gpu_setup && echo "$_GPU_EXPORTS"
fi
