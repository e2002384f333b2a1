"""Token permute / unpermute: torch.ops.mxmoe.{permute_tokens, unpermute_tokens, permute_by_map} and
mxmoe_torch.{permute, unpermute, permute_by_map} against a pure-PyTorch reference (stable argsort by
expert, then token, then slot; index gathers; an fp32 sum in slot order rounded once to bf16), their
gradients against float64 autograd through the reference, opcheck, and the CUDA path (which today
raises a RuntimeError naming the step no backend serves; the test turns into a comparison with the
CPU results once kernels land).

Run: PYTHONPATH=python MXMOE_TORCH_LIBRARY=<build>/python/libmxmoe_torch.so python -m pytest python/tests"""

import pytest
import torch

import mxmoe_torch

ops = torch.ops.mxmoe
CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------- reference

def ref_route(ids, experts, capacity):
    """(order of kept slots [R_kept] as flat slot indices t*K+k, offsets [E+1] int64, row_map [T, K] int64,
    invalid count): sort slots by expert, then token, then slot (the flat index), keep each expert's
    first `capacity`, drop ids outside [0, E)."""
    T, K = ids.shape
    flat = ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < experts)
    key = torch.where(valid, flat, torch.full_like(flat, experts))  # invalid ids sort last
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    counts = torch.bincount(flat[valid], minlength=experts)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - torch.cat([starts, starts.new_zeros(1)])[sorted_key]
    keep = sorted_key < experts
    if capacity >= 0:
        keep &= rank < capacity
    kept_counts = counts.clamp(max=capacity) if capacity >= 0 else counts
    offsets = torch.nn.functional.pad(torch.cumsum(kept_counts, 0), (1, 0))
    kept = order[keep]
    rows = offsets[sorted_key[keep]] + rank[keep]
    row_map = torch.full((T * K,), -1, dtype=torch.long)
    row_map[kept] = rows
    return offsets, row_map.view(T, K), int((~valid).sum())


def ref_rows(T, K, experts, capacity):
    return T * K if capacity < 0 else min(T * K, experts * capacity)


def ref_scatter(x, row_map, rows):
    """out[row_map[t, k]] = x[t] for every kept slot, zeros elsewhere (differentiable, any dtype).
    x [T, ...]; row_map [T, K]."""
    T, K = row_map.shape
    flat = row_map.reshape(-1).long()
    kept = flat >= 0
    src = x.unsqueeze(1).expand(T, K, *x.shape[1:]).reshape(T * K, *x.shape[1:])
    out = x.new_zeros((rows, *x.shape[1:]))
    return out.index_put((flat[kept],), src[kept])


def ref_scatter_slots(probs, row_map, rows):
    """out[row_map[t, k]] = probs[t, k] for every kept slot, zeros elsewhere (differentiable)."""
    flat = row_map.reshape(-1).long()
    kept = flat >= 0
    return probs.new_zeros(rows).index_put((flat[kept],), probs.reshape(-1)[kept])


def ref_gather(py, row_map):
    """[T, K, ...]: py[row_map[t, k]], zeros where dropped (differentiable, any dtype)."""
    flat = row_map.reshape(-1).long()
    padded = torch.cat([py, py.new_zeros((1, *py.shape[1:]))])  # row R: the zero a dropped slot reads
    g = padded[torch.where(flat >= 0, flat, py.shape[0])]
    return g.view(*row_map.shape, *py.shape[1:])


def ref_unpermute_bf16(py, row_map):
    """The op's numerics: fp32 from +0, in slot order, dropped slots skipped, rounded once to bf16."""
    T, K = row_map.shape
    acc = torch.zeros(T, py.shape[1], dtype=torch.float32)
    for k in range(K):
        m = row_map[:, k].long()
        rows = torch.cat([py, py.new_zeros(1, py.shape[1])])[torch.where(m >= 0, m, py.shape[0])]
        acc = torch.where((m >= 0).unsqueeze(1), acc + rows.float(), acc)
    return acc.to(torch.bfloat16)


# ---------------------------------------------------------------- inputs

