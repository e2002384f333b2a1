#!/usr/bin/env bash
# `mxmoe bench` of an older revision beside this checkout's build, in the same run on the GPU
# machine. That machine has no git history: make the old tree here and let it travel, e.g.
#   git archive --format=tar.gz -o .scratch/before.tar.gz REV -- . ':(exclude)bench/results'
#   BEFORE_TAR=.scratch/before.tar.gz scripts/bench_before_after.sh --recipe mxfp8 -- --recipe fp8_blockwise
# Each `--`-separated group of arguments is one bench run (none: one run with bench's defaults). In
# each run the two sides alternate, twice, so clock and power-cap drift land on both; the second
# pass is kept. BEFORE_ARGS / AFTER_ARGS add flags to one side only (e.g.
# AFTER_ARGS='--override fc2_dgrad=mxfp8_regs_n128'; a revision older than --override lacks it).
# Needs `scripts/gpu_check.sh build` first ($BUILD_DIR, default build-gpu; .deps/root). The old tree
# is built once per tarball in build-before/. Writes $OUT/before.json and after.json (every run's
# rows) and $OUT/before_after.md (bench/compare_bench.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT" && rm -f "$OUT/before.json" "$OUT/after.json" "$OUT/before_after.md"
export PATH=/usr/local/cuda/bin:$PATH
tar=${BEFORE_TAR:?set BEFORE_TAR to a git archive of the older revision}
new=${BUILD_DIR:-build-gpu}/mxmoe
[ -x "$new" ] || { echo "no $new: run scripts/gpu_check.sh build first"; exit 1; }
W=build-before
sum=$(sha256sum "$tar" | cut -c1-16)
if [ "$(cat $W/tar.sha 2>/dev/null)" != "$sum" ]; then
  rm -rf $W && mkdir -p $W/src && tar -xzf "$tar" -C $W/src || exit 1
fi
# CLI11 / nlohmann-json and the CUTLASS headers from this checkout's .deps (the old tree has none).
prefix=()
[ -d .deps/root/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
cutlass=$PWD/.deps/cutlass/cutlass_library/source/include
[ -d "$cutlass" ] && prefix+=(-DMXMOE_CUTLASS_INCLUDE_DIR="$cutlass")
if ! cmake -S $W/src -B $W/b -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA_ARCHS=90a -DMXMOE_BUILD_TESTS=OFF \
  -DMXMOE_BUILD_TORCH=OFF -DMXMOE_BUILD_SM100=OFF "${prefix[@]}" >$W/build.log 2>&1 ||
  ! cmake --build $W/b -j16 --target mxmoe_cli >>$W/build.log 2>&1; then
  tail -30 $W/build.log; exit 1
fi
echo "$sum" >$W/tar.sha
grep -iE 'mxmoe: .*sm90' $W/build.log | head -2  # whether the old tree has its Hopper kernels
old=$(find $W/b -maxdepth 2 -type f -name mxmoe -perm -u+x | head -1)
[ -n "$old" ] || { echo "no mxmoe binary in $W/b"; exit 1; }

runs=() cur=()
for a in "$@"; do
  if [ "$a" = -- ]; then runs+=("${cur[*]}"); cur=(); else cur+=("$a"); fi
done
runs+=("${cur[*]}")
rc=0 before=() after=()
for ((i = 0; i < ${#runs[@]}; i++)); do
  run=${runs[i]}
  for pass in 1 2; do
    for side in before after; do
      if [ $side = before ]; then bin=$old extra=${BEFORE_ARGS:-}; else bin=$new extra=${AFTER_ARGS:-}; fi
      # shellcheck disable=SC2086  # run and extra are lists of flags
      timeout 300 "$bin" bench $run $extra --json "$W/${side}_$i.json" >"$W/${side}_bench.log" 2>&1 ||
        { rc=1; echo "$side, bench $run $extra, pass $pass failed:"; tail -20 "$W/${side}_bench.log"; continue 3; }
    done
  done
  before+=("$W/before_$i.json") after+=("$W/after_$i.json")
done
# Each side's runs as one bench JSON: the rows and splits of every run.
merge() {
  python3 - "$@" <<'EOF'
import json, sys
docs = [json.load(open(p)) for p in sys.argv[2:]]
merged = docs[0]
merged.setdefault("splits", [])
for d in docs[1:]:
    merged["rows"] += d["rows"]
    merged["splits"] += [s for s in d.get("splits", []) if s not in merged["splits"]]
json.dump(merged, open(sys.argv[1], "w"), indent=1)
EOF
}
[ ${#before[@]} -gt 0 ] || exit 1
merge "$OUT/before.json" "${before[@]}" && merge "$OUT/after.json" "${after[@]}" &&
  python3 bench/compare_bench.py "$OUT/before.json" "$OUT/after.json" --out "$OUT/before_after.md" || rc=1
exit $rc
