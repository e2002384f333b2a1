"""mxmoe_torch.ExpertParallelMLP over torch.distributed (gloo, two CPU processes) against the
single-process GroupedMLP on the concatenated global batch.

Two ranks, E = 4 experts (2 per rank), each rank with its own tokens (24 each; 72 each; and unequal
counts 24/13 and 40/8 with some ids outside [0, E), which are dropped; and every slot routed to rank
0's experts, so rank 1 receives no rows), top-2. Every case compares y
(each rank's tokens), dx (per rank), dprobs (per rank), and dW1, dW2 (db1, db2 with bias) of each
rank's local experts against the corresponding slice of the full layer's gradients, for recipe
"bf16" and "mxfp8", without a capacity and with capacity_factor 0.75 (which drops rows: the test
checks that some are dropped).

The reference for the capacity mode is the single-process permute/GroupedMLP/unpermute on the global
batch where every slot that its source rank drops (permute with capacity C on that rank's tokens:
each expert keeps its first C slots in token, then slot order) is given an invalid expert id, so it
is dropped there too; the remaining rows of each expert are in the same order in both (rank 0's
tokens, then rank 1's, in token then slot order).

Tolerances. Without a capacity each expert sees exactly the rows of the single-process run in the
same order and in a group of the same size, and every step (row-wise GEMMs, per-row MXFP8 blocks,
column-wise MXFP8 blocks restarting at each group, the per-group dW sums, the fp32 slot-order
unpermute sums) is done on the same values in the same order: everything is expected bit-exact and
is checked with equality, for both recipes. With a capacity the EP layer runs each expert over
ep_size * C rows with zero padding rows between the ranks' blocks: y, dx and dprobs depend on a
row's own values only and stay bit-exact; dW sums the same non-zero products plus exact zeros, but
the zero rows shift where the kernel's blocks start (and, for mxfp8, where the column-wise 32-row
quantization blocks of X and dY^T start, which changes their shared E8M0 scales), so dW is compared
with a relative Frobenius error bound: 4e-3 for bf16 (fp32 accumulation order only, then one
rounding to bf16 that may land on the neighbouring value: at most 2^-8 relative per element) and
0.1 for mxfp8 (the recipe's bound vs an unquantized reference, docs/numerics.md; different block
boundaries are two different MXFP8 quantizations of the same data). The measured errors are printed (pytest -s). Measured on the CPU
(torch 2.15, reference backend): every output and every gradient of every case is bit-identical,
the capacity cases included; there the zero rows add exact zeros, and for mxfp8 the shifted 32-row
blocks happened to get the same power-of-two scales (these data, a block amax of normal values), so
the bound is not used; it is kept because neither is guaranteed.

MXFP8 dispatch (fp8_dispatch, the default for mxfp8): the rows cross as row-wise MXFP8 and the
reference runs the single-process layer on wire_rows(x) = dequant(quant_row(x)) with the gradient
passed straight through; one mxfp8 case sends bf16 rows. For values in the E4M3 normal range of their
blocks the wire changes nothing the layer computes (it quantizes row-wise to the same values, and an
E4M3 grid does not depend on a power-of-two scale there), so one case spreads each row over 14
octaves, where the column-wise copy of wire_rows(x) differs from that of x and test_wire_matters checks
that it does. test_fp8_dispatch_bytes checks what travels, forward and backward: with MXFP8 dispatch
one packed row per dispatched row (H E4M3 bytes + roundup(H/32, 4) scale bytes + its 4-byte
probability) in ONE all_to_all_single, against 2H bf16 bytes and the probabilities in two; the backward
collectives (bf16 gradient rows, float32 probability gradients) the same for both.
test_pack_rows_round_trip checks the packing (H with padded scale columns, 0 to 129 rows, special
probabilities) bit for bit, test_regroup_and_ungroup the regrouping and its gradient (signed zeros
included) against the expressions autograd differentiates.

The NCCL path (two GPUs, the same worker with backend "nccl") is skipped with a reason when fewer
than two GPUs exist, as is test_static_capacity_captures_in_a_cuda_graph_nccl: the static-capacity
mode (no host read) captured in one CUDA graph, forward and backward, replayed on new batches, equal
to eager runs, both recipes. What one GPU can check runs there: two gloo ranks sharing the GPU (every
mxmoe step on the GPU, gloo moving the CUDA tensors through host memory), and NCCL with a group of one
(the equality without a capacity, and the CUDA-graph capture). A group of one also runs on the CPU
(gloo): EP = 1 holds every expert and brings the global batch, so its rows are the reference's. Four
CPU ranks (FOUR_RANK_CASES) run E = 8 (the regrouping over four sources) and E = 4 (one local expert a
rank: nothing to regroup), with the same equality.

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests/test_ep.py
"""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mxmoe_torch
from mxmoe_torch._moe import expert_capacity