def make_ids(T, K, E, g, used=None, invalid=0.0):
    """Ids [T, K] int32 from `used` experts (so the others stay empty), distinct per token where
    possible; a fraction `invalid` replaced by -1 or ids >= E."""
    used = list(range(E)) if used is None else used
    rows = []
    for _ in range(T):
        perm = torch.randperm(len(used), generator=g)
        rows.append([used[int(perm[k % len(used)])] for k in range(K)])
    ids = torch.tensor(rows, dtype=torch.int32).view(T, K)
    if invalid and T:
        bad = torch.rand(T, K, generator=g) < invalid
        wild = torch.where(torch.rand(T, K, generator=g) < 0.5, torch.tensor(-1), torch.tensor(E + 3))
        ids = torch.where(bad, wild.to(torch.int32), ids)
    return ids


def make_inputs(T, H, K, E, seed, used=None, invalid=0.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(T, H, generator=g, dtype=torch.float64) * 2 - 1).to(torch.bfloat16)
    ids = make_ids(T, K, E, g, used, invalid)
    probs = torch.rand(T, K, generator=g, dtype=torch.float64).to(torch.float32)
    return x, ids, probs, g


CASES = [  # (T, H, K, E, capacity, used experts or None, invalid fraction)
    (37, 32, 1, 4, -1, None, 0.0),
    (37, 32, 2, 6, -1, [0, 2, 5], 0.0),          # empty experts
    (29, 64, 8, 16, -1, list(range(0, 16, 2)), 0.0),
    (40, 32, 2, 4, 7, None, 0.0),                # capacity drops
    (23, 16, 8, 12, 3, [1, 4, 5, 6, 7, 8, 9, 11], 0.1),
    (31, 32, 2, 5, -1, None, 0.2),               # invalid ids: -1 and >= E
    (16, 16, 2, 3, 0, None, 0.0),                # capacity 0: nothing kept
    (8, 16, 8, 64, 2, None, 0.0),                # E * C > T * K
    (0, 32, 2, 4, -1, None, 0.0),                # no tokens
    (0, 32, 8, 4, 3, None, 0.0),
]


def case_id(c):
    return f"T{c[0]}-H{c[1]}-K{c[2]}-E{c[3]}-C{c[4]}" + ("-empty" if c[5] else "") + ("-invalid" if c[6] else "")


# ---------------------------------------------------------------- forward vs reference

@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("with_probs", [True, False])
def test_permute_tokens_matches_reference(case, with_probs):
    T, H, K, E, C, used, bad = case
    x, ids, probs, _ = make_inputs(T, H, K, E, seed=T * 31 + K, used=used, invalid=bad)
    px, offsets, row_map, pprobs, invalid = ops.permute_tokens(x, ids, probs if with_probs else None, E, C)
    r_offsets, r_map, r_invalid = ref_route(ids, E, C)
    R = ref_rows(T, K, E, C)
    assert offsets.dtype == row_map.dtype == invalid.dtype == torch.int32
    assert torch.equal(offsets.long(), r_offsets)
    assert torch.equal(row_map.long(), r_map)
    assert invalid.tolist() == [r_invalid]
    assert px.shape == (R, H) and px.dtype == torch.bfloat16
    assert torch.equal(px, ref_scatter(x, r_map, R))  # rows past offsets[E] are zeros
    if with_probs:
        assert pprobs.shape == (R,) and pprobs.dtype == torch.float32
        assert torch.equal(pprobs, ref_scatter_slots(probs, r_map, R))
    else:
        assert pprobs.shape == (0,)
    # The rows of each expert are its slots in token, then slot order.
    for e in range(E):
        slots = ((r_map >= offsets[e]) & (r_map < offsets[e + 1])).nonzero()
        assert (ids[slots[:, 0], slots[:, 1]] == e).all()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_unpermute_and_permute_by_map_match_reference(case):
    T, H, K, E, C, used, bad = case
    x, ids, probs, g = make_inputs(T, H, K, E, seed=T * 17 + K + 1, used=used, invalid=bad)
    _, _, row_map, pprobs, _ = ops.permute_tokens(x, ids, probs, E, C)
    R = ref_rows(T, K, E, C)
    py = (torch.randn(R, H, generator=g, dtype=torch.float64) * 4).to(torch.bfloat16)
    y, gathered = ops.unpermute_tokens(py, row_map, pprobs)
    assert y.shape == (T, H) and y.dtype == torch.bfloat16
    assert torch.equal(y, ref_unpermute_bf16(py, row_map))
    assert torch.equal(gathered, ref_gather(pprobs, row_map))
    assert torch.equal(gathered, torch.where(row_map >= 0, probs, torch.zeros_like(probs)))
    y_only, none = ops.unpermute_tokens(py, row_map)
    assert torch.equal(y_only, y) and none.shape == (0,)
    # permute_by_map with permute_tokens' row_map moves the same rows.
    for rows in (R, R + 5):
        bx, bprobs = ops.permute_by_map(x, row_map, probs, rows)
        assert torch.equal(bx, ref_scatter(x, row_map, rows))
        assert torch.equal(bprobs, ref_scatter_slots(probs, row_map, rows))
    px, *_ = ops.permute_tokens(x, ids, None, E, C)
    assert torch.equal(ops.permute_by_map(x, row_map, None, R)[0], px)


