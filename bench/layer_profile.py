#!/usr/bin/env python3
"""Per-kernel CUDA time of one mxmoe_torch.GroupedMLP forward+backward (torch.profiler, CUPTI): where a
layer's time goes, kernel by kernel, in launch order and summed per kernel name. The GPU machine has
no nsys; this needs only the built extension (`scripts/gpu_check.sh build`, then as below).

    PYTHONPATH=python MXMOE_TORCH_LIBRARY=build-gpu/python/libmxmoe_torch.so \\
        python3 bench/layer_profile.py --preset dsv3 --recipe fp8_blockwise [--skew] [--no-cache]
        python3 bench/layer_profile.py --preset dsv3 --peer compile     # the peer's BF16 layer instead

The weights are prepared once (the module's cache) unless --no-cache; parameter grads are set to
None before the profiled step, so no gradient accumulation kernels are counted. Timings are of one
step on a warm GPU (clocks near their peak), not the sustained, power-capped state `mxmoe bench`
measures: compare kernels within one profile.
"""
import argparse
import collections
import os
import sys

PRESETS = {  # hidden, ffn, experts, tokens, activation, glu_layout (tools/mxmoe/presets.cpp)
    "small": (512, 256, 8, 1024, "swiglu", "halves"),
    "dsv3": (7168, 2048, 32, 32768, "swiglu", "halves"),
    "qwen3-30b": (2048, 768, 128, 65536, "swiglu", "halves"),
    "gptoss-120b": (2880, 2880, 32, 32768, "clamped_swiglu", "interleave32"),
    "mixtral": (4096, 14336, 8, 16384, "swiglu", "halves"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="dsv3", choices=sorted(PRESETS))
    ap.add_argument("--recipe", default="fp8_blockwise",
                    choices=["bf16", "mxfp8", "fp8_blockwise", "fp8_blockwise_pow2"])
    ap.add_argument("--skew", action="store_true", help="skewed split (cubed uniform weights), else balanced")
    ap.add_argument("--no-cache", action="store_true", help="quantize the weights in every call")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peer", choices=["eager", "compile"], default=None,
                    help="profile bench/peer_torch.py's BF16 layer (torch._grouped_mm, eager or torch.compile) "
                         "on the same split, its groups rounded to 16 rows as in the peer benchmark")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("layer_profile: no CUDA device (it profiles GPU kernels)", file=sys.stderr)
        return 2
    from torch.profiler import ProfilerActivity, profile

    H, F, E, T, act, layout = PRESETS[args.preset]
    torch.manual_seed(0)
    dev = "cuda"
    w = torch.rand(E, device=dev) ** 3 + 0.01 if args.skew else torch.ones(E, device=dev)
    counts = torch.floor(w / w.sum() * T).to(torch.int64)
    counts[0] += T - counts.sum()
    if args.peer:
        step, title = peer_step(torch, args, H, F, E, T, act, layout, counts, dev)
    else:
        step, title = mxmoe_step(torch, args, H, F, E, T, act, layout, counts, dev)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(e, "device_time_total", None)
            rows.append((e.name, us if us is not None else e.cuda_time_total))
    total = sum(t for _, t in rows)
    split = "skew" if args.skew else "balanced"
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MXMOE_SM90_"))
    print(f"## {args.preset} {split} {title}{' ' + env if env else ''}: {len(rows)} kernels, "
          f"{total / 1000:.3f} ms on the GPU")
    print_tables(rows, total)
    return 0


def peer_step(torch, args, H, F, E, T, act, layout, counts, dev):
    """One fwd+bwd of bench/peer_torch.py's BF16 layer (eager or torch.compile)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import peer_torch
    sizes = peer_torch.rounded_sizes([int(c) for c in counts.tolist()])
    offs = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32).to(dev)
    fn = peer_torch.make_layer(F, act, layout)
    if args.peer == "compile":
        fn = torch.compile(fn, dynamic=False)
    x = (torch.randn(T, H, device=dev) * 0.5).to(torch.bfloat16).requires_grad_(True)
    w1 = (torch.randn(E, 2 * F, H, device=dev) * H ** -0.5).to(torch.bfloat16).requires_grad_(True)
    w2 = (torch.randn(E, H, F, device=dev) * F ** -0.5).to(torch.bfloat16).requires_grad_(True)
    probs = torch.rand(T, device=dev, requires_grad=True)
    dy = torch.randn(T, H, device=dev, dtype=torch.bfloat16) * 0.01
    inputs = (x, w1, w2, probs)

    def step():
        y = fn(x, w1, w2, probs, offs)
        return torch.autograd.grad(y, inputs, dy)

    return step, f"peer BF16 layer ({'torch.compile' if args.peer == 'compile' else 'eager'}, groups rounded to 16)"


def mxmoe_step(torch, args, H, F, E, T, act, layout, counts, dev):
    import mxmoe_torch as mx
    m = mx.GroupedMLP(H, F, E, activation=act, glu_layout=layout, recipe=args.recipe,
                      cache_prepared_weights=not args.no_cache).to(dev)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(T, device=dev, requires_grad=True)
    offsets = mx.offsets_from_counts(counts.to(torch.int32))
    dy = torch.randn(T, H, device=dev, dtype=torch.bfloat16) * 0.01

    def step():
        for t in (x, probs, *m.parameters()):
            t.grad = None
        m(x, offsets, probs).backward(dy)

    return step, f"{args.recipe}{' (weights quantized per call)' if args.no_cache else ''}"


def print_tables(rows, total):
    def short(name):
        name = name.replace("mxmoe::cuda::", "").replace("(anonymous namespace)::", "")
        return name[:150]

    print("\n### In launch order\n\n| ms | kernel |\n|---|---|")
    for n, t in rows:
        print(f"| {t / 1000:.3f} | `{short(n)}` |")
    agg = collections.defaultdict(lambda: [0.0, 0])
    for n, t in rows:
        agg[short(n)][0] += t
        agg[short(n)][1] += 1
    print("\n### Per kernel, most time first\n\n| ms | share | launches | kernel |\n|---|---|---|---|")
    for n, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"| {t / 1000:.3f} | {100 * t / max(total, 1e-9):.1f}% | {c} | `{n}` |")


if __name__ == "__main__":
    sys.exit(main())