WORLD = 2
E, H, F, K = 4, 64, 32, 2
CASES = [  # (recipe, capacity_factor, bias, tokens per rank, invalid ids, fp8_dispatch)
    ("bf16", None, False, (24, 24), False, False),
    ("mxfp8", None, False, (24, 24), False, True),
    ("mxfp8", None, False, (24, 24), False, False),  # mxfp8 with the rows in bf16 on the wire
    # Values over 14 octaves in a row: many fall below the E4M3 normal range of their 32-block, so the
    # rows that cross the wire differ from x also in what the column-wise (wgrad) copy makes of them.
    ("mxfp8", None, False, (24, 24), "wide", True),
    ("bf16", 0.75, False, (24, 24), False, False),
    ("mxfp8", 0.75, False, (24, 24), False, True),
    # 72 tokens: C = 27, so each local expert runs 54 rows, more than one 32-row MXFP8 block.
    ("mxfp8", 0.75, True, (72, 72), False, True),
    # Different token counts per rank and ids outside [0, E) (dropped), no capacity.
    ("bf16", None, True, (24, 13), True, False),
    ("mxfp8", None, False, (40, 8), True, True),
    # Every slot routed to rank 0's experts: rank 1's experts receive no rows (empty splits, zero dW).
    ("bf16", None, False, (24, 16), "rank0", False),
    ("mxfp8", 0.75, False, (24, 24), "rank0", True),
]
# Four ranks (CPU, gloo): E = 8 (two local experts a rank) and E = 4 (one local expert a rank, where the
# received order is already the local order and nothing is regrouped). Each case: (recipe,
# capacity_factor, bias, tokens per rank, invalid ids, fp8_dispatch, experts).
FOUR_RANK_CASES = [
    ("bf16", None, False, (24, 13, 40, 8), True, False, 8),
    ("mxfp8", None, True, (24, 24, 24, 24), False, True, 8),
    ("mxfp8", 0.75, False, (24, 24, 24, 24), False, True, 8),
    ("bf16", 0.75, True, (24, 24, 24, 24), False, False, 8),
    ("bf16", None, False, (24, 13, 40, 8), "rank0", False, 4),
    ("mxfp8", 0.75, False, (24, 24, 24, 24), False, True, 4),
]
SUITES = {"two": (CASES, 0), "four": (FOUR_RANK_CASES, 500)}  # (cases, seed offset)
DW_TOLERANCE = {"bf16": 4e-3, "mxfp8": 0.1}


def suite_cases(suite, world):
    """(seed index, recipe, capacity_factor, bias, tokens, invalid, fp8_dispatch, experts) of a suite's
    cases that run at `world` ranks: a group of one leaves out the capacity cases (a capacity applies per
    source rank, so the reference's drops are those of len(tokens) ranks)."""
    cases, seed = SUITES[suite]
    return [(seed + i, *c[:6], c[6] if len(c) > 6 else E) for i, c in enumerate(cases)
            if world > 1 or c[1] is None]


