#!/usr/bin/env bash
# The main job: install what is missing, build, and run `mxmoe run` on its default preset
# (a small CPU problem without a GPU; dsv3 with one). Extra arguments go to `mxmoe run`.
# The CLI needs no torch: the extension (and its ~5 GB .venv) is built only when asked for with
# MXMOE_BUILD_TORCH=1 (scripts/setup.sh lists the switches).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MXMOE_NO_TORCH:-}" ]; then export MXMOE_BUILD_TORCH=${MXMOE_BUILD_TORCH:-0}; fi
scripts/setup.sh
exec "${BUILD_DIR:-build}/mxmoe" run "$@"
