#!/usr/bin/env bash
# The bad-input suites under AddressSanitizer and UndefinedBehaviorSanitizer, every report fatal:
# a CPU-only build of the library, the CLI, the C ABI tests and the validation tests into
# ${SANITIZE_DIR:-build-sanitize}, then those tests through CTest; where the torch build is on
# (MXMOE_BUILD_TORCH, read as scripts/setup.sh reads it), also the torch extension (the same
# sanitized library objects) and python/tests' bad-input tests, under the Python that setup.sh
# chose with the sanitizer runtime preloaded. scripts/test.sh (and so CI) runs it after the main
# suite; MXMOE_SANITIZE=0 there skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SANITIZE_DIR:-build-sanitize}
jobs=$(nproc 2>/dev/null || echo 2)

# MXMOE_BUILD_TORCH as in scripts/setup.sh: 1/ON or 0/OFF, unset means on unless MXMOE_NO_TORCH is set.
case "${MXMOE_BUILD_TORCH:-}" in
  1|[oO][nN]|[tT][rR][uU][eE]|[yY][eE][sS]) build_torch=1 ;;
  0|[oO][fF][fF]|[fF][aA][lL][sS][eE]|[nN][oO]) build_torch=0 ;;
  "") if [ -n "${MXMOE_NO_TORCH:-}" ]; then build_torch=0; else build_torch=1; fi ;;
  *) echo "sanitize: MXMOE_BUILD_TORCH='$MXMOE_BUILD_TORCH' is not 1/ON or 0/OFF" >&2; exit 2 ;;
esac
targets=(mxmoe_bad_input_tests mxmoe_c_api_test mxmoe_c_api_test_asan mxmoe_c_api_edges_test mxmoe_cli)
torch_args=(-DMXMOE_BUILD_TORCH=OFF -DMXMOE_REQUIRE_TORCH=OFF)
if [ "$build_torch" = 1 ]; then
  # The interpreter scripts/setup.sh picked: python3 where it imports all three, else .venv's.
  if python3 -c "import torch, pytest, transformers" >/dev/null 2>&1; then
    py=$(command -v python3)
  elif [ -x .venv/bin/python ]; then
    py=$PWD/.venv/bin/python
  else
    echo "sanitize: the torch build is on, but no python3 imports torch, pytest and transformers and there is" \
         "no .venv (scripts/setup.sh makes it; MXMOE_BUILD_TORCH=0 skips the Python suite)" >&2
    exit 2
  fi
  torch_args=("-DPython3_EXECUTABLE=$py" -DMXMOE_BUILD_TORCH=ON -DMXMOE_REQUIRE_TORCH=ON)
  targets+=(mxmoe_torch)
fi
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DMXMOE_SANITIZE=ON -DMXMOE_WITH_CUDA=OFF "${torch_args[@]}" \
  -DMXMOE_INSTALL=OFF ${MXMOE_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
# Leaks are not what these suites look for (OpenMP's runtime keeps its pools to the end).
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=0:exitcode=99
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=99
# The CLI's bad-input cases (its correctness runs, small_tokens and fp8_blockwise, take minutes
# under the sanitizers and feed it nothing odd).
(cd "$dir" && ctest --output-on-failure -j"$jobs" \
   -R '^(Sanitized\.|CApi\.|Cli\.(zero_tokens|output_paths|edge_paths|memory_and_bounds|usage))' "$@")

[ "$build_torch" = 1 ] || exit 0
# The Python bad-input suite: every test of test_arguments.py and test_check_finite.py, and the
# refusal tests of the other files (named bad_*, *refuses*, *errors_name*, *_are_errors*, *an_error*,
# *a_clear_error*, *flag_is_checked*: about 90, seconds to run). The interpreter and torch are not
# instrumented, so the sanitizer runtimes the extension links come first through LD_PRELOAD (ASan
# must be the first library loaded), with the C++ runtime: ASan's __cxa_throw interceptor resolves
# the real one when it starts, and python does not link libstdc++ (without it the first exception
# torch throws stops the run with "CHECK failed ... real___cxa_throw"). UBSan reports come only from
# the extension and the library (the code built with -fsanitize=undefined -fno-sanitize-recover=all).
# --capture=sys: a report goes to fd 2, which pytest's default capture would swallow with the run.
# CUDA_VISIBLE_DEVICES is empty: the extension is CPU-only here, and CUDA under ASan is another matter.
lib=$dir/python/libmxmoe_torch.so
asan=$(ldd "$lib" | awk '/libasan\.so/ {print $3}')
stdcxx=$(ldd "$lib" | awk '/libstdc\+\+\.so/ {print $3}')
if [ -z "$asan" ] || [ -z "$stdcxx" ]; then
  echo "sanitize: cannot find libasan and libstdc++ among $lib's libraries (ldd)" >&2
  exit 2
fi
# The interpreter itself, not a wrapper (a pyenv shim is a shell script).
py=$("$py" -c 'import sys; print(sys.executable)')
k='test_arguments or test_check_finite or bad_argument or bad_input or refuses or errors_name or are_errors'
k+=' or an_error or a_clear_error or flag_is_checked'
t=python/tests
LD_PRELOAD="$asan $stdcxx" CUDA_VISIBLE_DEVICES= PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$lib" \
  "$py" -m pytest -q -rs -p no:cacheprovider --capture=sys -k "$k" \
  $t/test_arguments.py $t/test_check_finite.py $t/test_moe.py $t/test_torch_ops.py $t/test_hf_experts.py \
  $t/test_permute.py $t/test_prepared_weights.py $t/test_moe_fused_permute.py