@pytest.mark.parametrize("K", [1, 2, 8])
def test_round_trip_is_k_times_x(K):
    x, ids, probs, _ = make_inputs(41, 64, K, 8, seed=K)
    p = mxmoe_torch.permute(x, ids, probs, experts=8)
    assert int(p.offsets[-1]) == 41 * K and p.invalid.item() == 0
    u = mxmoe_torch.unpermute(p.x, p.row_map, p.probs)
    assert torch.equal(u.y, (x.float() * K).to(torch.bfloat16))  # exact for K a power of two
    assert torch.equal(u.probs, probs)


# ---------------------------------------------------------------- Python API

def test_python_api_conversions_and_results():
    x, ids, probs, _ = make_inputs(19, 32, 2, 5, seed=3, invalid=0.1)
    p = mxmoe_torch.permute(x, ids.long(), probs.to(torch.bfloat16), experts=5, capacity=6)
    ref = ops.permute_tokens(x, ids, probs.to(torch.bfloat16).float(), 5, 6)
    assert isinstance(p, mxmoe_torch.Permuted)
    for got, want in zip(p, ref):
        assert torch.equal(got, want)
    assert p.x.shape[0] == mxmoe_torch.permuted_rows_bound(19, 2, 5, 6) == 30  # min(T*K=38, E*C=30)
    q = mxmoe_torch.permute(x, ids, experts=5)
    assert q.probs is None and q.x.shape[0] == mxmoe_torch.permuted_rows_bound(19, 2, 5, -1) == 38
    y = mxmoe_torch.unpermute(p.x, p.row_map)
    assert isinstance(y, torch.Tensor) and torch.equal(y, ops.unpermute_tokens(p.x, p.row_map)[0])
    u = mxmoe_torch.unpermute(p.x, p.row_map.long(), p.probs)
    assert isinstance(u, mxmoe_torch.Unpermuted) and torch.equal(u.y, y)
    b = mxmoe_torch.permute_by_map(x, p.row_map, probs, rows=30)
    assert isinstance(b, mxmoe_torch.PermutedByMap)
    assert torch.equal(b.x, p.x) and torch.equal(b.probs, ops.permute_tokens(x, ids, probs, 5, 6)[3])
    assert torch.equal(mxmoe_torch.permute_by_map(x, p.row_map, rows=30), p.x)
    with pytest.raises(TypeError, match="expert_ids"):
        mxmoe_torch.permute(x, ids.float(), experts=5)
    # int64 ids go to the library as they are: a value past int32 (2^32 would wrap to expert 0) is
    # an id outside [0, E), dropped and counted like -1, on the CPU and on a GPU.
    wide = torch.where((ids >= 0) & (ids < 5), ids.long(), torch.tensor(2 ** 32, dtype=torch.int64))
    narrow = torch.where((ids >= 0) & (ids < 5), ids, torch.tensor(-1, dtype=torch.int32))
    devices = ["cpu"] + (["cuda"] if CUDA else [])
    for dev in devices:
        got = ops.permute_tokens(x.to(dev), wide.to(dev), probs.to(dev), 5, 6)
        want = ops.permute_tokens(x, narrow, probs, 5, 6)
        assert int(want[4]) > 0
        for g_, w_ in zip(got, want):
            assert torch.equal(g_.cpu(), w_), dev


