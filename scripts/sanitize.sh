#!/usr/bin/env bash
# The bad-input suites under AddressSanitizer and UndefinedBehaviorSanitizer, every report fatal:
# a CPU-only build (no torch) of the library, the CLI, the C ABI tests and the validation tests into
# ${SANITIZE_DIR:-build-sanitize}, then those tests through CTest. scripts/test.sh (and so CI) runs
# it after the main suite; MXMOE_SANITIZE=0 there skips it. The Python suite is not run here: the
# torch extension under ASan needs a sanitized interpreter or libasan preloaded into torch's.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SANITIZE_DIR:-build-sanitize}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DMXMOE_SANITIZE=ON -DMXMOE_WITH_CUDA=OFF \
  -DMXMOE_BUILD_TORCH=OFF -DMXMOE_REQUIRE_TORCH=OFF -DMXMOE_INSTALL=OFF ${MXMOE_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j"$jobs" --target mxmoe_bad_input_tests mxmoe_c_api_test mxmoe_c_api_test_asan \
  mxmoe_c_api_edges_test mxmoe_cli
# Leaks are not what these suites look for (OpenMP's runtime keeps its pools to the end).
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=0:exitcode=99
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=99
cd "$dir"
# The CLI's bad-input cases (its correctness runs, small_tokens and fp8_blockwise, take minutes
# under the sanitizers and feed it nothing odd).
ctest --output-on-failure -j"$jobs" -R '^(Sanitized\.|CApi\.|Cli\.(zero_tokens|output_paths|edge_paths|memory_and_bounds|usage))' "$@"
