"""x-stationary LM head (shaders/lm_head.wgsl via webinfer.kernels.lm_head) against the quant dequantizer + numpy.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_lm_head.py -q
Tolerance: f32 accumulation over K in another order than numpy: atol 4e-4 * sqrt(K) on outputs of magnitude
~sqrt(K) (random normal data), rtol 1e-4 (as test_gemv.py). The kernel has no f16 path (x stays f32), so the
gpu and gpu_f32 devices run the same code; both are exercised.
Pipelines compile per (dtype, ceil(K/32), tile, rows per lane) and lavapipe compiles the unrolled kernel slowly
(seconds per variant, a minute for tile 4 at K=576): the tests reuse q8 K=100 rows-per-lane 16 (cached) wherever
they can and name one tile where one is enough.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from webinfer_packager.quant import dequantize, quantize

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.linear import WeightPart
from webinfer.kernels.lm_head import LMHead, supports

pytestmark = pytest.mark.gpu


def make_weight(dtype, n, k, gs, seed):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    comps = quantize(dtype, w, gs)
    return comps, dequantize(dtype, comps, [n, k], gs, None)


def parts_of(dev, comps, splits):
    """One WeightPart per row range [a, b) of `splits` (a head split over several bindings)."""
    parts = []
    for a, b in splits:
        def up(c, a=a, b=b):
            return GpuArray.upload(dev, np.ascontiguousarray(comps[c][a:b])).binding
        parts.append(WeightPart(a, b - a, up("qweight"), up("scales"), up("mins") if "mins" in comps else None))
    return parts


def rows_x(t, k, seed):
    xs = -(-k // 4) * 4
    x = np.full((t, xs), np.nan, np.float32)  # NaN past K: must never be read
    x[:, :k] = np.random.default_rng(seed).standard_normal((t, k))
    return x, xs


def step_buf(dev, count):
    return GpuArray.upload(dev, np.array([0, count, 0, 0], np.uint32)).binding  # count in entry 1 (STEP_SAMPLED)


def run_head(dev, lib, dtype, n, k, t, gs=32, seed=0, splits=None, tile="auto", rpl=None, rows=None):
    comps, wref = make_weight(dtype, n, k, gs, seed)
    x, xs = rows_x(t, k, seed + 1)
    out = GpuArray.empty(dev, (t, n))
    kw = {} if rpl is None else {"rpl": rpl}
    head = LMHead(lib, dtype, n, k, gs, parts_of(dev, comps, splits or [(0, n)]), GpuArray.upload(dev, x).binding,
                  out.binding, xs, n, step_buf(dev, t if rows is None else rows), count_index=1, tile=tile, **kw)
    run(dev, lambda c: head.encode(c, t))
    return out, (x[:, :k].astype(np.float64) @ wref.T.astype(np.float64)).astype(np.float32)


def tol(k):
    return 4e-4 * np.sqrt(k), 1e-4


@pytest.mark.parametrize("dtype,n,k,t,tile", [("q8", 1000, 100, 17, 4), ("q4", 130, 77, 3, 2), ("q4a", 1, 77, 1, 1)])
def test_lm_head_matches_dequantized_matmul(gpu, kernels, dtype, n, k, t, tile):
    # N not a multiple of the 64 * 16 rows of a workgroup, K not a multiple of 32 (77, 100) or of 4 (77),
    # a single weight row; T=17 in five tiles of 4 (the last partial), T=3 in two tiles of 2 (one slot idle), T=1
    out, ref = run_head(gpu, kernels, dtype, n, k, t, rpl=16, tile=tile)
    check_op(out, ref, *tol(k), name=f"{dtype} {n}x{k} T={t}")



@pytest.mark.parametrize("dtype", ["q4a"])
def test_lm_head_group_64_split_bindings_f32_device(gpu_f32, dtype):
    # a head split over three bindings (rows [0, 300), [300, 301), [301, 700)), group size 64, 2 rows (tile 2)
    from webinfer.kernels.library import KernelLibrary

    lib = KernelLibrary(gpu_f32)
    out, ref = run_head(gpu_f32, lib, dtype, 700, 100, 2, gs=64, splits=[(0, 300), (300, 301), (301, 700)], rpl=16,
                        tile=2)
    check_op(out, ref, *tol(100), name=f"{dtype} gs 64, 3 bindings")


def test_lm_head_rows_beyond_step_count_untouched(gpu, kernels):
    # 4 rows recorded, step says 2: rows 2, 3 keep the guard pattern (NaN)
    out, ref = run_head(gpu, kernels, "q8", 300, 100, 4, rows=2, rpl=16, tile=4)
    ref[2:] = np.nan
    check_op(out, ref, *tol(100), name="rows >= count")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("dtype,k", [("q8", 100)])
def test_lm_head_row_alone_vs_among_15_bitwise(gpu, kernels, dtype, k):
    """A sampled row's logits are the same bits alone (tile 1), in slot 1 of a tile of 2, and among 15 or 16 other
    rows (tiles of 4, full and partial last tiles), with a K tail (100)."""
    n = 1100
    comps, _ = make_weight(dtype, n, k, 32, 21)
    x, xs = rows_x(17, k, 22)
    parts = parts_of(gpu, comps, [(0, n)])
    heads = {}

    def go(rows):
        out = GpuArray.empty(gpu, (len(rows), n))
        xb = GpuArray.upload(gpu, x[rows]).binding
        head = LMHead(kernels, dtype, n, k, 32, parts, xb, out.binding, xs, n, step_buf(gpu, len(rows)), count_index=1,
                      rpl=16)
        heads[len(rows)] = head
        run(gpu, lambda c: head.encode(c, len(rows)))
        return out.read()

    for r in (5, 14):
        alone = go([r])[0]
        assert not np.isnan(alone).any()
        assert np.array_equal(_bits(alone), _bits(go([0, r])[1])), f"row {r} in slot 1 of a tile of 2"
        assert np.array_equal(_bits(alone), _bits(go(list(range(16)))[r])), f"row {r} among 16"
        assert np.array_equal(_bits(alone), _bits(go(list(range(17)))[r])), f"row {r} among 17"


def test_lm_head_tile_choice_and_limits(kernels):
    assert supports("q8", 576) and supports("q4", 1024) and not supports("q8", 1025) and not supports("f32", 64)
    with pytest.raises(ValueError, match="unsupported"):
        LMHead(kernels, "q8", 8, 2048, 32, [], None, None, 2048, 8, None)
    comps, _ = make_weight("q8", 8, 100, 32, 1)
    dev = kernels.device
    head = LMHead(kernels, "q8", 8, 100, 32, parts_of(dev, comps, [(0, 8)]), GpuArray.empty(dev, (16, 100)).binding,
                  GpuArray.empty(dev, (16, 8)).binding, 100, 8, step_buf(dev, 16), rpl=16)
    picked = {}
    for rows in (1, 2, 3, 4, 5, 16):
        class Rec:
            def dispatch(self, pipeline, bg, gx, gy, gz, label, rows=rows):
                picked[rows] = (pipeline, gy)
        head.encode(Rec(), rows)
    tiles = {p: tt for p, tt, _ in head._variants}
    assert {r: (tiles[p], gy) for r, (p, gy) in picked.items()} == {
        1: (1, 1), 2: (2, 1), 3: (4, 1), 4: (4, 1), 5: (4, 2), 16: (4, 4)}


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 2500), t=st.integers(1, 9), seed=st.integers(0, 1000))
def test_lm_head_hypothesis_shapes(gpu, kernels, n, t, seed):
    # q8, K=100 only: each new (dtype, K) compiles three pipelines (slow on lavapipe); N and T drawn
    out, ref = run_head(gpu, kernels, "q8", n, 100, t, seed=seed, rpl=16)
    check_op(out, ref, *tol(100), name=f"q8 {n}x100 T={t}")