def test_errors_name_the_argument():
    x, ids, probs, _ = make_inputs(9, 32, 2, 4, seed=5)
    with pytest.raises(RuntimeError, match="experts"):
        ops.permute_tokens(x, ids, None, 0, -1)
    with pytest.raises(RuntimeError, match="capacity"):
        ops.permute_tokens(x, ids, None, 4, -2)
    with pytest.raises(RuntimeError, match="x"):
        ops.permute_tokens(x.float(), ids, None, 4, -1)
    with pytest.raises(RuntimeError, match="probs"):
        ops.permute_tokens(x, ids, probs[:, :1].contiguous(), 4, -1)
    _, _, row_map, _, _ = ops.permute_tokens(x, ids, None, 4, -1)
    bad = row_map.clone()
    bad[3, 1] = 18
    with pytest.raises(RuntimeError, match=r"row_map\[3, 1\]=18"):
        ops.unpermute_tokens(torch.zeros(18, 32, dtype=torch.bfloat16), bad)
    twice = row_map.clone()
    twice[2, 0] = twice[1, 0]
    with pytest.raises(RuntimeError, match="repeats"):
        ops.permute_by_map(x, twice, None, 18)
    with pytest.raises(RuntimeError, match="device"):
        ops.permute_tokens(x, ids.to("meta"), None, 4, -1)


# ---------------------------------------------------------------- gradients

GRAD_CASES = [(23, 32, 1, 4, -1, None, 0.0), (23, 32, 2, 6, 5, [0, 1, 4], 0.1), (17, 16, 8, 8, -1, None, 0.15),
              (0, 16, 2, 4, -1, None, 0.0)]


def upstream(shape, g, dtype):
    return (torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("case", GRAD_CASES, ids=case_id)
def test_permute_backward_matches_float64_reference(case):
    """permute's backward is unpermute: dx = fp32 slot-order sum of d_permuted_x rows (bf16), dprobs a
    gather of d_permuted_probs. Checked against autograd through the reference in float64."""
    T, H, K, E, C, used, bad = case
    x, ids, probs, g = make_inputs(T, H, K, E, seed=7 + K, used=used, invalid=bad)
    x.requires_grad_(True)
    probs.requires_grad_(True)
    p = mxmoe_torch.permute(x, ids, probs, experts=E, capacity=C)
    R = p.x.shape[0]
    gx, gp = upstream((R, H), g, torch.bfloat16), upstream((R,), g, torch.float32)
    dx, dprobs = torch.autograd.grad((p.x, p.probs), (x, probs), (gx, gp))

    _, r_map, _ = ref_route(ids, E, C)
    x64 = x.detach().double().requires_grad_(True)
    p64 = probs.detach().double().requires_grad_(True)
    out = (ref_scatter(x64, r_map, R), ref_scatter_slots(p64, r_map, R))
    dx64, dp64 = torch.autograd.grad(out, (x64, p64), (gx.double(), gp.double()))
    assert dx.dtype == torch.bfloat16 and dprobs.dtype == torch.float32
    torch.testing.assert_close(dx.double(), dx64, rtol=2 ** -8, atol=1e-6 * K)  # one bf16 rounding
    assert torch.equal(dx, ref_unpermute_bf16(gx, r_map))  # and exactly the op's numerics
    assert torch.equal(dprobs.double(), dp64)  # a gather: exact

    # Only x differentiable: probs' path still works (no probs).
    q = mxmoe_torch.permute(x, ids, experts=E, capacity=C)
    (dx_only,) = torch.autograd.grad(q.x, x, gx)
    assert torch.equal(dx_only, dx)


@pytest.mark.parametrize("case", GRAD_CASES, ids=case_id)
def test_unpermute_backward_matches_float64_reference(case):
    """unpermute's backward is permute_by_map: d_permuted_y[row_map[t, k]] = dy[t] (zeros elsewhere),
    d_permuted_probs[row_map[t, k]] = dprobs[t, k]."""
    T, H, K, E, C, used, bad = case
    x, ids, probs, g = make_inputs(T, H, K, E, seed=11 + K, used=used, invalid=bad)
    p = mxmoe_torch.permute(x, ids, probs, experts=E, capacity=C)
    R = p.x.shape[0]
    py = upstream((R, H), g, torch.bfloat16).requires_grad_(True)
    pp = p.probs.detach().requires_grad_(True)
    u = mxmoe_torch.unpermute(py, p.row_map, pp)
    dy, dpr = upstream((T, H), g, torch.bfloat16), upstream((T, K), g, torch.float32)
    dpy, dpp = torch.autograd.grad((u.y, u.probs), (py, pp), (dy, dpr))

    py64 = py.detach().double().requires_grad_(True)
    pp64 = pp.detach().double().requires_grad_(True)
    out = (ref_gather(py64, p.row_map).sum(1), ref_gather(pp64, p.row_map))
    dpy64, dpp64 = torch.autograd.grad(out, (py64, pp64), (dy.double(), dpr.double()))
    assert torch.equal(dpy.double(), dpy64)  # pure data movement: exact
    assert torch.equal(dpp.double(), dpp64)
    # Adjoint identity <unpermute(py), dy> = <py, permute_by_map(dy)> in float64 (unpermute's value
    # taken before its bf16 rounding, i.e. the float64 reference forward).
    lhs = (out[0] * dy.double()).sum() + (out[1] * dpr.double()).sum()
    rhs = (py64 * dpy.double()).sum() + (pp64 * dpp.double()).sum()
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)

    (dpy_only,) = torch.autograd.grad(mxmoe_torch.unpermute(py, p.row_map), py, dy)
    assert torch.equal(dpy_only, dpy)