def rel_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def make_data(case_index, recipe, bias, tokens, invalid, experts=E):
    """The full layer's weights and every rank's tokens, ids, probs and upstream gradient (CPU), for
    len(tokens) ranks and `experts` experts."""
    E = experts
    g = torch.Generator().manual_seed(1234 + case_index)
    full = {"w1": (torch.randn(E, 2 * F, H, generator=g) / H ** 0.5).bfloat16(),
            "w2": (torch.randn(E, H, F, generator=g) / F ** 0.5).bfloat16()}
    if bias:
        full["b1"] = (torch.randn(E, 2 * F, generator=g) * 0.1).bfloat16()
        full["b2"] = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    ranks = []
    for T in tokens:
        x = torch.randn(T, H, generator=g)
        if invalid == "wide":
            x = x * torch.exp2(-14 * torch.rand(T, H, generator=g))
        x = x.bfloat16()
        # Skewed routing (expert 0 is popular) so the capacity drops rows.
        popular = torch.tensor([1.0, 0.3, 0.0, -0.3]) if E == 4 else torch.linspace(1.0, -0.3, E)
        logits = torch.randn(T, E, generator=g) + popular
        top, ids = torch.topk(logits.softmax(-1), K, dim=-1)
        probs = top / top.sum(-1, keepdim=True)
        if invalid == "rank0":
            ids = ids % (E // len(tokens))
        elif invalid is True:
            ids[1::5, 1] = E  # dropped by permute (counted as invalid)
            ids[3, 0] = -1
        dy = torch.randn(T, H, generator=g)
        ranks.append((x, ids, probs, dy))
    return full, ranks


def make_layer(full, recipe, experts, device):
    layer = mxmoe_torch.GroupedMLP(H, F, experts, bias="b1" in full, recipe=recipe, device=device)
    with torch.no_grad():
        for name, value in full.items():
            getattr(layer, name).copy_(value)
    return layer


def _worker_device(rank, placement):
    """Where a rank computes: "cpu"; "cuda" (rank r on cuda:r, the NCCL runs); "cuda:0" (every rank on
    the one GPU: the gloo run on a one-GPU machine, gloo moving CUDA tensors through host memory)."""
    if placement == "cuda":
        return torch.device("cuda", rank)
    return torch.device(placement)


def _rank_batch(ranks, rank, world):
    """A rank's tokens. With one rank it brings every rank's tokens (the global batch), so the
    reference's rows are its rows."""
    if world == len(ranks):
        return ranks[rank]
    assert world == 1
    return tuple(torch.cat([r[j] for r in ranks]) for j in range(4))


def _worker(rank, init_method, backend, out_dir, placement="cpu", world=WORLD, suite="two"):
    torch.set_num_threads(1)
    device = _worker_device(rank, placement)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    try:
        results = []
        for i, recipe, factor, bias, tokens, invalid, fp8, experts in suite_cases(suite, world):
            full, ranks = make_data(i, recipe, bias, tokens, invalid, experts)
            ep = mxmoe_torch.ExpertParallelMLP.from_grouped_mlp(make_layer(full, recipe, experts, device),
                                                                capacity_factor=factor, fp8_dispatch=fp8,
                                                                device=device)
            assert ep.fp8_dispatch == fp8
            x, ids, probs, dy = (t.to(device) for t in _rank_batch(ranks, rank, world))
            x.requires_grad_(True)
            probs.requires_grad_(True)
            y = ep(x, ids, probs)
            (y.float() * dy).sum().backward()
            grads = {n: getattr(ep.local, n).grad.cpu() for n in ("w1", "w2", "b1", "b2")
                     if getattr(ep.local, n) is not None}
            results.append({"y": y.detach().cpu(), "dx": x.grad.cpu(), "dprobs": probs.grad.cpu(), **grads,
                            "slice": (ep.expert_slice().start, ep.expert_slice().stop)})
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def wire_rows(x):
    """What MXFP8 dispatch delivers for bf16 rows x: dequant(quant_row(x)), with the gradient passed
    straight through (the EP layer's backward sends the bf16 gradient back unquantized)."""
    q, s = torch.ops.mxmoe.quantize_mxfp8(x.detach(), "row")
    xq = torch.ops.mxmoe.dequantize_mxfp8(q, s, "row", dtype=torch.bfloat16)
    return x + (xq - x).detach()


def reference(case_index, recipe, factor, bias, tokens, invalid, fp8, device, experts=E):
    """Single-process permute -> GroupedMLP -> unpermute on the global batch, with the slots each source
    rank drops (capacity C per expert per rank) given an invalid id; with fp8 dispatch the layer sees
    the rows as they arrive (wire_rows; row-wise blocks are within a row, so quantizing before or
    after the permutation is the same)."""
    E = experts
    full, ranks = make_data(case_index, recipe, bias, tokens, invalid, E)
    ids_all, dropped = [], 0
    for x, ids, _, _ in ranks:
        if factor is not None:
            C = expert_capacity(factor, x.shape[0], K, E)
            kept = mxmoe_torch.permute(x, ids, experts=E, capacity=C).row_map >= 0
            ids = torch.where(kept, ids, torch.full_like(ids, -1))
            dropped += int((~kept).sum())
        ids_all.append(ids)
    x = torch.cat([r[0] for r in ranks]).to(device).requires_grad_(True)
    probs = torch.cat([r[2] for r in ranks]).to(device).requires_grad_(True)
    dy = torch.cat([r[3] for r in ranks]).to(device)
    ids = torch.cat(ids_all).to(device)
    layer = make_layer(full, recipe, E, device)
    p = mxmoe_torch.permute(wire_rows(x) if fp8 else x, ids, probs, experts=E)
    n = int(p.offsets[-1])
    y = mxmoe_torch.unpermute(layer(p.x[:n], p.offsets, p.probs[:n]), p.row_map)
    (y.float() * dy).sum().backward()
    grads = {n: getattr(layer, n).grad.cpu() for n in ("w1", "w2", "b1", "b2") if getattr(layer, n) is not None}
    return {"y": y.detach().cpu(), "dx": x.grad.cpu(), "dprobs": probs.grad.cpu(), **grads}, dropped


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_and_compare(backend, tmp_path, device, placement="cpu", world=WORLD, suite="two"):
    """Runs _worker on `world` processes (placement: _worker_device) and compares every rank's outputs
    and gradients with the single-process layer on `device`. With world = 1 the one rank holds every
    expert and brings the global batch (the capacity cases, whose drops are per source rank, are left
    out)."""
    init_method = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_worker, args=(init_method, backend, str(tmp_path), placement, world, suite), nprocs=world, join=True)
    got = [iter(torch.load(tmp_path / f"rank{r}.pt")) for r in range(world)]
    compared = 0
    cases = suite_cases(suite, world)
    for i, recipe, factor, bias, tokens, invalid, fp8, experts in cases:
        mine = [next(g) for g in got]
        want, dropped = reference(i, recipe, factor, bias, tokens, invalid, fp8, device, experts)
        name = (f"case {i} recipe={recipe} capacity_factor={factor} bias={bias} tokens={tokens} fp8_dispatch={fp8} "
                f"experts={experts}")
        if factor is not None:
            assert dropped > 0, f"{name}: the capacity should drop rows"
        for r in range(world):
            rows = slice(sum(tokens[:r]), sum(tokens[:r + 1])) if world == len(tokens) else slice(None)
            for key in ("y", "dx", "dprobs"):
                diff = (mine[r][key].float() - want[key][rows].float()).abs().max().item()
                print(f"{name} rank {r} {key}: max |diff| {diff}")
                assert torch.equal(mine[r][key], want[key][rows]), f"{name} rank {r} {key}: max |diff| {diff}"
            s = slice(*mine[r]["slice"])
            for key in ("w1", "w2", "b1", "b2"):
                if key not in want:
                    continue
                g, w = mine[r][key], want[key][s]
                err = rel_error(g, w)
                print(f"{name} rank {r} d{key}: rel error {err:.3g}, bit-exact {torch.equal(g, w)}")
                if factor is None:
                    assert torch.equal(g, w), f"{name} rank {r} d{key}: rel error {err}"
                else:
                    assert err <= DW_TOLERANCE[recipe], f"{name} rank {r} d{key}: rel error {err}"
        compared += 1
    assert compared == len(cases) > 0


