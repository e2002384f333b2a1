#!/usr/bin/env bash
# Installs what the chosen build needs where it is missing, then configures and builds mxmoe into
# ${BUILD_DIR:-build}. Two switches, each meaning here what the CMake option of the same name means
# (1/ON or 0/OFF; unset: the default):
#   MXMOE_WITH_CUDA    the CUDA backends (default: on where nvcc exists). Off: no CUTLASS install,
#                      -DMXMOE_WITH_CUDA=OFF.
#   MXMOE_BUILD_TORCH  the PyTorch extension and python/tests (default: on). On: torch and pytest
#                      from python/requirements-test.txt into .venv (about 5 GB, two minutes here)
#                      unless the python3 on PATH imports both. Off: nothing installed for it.
#                      MXMOE_NO_TORCH=1 is the older spelling of MXMOE_BUILD_TORCH=0.
# scripts/run.sh builds without torch unless asked (the CLI needs none); scripts/test.sh with it.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1/ON/TRUE/YES -> 1, 0/OFF/FALSE/NO -> 0, unset or empty -> $3; anything else stops setup.
switch() {
  case "${2,,}" in
    1|on|true|yes) echo 1 ;;
    0|off|false|no) echo 0 ;;
    "") echo "$3" ;;
    *) echo "setup: $1='$2' is not 1/ON or 0/OFF" >&2; return 2 ;;
  esac
}
have_nvcc=0
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then have_nvcc=1; fi
with_cuda=$(switch MXMOE_WITH_CUDA "${MXMOE_WITH_CUDA:-}" $have_nvcc) || exit 2
torch_default=1
if [ -n "${MXMOE_NO_TORCH:-}" ]; then torch_default=0; fi
build_torch=$(switch MXMOE_BUILD_TORCH "${MXMOE_BUILD_TORCH:-}" $torch_default) || exit 2

declare -A pins=([cmake]=3.25.1-1 [g++]=4:12.2.0-3 [make]=4.3-4.1 [libgtest-dev]=1.12.1-0.2
                 [libcli11-dev]=2.1.2+ds-1 [nlohmann-json3-dev]=3.11.2-2)
missing=()
command -v cmake >/dev/null || missing+=("cmake=${pins[cmake]}")
command -v g++ >/dev/null || missing+=("g++=${pins[g++]}")
command -v make >/dev/null || missing+=("make=${pins[make]}")
[ -f /usr/include/gtest/gtest.h ] || missing+=("libgtest-dev=${pins[libgtest-dev]}")
[ -f /usr/include/CLI/CLI.hpp ] || missing+=("libcli11-dev=${pins[libcli11-dev]}")
[ -f /usr/include/nlohmann/json.hpp ] || missing+=("nlohmann-json3-dev=${pins[nlohmann-json3-dev]}")
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake_args=(${MXMOE_CMAKE_ARGS:-})
# CUTLASS/CuTe headers for the Hopper backend: only for a build with the CUDA backends.
if [ "$with_cuda" = 1 ]; then
  if [ "$have_nvcc" = 1 ]; then scripts/install_cutlass.sh; fi
  cmake_args+=(-DMXMOE_WITH_CUDA=ON)
else
  cmake_args+=(-DMXMOE_WITH_CUDA=OFF)
fi

# PyTorch, pytest and transformers for the torch extension and python/tests (the Torch.PytestSuite
# test; transformers for mxmoe_torch.hf): the pinned python/requirements-test.txt in a virtual
# environment of the checkout (.venv), unless the python3 on PATH already imports all three.
if [ "$build_torch" = 0 ]; then
  cmake_args+=(-DMXMOE_BUILD_TORCH=OFF -DMXMOE_REQUIRE_TORCH=OFF)
else
  if python3 -c "import torch, pytest, transformers" >/dev/null 2>&1; then
    py=$(command -v python3)
  else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    if ! .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-test.txt; then
      echo "setup: installing python/requirements-test.txt into .venv failed (MXMOE_BUILD_TORCH=0 skips it)" >&2
      exit 1
    fi
    py=$PWD/.venv/bin/python
  fi
  cmake_args+=("-DPython3_EXECUTABLE=$py" -DMXMOE_BUILD_TORCH=ON -DMXMOE_REQUIRE_TORCH=ON)
fi

BUILD_DIR=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j"$jobs"
