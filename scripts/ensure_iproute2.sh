#!/usr/bin/env bash
# The multi-node tests (tests/training/test_multinode.py) simulate two hosts with network namespaces: they
# need iproute2's `ip` and root. Install iproute2 where it is missing and apt can (CI runs as root
# on Debian); elsewhere only say what is missing. Output goes to stderr (bootstrap.sh's stdout is
# the ComfyUI path).
set -uo pipefail
command -v ip >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "[bootstrap] installing iproute2 (ip netns, for the multi-node tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends iproute2 >&2 \
    || echo "[bootstrap] could not install iproute2: the multi-node tests will fail" >&2
else
  echo "[bootstrap] iproute2 (ip) is missing: the multi-node tests need it and root (apt-get install iproute2)" >&2
fi
exit 0
