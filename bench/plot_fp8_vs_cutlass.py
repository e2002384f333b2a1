"""Chart of a session-12 FP8-vs-CUTLASS table (bench/results/2026-12-03-h200-sm90-s12-fp8-vs-cutlass.md): mxmoe
step time / best CUTLASS plain-GEMM time per preset, split and GEMM.

    python3 bench/plot_fp8_vs_cutlass.py OUT.png [TABLE.md]
"""
import sys
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = []
for l in open(sys.argv[2] if len(sys.argv) > 2 else "bench/results/2026-12-03-h200-sm90-s12-fp8-vs-cutlass.md"):
    p = [x.strip() for x in l.strip().strip("|").split("|")]
    if len(p) == 11 and p[0] != "preset" and not p[0].startswith("---"):
        rows.append((p[0], p[1], p[2], float(p[10])))
gemms = ["fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_dgrad"]
labels = [f"{r[0]}\n{r[1][:4]}" for r in rows if r[2] == "fc1_fprop"]
fig, ax = plt.subplots(figsize=(12, 4.5))
w = 0.2
for i, g in enumerate(gemms):
    v = [r[3] for r in rows if r[2] == g]
    ax.bar([x + (i - 1.5) * w for x in range(len(v))], v, w, label=g + (" (store)" if g in ("fc2_fprop", "fc1_dgrad") else " (GLU epilogue + quantize)"))
ax.axhline(1.0, color="k", lw=0.8)
ax.set_xticks(range(len(labels))); ax.set_xticklabels(labels, fontsize=8)
ax.set_ylabel("mxmoe step ms / best CUTLASS plain GEMM ms")
ax.set_title("FP8 blockwise m-grouped GEMMs, H200: mxmoe layer steps vs CUTLASS 4.2 sm90 blockwise grouped GEMM (lower is better)")
ax.legend(fontsize=8)
fig.tight_layout(); fig.savefig(sys.argv[1], dpi=110)
