#!/usr/bin/env python3
"""Expert parallelism over torch.distributed, same run (issue 12): the dispatch + combine of
mxmoe_torch.ExpertParallelMLP against a raw all_to_all_single of the same bytes, and the layer at
EP = --world against one GPU.

Part A, every preset, balanced and skewed router ids, rows sent as bf16 or as row-wise MXFP8
(fp8_dispatch), without and with a capacity (static splits): each rank brings T_rank = T / top_k /
world tokens (T the preset's routed rows) and holds E / world of the preset's E experts. Timed:
  - dispatch + combine: mxmoe_torch.expert_parallel_mlp with the local GroupedMLP replaced by an
    identity (IdentityExperts): permute, the count exchange and its host read, the row exchange
    (bf16: the rows' all-to-all, then the probabilities'; MXFP8: quantize, pack each row's E4M3
    bytes, scale bytes and probability into one uint8 row, one all-to-all, regroup the bytes,
    dequantize), regroup, inverse regroup, the return all-to-all, unpermute: the module's own code,
    minus the experts;
  - raw: torch.distributed.all_to_all_single of the same row payload with the same split sizes, one
    call a direction (bf16 rows; MXFP8: the module's packed rows, H + roundup(H/32, 4) + 4 bytes),
    then the return (bf16 rows, reverse splits);
  - the layer's collectives: the all_to_all_single calls the module makes (counts, rows, bf16:
    probabilities, return), same tensors, nothing else.
  GB/s = the row payload a rank sends + receives (both directions, its own block included) / the
  step time, averaged over the ranks; the step time of a sample is the slowest rank's. Bar: dispatch
  + combine >= 80% of the raw all-to-all's GB/s.
Part B, one preset (--block-preset): ExpertParallelMLP forward and forward+backward at EP = world
against permute -> GroupedMLP (all E experts) -> unpermute on rank 0 alone with the global batch
(every rank's tokens), recipes bf16 and mxfp8 (mxfp8: fp8_dispatch, weights prepared every call on
both sides); ms, tokens/s and 1-GPU ms / EP ms.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=python MXMOE_TORCH_LIBRARY=build-gpu/python/libmxmoe_torch.so \\
        python3 bench/ep_bench.py --out-dir out          # nvidia-h200-x2: ep_bench.json, .md, .png
    ... bench/ep_bench.py --device cpu --backend gloo --smoke --out-dir /tmp/ep   # tiny sizes, any machine

The script spawns --world processes itself (rank r on cuda:r with NCCL, or on the CPU with gloo) and
sets NCCL_NVLS_ENABLE=0 where it is not set (NVLink multicast off; the report says which). Presets:
bench/moe_block_peer.py's (tools/mxmoe/presets.cpp's H, F, E, T with the models' top-k).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import moe_block_peer as mbp  # noqa: E402  (PRESETS, make_ids, draw_fallback; no torch at import)
import peer_torch as pt  # noqa: E402  (PRESET_GLU, _git_describe, _device_text)

PRESETS = mbp.PRESETS
SMOKE = {"hidden": 64, "ffn": 64, "experts_per_rank": 2, "tokens_per_rank": 24, "max_top_k": 2}
SPLITS = ("balanced", "skew")
DISPATCHES = ("bf16", "mxfp8")  # how the dispatched rows travel: bf16, or row-wise MXFP8 (fp8_dispatch)
RECIPES = ("bf16", "mxfp8")
BAR = 80.0             # % of the raw all-to-all's GB/s, dispatch + combine
MX_BLOCK = 32          # values per E8M0 scale (docs/numerics.md)
SCALE_COL_ALIGN = 4    # compact row-wise scales are padded to a multiple of 4 bytes a row (_ep._scale_cols)
COUNT_BYTES = 8        # int64 per-expert counts
PROB_BYTES = 4         # float32 probabilities
ROW_CELLS = [("raw", "raw all_to_all_single"), ("dc", "dispatch + combine"),
             ("calls", "the layer's collectives")]


# ----------------------------------------------------------------------------------------------
# Bytes (pure Python; python/tests/test_ep_bench.py checks them by hand)
# ----------------------------------------------------------------------------------------------

def scale_cols(hidden):
    """Bytes of one row's compact E8M0 scales: roundup(H / 32, 4)."""
    return -(-(hidden // MX_BLOCK) // SCALE_COL_ALIGN) * SCALE_COL_ALIGN


def dispatch_row_bytes(hidden, fp8):
    """Bytes of one dispatched row as its all-to-all moves it: 2H in bf16 (the probability travels in a
    call of its own); in MXFP8 one packed row, H (E4M3) + roundup(H/32, 4) (E8M0) + 4 (its float32
    probability) (_ep._packed_row_bytes)."""
    return hidden + scale_cols(hidden) + PROB_BYTES if fp8 else 2 * hidden


def combine_row_bytes(hidden):
    """Bytes of one returned row: the experts' output comes back in bf16."""
    return 2 * hidden


def payload_bytes(n_send, n_recv, hidden, fp8):
    """Row bytes a rank sends + receives in one dispatch + combine: it dispatches n_send rows and
    receives n_recv, then sends the n_recv results back and receives its n_send."""
    return (n_send + n_recv) * (dispatch_row_bytes(hidden, fp8) + combine_row_bytes(hidden))


def off_rank_bytes(n_send, n_recv, n_self, hidden, fp8):
    """payload_bytes without the n_self rows a rank sends to itself (counted going and coming back)."""
    return payload_bytes(n_send - n_self, n_recv - n_self, hidden, fp8)


def overhead_bytes(n_send, n_recv, experts, capacity, fp8=False):
    """What dispatch + combine move beyond the row payload: with bf16 rows the float32 probabilities of
    every dispatched row (MXFP8 rows carry theirs, in dispatch_row_bytes) and, without a capacity, the
    int64 counts of every expert (E sent, E received)."""
    return (0 if fp8 else (n_send + n_recv) * PROB_BYTES) + (2 * experts * COUNT_BYTES if capacity < 0 else 0)


def gbps(nbytes, ms):
    """GB/s (10^9 bytes a second) of nbytes in ms milliseconds."""
    return nbytes / ms * 1e-6


# ----------------------------------------------------------------------------------------------
# Shapes and routing
# ----------------------------------------------------------------------------------------------

def preset_shape(name, smoke, world):
    p = PRESETS[name]
    act, layout = pt.PRESET_GLU[name]
    if smoke:
        E = SMOKE["experts_per_rank"] * world
        return {"preset": name, "hidden": SMOKE["hidden"], "ffn": SMOKE["ffn"], "experts": E,
                "top_k": min(p["top_k"], SMOKE["max_top_k"]), "tokens": SMOKE["tokens_per_rank"],
                "activation": act, "glu_layout": layout}
    if p["experts"] % world or p["routed"] % (p["top_k"] * world):
        raise ValueError(f"preset {name}: E={p['experts']} and T/top_k={p['routed'] // p['top_k']} must divide "
                         f"by --world {world}")
    return {"preset": name, "hidden": p["hidden"], "ffn": p["ffn"], "experts": p["experts"], "top_k": p["top_k"],
            "tokens": p["routed"] // p["top_k"] // world, "activation": act, "glu_layout": layout}


def make_ids(N, K, E, split, seed, popularity_seed, zipf):
    """Router ids [N, K] int64 (CPU), K distinct experts per token. balanced: moe_block_peer.make_ids
    (exactly N*K/E slots per expert). skew: expert weights 1 / (i+1)^zipf over a permutation of the E
    experts drawn from popularity_seed (the same on every rank, so some ranks' experts are hot), K
    experts per token drawn without replacement by torch.multinomial."""
    import torch
    if split == "balanced":
        return mbp.make_ids(N, K, E, "balanced", seed)
    order = torch.randperm(E, generator=torch.Generator().manual_seed(popularity_seed))
    w = torch.empty(E, dtype=torch.float64)
    w[order] = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** zipf
    return torch.multinomial(w.expand(N, E), K, replacement=False, generator=torch.Generator().manual_seed(seed))


def record_all_to_all(fn):
    """fn()'s result and the [bytes sent, bytes received] of every torch.distributed.all_to_all_single
    call it makes, in order."""
    import torch.distributed as dist
    real, calls = dist.all_to_all_single, []

    def recording(out, inp, *args, **kwargs):
        calls.append([inp.numel() * inp.element_size(), out.numel() * out.element_size()])
        return real(out, inp, *args, **kwargs)

    dist.all_to_all_single = recording
    try:
        return fn(), calls
    finally:
        dist.all_to_all_single = real


class IdentityExperts:
    """A stand-in for the local GroupedMLP of expert_parallel_mlp (which reads .recipe and .experts and
    calls layer(x, offsets, probs)): returns its rows unchanged, so only dispatch + combine is timed."""

    def __init__(self, experts, recipe):
        self.experts, self.recipe = experts, recipe

    def __call__(self, x, offsets, probs):
        return x


# ----------------------------------------------------------------------------------------------
# Timing across ranks
# ----------------------------------------------------------------------------------------------

def _err(e):
    return f"{type(e).__name__}: {e}".strip()


class RankTimer:
    """Every sample starts after a barrier (a one-element all_reduce, then a device sync) and is
    timed by CUDA events (time.perf_counter on the CPU) around `inner` calls; the step time of a
    sample is the slowest rank's (an all_reduce MAX of the samples). Median of `iters` samples after
    `warmup` calls. local() times one rank alone, no barrier."""

    def __init__(self, dev):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.dev = torch, dist, dev
        self.cuda = dev.type == "cuda"
        self.one = torch.zeros(1, device=dev)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def barrier(self):
        self.dist.all_reduce(self.one)
        self.sync()

    def _sample(self, fn, inner):
        torch = self.torch
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) * 1e3 / inner

    def __call__(self, fn, warmup, iters, inner=1):
        for _ in range(warmup):
            fn()
        self.sync()
        own = []
        for _ in range(iters):
            self.barrier()
            own.append(self._sample(fn, inner))
        step = self.torch.tensor(own, dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(step, op=self.dist.ReduceOp.MAX)
        step = step.tolist()
        return {"ms": statistics.median(step), "min_ms": min(step), "max_ms": max(step),
                "rank_ms": statistics.median(own)}

    def local(self, fn, warmup, iters, inner=1):
        for _ in range(warmup):
            fn()
        self.sync()
        t = [self._sample(fn, inner) for _ in range(iters)]
        return {"ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}

    def cell(self, fn):
        """fn() -> dict, or {"error": ...}; then every rank learns whether any failed (a rank whose own
        cell ran gets "error": "failed on another rank"), so no rank goes on alone."""
        try:
            out, ok = fn(), True
        except Exception as e:  # noqa: BLE001 - one failing cell must not stop the benchmark
            out, ok = {"error": _err(e), "trace": traceback.format_exc(limit=4)}, False
            try:
                self.sync()
            except Exception:  # noqa: BLE001
                pass
        failed = self.torch.tensor([0.0 if ok else 1.0], device=self.dev)
        self.dist.all_reduce(failed)
        if ok and failed.item() > 0:
            out = {"error": f"failed on {int(failed.item())} other rank(s)", "own": out}
        return out


# ----------------------------------------------------------------------------------------------
# Part A: dispatch + combine against the raw all-to-all
# ----------------------------------------------------------------------------------------------

def part_a(shape, split, args, dev, timer, rank, world):
    import torch
    import torch.distributed as dist
    from mxmoe_torch import expert_parallel_mlp, permute
    from mxmoe_torch._moe import expert_capacity
    ops = torch.ops.mxmoe
    T, K, H, E = shape["tokens"], shape["top_k"], shape["hidden"], shape["experts"]
    L = E // world
    base = args.seed + 1000 * sorted(PRESETS).index(shape["preset"]) + 100 * SPLITS.index(split)
    ids_cpu = make_ids(T, K, E, split, base + rank, base, args.zipf)
    counts_cpu = torch.bincount(ids_cpu.reshape(-1), minlength=E)
    g = torch.Generator(device=dev).manual_seed(base + 17 * rank + 3)
    x = torch.randn(T, H, generator=g, device=dev).to(torch.bfloat16)
    probs = torch.rand(T, K, generator=g, device=dev)
    probs = probs / probs.sum(-1, keepdim=True)
    ids = ids_cpu.to(dev)
    counts = counts_cpu.to(dev)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # the splits of the no-capacity cells, once
    send_rows = counts.reshape(world, L).sum(1).tolist()
    recv_rows = recv_counts.reshape(world, L).sum(1).tolist()
    W, I, inner = args.warmup, args.iters, args.inner
    recs = []
    for dispatch in args.dispatches:
        fp8 = dispatch == "mxfp8"
        for factor in (None, args.capacity_factor):
            C = expert_capacity(factor, T, K, E)
            if C >= 0:
                n_send = n_recv = E * C
                n_self = L * C
                s_splits = r_splits = None
            else:
                n_send, n_recv, n_self = sum(send_rows), sum(recv_rows), send_rows[rank]
                s_splits, r_splits = send_rows, recv_rows
            rec = {"preset": shape["preset"], "split": split, "dispatch": dispatch, "capacity_factor": factor,
                   "capacity": C, "tokens": T, "top_k": K, "hidden": H, "experts": E, "local_experts": L,
                   "rank": rank, "counts": counts_cpu.tolist(), "n_send": n_send, "n_recv": n_recv,
                   "n_self": n_self, "payload_bytes": payload_bytes(n_send, n_recv, H, fp8),
                   "off_rank_bytes": off_rank_bytes(n_send, n_recv, n_self, H, fp8),
                   "overhead_bytes": overhead_bytes(n_send, n_recv, E, C, fp8), "cells": {}, "check": {}}
            layer = IdentityExperts(L, "mxfp8" if fp8 else "bf16")

            def dc():
                return expert_parallel_mlp(x, ids, probs, layer, experts=E, capacity=C, fp8_dispatch=fp8)

            row_cols, row_dtype = (dispatch_row_bytes(H, True), torch.uint8) if fp8 else (H, torch.bfloat16)
            go_in = torch.zeros(n_send, row_cols, dtype=row_dtype, device=dev)
            go_out = torch.empty(n_recv, row_cols, dtype=row_dtype, device=dev)
            back_in = torch.zeros(n_recv, H, dtype=torch.bfloat16, device=dev)
            back_out = torch.empty(n_send, H, dtype=torch.bfloat16, device=dev)

            def raw():
                dist.all_to_all_single(go_out, go_in, output_split_sizes=r_splits, input_split_sizes=s_splits)
                dist.all_to_all_single(back_out, back_in, output_split_sizes=s_splits, input_split_sizes=r_splits)

            # the module's collectives, same shapes: counts (no capacity), rows (bf16 rows; MXFP8: the
            # packed rows, E4M3 bytes + scale bytes + probability), bf16 only: probabilities, results back
            p_in = torch.zeros(n_send, dtype=torch.float32, device=dev)
            p_out = torch.empty(n_recv, dtype=torch.float32, device=dev)
            c_out = torch.empty_like(counts)

            def calls():
                if C < 0:
                    dist.all_to_all_single(c_out, counts)
                dist.all_to_all_single(go_out, go_in, output_split_sizes=r_splits, input_split_sizes=s_splits)
                if not fp8:
                    dist.all_to_all_single(p_out, p_in, output_split_sizes=r_splits, input_split_sizes=s_splits)
                dist.all_to_all_single(back_out, back_in, output_split_sizes=s_splits, input_split_sizes=r_splits)

            with torch.no_grad():
                for name, fn in (("raw", raw), ("dc", dc), ("calls", calls)):
                    rec["cells"][name] = timer.cell(lambda fn=fn: timer(fn, W, I, inner))

                def check():
                    # identity experts: y = (kept slots of the token) x the rows as they crossed the wire;
                    # and the mirror is faithful: calls() makes the module's all_to_all_single calls, in
                    # its order, with the same bytes in and out
                    y, module_calls = record_all_to_all(dc)
                    _, mirror_calls = record_all_to_all(calls)
                    xw = ops.dequantize_mxfp8(*ops.quantize_mxfp8(x, "row"), "row", dtype=torch.bfloat16) \
                        if fp8 else x
                    kept = (permute(x, ids, experts=E, capacity=C).row_map >= 0).sum(1) if C >= 0 else \
                        torch.full((T,), K, device=dev)
                    want = (kept.float()[:, None] * xw.float()).to(torch.bfloat16)
                    return {"roundtrip_equal": bool(torch.equal(y, want)),
                            "roundtrip_max_abs_diff": float((y.float() - want.float()).abs().max()) if T else 0.0,
                            "dropped_slots": int(T * K - kept.sum()),
                            "collectives_match": module_calls == mirror_calls,
                            "collectives": module_calls}

                rec["check"] = timer.cell(check)
            recs.append(rec)
    return recs


# ----------------------------------------------------------------------------------------------
# Part B: the layer at EP = world against one GPU
# ----------------------------------------------------------------------------------------------

def part_b(shape, split, recipe, args, dev, timer, rank, world):
    import torch
    import torch.distributed as dist
    import mxmoe_torch
    T, K, H, Fd, E = shape["tokens"], shape["top_k"], shape["hidden"], shape["ffn"], shape["experts"]
    rec = {"preset": shape["preset"], "split": split, "recipe": recipe, "tokens": T, "global_tokens": T * world,
           "top_k": K, "hidden": H, "ffn": Fd, "experts": E, "local_experts": E // world,
           "capacity_factor": args.block_capacity_factor, "rank": rank, "ep": {}, "single": {}, "check": {}}
    base = args.seed + 50000 + 1000 * sorted(PRESETS).index(shape["preset"]) + 100 * SPLITS.index(split)
    ids = make_ids(T, K, E, split, base + rank, base, args.zipf).to(dev)
    g = torch.Generator(device=dev).manual_seed(base + 17 * rank + 5)
    x = torch.randn(T, H, generator=g, device=dev).to(torch.bfloat16).requires_grad_(True)
    probs = torch.rand(T, K, generator=g, device=dev)
    probs = probs / probs.sum(-1, keepdim=True)
    dy = torch.randn(T, H, generator=g, device=dev).to(torch.bfloat16)
    torch.manual_seed(args.seed + 7)
    full = mxmoe_torch.GroupedMLP(H, Fd, E, shape["activation"], shape["glu_layout"], recipe=recipe, device=dev)
    with torch.no_grad():  # rank 0's weights everywhere (bf16 as bytes: gloo has no 16-bit integers)
        for w in (full.w1, full.w2):
            dist.broadcast(w.data.view(torch.uint8), src=0)
    ep = mxmoe_torch.ExpertParallelMLP.from_grouped_mlp(full, capacity_factor=args.block_capacity_factor, device=dev)
    rec["fp8_dispatch"] = ep.fp8_dispatch
    release = recipe == "mxfp8"

    def ep_fwd():
        if release:  # as after an optimizer step: the weights quantized once a step
            ep.local.release_prepared_weights()
        return ep(x, ids, probs)

    def ep_fwd_bwd():
        return torch.autograd.grad(ep_fwd(), (x, ep.local.w1, ep.local.w2), dy)

    W, I = args.warmup, args.iters
    with torch.no_grad():
        rec["ep"]["fwd"] = timer.cell(lambda: timer(ep_fwd, W, I))
    rec["ep"]["fwd_bwd"] = timer.cell(lambda: timer(ep_fwd_bwd, W, I))

    # the global batch on rank 0 (gathered, so the single-GPU layer sees exactly the ranks' inputs)
    def gather(t):
        raw = t.detach().contiguous()
        raw = raw.view(torch.uint8) if raw.dtype == torch.bfloat16 else raw
        parts = [torch.empty_like(raw) for _ in range(world)]
        dist.all_gather(parts, raw)
        return torch.cat(parts).view(t.dtype)

    with torch.no_grad():
        ys = gather(ep_fwd())
        xg = gather(x).requires_grad_(True)
        idg, pg, dyg = gather(ids), gather(probs), gather(dy)
    if rank != 0:
        del full, xg, idg, pg, dyg, ys
    else:
        C = ep.capacity(T, K)

        def single_fwd():
            if release:
                full.release_prepared_weights()
            p = mxmoe_torch.permute(xg, idg, pg, experts=E)
            return mxmoe_torch.unpermute(full(p.x, p.offsets, p.probs), p.row_map)

        def single_fwd_bwd():
            return torch.autograd.grad(single_fwd(), (xg, full.w1, full.w2), dyg)

        def one(fn):
            try:
                return timer.local(fn, W, I)
            except Exception as e:  # noqa: BLE001
                timer.sync()
                return {"error": _err(e), "trace": traceback.format_exc(limit=4)}

        with torch.no_grad():
            rec["single"]["fwd"] = one(single_fwd)
        rec["single"]["fwd_bwd"] = one(single_fwd_bwd)
        if C < 0:  # with a capacity the EP layer drops per source rank: not the single layer's result
            try:
                with torch.no_grad():
                    y1 = single_fwd()
                rec["check"] = {"y_equal": bool(torch.equal(ys, y1)),
                                "y_max_abs_diff": float((ys.float() - y1.float()).abs().max()),
                                "y_max_abs": float(y1.float().abs().max())}
            except Exception as e:  # noqa: BLE001
                rec["check"] = {"error": _err(e)}
        del full, xg, idg, pg, dyg, ys
    timer.barrier()  # the other ranks wait for rank 0's single-GPU run
    return rec


# ----------------------------------------------------------------------------------------------
# The ranks
# ----------------------------------------------------------------------------------------------

def _worker(rank, opts, init_method, tmp_dir):
    import torch
    import torch.distributed as dist
    args = argparse.Namespace(**opts)
    world = args.world
    dev = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if args.backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    kw = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(args.backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout), **kw)
    out = {"rank": rank, "part_a": [], "part_b": [], "errors": [], "env": {
        k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
    path = os.path.join(tmp_dir, f"rank{rank}.json")

    def dump():
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    def say(text):
        if rank == 0:
            print(text, file=sys.stderr, flush=True)

    try:
        import mxmoe_torch
        out["mxmoe_library"] = mxmoe_torch.library_path()
        if dev.type == "cuda":
            out["device"] = pt._device_text(torch)
            try:
                out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001
                out["nccl"] = None
        timer = RankTimer(dev)
        t0 = time.monotonic()
        dump()
        if "a" in args.parts:
            for name in args.presets:
                shape = preset_shape(name, args.smoke, world)
                say(f"A {name}: T/rank={shape['tokens']} K={shape['top_k']} H={shape['hidden']} "
                    f"E={shape['experts']} t={time.monotonic() - t0:.0f}s")
                for split in SPLITS:
                    try:
                        recs = part_a(shape, split, args, dev, timer, rank, world)
                    except Exception as e:  # noqa: BLE001 - setup failed on this rank: the others hang, so stop
                        out["errors"].append(f"{name} {split} part A: {_err(e)}")
                        traceback.print_exc()
                        dump()
                        raise
                    out["part_a"] += recs
                    for r in recs:
                        cells = "  ".join(f"{n} {r['cells'][n].get('ms', float('nan')):.3f} ms" for n, _ in ROW_CELLS)
                        say(f"  {split:8s} {r['dispatch']:5s} capacity {str(r['capacity_factor']):4s} {cells}")
                    dump()
                if timer.cuda:
                    torch.cuda.empty_cache()
        if "b" in args.parts:
            shape = preset_shape(args.block_preset, args.smoke, world)
            say(f"B {args.block_preset}: T/rank={shape['tokens']} K={shape['top_k']} H={shape['hidden']} "
                f"F={shape['ffn']} E={shape['experts']} t={time.monotonic() - t0:.0f}s")
            for split in args.block_splits:
                for recipe in args.recipes:
                    try:
                        r = part_b(shape, split, recipe, args, dev, timer, rank, world)
                    except Exception as e:  # noqa: BLE001
                        out["errors"].append(f"{args.block_preset} {split} {recipe} part B: {_err(e)}")
                        traceback.print_exc()
                        dump()
                        raise
                    out["part_b"].append(r)
                    if timer.cuda:
                        torch.cuda.empty_cache()
                    say(f"  {split:8s} {recipe:5s} EP fwd+bwd {r['ep']['fwd_bwd'].get('ms', float('nan')):.3f} ms, "
                        f"1 device {r['single'].get('fwd_bwd', {}).get('ms', float('nan')):.3f} ms")
                    dump()
        out["wall_s"] = round(time.monotonic() - t0, 1)
        dump()
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Merging the ranks' records
# ----------------------------------------------------------------------------------------------

def merge_a(per_rank):
    """One record per cell from the ranks' records (same order on every rank)."""
    merged = []
    for recs in zip(*per_rank):
        r0 = recs[0]
        m = {k: r0[k] for k in ("preset", "split", "dispatch", "capacity_factor", "capacity", "tokens", "top_k",
                                "hidden", "experts", "local_experts")}
        totals = [sum(c) for c in zip(*(r["counts"] for r in recs))]
        m["expert_rows_min"], m["expert_rows_max"] = min(totals), max(totals)
        m["ranks"] = [{k: r[k] for k in ("rank", "n_send", "n_recv", "n_self", "payload_bytes", "off_rank_bytes",
                                         "overhead_bytes")} for r in recs]
        mean_bytes = statistics.mean(r["payload_bytes"] for r in recs)
        mean_off = statistics.mean(r["off_rank_bytes"] for r in recs)
        m["payload_bytes_mean"] = mean_bytes
        m["cells"] = {}
        for name, _ in ROW_CELLS:
            cells = [r["cells"].get(name, {}) for r in recs]
            errors = [f"rank {r['rank']}: {c['error']}" for r, c in zip(recs, cells) if "error" in c]
            if errors:
                m["cells"][name] = {"error": "; ".join(errors)}
                continue
            c = {k: cells[0][k] for k in ("ms", "min_ms", "max_ms")}
            c["rank_ms"] = [x["rank_ms"] for x in cells]
            c["gbps"] = gbps(mean_bytes, c["ms"]) if c["ms"] > 0 else None
            c["gbps_off_rank"] = gbps(mean_off, c["ms"]) if c["ms"] > 0 else None
            m["cells"][name] = c
        raw, dc, calls = (m["cells"][n].get("ms") for n in ("raw", "dc", "calls"))
        m["pct_raw"] = 100.0 * raw / dc if raw and dc else None
        m["pct_calls"] = 100.0 * calls / dc if calls and dc else None
        m["bar_met"] = None if m["pct_raw"] is None else m["pct_raw"] >= BAR
        checks = [r["check"] for r in recs]
        if any("error" in c for c in checks):
            m["check"] = {"error": "; ".join(f"rank {r['rank']}: {r['check']['error']}" for r in recs
                                             if "error" in r["check"])}
        else:
            m["check"] = {"roundtrip_equal": all(c["roundtrip_equal"] for c in checks),
                          "roundtrip_max_abs_diff": max(c["roundtrip_max_abs_diff"] for c in checks),
                          "dropped_slots": sum(c["dropped_slots"] for c in checks),
                          "collectives_match": all(c["collectives_match"] for c in checks),
                          "collectives": [c["collectives"] for c in checks]}
        merged.append(m)
    return merged


def merge_b(per_rank):
    merged = []
    for recs in zip(*per_rank):
        r0 = recs[0]
        m = {k: v for k, v in r0.items() if k not in ("rank", "ep", "single", "check")}
        m["ep"], m["single"], m["check"] = {}, r0["single"], r0["check"]
        for op in ("fwd", "fwd_bwd"):
            cells = [r["ep"].get(op, {}) for r in recs]
            errors = [f"rank {r['rank']}: {c['error']}" for r, c in zip(recs, cells) if "error" in c]
            m["ep"][op] = {"error": "; ".join(errors)} if errors else \
                {k: cells[0][k] for k in ("ms", "min_ms", "max_ms")} | {"rank_ms": [c["rank_ms"] for c in cells]}
        for side in (m["ep"], m["single"]):
            for c in side.values():
                if c.get("ms"):
                    c["tokens_per_s"] = m["global_tokens"] / c["ms"] * 1e3
        m["single_over_ep"] = {op: (m["single"].get(op, {}).get("ms") / m["ep"][op]["ms"]
                                    if m["single"].get(op, {}).get("ms") and m["ep"][op].get("ms") else None)
                               for op in ("fwd", "fwd_bwd")}
        merged.append(m)
    return merged


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

_short = mbp._short


def _ms(c):
    if not c:
        return ""
    if "ms" in c:
        return f"{c['ms']:.3f}"
    return "error: " + _short(c.get("error", "?"), 50) if "error" in c else ""


def _num(v, fmt):
    return format(v, fmt) if v is not None else ""


def _gb(v):
    """GB/s or MB: one decimal, three significant digits below 10 (the smoke sizes)."""
    return "" if v is None else (f"{v:.1f}" if v >= 10 else f"{v:.3g}")


def _cap(r):
    return "none" if r["capacity_factor"] is None else f"{r['capacity_factor']:g} (C={r['capacity']})"


def build_markdown(meta, rows, blocks):
    L = ["# Expert parallelism: dispatch + combine against a raw all-to-all, and the layer at EP="
         f"{meta.get('world')} against one device", ""]
    L.append(f"- date: {meta.get('date', '')}")
    L.append(f"- device: {meta.get('device', '')}")
    L.append(f"- torch {meta.get('torch', '')}, CUDA {meta.get('cuda', '')}, NCCL {meta.get('nccl', '')}, "
             f"python {meta.get('python', '')}, mxmoe_torch {meta.get('mxmoe', '')}")
    if meta.get("git"):
        L.append(f"- mxmoe tree: {meta['git']}")
    L.append(f"- command: `{meta.get('command', '')}`")
    L.append(f"- processes: {meta.get('world')} ranks, backend {meta.get('backend')}, device type "
             f"{meta.get('device_type')}; environment: " +
             (", ".join(f"{k}={v}" for k, v in sorted(meta.get("env", {}).items())) or "no NCCL_* variable") +
             (f" ({meta['nvls_note']})" if meta.get("nvls_note") else ""))
    if meta.get("smoke"):
        L.append(f"- **smoke run**: tiny sizes (H={SMOKE['hidden']}, F={SMOKE['ffn']}, "
                 f"E={SMOKE['experts_per_rank']}/rank, {SMOKE['tokens_per_rank']} tokens/rank, top-k <= "
                 f"{SMOKE['max_top_k']}), not the presets' sizes; the numbers only show that the script runs")
    timing = "CUDA events" if meta.get("device_type") == "cuda" else "time.perf_counter (CPU)"
    L.append(f"- timing: {timing}; each sample starts on every rank after a barrier (one-element all_reduce, "
             f"then a device sync) and covers {meta.get('inner')} call(s); a sample's step time is the slowest "
             f"rank's; median of {meta.get('iters')} samples after {meta.get('warmup')} warm-up calls.")
    L.append(f"- routing: balanced = exactly T·K/E slots per expert on every rank; skew = Zipf weights "
             f"1/(i+1)^{meta.get('zipf')} over a seeded permutation of the experts (the same on every rank), "
             "K distinct experts per token (torch.multinomial without replacement), seed per rank.")
    L.append("")
    if rows:
        L.append("## Part A: dispatch + combine against all_to_all_single of the same bytes")
        L.append("")
        L.append("Each rank brings T = T_preset / top_k / world tokens and holds E / world of the preset's E "
                 "experts. **dispatch + combine**: `mxmoe_torch.expert_parallel_mlp` with an identity in place of "
                 "the local GroupedMLP: permute, count all-to-all + the host read of the splits (no capacity), "
                 "the rows' exchange (bf16: rows all-to-all, then probabilities all-to-all; mxfp8: quantize, "
                 "each row's E4M3 bytes, scale bytes and probability packed in one uint8 row, one all-to-all, "
                 "the bytes regrouped, dequantize), regroup, inverse regroup, return all-to-all, unpermute. "
                 "**raw**: `all_to_all_single` of the same row payload, same split sizes, one call each way "
                 "(mxfp8: the packed rows of H + roundup(H/32, 4) + 4 bytes; the return in bf16). **layer's "
                 "collectives**: the module's `all_to_all_single` calls alone (counts, rows, bf16: "
                 "probabilities, return). GB/s = row payload a rank sends + receives, dispatch and return, its "
                 "own block included, / step time, averaged over ranks (rows · (dispatch row bytes + 2H), "
                 "dispatch row bytes 2H or H + roundup(H/32, 4) + 4); the bf16 rows' probabilities (4 B a row, "
                 "their own call) and the counts (8·E B) are not "
                 "counted, so every GB/s here is the same bytes / a different time and % of raw = raw ms / "
                 "dispatch+combine ms (the JSON's gbps_off_rank leaves out the block a rank sends itself). "
                 "Capacity: C = ceil(factor·T·K/E) rows per expert per source rank, every rank pair exchanging "
                 "E_local·C rows (padding included, and counted).")
        L.append("")
        L.append(f"Bar: dispatch + combine >= {BAR:.0f}% of the raw all-to-all's GB/s, measured in the same run.")
        L.append("")
        met = [r for r in rows if r["bar_met"]]
        below = [r for r in rows if r["bar_met"] is False]
        L.append(f"Verdict: {len(met)} of {len(met) + len(below)} measured cells meet the bar" +
                 ("; below: " + ", ".join(f"{r['preset']} {r['split']} {r['dispatch']} capacity {_cap(r)} "
                                          f"({r['pct_raw']:.0f}%)" for r in below) if below else "") +
                 (" (smoke sizes: not a verdict on the GPU)" if meta.get("smoke") else "") + ".")
        L.append("")
        L.append("| preset | split | rows as | capacity | T/rank | K | H | E | rows sent / received per rank | "
                 "payload MB/rank | raw ms | raw GB/s | d+c ms | d+c GB/s | % of raw | bar | collectives ms | "
                 "d+c % of collectives | roundtrip |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            c = r["cells"]
            sr = "; ".join(f"{x['n_send']}/{x['n_recv']}" for x in r["ranks"])
            ch = r["check"]
            rt = ("error: " + _short(ch["error"], 40)) if "error" in ch else \
                ("exact" if ch["roundtrip_equal"] else f"DIFFERS ({ch['roundtrip_max_abs_diff']:.3g})") + \
                ("" if ch.get("collectives_match", True) else "; collectives mirror DIFFERS")
            bar = "" if r["bar_met"] is None else ("meets" if r["bar_met"] else "below")
            L.append(f"| {r['preset']} | {r['split']} | {r['dispatch']} | {_cap(r)} | {r['tokens']} | {r['top_k']} | "
                     f"{r['hidden']} | {r['experts']} | {sr} | {_gb(r['payload_bytes_mean'] / 1e6)} | "
                     f"{_ms(c['raw'])} | {_gb(c['raw'].get('gbps'))} | {_ms(c['dc'])} | "
                     f"{_gb(c['dc'].get('gbps'))} | {_num(r['pct_raw'], '.0f')} | {bar} | {_ms(c['calls'])} | "
                     f"{_num(r['pct_calls'], '.0f')} | {rt} |")
        L.append("")
        L.append("Roundtrip: with identity experts y = (the token's kept slots) · (x as it crossed the wire: "
                 "dequant(quant_row(x)) for mxfp8 rows), checked exactly; the same call also checks that the "
                 "layer's-collectives cell makes the module's `all_to_all_single` calls (order, bytes in and "
                 "out; the JSON's check.collectives). Expert rows (all ranks) min/max: " +
                 ", ".join(f"{r['preset']} {r['split']} {r['expert_rows_min']}/{r['expert_rows_max']}"
                           for r in rows if r["dispatch"] == rows[0]["dispatch"] and r["capacity_factor"] is None)
                 + ".")
        L.append("")
    if blocks:
        L.append(f"## Part B: ExpertParallelMLP at EP={meta.get('world')} against one device")
        L.append("")
        L.append("EP: `ExpertParallelMLP.from_grouped_mlp` (E / world experts a rank, every rank its T tokens; "
                 "mxfp8 sends the rows as MXFP8). One device: `permute` -> `GroupedMLP` (all E experts, the same "
                 "weights) -> `unpermute` on rank 0 with the global batch (world·T tokens, the ranks' inputs "
                 "gathered) while the other ranks wait. fwd+bwd: `torch.autograd.grad` for x, W1, W2 with a "
                 "fixed dY. mxfp8: the quantized weights are released before every call on both sides (one "
                 "weight quantization a step). tokens/s = global tokens / ms. 1 device / EP > 1: EP faster "
                 f"({meta.get('world')}.0 would be linear).")
        L.append("")
        L.append("| preset | split | recipe | global tokens | EP fwd ms | EP fwd+bwd ms | EP tokens/s | "
                 "1-device fwd ms | 1-device fwd+bwd ms | 1-device tokens/s | 1 device / EP fwd | "
                 "1 device / EP fwd+bwd | y EP vs 1 device |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for b in blocks:
            e, s, ch = b["ep"], b["single"], b["check"]
            yc = ("error: " + _short(ch["error"], 40)) if "error" in ch else \
                ("" if not ch else ("equal" if ch["y_equal"] else f"max |diff| {ch['y_max_abs_diff']:.3g}"))
            L.append(f"| {b['preset']} | {b['split']} | {b['recipe']} | {b['global_tokens']} | {_ms(e.get('fwd'))} | "
                     f"{_ms(e.get('fwd_bwd'))} | {_num(e.get('fwd_bwd', {}).get('tokens_per_s'), '.0f')} | "
                     f"{_ms(s.get('fwd'))} | {_ms(s.get('fwd_bwd'))} | "
                     f"{_num(s.get('fwd_bwd', {}).get('tokens_per_s'), '.0f')} | "
                     f"{_num(b['single_over_ep']['fwd'], '.2f')} | {_num(b['single_over_ep']['fwd_bwd'], '.2f')} | "
                     f"{yc} |")
        L.append("")
    notes = []
    for r in rows:
        for name, label in ROW_CELLS:
            if "error" in r["cells"][name]:
                notes.append(f"- error, {r['preset']} {r['split']} {r['dispatch']} capacity {_cap(r)} {label}: "
                             f"`{_short(r['cells'][name]['error'], 300)}`")
    for b in blocks:
        for side in ("ep", "single"):
            for op, c in b[side].items():
                if "error" in c:
                    notes.append(f"- error, {b['preset']} {b['split']} {b['recipe']} {side} {op}: "
                                 f"`{_short(c['error'], 300)}`")
    notes += [f"- error: `{_short(e, 300)}`" for e in meta.get("errors", [])]
    if notes:
        L += ["## Errors", ""] + notes + [""]
    if meta.get("chart_note"):
        L += [meta["chart_note"], ""]
    return "\n".join(L)


def chart_panels(rows, blocks, world):
    panels = []
    if rows:
        groups = [f"{r['preset']} {r['split']} {r['dispatch']}/" +
                  ("nocap" if r["capacity_factor"] is None else f"cap{r['capacity_factor']:g}") for r in rows]
        panels.append({"title": "Part A: GB/s per rank (row payload sent + received / step time)", "ylabel": "GB/s",
                       "groups": groups, "target": None, "reference": None,
                       "series": [(label, [r["cells"][n].get("gbps") for r in rows]) for n, label in ROW_CELLS]})
        panels.append({"title": f"Part A: dispatch + combine, % of the raw all-to-all (bar {BAR:.0f}%)",
                       "ylabel": "% of raw", "groups": groups, "target": BAR, "reference": 100.0,
                       "series": [("dispatch + combine", [r["pct_raw"] for r in rows])]})
    if blocks:
        panels.append({"title": f"Part B: 1-device ms / EP={world} ms (above 1: EP faster, {world}: linear)",
                       "ylabel": "ratio", "groups": [f"{b['preset']} {b['split']} {b['recipe']}" for b in blocks],
                       "target": None, "reference": 1.0,
                       "series": [(op, [b["single_over_ep"][op] for b in blocks]) for op in ("fwd", "fwd_bwd")]})
    return panels


def draw_matplotlib(path, panels, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(9.0, 0.9 * max(len(p["groups"]) for p in panels) + 3), 4.6 * len(panels)))
    cmap = plt.get_cmap("tab10")
    for ax, p in zip((a[0] for a in axes), panels):
        n = len(p["series"])
        width = 0.8 / max(n, 1)
        for si, (name, vals) in enumerate(p["series"]):
            xs = [gi + (si - (n - 1) / 2) * width for gi, v in enumerate(vals) if v is not None]
            vs = [v for v in vals if v is not None]
            if not vs:
                continue
            ax.bar(xs, vs, width, color=cmap(si % 10), label=name)
            for x, v in zip(xs, vs):
                ax.text(x, v, f"{v:.0f}" if max(vs) >= 10 else f"{v:.3g}", rotation=90, fontsize=6, ha="center",
                        va="bottom")
        if p["target"] is not None:
            ax.axhline(p["target"], color="black", linewidth=1.2, label=f"bar {p['target']:g}")
        if p["reference"] is not None:
            ax.axhline(p["reference"], color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(p["groups"])))
        ax.set_xticklabels([g.replace(" ", "\n") for g in p["groups"]], fontsize=7)
        ax.set_ylabel(p["ylabel"])
        ax.set_title(p["title"], fontsize=9)
        ax.grid(axis="y", linewidth=0.3, alpha=0.5)
        ax.legend(fontsize=7, ncol=4, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out_dir, meta, rows, blocks):
    path = os.path.join(out_dir, "ep_bench.png")
    panels = chart_panels(rows, blocks, meta.get("world"))
    if panels:
        title = f"{meta.get('device', '')}, torch {meta.get('torch', '')}, {meta.get('git') or ''}"
        # The dependency-free canvas draws a line at every target: 0 where a panel has none.
        canvas = [dict(p, target=p["target"] or 0.0, reference=p["reference"] or 0.0) for p in panels]
        meta["chart"] = mbp.draw_chart(path, panels, title, draw=draw_matplotlib, fallback_panels=canvas)
        meta["chart_note"] = f"Chart: ep_bench.png ({meta['chart']})."
    md = build_markdown(meta, rows, blocks)
    bars = [{"preset": r["preset"], "split": r["split"], "dispatch": r["dispatch"],
             "capacity_factor": r["capacity_factor"], "pct_raw": r["pct_raw"], "bar": BAR, "met": r["bar_met"]}
            for r in rows]
    with open(os.path.join(out_dir, "ep_bench.json"), "w") as f:
        json.dump({"meta": meta, "bars": bars, "part_a": rows, "part_b": blocks}, f, indent=1)
    with open(os.path.join(out_dir, "ep_bench.md"), "w") as f:
        f.write(md + "\n")
    return md


# ----------------------------------------------------------------------------------------------

def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _factor(text):
    return None if text.lower() in ("none", "") else float(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="out", help="ep_bench.json, ep_bench.md and ep_bench.png go here")
    ap.add_argument("--presets", default=",".join(PRESETS), help=f"Part A, comma-separated from {', '.join(PRESETS)}")
    ap.add_argument("--block-preset", default="gptoss-120b", help="Part B's preset (default gptoss-120b)")
    ap.add_argument("--parts", default="a,b", help="a (dispatch + combine), b (the layer) or a,b")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--backend", default=None, choices=("nccl", "gloo"), help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--world", type=int, default=2, help="processes (EP size), rank r on cuda:r")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, not the performance")
    ap.add_argument("--dispatches", default=",".join(DISPATCHES), help="Part A rows as bf16 and/or mxfp8")
    ap.add_argument("--capacity-factor", type=float, default=1.0, help="Part A's capacity cells (default 1.0)")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="Part B recipes")
    ap.add_argument("--block-splits", default=",".join(SPLITS), help="Part B routing: balanced and/or skew")
    ap.add_argument("--block-capacity-factor", type=_factor, default=None, help="Part B's capacity_factor (none)")
    ap.add_argument("--zipf", type=float, default=1.0, help="exponent of the skewed routing's expert weights")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 5; smoke 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed samples, median reported (default 20; smoke 3)")
    ap.add_argument("--inner", type=int, default=1, help="calls per Part A sample (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="process-group timeout, seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 5)
    args.iters = args.iters if args.iters is not None else (3 if args.smoke else 20)
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    args.presets = [p for p in args.presets.split(",") if p]
    args.parts = set(p for p in args.parts.split(",") if p)
    args.dispatches = [d for d in args.dispatches.split(",") if d]
    args.recipes = [r for r in args.recipes.split(",") if r]
    args.block_splits = [s for s in args.block_splits.split(",") if s]
    bad = [p for p in args.presets + [args.block_preset] if p not in PRESETS]
    if bad:
        ap.error(f"unknown preset(s) {', '.join(bad)}; known: {', '.join(PRESETS)}")
    if not args.parts or not args.parts <= {"a", "b"}:
        ap.error("--parts takes a, b or a,b")
    if not set(args.dispatches) <= set(DISPATCHES) or not set(args.recipes) <= set(RECIPES) \
            or not set(args.block_splits) <= set(SPLITS):
        ap.error(f"--dispatches and --recipes from {', '.join(RECIPES)}; --block-splits from {', '.join(SPLITS)}")
    if args.backend == "nccl" and args.device != "cuda":
        ap.error("--backend nccl needs --device cuda")
    if args.world < 1:
        ap.error("--world must be >= 1")
    for name in args.presets + [args.block_preset]:
        try:
            preset_shape(name, args.smoke, args.world)
        except ValueError as e:
            ap.error(str(e))

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or (args.backend == "gloo" and not dist.is_gloo_available()) or \
            (args.backend == "nccl" and not dist.is_nccl_available()):
        print(f"ep_bench: torch.distributed has no {args.backend} backend here", file=sys.stderr)
        return 2
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        print(f"ep_bench: --world {args.world} needs {args.world} CUDA devices, torch sees "
              f"{torch.cuda.device_count()} (use --device cpu --backend gloo --smoke on a CPU)", file=sys.stderr)
        return 2
    nvls_note = None
    if args.backend == "nccl":
        if "NCCL_NVLS_ENABLE" in os.environ:
            nvls_note = "NCCL_NVLS_ENABLE from the environment"
        else:
            os.environ["NCCL_NVLS_ENABLE"] = "0"  # inherited by the ranks
            nvls_note = "NCCL_NVLS_ENABLE=0 set by ep_bench.py"
    os.makedirs(args.out_dir, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
        "device_type": args.device, "backend": args.backend, "world": args.world,
        "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None, "python": sys.version.split()[0],
        "git": pt._git_describe(),
        "command": "python3 " + " ".join(shlex.quote(a) for a in (sys.argv if argv is None else [sys.argv[0]] + argv)),
        "presets": args.presets, "block_preset": args.block_preset, "parts": sorted(args.parts),
        "smoke": args.smoke, "warmup": args.warmup, "iters": args.iters, "inner": args.inner, "zipf": args.zipf,
        "capacity_factor": args.capacity_factor, "block_capacity_factor": args.block_capacity_factor,
        "seed": args.seed, "env": {}, "nvls_note": nvls_note, "errors": [],
    }
    opts = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}
    tmp = tempfile.mkdtemp(prefix="ep_bench.")
    t0 = time.monotonic()
    try:
        try:
            mp.spawn(_worker, args=(opts, f"tcp://127.0.0.1:{_free_port()}", tmp), nprocs=args.world, join=True)
        except Exception as e:  # noqa: BLE001 - a rank died: report what the ranks wrote
            meta["errors"].append(f"a rank failed: {_err(e)}")
        per_rank = []
        for r in range(args.world):
            try:
                with open(os.path.join(tmp, f"rank{r}.json")) as f:
                    per_rank.append(json.load(f))
            except (OSError, ValueError) as e:
                meta["errors"].append(f"rank {r} wrote nothing readable: {_err(e)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    rows, blocks = [], []
    if len(per_rank) == args.world:
        r0 = per_rank[0]
        meta["device"] = f"{args.world} x {r0['device']}" if r0.get("device") else meta["device"]
        meta["nccl"] = r0.get("nccl")
        meta["mxmoe_library"] = r0.get("mxmoe_library")
        meta["env"] = r0.get("env", {})
        for p in per_rank:
            meta["errors"] += [f"rank {p['rank']}: {e}" for e in p.get("errors", [])]
        n_a = min(len(p["part_a"]) for p in per_rank)
        n_b = min(len(p["part_b"]) for p in per_rank)
        rows = merge_a([p["part_a"][:n_a] for p in per_rank])
        blocks = merge_b([p["part_b"][:n_b] for p in per_rank])
    try:
        import mxmoe_torch
        meta["mxmoe"] = getattr(mxmoe_torch, "__version__", "")
    except Exception as e:  # noqa: BLE001
        meta["mxmoe"] = f"not importable here: {_err(e)}"
    md = write_outputs(args.out_dir, meta, rows, blocks)
    print(md)
    return 0 if not meta["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
