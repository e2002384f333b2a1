#!/usr/bin/env python3
"""Library memory of one MXFP8 forward+backward (weights quantized in the call), step by step, as
`mxmoe bench` measures its peak (bench.cpp: the resident x, dY, W1, W2, y, dX, probs, dprobs and
bf16 dW1, dW2, plus the high watermark of the stream-ordered pool the library allocates from).

Dataflows, every preset (tools/mxmoe/presets.cpp):
  - `fp8 route`: FP8 copies of W1 and W2 held for the whole call, each GEMM dequantizing its own into
    a transient bf16 buffer; everything freed at the end of the call (mxmoe up to session 14;
    MXMOE_SM90_MX_WEIGHTS=fp8 since). Checked against session 14's measured peaks.
  - `copy route`: session 15 (src/api/grouped_mlp.cpp): each weight quantized straight into the bf16
    copy its GEMM reads, made before its quantize step, freed after its GEMM; X's and dY's row-wise
    copies, C and dC's row-wise copy freed after their last reader.
    Since session 19 FC2 dgrad where H >= 4096 also holds dY's bf16 dequantized copy (T x H x 2: it
    runs on BF16 operands there) and the bf16 dC the quantizer reads (T x 2F x 2; not with
    MXMOE_SM90_MX_GLU_BWD=bf16q, whose kernel quantizes dC itself: `--bf16q`).
  - `floor`: what the issue's dataflow needs at FC2 dgrad whatever the kernels do (saved C bf16, X and
    A column-wise; dY row-wise, read there; dC row- and column-wise, written there) plus W2 in FP8 (a
    kernel converting FP8 weights in shared memory needs no bf16 copy). dY's column-wise copy is left
    out: it could be quantized after FC2 dgrad.
  - `prepared`: weights prepared before the call (prepare_weights; in the peak, as `mxmoe bench`
    counts them), up to session 14 (FP8 copies of both orientations plus their bf16 copies) and since
    session 15 (the bf16 copies alone on cuda_sm90). Checked against session 14's measured peaks.
Ratios are against the eager BF16 layer's peak measured in the same session-14 run.

    python3 bench/memory_model.py [--bf16q] [--chunks N]
"""
MIB = 1 / 2**20
# H, F, E, T (tools/mxmoe/presets.cpp)
PRESETS = {"dsv3": (7168, 2048, 32, 32768), "qwen3-30b": (2048, 768, 128, 65536),
           "gptoss-120b": (2880, 2880, 32, 32768), "mixtral": (4096, 14336, 8, 16384)}
# bench/results/2026-12-03-h200-sm90-s14-peer.md: eager BF16 peak, mxmoe mxfp8 per-call peak (MiB)
EAGER = {"dsv3": 7424, "qwen3-30b": 3649, "gptoss-120b": 6165, "mixtral": 10240}
MEASURED_FP8_ROUTE = {"dsv3": 11627.8, "qwen3-30b": 5529.1, "gptoss-120b": 6658.6, "mixtral": 11316.7}
# The same run, prepared weights (made before the measured call, so in the peak)
MEASURED_PREPARED = {"dsv3": 17045.8, "qwen3-30b": 7915.1, "gptoss-120b": 9647.4, "mixtral": 16414.7}


def fp8(n):
    """MiB of n e4m3 values with one e8m0 scale per 32 (padding ignored)."""
    return n * (1 + 1 / 32) * MIB


def bf16(n):
    return 2 * n * MIB


