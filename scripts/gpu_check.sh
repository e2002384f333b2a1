#!/usr/bin/env bash
# The GPU machine's work (docs/gpu_machine.md): build there, ctest with the gpu label, the torch
# suite, compute-sanitizer, `mxmoe run`, `mxmoe bench` beside the torch peer; on request the plans
# for every GPU, a bench beside an older revision, an A/B of two plan overrides, ncu, expert parallelism.
#   scripts/gpu_check.sh [build|test|torch|sanitize|run|bench|plan|before_after|ab|ncu|ep]...
#   (default: build test torch sanitize run bench; each step's knobs are in its comment)
# Results go to $OUT (default ./out), which returns at most 8 files: a step's log is copied there
# only when the step fails (or with KEEP_LOGS=1); all logs stay in $BUILD_DIR/logs.
# GoogleTest, CLI11, nlohmann-json and CUTLASS come carried in .deps/ and .whl/ (docs/gpu_machine.md).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=$(realpath -m "${OUT:-out}")
B=${BUILD_DIR:-build-gpu}
L=$(realpath -m "$B")/logs
mkdir -p "$OUT" "$L"
export PATH=/usr/local/cuda/bin:$PATH
# The commit this tree is, written here before the call (`git describe --always --dirty >
# .scratch/commit.txt`): the copy on the GPU machine has no history. The peer reports print it.
[ -s .scratch/commit.txt ] && MXMOE_TREE="$(cat .scratch/commit.txt) (from .scratch/commit.txt)" && export MXMOE_TREE
steps=${*:-build test torch sanitize run bench}

summary() { echo "== $1: $2" | tee -a "$OUT/summary.txt"; }
keep() { if [ "$2" -ne 0 ] || [ "${KEEP_LOGS:-0}" = 1 ]; then cp "$L/$1" "$OUT/"; fi; }  # keep LOG RC
gtest_counts() {  # passed / failed totals of gtest logs
  grep -hE '^\[  (PASSED|FAILED)  \] [0-9]' "$@" | awk '{n[$2] += $4} END {for (k in n) printf "%s %d, ", k, n[k]}'
}
torch_lib=$(realpath -m "$B")/python/libmxmoe_torch.so
have_torch() {
  [ -f "$torch_lib" ] && return 0
  summary "$1" "skipped: the torch extension was not built (no PyTorch at configure time)"; return 1
}
with_torch() { PYTHONPATH="python:$(realpath -m "$B")/site" MXMOE_TORCH_LIBRARY="$torch_lib" PYTHONUNBUFFERED=1 "$@"; }

