#!/usr/bin/env bash
# The main job: install what is missing, build, and run `mxmoe run` on its default preset
# (a small CPU problem without a GPU; dsv3 with one). Extra arguments go to `mxmoe run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BUILD_DIR:-build}/mxmoe" run "$@"