def test_permute_by_map_backward_and_double_backward():
    x, ids, probs, g = make_inputs(21, 32, 2, 5, seed=13, invalid=0.1)
    row_map = ops.permute_tokens(x, ids, None, 5, 4)[2]
    R = 24
    x.requires_grad_(True)
    probs.requires_grad_(True)
    b = mxmoe_torch.permute_by_map(x, row_map, probs, rows=R)
    gx, gp = upstream((R, 32), g, torch.bfloat16), upstream((R,), g, torch.float32)
    dx, dprobs = torch.autograd.grad((b.x, b.probs), (x, probs), (gx, gp), create_graph=True)
    assert torch.equal(dx, ref_unpermute_bf16(gx, row_map))
    assert torch.equal(dprobs, ref_gather(gp, row_map))
    # Double backward: the backward ran through unpermute's autograd Function; d(dx)/d(gx) is
    # permute_by_map again. gx did not require grad, so differentiate w.r.t. a fresh one.
    gx2 = gx.clone().requires_grad_(True)
    dx2, _ = torch.autograd.grad((b.x, b.probs), (x, probs), (gx2, gp), create_graph=True)
    w = upstream(dx2.shape, g, torch.bfloat16)
    (ddg,) = torch.autograd.grad(dx2, gx2, w)
    assert torch.equal(ddg, ref_scatter(w, row_map, R))