for s in $steps; do
  # STOP_AFTER=N: steps not begun by N seconds into the call are skipped (a call has 600 s).
  if [ "$SECONDS" -gt "${STOP_AFTER:-999999}" ]; then summary "$s" "skipped: ${SECONDS}s > STOP_AFTER"; continue; fi
  case $s in
    build)
      # Release, sm_90a, 16 jobs. FAST_BUILD=1: no sm_100a kernels (they cannot run on Hopper; CI
      # compiles them). CMAKE_ARGS adds options, e.g. -DMXMOE_BUILD_KERNEL_BENCH=ON.
      scripts/install_cutlass.sh >"$L/build.log" 2>&1
      # CLI11 and nlohmann/json: Debian packages carried as .debs (no network there), unpacked into a
      # prefix; their CMake packages are relocatable.
      prefix=()
      if ls .deps/debs/*.deb >/dev/null 2>&1; then
        mkdir -p .deps/root && for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
        prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
      fi
      fast=(); [ "${FAST_BUILD:-0}" = 1 ] && fast=(-DMXMOE_BUILD_SM100=OFF)
      # shellcheck disable=SC2086  # CMAKE_ARGS is a list of options
      cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA_ARCHS=90a "${fast[@]}" -DGTEST_ROOT="$PWD/.deps/gtest" \
        "${prefix[@]}" ${CMAKE_ARGS:-} >>"$L/build.log" 2>&1 && cmake --build "$B" -j16 >>"$L/build.log" 2>&1
      rc=$?; summary build "rc=$rc"; keep build.log $rc
      [ $rc -eq 0 ] || { tail -40 "$L/build.log"; exit 1; }
      # The carried Python wheels the suites and peers pin (transformers, torchao) over the machine's own.
      for w in .whl/transformers-*.whl .whl/torchao-*.whl; do
        [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --upgrade --target "$B/site" "$w" >>"$L/build.log" 2>&1
      done ;;
    test)
      # Every CTest test but label torch: the torch step runs that suite itself (it is most of
      # ctest's time otherwise).
      (cd "$B" && ctest -j4 -LE torch --output-on-failure --timeout 300 >"$L/ctest.log" 2>&1)
      rc=$?; summary ctest "rc=$rc $(grep -E 'tests passed|tests failed' "$L/ctest.log")"; keep ctest.log $rc
      grep -E '\(Failed\)|\(SEGFAULT\)|Timeout|\*\*\*' "$L/ctest.log" | head -20 ;;
    torch)
      have_torch pytest || continue
      with_torch timeout 300 python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$L/pytest.log" 2>&1
      rc=$?; summary pytest "rc=$rc $(tail -1 "$L/pytest.log")"; keep pytest.log $rc ;;
    sanitize)
      # memcheck, then racecheck, over the kernel tests (SANITIZE_FILTER), each as SANITIZE_SHARDS
      # gtest shards run at once (1: one process). In one process racecheck had done 19 of 35 tests
      # at 150 s on the H200, hence its 360 s a shard (SANITIZE_TIMEOUT sets both tools').
      filter=${SANITIZE_FILTER:-*QuantGpu*:*GpuQuant*:*GpuGemm*/cuda_sm90:*GpuGlu*/cuda_sm90}
      n=${SANITIZE_SHARDS:-4}
      for tool in memcheck racecheck; do
        limit=${SANITIZE_TIMEOUT:-150}; [ $tool = racecheck ] && limit=${SANITIZE_TIMEOUT:-360}
        pids=()
        for ((i = 0; i < n; i++)); do
          GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "$limit" compute-sanitizer --tool $tool \
            --error-exitcode 9 "$B/tests/mxmoe_gpu_tests" --gtest_filter="$filter" >"$L/$tool.$i.log" 2>&1 &
          pids+=($!)
        done
        rcs=(); for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
        for ((i = 0; i < n; i++)); do echo "##### shard $i of $n: rc=${rcs[i]}"; cat "$L/$tool.$i.log"; done >"$L/$tool.log"
        rc=0; for r in "${rcs[@]}"; do [ "$r" -eq 0 ] || rc=$r; done
        summary $tool "rc=$rc (shards: ${rcs[*]}) $(gtest_counts "$L"/$tool.?.log)$(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' \
          "$L"/$tool.?.log | sed 's/^=* *//' | sort | uniq -c | awk '{$1 = $1; printf "%s; ", $0}')"
        keep $tool.log "$rc"
      done ;;
    run)
      # `mxmoe run` on its GPU default (dsv3, mxfp8); RUN_ARGS adds flags (--preset, --override ...).
      # shellcheck disable=SC2086
      timeout 300 "$B/mxmoe" run ${RUN_ARGS:-} --json "$OUT/run.json" >"$OUT/run.log" 2>&1
      summary "mxmoe run${RUN_ARGS:+ $RUN_ARGS}" "rc=$?"; tail -45 "$OUT/run.log" ;;
    bench)
      # `mxmoe bench` (every preset but small, balanced and skewed, mxfp8 and bf16; BENCH_ARGS narrows
      # or adds, e.g. '--preset dsv3' or '--recipe fp8_blockwise'), then bench/peer_torch.py measures
      # the torch peers on every split of its JSON (PEER_ARGS adds options, e.g. '--no-compile'; with
      # fp8_blockwise rows it adds torchao's FP8 row-wise layer; PEER_TIMEOUT, default 300 s).
      # $OUT gets bench.json, peer.json, bench.md and bench.png.
      # shellcheck disable=SC2086
      timeout 400 "$B/mxmoe" bench ${BENCH_ARGS:-} --json "$OUT/bench.json" >"$L/bench.log" 2>&1
      rc=$?; summary "mxmoe bench${BENCH_ARGS:+ $BENCH_ARGS}" "rc=$rc"; keep bench.log $rc
      if [ $rc -ne 0 ] || [ ! -s "$OUT/bench.json" ]; then tail -30 "$L/bench.log"; continue; fi
      # torchao (the FP8 row-wise layer peer of fp8_blockwise runs): the carried wheel, installed by build.
      # shellcheck disable=SC2086
      PYTHONPATH="$(realpath -m "$B")/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout "${PEER_TIMEOUT:-300}" python3 bench/peer_torch.py --mxmoe-json "$OUT/bench.json" --out-dir "$OUT" \
        --warmup 3 --iters 10 --time-budget 200 ${PEER_ARGS:-} >"$L/peer.log" 2>&1
      rc=$?; summary peer "rc=$rc"; keep peer.log $rc
      [ $rc -eq 0 ] || tail -30 "$L/peer.log"
      [ -f "$OUT/bench.md" ] && sed '/^## All rows/q' "$OUT/bench.md" ;;  # header, layer vs compile, memory
    plan)
      # `mxmoe plan` (no GPU needed) for each of PLAN_ARCHS x PLAN_PRESETS x PLAN_RECIPES: sm_80,
      # sm_90a, sm_100a; every preset; mxfp8, bf16, fp8_blockwise, and fp8_blockwise+pow2 (with
      # --pow2-scales). PLAN_ARGS adds flags (--prepared, --skew, --override ...). -> $OUT/plan.txt,
      # and plan.json (each plan's flags and JSON).
      : >"$OUT/plan.txt"; rm -f "$L"/plan_*.json
      n=0; bad=0; jsons=()
      for arch in ${PLAN_ARCHS:-sm_80 sm_90a sm_100a}; do
        for preset in ${PLAN_PRESETS:-small dsv3 qwen3-30b gptoss-120b mixtral}; do
          for recipe in ${PLAN_RECIPES:-mxfp8 bf16 fp8_blockwise fp8_blockwise+pow2}; do
            n=$((n + 1))
            args=(--arch "$arch" --preset "$preset" --recipe "${recipe%+pow2}")
            [ "$recipe" != "${recipe%+pow2}" ] && args+=(--pow2-scales)
            echo "##### mxmoe plan ${args[*]}${PLAN_ARGS:+ $PLAN_ARGS}" >>"$OUT/plan.txt"
            # shellcheck disable=SC2086
            if timeout 60 "$B/mxmoe" plan "${args[@]}" ${PLAN_ARGS:-} --json "$L/plan_$n.json" >>"$OUT/plan.txt" 2>&1; then
              jsons+=("${args[*]}${PLAN_ARGS:+ $PLAN_ARGS}" "$L/plan_$n.json")
            else echo "##### rc=$?" >>"$OUT/plan.txt"; bad=$((bad + 1)); fi
          done
        done
      done
      python3 -c 'import json, sys; v = sys.argv[2:]; json.dump([{"args": a, "plan": json.load(open(p))}
        for a, p in zip(v[::2], v[1::2])], open(sys.argv[1], "w"), indent=1)' "$OUT/plan.json" "${jsons[@]}"
      summary plan "$((n - bad)) of $n plans made" ;;
    before_after)
      # scripts/bench_before_after.sh: `mxmoe bench` of the revision in BEFORE_TAR (default
      # .scratch/before.tar.gz, a git archive made here) beside this build, over BA_ARGS (default:
      # every preset but small, both splits, mxfp8, bf16 and fp8_blockwise, one bench run per recipe).
      # AFTER_ARGS / BEFORE_ARGS add flags to one side. -> $OUT/before.json, after.json, before_after.md.
      export BEFORE_TAR=${BEFORE_TAR:-.scratch/before.tar.gz}
      [ -f "$BEFORE_TAR" ] || { summary before_after "skipped: no $BEFORE_TAR"; continue; }
      # shellcheck disable=SC2086
      BUILD_DIR=$B OUT=$OUT scripts/bench_before_after.sh ${BA_ARGS:---recipe mxfp8 -- --recipe bf16 -- --recipe fp8_blockwise} \
        >"$L/before_after.log" 2>&1
      rc=$?; summary before_after "rc=$rc $(grep -E '^slowest' "$OUT/before_after.md" 2>/dev/null)"; keep before_after.log $rc
      [ $rc -eq 0 ] || tail -30 "$L/before_after.log"
      grep -E 'layer_fwd_bwd \|' "$OUT/before_after.md" 2>/dev/null | head -30 ;;
    ab)
      # Two configurations of one step, in one binary: `mxmoe bench $AB_ARGS` (default '--preset dsv3
      # --recipe mxfp8') with --override AB_STEP=AB_A, then AB_B, interleaved, twice; pass 2 is
      # compared (B against A) -> $OUT/ab_a.json, ab_b.json, ab.md. A side may instead list
      # STEP=CONFIG pairs (several steps), or be empty: the plan's own choice. `mxmoe plan` names
      # the configurations.
      rm -f "$OUT"/ab.md "$OUT"/ab_?.json
      for pass in 1 2; do
        for side in a b; do
          if [ $side = a ]; then cfg=${AB_A:-}; else cfg=${AB_B:-}; fi
          ov=(); for c in $cfg; do [[ $c == *=* ]] || c=${AB_STEP:-AB_STEP}=$c; ov+=(--override "$c"); done
          # shellcheck disable=SC2086
          timeout 300 "$B/mxmoe" bench ${AB_ARGS:---preset dsv3 --recipe mxfp8} "${ov[@]}" --json "$OUT/ab_$side.json" \
            >"$L/ab_$side.log" 2>&1
          rc=$?; summary "ab pass $pass, $side: ${cfg:-plan}" "rc=$rc"; keep ab_$side.log $rc
        done
      done
      python3 bench/compare_bench.py "$OUT/ab_a.json" "$OUT/ab_b.json" --labels "${AB_A:-plan}" "${AB_B:-plan}" \
        --out "$OUT/ab.md" >/dev/null 2>&1
      summary ab "$(grep -E '^slowest' "$OUT/ab.md" 2>/dev/null)"
      grep -E "${AB_STEP:-layer_fwd_bwd} \||layer_fwd_bwd \|" "$OUT/ab.md" | head -40 ;;
    ncu)
      # ncu --set full on NCU_COUNT (1) launches of the kernels matching NCU_KERNEL (regex:gemm),
      # after skipping NCU_SKIP (0) of them, in `mxmoe bench $NCU_ARGS` (default '--preset dsv3
      # --recipe mxfp8 --skew'; --override profiles a configuration). NCU_FLAGS adds ncu options
      # (e.g. --kernel-name-base demangled, to match template arguments). The program is stopped
      # after those launches. -> $OUT/ncu_details.txt, ncu_sass.csv.gz (the SASS
      # source counters with stall reasons).
      # shellcheck disable=SC2086
      timeout "${NCU_TIMEOUT:-300}" ncu ${NCU_FLAGS:-} -k "${NCU_KERNEL:-regex:gemm}" --launch-skip "${NCU_SKIP:-0}" \
        --launch-count "${NCU_COUNT:-1}" --set full --import-source yes --kill yes -f -o "$L/ncu" \
        "$B/mxmoe" bench ${NCU_ARGS:---preset dsv3 --recipe mxfp8 --skew} >"$L/ncu.log" 2>&1
      rc=$?; summary ncu "rc=$rc"; keep ncu.log $rc
      ncu -i "$L/ncu.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
      ncu -i "$L/ncu.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip >"$OUT/ncu_sass.csv.gz"
      grep -E "gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Registers Per" \
        "$OUT/ncu_details.txt" | cut -c1-150 | head -24 ;;
    ep)
      # Expert parallelism: python/tests/test_ep.py (two GPUs: the NCCL tests; one GPU: gloo ranks
      # sharing it and one-rank NCCL), then bench/ep_bench.py at EP_WORLD (default 2 where two GPUs
      # exist, else 1, where the all-to-all is a copy within the GPU: the module's own overhead).
      # EP_ARGS adds options. NVLink multicast off. -> $OUT/ep_bench.json, .md, .png.
      have_torch ep || continue
      export NCCL_NVLS_ENABLE=0
      n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
      ep_world=${EP_WORLD:-$((n_gpu >= 2 ? 2 : 1))}
      with_torch timeout 300 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_ep.py >"$L/ep_test.log" 2>&1
      rc=$?; summary "ep tests ($n_gpu GPUs)" "rc=$rc $(tail -1 "$L/ep_test.log")"; keep ep_test.log $rc
      # shellcheck disable=SC2086
      with_torch timeout 300 python3 bench/ep_bench.py --world "$ep_world" --out-dir "$OUT" ${EP_ARGS:-} >"$L/ep_bench.log" 2>&1
      rc=$?; summary "ep bench (world $ep_world)" "rc=$rc"; keep ep_bench.log $rc
      [ -f "$OUT/ep_bench.md" ] && head -60 "$OUT/ep_bench.md" ;;
    *) summary "$s" "unknown step (build test torch sanitize run bench plan before_after ab ncu ep)" ;;
  esac
done
cat "$OUT/summary.txt"
