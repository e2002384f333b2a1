#!/usr/bin/env bash
# Installs the pinned CUTLASS/CuTe C++ headers (PyPI nvidia-cutlass) into .deps/cutlass, where CMake
# looks for them, unless they are already there. The wheel is taken from .whl/ when that folder
# holds it (machines without network), else from PyPI. Only the cuda_sm90 backend needs them:
# without them it reports itself unavailable and the build goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
pin=4.2.0.0
header=.deps/cutlass/cutlass_library/source/include/cute/arch/mma_sm90_gmma.hpp
[ -f "$header" ] && exit 0
if ! command -v python3 >/dev/null; then
  echo "setup: python3 not found; cannot install nvidia-cutlass==$pin (cuda_sm90 will be unavailable)" >&2
  exit 0
fi
src=()
if ls .whl/nvidia_cutlass-$pin-*.whl >/dev/null 2>&1; then src=(--no-index --find-links .whl); fi
echo "setup: installing nvidia-cutlass==$pin headers into .deps/cutlass" >&2
if ! python3 -m pip install -q --disable-pip-version-check --no-deps --target .deps/cutlass "${src[@]}" \
    "nvidia-cutlass==$pin" >&2; then
  echo "setup: could not install nvidia-cutlass==$pin (cuda_sm90 will be unavailable)" >&2
fi
[ -f "$header" ] || echo "setup: $header is missing after the install" >&2
exit 0