def _skip_unless_gloo():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def test_expert_parallel_gloo(tmp_path):
    _skip_unless_gloo()
    run_and_compare("gloo", tmp_path, torch.device("cpu"))


def test_expert_parallel_gloo_four_ranks(tmp_path):
    """Four ranks: two local experts a rank (the regrouping over four sources), and one local expert a
    rank (no regrouping); unequal token counts, invalid ids, every slot to rank 0's experts, both
    recipes, with and without a capacity."""
    _skip_unless_gloo()
    run_and_compare("gloo", tmp_path, torch.device("cpu"), world=4, suite="four")


def test_expert_parallel_gloo_one_rank(tmp_path):
    """A group of one (EP = 1: every expert local, the global batch), the cases without a capacity."""
    _skip_unless_gloo()
    run_and_compare("gloo", tmp_path, torch.device("cpu"), world=1)


def _skip_unless_gpus(what, n_needed, backend="nccl"):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < n_needed:
        pytest.skip(f"{what} needs {n_needed} GPU{'s' if n_needed > 1 else ''}, found {n}")
    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("torch.distributed was built without NCCL")
    if backend == "gloo":
        _skip_unless_gloo()
    try:  # the permute steps need a CUDA backend (cuda_portable)
        mxmoe_torch.permute(torch.zeros(1, H, dtype=torch.bfloat16, device="cuda"),
                            torch.zeros(1, K, dtype=torch.int32, device="cuda"), experts=E)
    except RuntimeError as error:
        pytest.skip(f"mxmoe permute does not run on CUDA in this build: {error}")