def model(H, F, E, T, bf16q=False, chunks=1):
    """chunks > 1: the copy route's weight copies made and consumed in that many expert chunks, and dY's
    column-wise copy quantized after FC2 dgrad (a proposal, session 19: not built)."""
    W1, W2 = E * 2 * F * H, E * H * F
    # session 19: FC2 dgrad's transient bf16 dY and (unless bf16q) staged bf16 dC where H >= 4096
    dgrad_extra = (bf16(T * H) + (0 if bf16q else bf16(T * 2 * F))) if H >= 4096 else 0
    resident = bf16(T * H) * 4 + bf16(W1 + W2) * 2 + 2 * 4 * T * MIB  # x dy y dx, W dW, probs dprobs
    c, x_row, x_col, a_row, a_col = bf16(T * 2 * F), fp8(T * H), fp8(T * H), fp8(T * F), fp8(T * F)
    dy_row, dy_col, dc_row, dc_col = fp8(T * H), fp8(T * H), fp8(T * 2 * F), fp8(T * 2 * F)
    saved = c + x_col + a_col
    wgrad_tmp = max(bf16(T * H) + bf16(T * F), bf16(T * 2 * F) + bf16(T * H))  # sm90 gemm_k's bf16 operands
    fwd_all = c + x_row + x_col + a_row + a_col
    fp8_route = {
        "fc1 fprop": fwd_all + fp8(W1) + fp8(W2) + bf16(W1),
        "fc2 fprop": fwd_all + fp8(W1) + fp8(W2) + bf16(W2),
        "fc2 dgrad": saved + dy_row + dy_col + dc_row + dc_col + fp8(W1) + fp8(W2) + bf16(W2),
        "fc1 dgrad": saved + dy_row + dy_col + dc_row + dc_col + fp8(W1) + fp8(W2) + bf16(W1),
        "wgrads": saved - c + dy_row + dy_col + dc_row + dc_col + fp8(W1) + fp8(W2) + wgrad_tmp,
    }
    n = max(1, min(chunks, E))
    late_dy_col = dy_col if n == 1 else 0  # chunked: dY's column-wise copy made after FC2 dgrad
    copy_route = {
        "fc1 fprop": fwd_all + bf16(W1) / n,
        "fc2 fprop": fwd_all - x_row + bf16(W2) / n,
        "fc2 dgrad": saved + dy_row + late_dy_col + dc_row + dc_col + bf16(W2) / n + dgrad_extra,
        "fc1 dgrad": saved - c + dy_col + dc_row + dc_col + bf16(W1) / n,
        "wgrads": saved - c + dy_col + dc_col + wgrad_tmp,
    }
    floor = saved + dy_row + dc_row + dc_col + fp8(W2)
    # Prepared weights (no weight work in the call): up to session 14 the FP8 copies of both weights in
    # both orientations and their bf16 copies, and no buffer freed before the call's end; since
    # session 15 the bf16 copies alone and the frees above.
    prepared_old = 2 * (fp8(W1) + fp8(W2)) + 2 * bf16(W1 + W2) + max(
        fwd_all, saved + dy_row + dy_col + dc_row + dc_col, saved - c + dy_row + dy_col + dc_row + dc_col + wgrad_tmp)
    prepared_new = 2 * bf16(W1 + W2) + max(
        fwd_all, saved + dy_row + dy_col + dc_row + dc_col + dgrad_extra, saved - c + dy_col + dc_col + wgrad_tmp)
    return resident, fp8_route, copy_route, floor, prepared_old, prepared_new


def main():
    import sys
    bf16q = "--bf16q" in sys.argv[1:]
    chunks = int(sys.argv[sys.argv.index("--chunks") + 1]) if "--chunks" in sys.argv[1:] else 1
    print("| preset | eager BF16 peak | fp8 route: model (measured) | copy route: model, ratio, peak step | "
          "floor at FC2 dgrad, ratio | prepared, up to session 14: model (measured) | prepared, session 15: model, ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, shape in PRESETS.items():
        resident, old, new, floor, prep_old, prep_new = model(*shape, bf16q=bf16q, chunks=chunks)
        o = resident + max(old.values())
        step = max(new, key=new.get)
        n = resident + new[step]
        f = resident + floor
        po, pn = resident + prep_old, resident + prep_new
        print(f"| {name} | {EAGER[name]} | {o:.0f} ({MEASURED_FP8_ROUTE[name]:.0f}) | {n:.0f}, {n / EAGER[name]:.2f}x, "
              f"{step} | {f:.0f}, {f / EAGER[name]:.2f}x | {po:.0f} ({MEASURED_PREPARED[name]:.0f}) | "
              f"{pn:.0f}, {pn / EAGER[name]:.2f}x |")


if __name__ == "__main__":
    main()
