#!/usr/bin/env python3
"""Peer measurements beside `mxmoe bench`, on the same GPU in the same session.

Reads the JSON that `mxmoe bench --json FILE` wrote (its rows and the exact token split of every
preset/split), times what a Hopper user runs today on the same shapes and splits:
  - torch._grouped_mm BF16 (device-side int32 offsets) for each GEMM of the layer:
    FC1/FC2 fprop, FC2/FC1 dgrad (m-grouped), FC2/FC1 wgrad (k-grouped);
  - the eager-PyTorch BF16 layer forward+backward (grouped_mm + SwiGLU*prob, autograd),
and prints a markdown table of mxmoe's time against the peer's, with ratios (peer_ms / mxmoe_ms:
> 1 means mxmoe is faster).

    python3 bench/peer_torch.py --mxmoe-json out/bench.json [--out results.md]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def peer_rows(split):
    H, Fd, E, T = split["hidden"], split["ffn"], split["experts"], split["tokens"]
    sizes = list(split["sizes"])
    # torch._grouped_mm needs every group's byte extent along a dynamic dimension to be a multiple of
    # 16 (8 bf16 tokens) for the k-grouped case: round the peer's split down to 16-token multiples and
    # give the remainder to the largest expert (same T). mxmoe runs the exact split.
    rounded = [s // 16 * 16 for s in sizes]
    rounded[max(range(len(sizes)), key=lambda e: sizes[e])] += sum(sizes) - sum(rounded)
    sizes = torch.tensor(rounded, dtype=torch.int64)
    offs = torch.cumsum(sizes, 0).to(torch.int32).cuda()  # end offsets, as _grouped_mm wants
    dev = "cuda"
    bf = torch.bfloat16
    x = torch.randn(T, H, device=dev, dtype=bf)
    dy = torch.randn(T, H, device=dev, dtype=bf)
    w1 = torch.randn(E, 2 * Fd, H, device=dev, dtype=bf) / H**0.5
    w2 = torch.randn(E, H, Fd, device=dev, dtype=bf) / Fd**0.5
    a = torch.randn(T, Fd, device=dev, dtype=bf)
    dc = torch.randn(T, 2 * Fd, device=dev, dtype=bf)
    probs = torch.rand(T, device=dev, dtype=torch.float32)
    gm = torch._grouped_mm
    w1t = w1.transpose(-2, -1)  # [E, H, 2F]
    w2t = w2.transpose(-2, -1)  # [E, F, H]
    out = {}
    out["fc1_fprop"] = median_ms(lambda: gm(x, w1t, offs=offs))
    out["fc2_fprop"] = median_ms(lambda: gm(a, w2t, offs=offs))
    out["fc2_dgrad"] = median_ms(lambda: gm(dy, w2, offs=offs))
    out["fc1_dgrad"] = median_ms(lambda: gm(dc, w1, offs=offs))
    # k-grouped: [H, T] x [T, F] per expert -> [E, H, F]
    dyt = dy.t()  # column-major [H, T] view, as autograd passes it
    dct = dc.t()
    out["fc2_wgrad"] = median_ms(lambda: gm(dyt, a, offs=offs))
    out["fc1_wgrad"] = median_ms(lambda: gm(dct, x, offs=offs))

    xr = x.clone().requires_grad_(True)
    w1r = w1.clone().requires_grad_(True)
    w2r = w2.clone().requires_grad_(True)
    pr = probs.clone().requires_grad_(True)

    def layer():
        c = gm(xr, w1r.transpose(-2, -1), offs=offs)
        ga, lin = c[:, :Fd], c[:, Fd:]
        h = (F.silu(ga.float()) * lin.float() * pr[:, None]).to(bf)
        return gm(h, w2r.transpose(-2, -1), offs=offs)

    out["layer_fwd"] = median_ms(lambda: layer())

    def fwd_bwd():
        y = layer()
        y.backward(dy)

    out["layer_fwd_bwd"] = median_ms(fwd_bwd)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mxmoe-json", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with open(args.mxmoe_json) as f:
        ours = json.load(f)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    flops = {"fc1_fprop": 4, "fc2_fprop": 2, "fc2_dgrad": 2, "fc1_dgrad": 4, "fc2_wgrad": 2, "fc1_wgrad": 4,
             "layer_fwd": 6, "layer_fwd_bwd": 18}
    lines = ["| preset | split | op | mxmoe recipe | mxmoe ms | mxmoe TFLOP/s | torch bf16 ms | torch TFLOP/s | torch/mxmoe |",
             "|---|---|---|---|---|---|---|---|---|"]
    for split in ours["splits"]:
        peer = peer_rows(split)
        thf = split["tokens"] * split["hidden"] * split["ffn"]
        for row in ours["rows"]:
            if row["preset"] != split["preset"] or row["split"] != split["split"] or row["op"] not in peer:
                continue
            p_ms = peer[row["op"]]
            tf = flops[row["op"]] * thf
            lines.append(f"| {row['preset']} | {row['split']} | {row['op']} | {row['recipe']} | {row['ms']:.3f} | "
                         f"{tf / row['ms'] * 1e-9:.0f} | {p_ms:.3f} | {tf / p_ms * 1e-9:.0f} | {p_ms / row['ms']:.2f} |")
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