def test_expert_parallel_nccl(tmp_path):
    _skip_unless_gpus("the NCCL expert-parallel test", 2)
    run_and_compare("nccl", tmp_path, torch.device("cuda", 0), placement="cuda")


def test_expert_parallel_gloo_two_ranks_on_one_gpu(tmp_path):
    """What a one-GPU machine can check of the GPU side: two ranks on cuda:0, gloo moving the CUDA
    tensors (through host memory), every mxmoe step (permute, quantize and pack, regroup, the local
    layer, unpermute) on the GPU; every case, equal to the single-process layer on the GPU."""
    _skip_unless_gpus("the GPU gloo expert-parallel test", 1, backend="gloo")
    run_and_compare("gloo", tmp_path, torch.device("cuda", 0), placement="cuda:0")


def test_expert_parallel_nccl_one_rank(tmp_path):
    """NCCL with a group of one (every expert local, the global batch): the module's collectives through
    NCCL on one GPU, equal to the single-process layer (the cases without a capacity)."""
    _skip_unless_gpus("the one-rank NCCL expert-parallel test", 1)
    run_and_compare("nccl", tmp_path, torch.device("cuda", 0), placement="cuda", world=1)


GRAPH_CASES = [("bf16", False), ("mxfp8", True)]  # (recipe, fp8_dispatch), static capacity 0.75