@pytest.mark.parametrize("capacity", [-1, 9])
def test_moe_block_with_grouped_mlp(capacity):
    """permute -> GroupedMLP (bf16 recipe, CPU) -> unpermute equals the same layer between the reference
    permute and unpermute, forward and backward (x, probs, w1)."""
    T, H, K, E = 25, 32, 2, 4
    x, ids, probs, _ = make_inputs(T, H, K, E, seed=29, used=[0, 1, 3], invalid=0.1)
    torch.manual_seed(0)
    layer = mxmoe_torch.GroupedMLP(hidden=H, ffn=32, experts=E, recipe="bf16")
    dy = torch.randn(T, H).to(torch.bfloat16)

    def ours(x, probs):
        p = mxmoe_torch.permute(x, ids, probs, experts=E, capacity=capacity)
        n = int(p.offsets[-1])
        return mxmoe_torch.unpermute(layer(p.x[:n], p.offsets, p.probs[:n]), p.row_map)

    def reference(x, probs):
        offsets, r_map, _ = ref_route(ids, E, capacity)
        n = int(offsets[-1])
        px, pp = ref_scatter(x, r_map, n), ref_scatter_slots(probs, r_map, n)
        out = layer(px, offsets.to(torch.int32), pp)
        return ref_gather(out.float(), r_map).sum(1).to(torch.bfloat16)  # K = 2: one fp32 add, one rounding

    results = []
    for fn in (ours, reference):
        layer.zero_grad()
        xi, pi = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        y = fn(xi, pi)
        y.backward(dy)
        results.append((y, xi.grad, pi.grad, layer.w1.grad.clone()))
    (y, dx, dp, dw1), (ry, rdx, rdp, rdw1) = results
    assert torch.equal(y, ry)
    torch.testing.assert_close(dx.float(), rdx.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(dp, rdp) and torch.equal(dw1, rdw1)
    assert dx.abs().sum() > 0 and dp.abs().sum() > 0


# ---------------------------------------------------------------- opcheck

def opcheck_cases():
    x, ids, probs, _ = make_inputs(27, 32, 2, 6, seed=17, used=[0, 2, 3, 5], invalid=0.1)
    row_map = ops.permute_tokens(x, ids, None, 6, 5)[2]
    py = torch.randn(30, 32).to(torch.bfloat16)
    pp = torch.rand(30)
    x8, ids8, probs8, _ = make_inputs(11, 16, 8, 16, seed=19)
    return [
        (ops.permute_tokens, (x, ids, probs, 6, -1)),
        (ops.permute_tokens, (x, ids, None, 6, 5)),
        (ops.permute_tokens, (x8, ids8, probs8, 16, 2)),
        (ops.unpermute_tokens, (py, row_map, pp)),
        (ops.unpermute_tokens, (py, row_map, None)),
        (ops.permute_by_map, (x, row_map, probs, 30)),
        (ops.permute_by_map, (x, row_map, None, 33)),
    ]


@pytest.mark.parametrize("index", range(7))
def test_permute_ops_pass_opcheck(index):
    op, args = opcheck_cases()[index]
    torch.library.opcheck(op, args)


def test_fake_shapes_match_real():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for op, args in opcheck_cases():
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        for r, f in zip(real, fake):
            assert r.shape == f.shape and r.dtype == f.dtype


def test_compiles_with_dynamic_tokens():
    def block(x, ids, probs):
        p = mxmoe_torch.permute(x, ids, probs, experts=6, capacity=-1)
        return mxmoe_torch.unpermute(p.x * 2, p.row_map, p.probs)

    compiled = torch.compile(block, backend="aot_eager", dynamic=True, fullgraph=True)
    for T in (13, 29):
        x, ids, probs, _ = make_inputs(T, 32, 2, 6, seed=T)
        x.requires_grad_(True)
        got = compiled(x, ids, probs)
        want = block(x, ids, probs)
        assert torch.equal(got.y, want.y) and torch.equal(got.probs, want.probs)
        (dx,) = torch.autograd.grad(got.y, x, torch.ones_like(got.y))
        (dx_eager,) = torch.autograd.grad(want.y, x, torch.ones_like(want.y))
        assert torch.equal(dx, dx_eager)


# ---------------------------------------------------------------- CUDA

NO_BACKEND = "no backend can run step"


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_refuses_clearly_until_kernels_land():
    """Today no CUDA backend serves route_tokens / permute_rows / unpermute_rows: each op raises a
    RuntimeError naming the step (skipped then, saying so). Once kernels land, the results must
    equal the CPU's (the same order, exact copies, the same fp32 slot-order sum)."""
    x, ids, probs, g = make_inputs(45, 64, 2, 6, seed=23, used=[0, 1, 3, 4], invalid=0.1)
    want = ops.permute_tokens(x, ids, probs, 6, 12)
    R = want[0].shape[0]
    py = upstream((R, 64), g, torch.bfloat16)
    cases = [("route_tokens", ops.permute_tokens, (x, ids, probs, 6, 12)),
             ("unpermute_rows", ops.unpermute_tokens, (py, want[2], want[3])),
             ("permute_rows", ops.permute_by_map, (x, want[2], probs, R))]
    refused = []
    for step, op, args in cases:
        cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            got = op(*cuda_args)
        except RuntimeError as e:
            assert NO_BACKEND in str(e) and step in str(e), str(e)
            refused.append(step)
            continue
        for gt, wt in zip(got, op(*args)):
            assert torch.equal(gt.cpu(), wt), step
    if refused:
        pytest.skip(f"no CUDA backend serves {', '.join(refused)} yet")
