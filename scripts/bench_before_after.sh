#!/usr/bin/env bash
# One preset's `mxmoe bench`, an older revision beside this checkout, in the same run on the GPU
# machine (which has no git history: carry the old tree as a tarball made here).
#   git archive --format=tar.gz -o .scratch/before.tar.gz <commit>
#   BEFORE_TAR=.scratch/before.tar.gz AFTER_ENV='MXMOE_DENY=cuda_sm90' \
#     scripts/bench_before_after.sh --preset dsv3 --recipe bf16
# Needs `scripts/gpu_check.sh build` first (build-gpu/, .deps/root). Writes $OUT/before.json,
# $OUT/after.json and $OUT/before_after.md. AFTER_ENV / BEFORE_ENV: environment for each side (e.g.
# to hold this checkout on the backend the old revision had).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
tar=${BEFORE_TAR:?set BEFORE_TAR to a git archive of the older revision}
src=build-before/src
rm -rf build-before && mkdir -p $src && tar -xzf "$tar" -C $src || exit 1
prefix=()
[ -d .deps/root/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
cmake -S $src -B build-before/b -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA_ARCHS=90a -DMXMOE_BUILD_TESTS=OFF \
  -DMXMOE_BUILD_TORCH=OFF "${prefix[@]}" >"$OUT/before_build.log" 2>&1 &&
  cmake --build build-before/b -j16 --target mxmoe_cli >>"$OUT/before_build.log" 2>&1 ||
  { tail -30 "$OUT/before_build.log"; exit 1; }
old=$(find build-before/b -maxdepth 2 -type f -name mxmoe -perm -u+x | head -1)
[ -n "$old" ] || { echo "no mxmoe binary in build-before/b"; exit 1; }
# Interleaved, twice each, so clock and thermal drift land on both sides; the second pass is kept.
for pass in 1 2; do
  env ${BEFORE_ENV:-} timeout 300 "$old" bench "$@" --json "$OUT/before.json" >"$OUT/before_bench.log" 2>&1 || { tail -20 "$OUT/before_bench.log"; exit 1; }
  env ${AFTER_ENV:-} timeout 300 build-gpu/mxmoe bench "$@" --json "$OUT/after.json" >"$OUT/after_bench.log" 2>&1 || { tail -20 "$OUT/after_bench.log"; exit 1; }
done
python3 bench/compare_bench.py "$OUT/before.json" "$OUT/after.json" --out "$OUT/before_after.md"