def _graph_worker(rank, init_method, out_dir, world=WORLD):
    """The static-capacity mode (no host read) captured in one CUDA graph, forward and backward, then
    replayed on two new batches copied into the captured inputs: every output and gradient of each
    replay must equal an eager run on the same batch."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world)
    try:
        report = []
        for c, (recipe, fp8) in enumerate(GRAPH_CASES):
            full, _ = make_data(100 + c, recipe, False, (24, 24), False)
            ep = mxmoe_torch.ExpertParallelMLP.from_grouped_mlp(make_layer(full, recipe, E, device),
                                                                capacity_factor=0.75, fp8_dispatch=fp8,
                                                                device=device)
            batches = [[t.to(device) for t in make_data(200 + 10 * c + b, recipe, False, (24, 24), False)[1][rank]]
                       for b in range(3)]
            params = [q for q in ep.local.parameters()]

            def step(x, ids, probs, dy):
                y = ep(x, ids, probs)
                (y.float() * dy).sum().backward()
                return y

            def eager(batch):
                for q in params:
                    q.grad = None
                x, ids, probs, dy = batch
                x, probs = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
                y = step(x, ids, probs, dy)
                return [y.detach().clone(), x.grad.clone(), probs.grad.clone()] + [q.grad.clone() for q in params]

            want = [eager(b) for b in batches[1:]]
            x_s, ids_s, probs_s, dy_s = (t.clone() for t in batches[0])
            x_s.requires_grad_(True)
            probs_s.requires_grad_(True)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs asks
                for _ in range(2):
                    for t in [x_s, probs_s] + params:
                        t.grad = None
                    step(x_s, ids_s, probs_s, dy_s)
            torch.cuda.current_stream().wait_stream(side)
            for t in [x_s, probs_s] + params:
                t.grad = None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y_s = step(x_s, ids_s, probs_s, dy_s)
            for b, batch in enumerate(batches[1:]):
                with torch.no_grad():
                    for dst, src in zip((x_s, ids_s, probs_s, dy_s), batch):
                        dst.copy_(src)
                graph.replay()
                torch.cuda.synchronize()
                got = [y_s, x_s.grad, probs_s.grad] + [q.grad for q in params]
                same = [torch.equal(g, w) for g, w in zip(got, want[b])]
                report.append((recipe, b, same))
        torch.save(report, os.path.join(out_dir, f"graph{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_graph_test(tmp_path, world):
    init_method = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_graph_worker, args=(init_method, str(tmp_path), world), nprocs=world, join=True)
    for r in range(world):
        report = torch.load(tmp_path / f"graph{r}.pt")
        assert len(report) == 2 * len(GRAPH_CASES)
        for recipe, b, same in report:
            print(f"rank {r} {recipe} replay {b}: equal to eager {same}")
            assert all(same), f"rank {r} {recipe} replay {b}: y, dx, dprobs, dW equal to eager: {same}"


def test_static_capacity_captures_in_a_cuda_graph_nccl(tmp_path):
    _skip_unless_gpus("the NCCL CUDA-graph test", 2)
    _run_graph_test(tmp_path, WORLD)


def test_static_capacity_captures_in_a_cuda_graph_nccl_one_rank(tmp_path):
    """The capture with a group of one on one GPU: the NCCL collectives (a group of one still runs its
    all_to_all_single through NCCL) inside the graph, replays equal to eager."""
    _skip_unless_gpus("the one-rank NCCL CUDA-graph test", 1)
    _run_graph_test(tmp_path, 1)


def test_regroup_index():
    from mxmoe_torch._ep import _regroup_index_n
    counts = torch.tensor([[2, 0, 1], [1, 3, 0]])  # W = 2 sources, L = 3 local experts
    n = int(counts.sum())
    dest, inv = _regroup_index_n(counts, n)
    # received rows: (w0,l0) a0 a1 | (w0,l2) c0 | (w1,l0) d0 | (w1,l1) e0 e1 e2
    # by expert:     l0: a0 a1 d0 | l1: e0 e1 e2 | l2: c0
    assert dest.tolist() == [0, 1, 6, 2, 3, 4, 5]
    assert inv.tolist() == [0, 1, 3, 4, 5, 6, 2]


def test_needs_initialised_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already initialised here")
    with pytest.raises(RuntimeError, match="init_process_group"):
        mxmoe_torch.ExpertParallelMLP(H, F, E, recipe="bf16")


def test_wire_matters():
    """The wide-range case is one where MXFP8 dispatch changes the result: the column-wise MXFP8 copy
    of wire_rows(x) (what the layer's dW1 reads) differs from that of x."""
    i = next(i for i, c in enumerate(CASES) if c[4] == "wide")
    _, ranks = make_data(i, "mxfp8", False, CASES[i][3], "wide")
    x = torch.cat([r[0] for r in ranks])
    ops = torch.ops.mxmoe
    col = lambda t: ops.dequantize_mxfp8(*ops.quantize_mxfp8(t, "col"), "col", dtype=torch.float32)
    assert not torch.equal(col(wire_rows(x)), col(x))


def test_fp8_dispatch_needs_mxfp8_and_wire_rows_are_exact():
    """wire_rows is idempotent in value (what the receiving layer re-quantizes gives back the same
    values), and the bf16 recipe refuses fp8_dispatch before any exchange."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(37, H, generator=g) * 3).bfloat16()
    once = wire_rows(x)
    assert torch.equal(wire_rows(once), once)
    assert (once.float() - x.float()).abs().max() > 0  # it is a real quantization
    layer = make_layer({"w1": torch.zeros(2, 2 * F, H).bfloat16(), "w2": torch.zeros(2, H, F).bfloat16()}, "bf16", 2,
                       torch.device("cpu"))
    with pytest.raises(ValueError, match="fp8_dispatch needs the mxfp8 recipe"):
        mxmoe_torch.expert_parallel_mlp(x, torch.zeros(37, K, dtype=torch.int64), None, layer, experts=2,
                                        fp8_dispatch=True)


def _bytes_worker(rank, init_method, out_dir):
    """Records (phase, bytes sent) for every all_to_all_single of one mxfp8 forward + backward, fp8
    dispatch on and off."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    try:
        sent, phase = [], ["forward"]
        real = dist.all_to_all_single

        def counting(out, inp, *a, **kw):
            sent.append((phase[0], inp.numel() * inp.element_size()))
            return real(out, inp, *a, **kw)

        full, ranks = make_data(0, "mxfp8", False, (24, 24), False)
        x, ids, probs, dy = ranks[rank]
        totals = {}
        for fp8 in (False, True):
            ep = mxmoe_torch.ExpertParallelMLP.from_grouped_mlp(make_layer(full, "mxfp8", E, torch.device("cpu")),
                                                                fp8_dispatch=fp8)
            sent.clear()
            phase[0] = "forward"
            dist.all_to_all_single = counting
            try:
                xg, pg = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
                y = ep(xg, ids, pg)
                phase[0] = "backward"
                (y.float() * dy).sum().backward()
            finally:
                dist.all_to_all_single = real
            totals[fp8] = list(sent)
        torch.save(totals, os.path.join(out_dir, f"bytes{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fp8_dispatch_bytes(tmp_path):
    """What travels: MXFP8 dispatch sends each row's E4M3 bytes, scale bytes and probability in one packed
    uint8 row (H + roundup(H/32, 4) + 4 bytes) by ONE all_to_all_single; the bf16 dispatch sends the bf16
    rows (2H) and the float32 probabilities (4 bytes) by two. Backward is the same for both: the return's
    reverse (bf16 rows), then the dispatch's reverse, bf16 rows and float32 probabilities."""
    _skip_unless_gloo()
    mp.spawn(_bytes_worker, args=(f"tcp://127.0.0.1:{free_port()}", str(tmp_path)), nprocs=WORLD, join=True)
    rows = 24 * K  # every slot valid, no capacity: every rank sends 48 rows (and receives n_recv)
    counts = E * 8
    for r in range(WORLD):
        t = torch.load(tmp_path / f"bytes{r}.pt")
        bf16, fp8 = t[False], t[True]
        n_recv = bf16[3][1] // (2 * H)  # the results go back from the rows this rank received
        # forward: counts, rows, (bf16: probabilities,) results
        assert bf16[:4] == [("forward", counts), ("forward", rows * 2 * H), ("forward", rows * 4),
                            ("forward", n_recv * 2 * H)], bf16
        assert fp8[:3] == [("forward", counts), ("forward", rows * (H + (H // 32 + 3) // 4 * 4 + 4)),
                           ("forward", n_recv * 2 * H)], fp8
        # backward: the results' gradient (bf16), then the dispatch's reverse: rows (bf16) and probabilities
        back = [("backward", rows * 2 * H)] + sorted([("backward", n_recv * 2 * H), ("backward", n_recv * 4)])
        assert bf16[4:5] + sorted(bf16[5:]) == back, bf16
        assert fp8[3:4] + sorted(fp8[4:]) == back, fp8


def test_pack_rows_round_trip():
    """_pack_rows / _unpack_rows: one uint8 row = E4M3 bytes, the row's compact scale bytes (the padding
    columns included: H = 32, 96, 160, 2880 pad roundup(H/32, 4)), the probability's 4 bytes; the
    unpacked parts are views of the packed rows, bit-identical to the quantizer's output and to the
    probabilities (signed zeros, subnormals, NaN included), and dequantizing them (the scale rows in a
    128-row padded matrix) gives dequant(quant_row(x)) bit for bit."""
    from mxmoe_torch._ep import _pack_rows, _packed_row_bytes, _scale_cols, _unpack_rows
    ops = torch.ops.mxmoe
    g = torch.Generator().manual_seed(11)
    for hidden in (32, 64, 96, 160, 2880):
        S = _scale_cols(hidden)
        assert S == (hidden // 32 + 3) // 4 * 4 and S % 4 == 0 and S >= hidden // 32
        for n in (0, 1, 37, 129):
            x = (torch.randn(n, hidden, generator=g) * torch.exp2(-8 * torch.rand(n, hidden, generator=g))).bfloat16()
            probs = torch.rand(n, generator=g)
            special = torch.tensor([-0.0, 0.0, 1e-42, float("nan"), float("inf"), 1.0])[:n]
            probs[:special.numel()] = special
            packed = _pack_rows(x, probs)
            assert packed.dtype == torch.uint8 and packed.shape == (n, _packed_row_bytes(hidden))
            assert _packed_row_bytes(hidden) == hidden + S + 4
            q, s, p = _unpack_rows(packed, hidden)
            assert q.shape == (n, hidden) and s.shape == (n, S) and p.shape == (n,) and p.dtype == torch.float32
            if n:  # views of the packed rows at offsets 0, H, H + S
                base = packed.data_ptr()
                assert (q.data_ptr(), s.data_ptr(), p.data_ptr()) == (base, base + hidden, base + hidden + S)
            want_q, want_s = ops.quantize_mxfp8(x, "row")
            assert torch.equal(q, want_q.view(torch.uint8))
            assert torch.equal(s, want_s.view(-1, S)[:n])
            assert torch.equal(p.view(torch.int32), probs.view(torch.int32))
            scales = torch.zeros((n + 127) // 128 * 128, S, dtype=torch.uint8)
            scales[:n] = s
            got = ops.dequantize_mxfp8(q.contiguous().view(torch.float8_e4m3fn), scales.view(-1), "row",
                                       dtype=torch.bfloat16)
            want = ops.dequantize_mxfp8(want_q, want_s, "row", dtype=torch.bfloat16)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("order", ["index", "blocks", "blocks_l1"])
def test_regroup_and_ungroup(order):
    """_regroup writes (or returns) the rows in the local order the old expressions gave; _ungroup is
    bit for bit (signed zeros included) the gradient autograd computes through them."""
    from mxmoe_torch._ep import _regroup, _regroup_index_n, _ungroup
    g = torch.Generator().manual_seed(3)
    if order == "index":
        counts = torch.tensor([[2, 0, 3], [1, 4, 0]])
        n = int(counts.sum())
        _, plan = _regroup_index_n(counts, n)
        old = lambda t: t.index_select(0, plan)
    else:
        W, L, C = (2, 3, 2) if order == "blocks" else (2, 1, 3)
        n, plan = W * L * C, (W, L, C)
        old = lambda t: t.reshape((W, L, C) + tuple(t.shape[1:])).transpose(0, 1).reshape((n,) + tuple(t.shape[1:]))
    wide = torch.randint(0, 256, (n, 24), dtype=torch.uint8, generator=g)
    for t in (wide[:, 5:13], wide[:, 4:12].view(torch.int32), wide[:, 16:20].view(torch.float32).view(n),
              torch.randn(n, 6).bfloat16()):
        want = old(t)
        assert torch.equal(_regroup(t, plan), want)
        out = torch.full((n + 3,) + tuple(t.shape[1:]), 7, dtype=t.dtype)[:n]
        assert _regroup(t, plan, out=out).data_ptr() == out.data_ptr()
        assert torch.equal(out.view(torch.uint8), want.contiguous().view(torch.uint8))
    for shape in ((n, 6), (n,)):
        src = torch.randn(shape, generator=g).bfloat16().requires_grad_(True)
        dy = torch.randn(shape, generator=g).bfloat16()
        dy[::2] = -0.0
        (got_old,) = torch.autograd.grad(old(src), src, dy)
        got = _ungroup(dy, plan, n)
        assert got.shape == src.shape
        assert torch.equal(got.contiguous().view(torch.int16), got_old.contiguous().view(torch.int16))
