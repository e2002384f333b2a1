#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: build there (16 cores), run every test (the gpu
# label included), compute-sanitizer memcheck and racecheck over the kernel tests, the main job on
# its GPU default (dsv3), the benchmark and the torch peer beside it. Logs go to $OUT (or ./out).
# GoogleTest is not installed there: carry a copy in .deps/gtest (see docs/gpu_machine.md).
#   scripts/gpu_check.sh [build|test|torch|sanitize|run|kernels|ncu|bench|moe|fp8|fp8ncu|profile|repeat|hang|mxncu|mxweights|glubwd|mxbf16|qdq|pingpong|ppsan|pool|dequant|ep]...   (default: all but kernels, ncu, moe, fp8, fp8ncu, profile, repeat, hang, mxncu, mxweights, glubwd, mxbf16, qdq, pingpong, ppsan, pool, dequant, ep)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu
steps=${*:-build test torch sanitize run bench}
summary() { echo "== $1: $2" | tee -a "$OUT/summary.txt"; }
# ab_bench NAME "ENV_OFF" "ENV_ON" LABEL_OFF LABEL_ON TIMEOUT [bench args]: `mxmoe bench` twice in this
# binary, interleaved, under ENV_OFF and ENV_ON (space-separated VAR=value, may be empty) ->
# $OUT/NAME_{off,on}.json and NAME_before_after.md (bench/compare_bench.py; "before" = off).
ab_bench() {
  local name=$1 env_off=$2 env_on=$3 label_off=$4 label_on=$5 limit=$6 rc_off
  shift 6
  for pass in 1 2; do
    env $env_off timeout $limit $B/mxmoe bench "$@" --json "$OUT/${name}_off.json" >"$B/${name}_off.log" 2>&1; rc_off=$?
    env $env_on timeout $limit $B/mxmoe bench "$@" --json "$OUT/${name}_on.json" >"$B/${name}_on.log" 2>&1
    summary "$name bench pass $pass" "off rc=$rc_off, on rc=$?"
  done
  python3 bench/compare_bench.py "$OUT/${name}_off.json" "$OUT/${name}_on.json" --labels "$label_off" "$label_on" \
    --out "$OUT/${name}_before_after.md" >/dev/null 2>&1
}
for s in $steps; do
  # STOP_AFTER=N: steps not begun by N seconds into the call are skipped (a call has 600 s).
  if [ "$SECONDS" -gt "${STOP_AFTER:-999999}" ]; then summary "$s" "skipped: ${SECONDS}s > STOP_AFTER"; continue; fi
  case $s in
    build)
      scripts/install_cutlass.sh >"$OUT/build.log" 2>&1
      # The CLI's CLI11 and nlohmann/json: the pinned Debian packages, carried as .debs (no network
      # there) and unpacked into a prefix; their CMake packages are relocatable.
      prefix=()
      if ls .deps/debs/*.deb >/dev/null 2>&1; then
        mkdir -p .deps/root && for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
        prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
      fi
      # FAST_BUILD=1: no sm_100a kernels (they cannot run on a Hopper machine; CI compiles them) and
      # no kernel benchmark (steps kernels and ncu need it), for calls that only test and bench.
      fast=(-DMXMOE_BUILD_KERNEL_BENCH=ON)
      [ "${FAST_BUILD:-0}" = 1 ] && fast=(-DMXMOE_BUILD_KERNEL_BENCH=OFF -DMXMOE_BUILD_SM100=OFF)
      cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DMXMOE_CUDA_ARCHS=90a "${fast[@]}" -DGTEST_ROOT="$PWD/.deps/gtest" \
        "${prefix[@]}" >>"$OUT/build.log" 2>&1 && cmake --build $B -j16 >>"$OUT/build.log" 2>&1
      rc=$?; summary build "rc=$rc"; [ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; } ;;
    test)
      # -LE torch: the torch step runs the python suite itself (ctest's Torch.PytestSuite is the same
      # suite: it ran 174 s of that ctest's 260 s wall time on the H200, session 17).
      (cd $B && ctest -j4 -LE torch --output-on-failure --timeout 300 >"$OUT/ctest.log" 2>&1); rc=$?
      summary ctest "rc=$rc $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
      grep -E '\(Failed\)|\(SEGFAULT\)|Timeout|\*\*\*' "$OUT/ctest.log" | head -20 ;;
    sanitize)
      # racecheck is the slower: over the default filter it passed 150 s at its 19th test of 35 on the
      # H200 (session 20; GLU backward's tile variants alone take 41 s under it).
      for tool in memcheck racecheck; do
        limit=${SANITIZE_TIMEOUT:-150}; [ $tool = racecheck ] && limit=${SANITIZE_TIMEOUT:-360}
        timeout $limit compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
          --gtest_filter="${SANITIZE_FILTER:-*QuantGpu*:*GpuQuant*:*GpuGemm*/cuda_sm90:*GpuGlu*/cuda_sm90}" >"$OUT/$tool.log" 2>&1
        rc=$?; summary $tool "rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$tool.log" | head -2 | tr '\n' ' ')"
      done ;;
    torch)
      if [ -f $B/python/libmxmoe_torch.so ]; then
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" timeout 300 \
          python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1
        summary pytest "rc=$? $(tail -1 "$OUT/pytest.log")"
      else
        summary pytest "skipped: the torch extension was not built (PyTorch not found at configure time)"
      fi ;;
    run)
      timeout 300 $B/mxmoe run --json "$OUT/run.json" >"$OUT/run.log" 2>"$OUT/run.err"; rc=$?
      summary "mxmoe run (default preset)" "rc=$rc"; tail -45 "$OUT/run.log" ;;
    kernels)
      # bench/sm90_kernels.cu on one preset (KERNELS_ARGS, default dsv3): each GEMM's layer configuration
      # beside its variants, same bytes checked.
      timeout 300 $B/mxmoe_sm90_kernels ${KERNELS_ARGS:-dsv3} >"$OUT/kernels.md" 2>&1; rc=$?
      summary "sm90 kernels" "rc=$rc"; cat "$OUT/kernels.md" ;;
    ncu)
      # ncu (--set full, source counters) on single launches of the kernel benchmark's GEMMs: NCU_SKIPS
      # lists launch indices among the grouped_gemm_kernel launches of `mxmoe_sm90_kernels
      # ${KERNELS_ARGS:-dsv3}` (each variant launches 12 times, in the order it prints them: dsv3 0 =
      # FC1 GLU, 24 = FC1 plain store, 48 = FC2 fprop, 60 = FC2 fprop CTA pairs, 84 = FC2 dgrad GLU,
      # 120 = FC2 dgrad plain store BN 256). Per launch: details page, and with NCU_SOURCE=1 (default)
      # the SASS source page. The program is stopped after the profiled launch.
      for skip in ${NCU_SKIPS:-0 24}; do
        timeout ${NCU_TIMEOUT:-150} ncu -k regex:grouped_gemm_kernel --launch-skip $skip --launch-count 1 --set full \
          --import-source yes --kill yes -f -o "$OUT/ncu_$skip" $B/mxmoe_sm90_kernels ${KERNELS_ARGS:-dsv3} >"$OUT/ncu_$skip.log" 2>&1
        rc=$?; summary "ncu launch $skip" "rc=$rc"
        ncu -i "$OUT/ncu_$skip.ncu-rep" --page details >"$OUT/ncu_${skip}_details.txt" 2>&1
        [ "${NCU_SOURCE:-1}" = 1 ] && ncu -i "$OUT/ncu_$skip.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${skip}_sass.csv" 2>&1
        rm -f "$OUT/ncu_$skip.ncu-rep"  # large; the text pages are what comes back
        grep -E "grouped_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/ncu_${skip}_details.txt" | head -12
      done ;;
    bench)
      # mxmoe bench with no --preset runs every preset but small, balanced and skewed, both recipes
      # (BENCH_ARGS narrows it, e.g. '--preset dsv3'); the torch peer then measures every split of its
      # JSON (PEER_ARGS adds options, e.g. '--no-compile'). $OUT gets bench.json (mxmoe), peer.json,
      # bench.md and bench.png; the two logs stay in $B and are shown when a side fails.
      timeout 400 $B/mxmoe bench ${BENCH_ARGS:-} --json "$OUT/bench.json" >"$B/bench.log" 2>&1; rc=$?
      summary "mxmoe bench" "rc=$rc"
      if [ $rc -ne 0 ] || [ ! -s "$OUT/bench.json" ]; then tail -30 "$B/bench.log"; continue; fi
      # The commit this tree is (written here before the call: git describe --always --dirty >
      # .scratch/commit.txt, carried): the copy on the GPU machine cannot tell.
      [ -s .scratch/commit.txt ] && export MXMOE_TREE="$(cat .scratch/commit.txt) (from .scratch/commit.txt)"
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/peer_torch.py --mxmoe-json "$OUT/bench.json" --out-dir "$OUT" \
        --warmup 3 --iters 10 --time-budget 200 ${PEER_ARGS:-} >"$B/peer.log" 2>&1; rc=$?
      summary "peer" "rc=$rc"
      [ $rc -eq 0 ] || tail -30 "$B/peer.log"
      [ -f "$OUT/bench.md" ] && sed '/^## All rows/q' "$OUT/bench.md" ;;  # header, layer vs compile, memory
    fp8)
      # The FP8-blockwise kernels (issue 10): every *Fp8* GPU test (they set MXMOE_SM90_FP8_BLOCK and
      # MXMOE_SM90_FP8_MAINLOOP themselves), memcheck over the GEMM ones, the SASS of the FP8 kernel
      # objects (QGMMA), and mxmoe bench on FP8_PRESET (default dsv3, skewed) with every GEMM on FP8
      # wgmma (default), the backward on the dequantized BF16 path (MXMOE_SM90_FP8_BLOCK=forward), and
      # the scales loaded from L2 by the consumers (MXMOE_SM90_FP8_MAINLOOP=l2).
      timeout ${FP8_TIMEOUT:-180} $B/tests/mxmoe_gpu_tests --gtest_filter='*Fp8*' >"$OUT/fp8_tests.log" 2>&1; rc=$?
      summary "fp8 tests" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/fp8_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]|Failure$|reference' "$OUT/fp8_tests.log" | head -20
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
        --gtest_filter='*GpuGemm*Fp8*/cuda_sm90' >"$OUT/fp8_memcheck.log" 2>&1; rc=$?
      summary "fp8 memcheck" "rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/fp8_memcheck.log" | tail -1)"
      for o in $(find $B -name 'gemm_m_blk.cu.o' -o -name 'gemm_k.cu.o'); do
        summary "sass $(basename $o)" "QGMMA $(cuobjdump -sass "$o" 2>/dev/null | grep -c QGMMA)"
      done
      for mode in default forward l2; do
        env $([ $mode = forward ] && echo MXMOE_SM90_FP8_BLOCK=forward) \
          $([ $mode = l2 ] && echo MXMOE_SM90_FP8_MAINLOOP=l2) \
          timeout 120 $B/mxmoe bench --preset ${FP8_PRESET:-dsv3} \
          --skew --recipe fp8_blockwise --pow2-scales >"$OUT/fp8_bench_$mode.log" 2>&1
        summary "fp8 bench ($mode)" "rc=$?"
        grep -E '^  ' "$OUT/fp8_bench_$mode.log" | cut -c1-110
      done ;;
    fp8ncu)
      # ncu --set full on the first FP8 launches of `mxmoe bench --preset FP8_PRESET --skew --recipe
      # fp8_blockwise` (launches 0 and 1 of grouped_gemm_kernel: FC1 fprop with the GLU epilogue, FC2
      # fprop): $OUT/fp8ncu_details.txt, the raw page of every collected metric (fp8ncu_raw.csv.gz:
      # tensor pipe, shared-memory wavefronts and bank reads, L2) and the SASS source counters with stall
      # reasons (fp8ncu_sass.csv.gz). FP8NCU_ENV adds variables, e.g. 'MXMOE_SM90_FP8_MAINLOOP=l2'.
      env ${FP8NCU_ENV:-} timeout ${NCU_TIMEOUT:-180} ncu -k regex:grouped_gemm_kernel --launch-skip 0 --launch-count 2 \
        --set full --import-source yes --kill yes -f -o /tmp/fp8ncu $B/mxmoe bench --preset ${FP8_PRESET:-dsv3} --skew \
        --recipe fp8_blockwise >"$OUT/fp8ncu.log" 2>&1
      summary "fp8 ncu" "rc=$?"
      ncu -i /tmp/fp8ncu.ncu-rep --page details >"$OUT/fp8ncu_details.txt" 2>&1
      ncu -i /tmp/fp8ncu.ncu-rep --page raw --csv 2>/dev/null | gzip >"$OUT/fp8ncu_raw.csv.gz"
      ncu -i /tmp/fp8ncu.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip >"$OUT/fp8ncu_sass.csv.gz"
      grep -E "grouped_gemm|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|pipeline" \
        "$OUT/fp8ncu_details.txt" | cut -c1-150 | head -24 ;;
    mxncu)
      # Where the MXFP8 FC2 dgrad loses to its BF16 twin (1.29-1.47x its time, session 18): ncu --set
      # full on the layer's GLU-backward kernel with MXFP8 A (Mx::a) and on the BF16 one (Mx::none),
      # the fourth launch of each in `mxmoe bench --preset MXNCU_PRESET (default dsv3) --recipe R`:
      # $OUT/mxncu_{mxfp8,bf16}_details.txt and the SASS source counters with stall reasons
      # (mxncu_*_sass.csv.gz).
      for r in mxfp8 bf16; do
        mx=$([ $r = mxfp8 ] && echo 1 || echo 0)
        timeout ${NCU_TIMEOUT:-150} ncu --kernel-name-base demangled -k "regex:Epi\)2, 2, \(mxmoe::cuda::sm90::Mx\)$mx" \
          --launch-skip 3 --launch-count 1 --set full --import-source yes --kill yes -f -o /tmp/mxncu_$r \
          $B/mxmoe bench --preset ${MXNCU_PRESET:-dsv3} --recipe $r >"$B/mxncu_$r.log" 2>&1
        summary "mxncu $r" "rc=$?"
        ncu -i /tmp/mxncu_$r.ncu-rep --page details >"$OUT/mxncu_${r}_details.txt" 2>&1
        ncu -i /tmp/mxncu_$r.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip >"$OUT/mxncu_${r}_sass.csv.gz"
        grep -E "grouped_gemm|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Registers Per" \
          "$OUT/mxncu_${r}_details.txt" | cut -c1-150 | head -14
      done ;;
    mxweights)
      # The MXFP8 per-call weights (session 15): the tests that run the copy route (quantize of the
      # bf16 copy alone, every GPU layer / graph / dispatch test), memcheck over the quantize and
      # mxfp8 layer tests, then `mxmoe bench --recipe mxfp8` on MXW_ARGS (default: every preset but
      # small, both splits) with the copy route, with the FP8 route (MXMOE_SM90_MX_WEIGHTS=fp8), and
      # with the copy route again: $OUT/mxw_{copy,fp8,copy2}.json.
      timeout 200 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*:*GpuLayer*:*GpuGraph*:*GpuDispatch*' \
        >"$OUT/mxw_tests.log" 2>&1; rc=$?
      summary "mxweights tests" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/mxw_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]|Failure$' "$OUT/mxw_tests.log" | head -20
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
        --gtest_filter='*GpuQuant.QuantizeExperts*:*GpuLayer*Mxfp8*/cuda_sm90' >"$OUT/mxw_memcheck.log" 2>&1; rc=$?
      summary "mxweights memcheck" "rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/mxw_memcheck.log" | tail -1)"
      for run in copy fp8 copy2; do
        env $([ $run = fp8 ] && echo MXMOE_SM90_MX_WEIGHTS=fp8) timeout 150 $B/mxmoe bench --recipe mxfp8 \
          ${MXW_ARGS:-} --json "$OUT/mxw_$run.json" >"$OUT/mxw_$run.log" 2>&1
        summary "mxfp8 bench ($run route)" "rc=$?"
      done ;;
    glubwd)
      # The MXFP8 FC2 dgrad (GLU backward) variants beside the default (in-line epilogue, 256-wide
      # where F > 128): 128-wide tiles (MXMOE_SM90_MX_GLU_BWD_N=128), epilogue warps on 192- or
      # 128-wide tiles with the A scales from L2 (MXMOE_SM90_MX_GLU_BWD=ew / ew128; session 15, not
      # yet run; GpuGluBackward.Mxfp8TileVariantsMatchCpu sets them itself). Per variant: the GLU and
      # layer GPU tests (against the CPU reference), then `mxmoe
      # bench --recipe mxfp8` on GLU_ARGS (default: every preset but small, both splits):
      # $OUT/glu_<variant>.json (fc2_dgrad rows); memcheck and racecheck on the ew GLU tests.
      for v in default n128 ew ew128; do
        envs=()
        [ $v = n128 ] && envs=(MXMOE_SM90_MX_GLU_BWD_N=128)
        [ $v = ew ] && envs=(MXMOE_SM90_MX_GLU_BWD=ew)
        [ $v = ew128 ] && envs=(MXMOE_SM90_MX_GLU_BWD=ew128)
        if [ $v != default ]; then
          env "${envs[@]}" timeout 150 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuGlu*:*GpuLayer*' \
            >"$OUT/glu_$v.log" 2>&1; rc=$?
          summary "glu bwd $v tests" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/glu_$v.log" | tr '\n' ' ')"
          grep -E '^\[  FAILED  \]' "$OUT/glu_$v.log" | head -8
        fi
        env "${envs[@]}" timeout 120 $B/mxmoe bench --recipe mxfp8 ${GLU_ARGS:-} --json "$OUT/glu_$v.json" \
          >"$OUT/glu_bench_$v.log" 2>&1
        summary "glu bwd $v bench" "rc=$? $(grep -E 'fc2_dgrad' "$OUT/glu_bench_$v.log" | awk '{printf "%s/%s %s ms; ", $1, $2, $5}')"
      done
      for tool in memcheck racecheck; do
        MXMOE_SM90_MX_GLU_BWD=ew timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
          --gtest_filter='*GpuGlu*Backward*/cuda_sm90' >"$OUT/glu_ew_$tool.log" 2>&1
        summary "glu bwd ew $tool" "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/glu_ew_$tool.log" | tail -1)"
      done ;;
    mxbf16)
      # The MXFP8 FC2 dgrad on BF16 operands (session 18; the default where K >= 4096 since session 19):
      # dY dequantized into a transient bf16 copy, the BF16 GLU-backward kernel, the quantizer on its
      # bf16 dC, or (MXMOE_SM90_MX_GLU_BWD=bf16q; session 20: correct, slower) dC quantized in
      # that kernel's epilogue (Mx::q). The GLU and layer GPU tests with MXBF16_ON (default
      # MXMOE_SM90_MX_GLU_BWD=bf16q), then `mxmoe bench --recipe mxfp8` (MXBF16_ARGS, default every
      # preset but small) under MXBF16_OFF (default: none, the default route) and MXBF16_ON twice,
      # interleaved -> $OUT/mxbf16_before_after.md (fc2_dgrad and layer rows). Session 18's comparison
      # was MXBF16_OFF=MXMOE_SM90_MX_GLU_BWD=mx MXBF16_ON=MXMOE_SM90_MX_GLU_BWD=bf16.
      on=${MXBF16_ON:-MXMOE_SM90_MX_GLU_BWD=bf16q}
      env $on timeout 150 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuGlu*:*GpuLayer*' >"$OUT/mxbf16_tests.log" 2>&1
      summary "mxbf16 tests ($on)" "rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/mxbf16_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]' "$OUT/mxbf16_tests.log" | head -8
      ab_bench mxbf16 "${MXBF16_OFF:-}" "$on" "${MXBF16_OFF:-default}" "$on" 60 --recipe mxfp8 ${MXBF16_ARGS:-}
      grep -E 'fc2_dgrad|layer_fwd_bwd' "$OUT/mxbf16_before_after.md" | head -24 ;;
    qdq)
      # The weights' bf16 copies on the hardware conversions (quantize_experts.cu dequant8_fast, the
      # default since session 20; MXMOE_QDQ_CONVERT=exact decodes every value on the exact software
      # path). The quantize and layer GPU tests (bit for bit against the CPU, NaN / Inf / subnormal
      # inputs included), memcheck over the expert-quantize ones, then `mxmoe bench --recipe mxfp8`
      # (QDQ_ARGS, default every preset but small) with exact and with the default, twice, interleaved
      # -> $OUT/qdq_before_after.md (quantize_w*_copy, prepare_weights and layer rows).
      timeout 150 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*:*GpuLayer*' >"$OUT/qdq_tests.log" 2>&1
      summary "qdq tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/qdq_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]' "$OUT/qdq_tests.log" | head -8
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
        --gtest_filter='*GpuQuant*QuantizeExperts*' >"$OUT/qdq_memcheck.log" 2>&1
      summary "qdq memcheck" "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/qdq_memcheck.log" | tail -1)"
      ab_bench qdq MXMOE_QDQ_CONVERT=exact "" "exact dequant8" "hardware cvt" 60 --recipe mxfp8 ${QDQ_ARGS:-}
      grep -E 'quantize_w|prepare_weights|layer_fwd_bwd' "$OUT/qdq_before_after.md" | head -40 ;;
    pingpong)
      # The GLU steps with pingpong consumers (session 17, not yet run when written): MXFP8 FC2 dgrad
      # (MXMOE_SM90_MX_GLU_BWD=pp) and FC1 fprop (MXMOE_SM90_MX_GLU_FWD=pp), BF16 FC2 dgrad
      # (MXMOE_SM90_FC2_DGRAD=pp) and FC1 fprop (MXMOE_SM90_FC1_FPROP=pp); the FC2 dgrads only where no
      # db1 is asked for, so the bench's problems, which have no bias, take them. Their GPU tests
      # first under a timeout (a barrier mistake hangs), then the GLU and layer GPU tests with every
      # switch on, and `mxmoe bench` (PP_ARGS, default every preset but small, both recipes) off / on
      # twice, interleaved -> $OUT/pp_before_after.md. The sanitizers are the step ppsan (a call of
      # their own: under them the tests take minutes).
      ppf='*Pingpong*/cuda_sm90'
      ppenv=(MXMOE_SM90_MX_GLU_BWD=pp MXMOE_SM90_MX_GLU_FWD=pp MXMOE_SM90_FC2_DGRAD=pp MXMOE_SM90_FC1_FPROP=pp)
      timeout 90 $B/tests/mxmoe_gpu_tests --gtest_filter="$ppf" >"$OUT/pp_test.log" 2>&1
      rc=$?; summary "pingpong tests" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/pp_test.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]|Failure' "$OUT/pp_test.log" | head -8
      if [ $rc -eq 0 ]; then
        env "${ppenv[@]}" timeout 150 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuGlu*:*GpuLayer*' \
          >"$OUT/pp_glu_layer.log" 2>&1
        summary "pingpong glu+layer tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/pp_glu_layer.log" | tr '\n' ' ')"
        ab_bench pp "" "${ppenv[*]}" "coop" "pingpong" 60 ${PP_ARGS:-}
        grep -E 'fc1_fprop|fc2_dgrad|layer_fwd_bwd' "$OUT/pp_before_after.md" | head -48
      fi ;;
    ppsan)
      # synccheck, racecheck and memcheck over the pingpong GPU tests (PPSAN_TIMEOUT each, default 170 s).
      for tool in synccheck racecheck memcheck; do
        timeout ${PPSAN_TIMEOUT:-170} compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
          --gtest_filter='*Pingpong*/cuda_sm90' >"$OUT/pp_$tool.log" 2>&1
        summary "pingpong $tool" "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/pp_$tool.log" | tail -1)"
      done ;;
    pool)
      # The library memory pool (session 16, not yet run when written): GpuMemoryPool and the layer
      # and graph GPU tests on it, then `mxmoe bench` (POOL_ARGS, default every preset, both recipes)
      # twice in the same binary, interleaved: MXMOE_POOL_RELEASE_BYTES=0 (memory returned at every
      # sync, as the default pool did before) and unset (kept). $OUT/pool_{off,on}.json and
      # pool_before_after.md (bench/compare_bench.py: "before" = off).
      timeout 200 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuMemoryPool*:*GpuLayer*:*GpuGraph*:*Captured*:*GraphReplay*' >"$OUT/pool_tests.log" 2>&1
      summary "pool tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/pool_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]' "$OUT/pool_tests.log" | head -10
      ab_bench pool MXMOE_POOL_RELEASE_BYTES=0 "" "pool off" "pool on" 120 ${POOL_ARGS:-}
      grep -E 'layer_fwd_bwd|wgrad' "$OUT/pool_before_after.md" | head -24 ;;
    dequant)
      # The bf16 dequantize on the hardware e4m3 conversion (session 16, not yet run when written): the
      # quantize/dequantize GPU tests (bit-exact against the CPU) and memcheck over them, the layer's
      # profile (qwen3-30b skew mxfp8: the four wgrad operand copies), then `mxmoe bench --recipe
      # mxfp8` (DEQUANT_ARGS, default '--preset qwen3-30b') beside the revision in .scratch/before.tar.gz
      # (git archive of the tree before it, made here and carried; scripts/bench_before_after.sh),
      # the fc*_wgrad and layer rows side by side (dequantize_x_col is new: after.json only), and ncu
      # on one dequantize launch.
      timeout 120 $B/tests/mxmoe_gpu_tests --gtest_filter='*GpuQuant*:*QuantGpu*' >"$OUT/dequant_tests.log" 2>&1; rc=$?
      summary "dequant tests" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/dequant_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]|differ' "$OUT/dequant_tests.log" | head -10
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
        --gtest_filter='*GpuQuant.Dequantize*' >"$OUT/dequant_memcheck.log" 2>&1
      summary "dequant memcheck" "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/dequant_memcheck.log" | tail -1)"
      if [ -f $B/python/libmxmoe_torch.so ]; then
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" timeout 60 \
          python3 bench/layer_profile.py --preset qwen3-30b --skew --recipe mxfp8 >"$OUT/dequant_profile.md" 2>&1
        summary "dequant profile" "rc=$? $(grep -E 'dequantize_kernel' "$OUT/dequant_profile.md" | tail -1 | cut -c1-40)"
      fi
      if [ -f .scratch/before.tar.gz ]; then
        BEFORE_TAR=.scratch/before.tar.gz timeout 400 scripts/bench_before_after.sh --recipe mxfp8 \
          ${DEQUANT_ARGS:---preset qwen3-30b} >"$OUT/dequant_before_after.log" 2>&1
        summary "dequant before/after" "rc=$?"
        grep -E 'wgrad|dequantize|layer_fwd_bwd' "$OUT/before_after.md" | head -20
      fi
      # ncu on one bf16 dequantize launch (the first of `mxmoe bench`'s qwen3-30b mxfp8 run: X
      # column-wise, row dequantize_x_col): DRAM throughput, issue activity and stall reasons.
      timeout 150 ncu -k regex:dequantize_kernel --launch-count 1 --set full --kill yes -f -o "$OUT/dequant_ncu" \
        $B/mxmoe bench --preset qwen3-30b --recipe mxfp8 --skew >"$OUT/dequant_ncu.log" 2>&1
      summary "dequant ncu" "rc=$?"
      ncu -i "$OUT/dequant_ncu.ncu-rep" --page details >"$OUT/dequant_ncu_details.txt" 2>&1 && rm -f "$OUT/dequant_ncu.ncu-rep"
      grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Achieved Occupancy" \
        "$OUT/dequant_ncu_details.txt" | head -10 ;;
    ep)
      # Expert parallelism (issue 12): python/tests/test_ep.py (on two GPUs, kind nvidia-h200-x2, the
      # NCCL equality and CUDA-graph tests; on one GPU, two gloo ranks sharing it and one-rank NCCL),
      # then bench/ep_bench.py at EP_WORLD (default: 2 where two GPUs exist, else 1, where the
      # all-to-all is a copy within the GPU: a check of the script and of the module's own overhead,
      # not the bar): dispatch + combine against a raw all_to_all_single of the same bytes, the layer
      # at EP=world against one GPU; EP_ARGS adds options. NVLink multicast off. $OUT gets
      # ep_bench.json, .md and .png.
      if [ -f $B/python/libmxmoe_torch.so ]; then
        export NCCL_NVLS_ENABLE=0
        n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        ep_world=${EP_WORLD:-$((n_gpu >= 2 ? 2 : 1))}
        summary "ep" "$n_gpu GPU(s), bench at world $ep_world"
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" timeout 300 \
          python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_ep.py >"$OUT/ep_test.log" 2>&1
        summary "ep tests" "rc=$? $(tail -1 "$OUT/ep_test.log")"
        [ -s .scratch/commit.txt ] && export MXMOE_TREE="$(cat .scratch/commit.txt) (from .scratch/commit.txt)"
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" PYTHONUNBUFFERED=1 timeout 300 \
          python3 bench/ep_bench.py --world "$ep_world" --out-dir "$OUT" ${EP_ARGS:-} >"$OUT/ep_bench.log" 2>&1
        summary "ep bench" "rc=$?"
        [ -f "$OUT/ep_bench.md" ] && head -60 "$OUT/ep_bench.md"
      else
        summary "ep" "skipped: the torch extension was not built (PyTorch not found at configure time)"
      fi ;;
    repeat)
      # The layer GPU tests again and again on fresh random inputs (REPEAT_FILTER, default the
      # fp8_blockwise layer test on cuda_sm90; REPEAT_COUNT, default 10): a case that misses its
      # tolerance now and then shows here (session 12: fp8_clamped_interleave_bias, about one run in
      # ten, before the reference backward ran from the GPU's saved C).
      timeout ${REPEAT_TIMEOUT:-150} $B/tests/mxmoe_gpu_tests --gtest_filter="${REPEAT_FILTER:-*GpuLayer.Fp8Blockwise*/cuda_sm90}" \
        --gtest_repeat=${REPEAT_COUNT:-10} >"$OUT/repeat.log" 2>&1; rc=$?
      summary "repeat x${REPEAT_COUNT:-10}" "rc=$rc ok $(grep -c '^\[       OK \]' "$OUT/repeat.log") failed $(grep -c '^\[  FAILED  \] Backends' "$OUT/repeat.log")"
      grep -E "actual:|output |Failure" "$OUT/repeat.log" | head -12 ;;
    hang)
      # Session 17: two of four full `mxmoe bench` runs stopped at their 200 s timeout, the other two
      # took seconds; the one log kept stops after "gptoss-120b skew bf16 fc2_fprop" (the bench prints
      # a row to unbuffered stderr after its op's timing, so the next op, bf16 fc2_dgrad on the
      # epilogue-warp kernel GluBwdEw, BN 192, was running). Session 12 saw a bf16 bench time out once
      # too. HANG_ARGS (default '--preset gptoss-120b --recipe bf16') HANG_COUNT times (default 12),
      # 60 s each: how many stop, and the row after which each stopped. Then compute-sanitizer
      # synccheck and racecheck over the BF16 GLU-backward GPU tests with the epilogue warps forced.
      # Session 18: the first run that passes HANG_LIMIT seconds (default 45) is diagnosed while it
      # hangs: its threads' kernel wait channels, gdb's host stacks and cuda-gdb's kernels and warps
      # (attached, where the tools exist) -> $OUT/hang_diag.txt; then it is killed and the loop stops.
      hung=0
      for i in $(seq 1 ${HANG_COUNT:-12}); do
        env MXMOE_BENCH_TRACE=1 ${HANG_ENV:-} $B/mxmoe bench ${HANG_ARGS:---preset gptoss-120b --recipe bf16} >"$B/hang_$i.log" 2>&1 &
        pid=$!; t0=$SECONDS
        while kill -0 $pid 2>/dev/null && [ $((SECONDS - t0)) -lt ${HANG_LIMIT:-45} ]; do sleep 1; done
        if kill -0 $pid 2>/dev/null; then
          hung=$((hung + 1))
          { echo "run $i still running after ${HANG_LIMIT:-45} s; last lines:"; tail -4 "$B/hang_$i.log"
            for t in /proc/$pid/task/*; do echo "$t $(cat $t/comm) $(cat $t/wchan 2>/dev/null) $(awk '{print $3}' $t/stat)"; done
            nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw --format=csv 2>&1
            command -v gdb >/dev/null && timeout 60 gdb -p $pid -batch -ex 'thread apply all bt 12' 2>&1 | grep -E '^#|^Thread' | head -80
            cg=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
            if [ -n "$cg" ]; then
              timeout 100 $cg -p $pid -batch -ex 'info cuda kernels' -ex 'info cuda blocks' -ex 'info cuda warps' \
                -ex 'bt' >"$B/cg1.txt" 2>&1; tail -60 "$B/cg1.txt"
              # Then where each role of each running block waits (source line of the inlined wait):
              # threads 0 (producer), 1, 32 and 96 (epilogue warps / loaders), 128 and 256 (the consumer
              # warp groups), 383.
              cmds=()
              for blk in $(awk '/^ *\(/ && /running/ {gsub(/[(),]/," "); print $1"-"$4}' "$B/cg1.txt"); do
                b0=${blk%-*}; b1=${blk#*-}
                for b in $(seq $b0 $b1); do
                  cmds+=(-ex "cuda block $b" -ex 'info cuda warps')
                  for t in 0 1 32 96 128 200 256 383; do cmds+=(-ex "cuda block $b thread $t" -ex 'bt 1'); done
                done
              done
              [ ${#cmds[@]} -gt 0 ] && timeout 150 $cg -p $pid -batch "${cmds[@]}" 2>&1 | grep -vE '^\[New|^\[Thread|libthread_db' | tail -200
            fi
          } >"$OUT/hang_diag.txt" 2>&1
          kill -9 $pid; wait $pid 2>/dev/null
          cp "$B/hang_$i.log" "$OUT/hang_run.log"; head -20 "$OUT/hang_diag.txt"
          break
        fi
        wait $pid; echo "run $i rc=$? $((SECONDS - t0)) s" >>"$OUT/hang.txt"
      done
      summary "hang x${HANG_COUNT:-12}" "stopped $hung"
      [ "${HANG_SAN:-1}" = 1 ] && for tool in synccheck racecheck; do
        MXMOE_SM90_FC2_DGRAD=ew timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/mxmoe_gpu_tests \
          --gtest_filter='*GpuGluBackward*/cuda_sm90:*GpuLayer.MatchesCpu*/cuda_sm90' >"$OUT/hang_$tool.log" 2>&1
        summary "hang $tool (ew forced)" "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/hang_$tool.log" | tail -1)"
      done ;;
    profile)
      # bench/layer_profile.py with the built extension: torch.profiler's per-kernel CUDA times of one
      # GroupedMLP forward+backward (no nsys there), PROFILE_ARGS (default: dsv3, skewed, fp8_blockwise)
      # -> $OUT/profile.md.
      if [ -f $B/python/libmxmoe_torch.so ]; then
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" timeout 120 \
          python3 bench/layer_profile.py ${PROFILE_ARGS:---preset dsv3 --skew --recipe fp8_blockwise} >"$OUT/profile.md" 2>&1
        summary "layer profile" "rc=$?"
        sed -n '/^### Per kernel/,$p' "$OUT/profile.md" | head -25
      else
        summary "layer profile" "skipped: the torch extension was not built (PyTorch not found at configure time)"
      fi ;;
    moe)
      # bench/moe_block_peer.py with the built extension: mxmoe permute/unpermute against PyTorch ops
      # (argsort, gathers, index_add; eager and torch.compile) and the device copy, and the whole MoE block
      # fwd+bwd (mxmoe_torch.MoE bf16/mxfp8 against a PyTorch BF16 block, eager and torch.compile), every
      # preset (MOE_ARGS adds options, e.g. '--presets dsv3,mixtral' or '--parts block'). Once MOE_BUDGET
      # seconds are spent, later presets skip torch.compile. $OUT gets moe_block.json, .md and .png; the
      # log stays in $B and is shown when the run fails.
      if [ -f $B/python/libmxmoe_torch.so ]; then
        [ -s .scratch/commit.txt ] && export MXMOE_TREE="$(cat .scratch/commit.txt) (from .scratch/commit.txt)"
        PYTHONPATH=python MXMOE_TORCH_LIBRARY="$PWD/$B/python/libmxmoe_torch.so" PYTHONUNBUFFERED=1 \
          timeout ${MOE_TIMEOUT:-480} python3 bench/moe_block_peer.py --out-dir "$OUT" --warmup 3 --iters 10 \
          --time-budget ${MOE_BUDGET:-300} ${MOE_ARGS:-} >"$B/moe_block.log" 2>&1; rc=$?
        summary "moe block peer" "rc=$rc"
        [ $rc -eq 0 ] || tail -30 "$B/moe_block.log"
        [ -f "$OUT/moe_block.md" ] && sed '/^### Every permute/q' "$OUT/moe_block.md" \
          && sed -n '/^## The MoE block/,/^### Every block cell/p' "$OUT/moe_block.md"
      else
        summary "moe block peer" "skipped: the torch extension was not built (PyTorch not found at configure time)"
      fi ;;
  esac
done
cat "$OUT/summary.txt"
