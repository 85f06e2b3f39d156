#!/usr/bin/env bash
# Run PipeTrain's tests on the two ComfyUI versions CI supports (scripts/bootstrap.sh installs both):
#   main suite           ComfyUI 0.3.75  .venv/       .comfyui/ComfyUI/
#   core suite, -m core  ComfyUI 0.33.0  .venv-0.33/  .comfyui/ComfyUI-0.33.0/ (a copy of ../shared/comfyui-0.33.0)
# Extra arguments go to both pytest runs, e.g. `bash scripts/test.sh -k cache` (the second keeps its -m core).
# The 0.33 venv is built while the main suite runs; the core suite follows it. PIPETRAIN_TEST_PARALLEL=1
# runs the core suite beside the main one instead (its output still comes after the main suite's):
# faster, but then the two suites compete for the CPU cores.
# Exits non-zero if either suite fails.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SHARED_033="$ROOT/../shared/comfyui-0.33.0"
PYTEST=(-m pytest -q -p no:cacheprovider --durations=25)  # the 25 slowest tests: what to look at when CI nears its limit
# Each suite runs on several pytest workers (pytest-xdist), a test file per worker at a time (its module fixtures
# are built once). One test alone leaves a core idle much of the time (a rank waits for its peer, the server
# for a rank, a poll for a file); on a 2-core machine two workers took the main suite from 47 to 32 minutes and
# the core suite from 22 to 13 (2026-12-07; the earlier figures with the two suites side by side).
# PIPETRAIN_TEST_WORKERS picks the count (default: the cores, at most 4; 1 = no workers, one process).
WORKERS="${PIPETRAIN_TEST_WORKERS:-$(n=$(nproc 2>/dev/null || echo 2); [ "$n" -gt 4 ] && n=4; [ "$n" -lt 2 ] && n=2; echo $n)}"
if [ "$WORKERS" -gt 1 ]; then PYTEST+=(-n "$WORKERS" --dist loadfile); fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-test.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
now() { date +%s; }
unset PIPETRAIN_VENV  # each suite has its venv: .venv and .venv-0.33 (bootstrap.sh's defaults)
# One OpenMP thread per process unless the caller chose: the tests' models are tiny, and on 2 cores a
# process with two threads stalls behind any other busy process (2-3x slower family tests).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

COMFY="$(bash scripts/bootstrap.sh)" || exit $?

bootstrap_033() {  # the venv's messages go to $TMP/boot.log, the ComfyUI folder to $TMP/comfy
  local start=$(now) rc
  bash scripts/bootstrap_033.sh >"$TMP/comfy" 2>"$TMP/boot.raw"
  rc=$?
  grep -v "is ignored: it is neither a file" "$TMP/boot.raw" >"$TMP/boot.log"  # pip's notes on local indexes
  echo "[test] bootstrap of ComfyUI 0.33.0 (.venv-0.33): exit $rc in $(( $(now) - start )) s" >>"$TMP/boot.log"
  return $rc
}

core_suite() {  # -m core on ComfyUI 0.33.0, once its venv is ready
  local start=$(now) rc
  COMFYUI_PATH="$(tail -n1 "$TMP/comfy")" "$ROOT/.venv-0.33/bin/python" "${PYTEST[@]}" "$@" -m core
  rc=$?
  echo "[test] core suite on ComfyUI 0.33.0: exit $rc in $(( $(now) - start )) s"
  # exit 5 = nothing collected: fine when the caller's own selection holds no core test
  if [ $rc -eq 5 ] && [ $# -gt 0 ]; then rc=0; fi
  return $rc
}

BG=""
if [ -d "$SHARED_033" ]; then
  if [ "${PIPETRAIN_TEST_PARALLEL:-0}" = "1" ]; then
    { bootstrap_033 && core_suite "$@"; } >"$TMP/core.log" 2>&1 & BG=$!
  else
    bootstrap_033 & BG=$!
  fi
fi

start=$(now)
COMFYUI_PATH="$COMFY" "$ROOT/.venv/bin/python" "${PYTEST[@]}" "$@"
MAIN_RC=$?
echo "[test] main suite on ComfyUI 0.3.75: exit $MAIN_RC in $(( $(now) - start )) s"

if [ -z "$BG" ]; then
  echo "[test] ComfyUI 0.3.75 main suite: exit $MAIN_RC"
  echo "ComfyUI 0.33.0 was not tested: ../shared/comfyui-0.33.0 not found"
  exit $MAIN_RC
fi
wait "$BG"
BG_RC=$?
echo "=================== ComfyUI 0.33.0: core suite (-m core) ==================="
cat "$TMP/boot.log"
if [ "${PIPETRAIN_TEST_PARALLEL:-0}" = "1" ]; then
  cat "$TMP/core.log"
  CORE_RC=$BG_RC
elif [ $BG_RC -eq 0 ]; then
  core_suite "$@"
  CORE_RC=$?
else
  CORE_RC=$BG_RC
fi
echo "[test] ComfyUI 0.3.75 main suite: exit $MAIN_RC; ComfyUI 0.33.0 core suite: exit $CORE_RC"
[ $MAIN_RC -eq 0 ] && [ $CORE_RC -eq 0 ]
