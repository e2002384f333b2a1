#!/usr/bin/env bash
# Installs the build dependencies (pinned Debian packages) where they are missing, then configures
# and builds mxmoe into ${BUILD_DIR:-build}. nvcc is optional: without it only the CPU backend builds.
set -euo pipefail
cd "$(dirname "$0")/.."

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

# CUTLASS/CuTe headers for the Hopper backend, where there is a CUDA compiler to use them.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then scripts/install_cutlass.sh; fi

# PyTorch, pytest and transformers for the torch extension and python/tests (the Torch.PytestSuite
# test; transformers for mxmoe_torch.hf): the pinned python/requirements-test.txt in a virtual
# environment of the checkout (.venv, about 5 GB, two minutes here), unless the python3 on PATH
# already imports all three. MXMOE_NO_TORCH=1 skips it (then the extension and its tests are left
# out, and configure says so).
cmake_args=(${MXMOE_CMAKE_ARGS:-})
if [ -z "${MXMOE_NO_TORCH:-}" ]; then
  if python3 -c "import torch, pytest, transformers" >/dev/null 2>&1; then
    py=$(command -v python3)
  else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    if ! .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-test.txt; then
      echo "setup: installing python/requirements-test.txt into .venv failed (MXMOE_NO_TORCH=1 skips it)" >&2
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
