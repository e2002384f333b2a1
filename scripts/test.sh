#!/usr/bin/env bash
# The test command: install what is missing, build everything, run every test through CTest, then
# the bad-input suites again under ASan and UBSan (scripts/sanitize.sh; MXMOE_SANITIZE=0 skips it).
# GPU tests (label gpu) report SKIPPED with the reason where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)" "$@")
if [ "${MXMOE_SANITIZE:-1}" != 0 ]; then scripts/sanitize.sh; fi
