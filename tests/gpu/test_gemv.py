"""GEMV kernel (shaders/gemv.wgsl via webinfer.kernels.linear) against the quant dequantizer + numpy matmul.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_gemv.py -q
Tolerance: f32 accumulation over K with a different summation order than numpy: atol 1e-4 * sqrt(K) on outputs
of magnitude ~sqrt(K) (random normal data), rtol 1e-4.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.linear import Linear, WeightPart, interleave_gate_up, split_rows
from webinfer_packager.pack.quant import dequantize, quantize

pytestmark = pytest.mark.gpu


def make_weight(dtype, n, k, gs, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    comps = quantize(dtype, w, gs)
    ref = dequantize(dtype, comps, [n, k], gs, None)
    return comps, ref


def upload_parts(dev, comps, n):
    return WeightPart(0, n, GpuArray.upload(dev, comps["qweight"]).binding, GpuArray.upload(dev, comps["scales"]).binding,
                      GpuArray.upload(dev, comps["mins"]).binding if "mins" in comps else None)


def step_buf(dev, *counts):
    return GpuArray.upload(dev, np.array(list(counts) + [0] * (4 - len(counts)), np.uint32)).binding


def run_linear(dev, lib, dtype, n, k, t, gs=32, seed=0, bias=False, accumulate=False, x_stride=None, rows8=False):
    comps, wref = make_weight(dtype, n, k, gs, seed)
    rng = np.random.default_rng(seed + 1)
    xs = x_stride or -(-k // 4) * 4
    x = np.zeros((t, xs), np.float32)
    x[:, :k] = rng.standard_normal((t, k))
    x[:, k:] = np.nan  # padding beyond K must never be read
    ref = x[:, :k].astype(np.float64) @ wref.T.astype(np.float64)
    y0 = rng.standard_normal((t, n)).astype(np.float32)
    out = GpuArray.upload(dev, y0) if accumulate else GpuArray.empty(dev, (t, n))
    if accumulate:
        ref = ref + y0
    b = None
    if bias:
        bnp = rng.standard_normal(n).astype(np.float32)
        ref = ref + bnp
        b = GpuArray.upload(dev, bnp).binding
    lin = Linear(lib, dtype, n, k, gs, [upload_parts(dev, comps, n)], GpuArray.upload(dev, x).binding, out.binding,
                 xs, n, step_buf(dev, t), bias=b, accumulate=accumulate, rows8=rows8)
    run(dev, lambda c: lin.encode(c, t))
    return out, ref.astype(np.float32), k


def tol(k):
    return 1e-4 * np.sqrt(k) * 4, 1e-4


@pytest.mark.parametrize("rows8", [False, True])
@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
@pytest.mark.parametrize("n,k,t", [(1, 32, 1), (37, 77, 1), (300, 576, 17), (64, 1000, 3), (5, 33, 16)])
def test_gemv_matches_dequantized_matmul(gpu, kernels, dtype, n, k, t, rows8):
    out, ref, k = run_linear(gpu, kernels, dtype, n, k, t, rows8=rows8)
    check_op(out, ref, *tol(k), name=f"{dtype} {n}x{k} T={t}")


@pytest.mark.parametrize("dtype", ["q4", "q4a"])
def test_gemv_group_64_bias_accumulate(gpu_f32, dtype):
    from webinfer.kernels.library import KernelLibrary

    lib = KernelLibrary(gpu_f32)
    out, ref, k = run_linear(gpu_f32, lib, dtype, 70, 200, 2, gs=64, bias=True)
    check_op(out, ref, *tol(k), name="bias")
    out, ref, k = run_linear(gpu_f32, lib, dtype, 70, 200, 2, gs=64, accumulate=True, rows8=True)
    check_op(out, ref, *tol(k), name="accumulate")


def test_gemv_rows_beyond_step_count_untouched(gpu, kernels):
    # the kernel reads T from the step buffer: rows >= T must stay as they were (guard pattern = NaN)
    comps, wref = make_weight("q4", 40, 64, 32, 3)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    out = GpuArray.empty(gpu, (4, 40))
    lin = Linear(kernels, "q4", 40, 64, 32, [upload_parts(gpu, comps, 40)], GpuArray.upload(gpu, x).binding,
                 out.binding, 64, 40, step_buf(gpu, 2))
    run(gpu, lambda c: lin.encode(c, 4))
    ref = np.full((4, 40), np.nan, np.float32)
    ref[:2] = x[:2] @ wref.T
    check_op(out, ref, 1e-3, 1e-4, "rows >= T")


def test_gemv_batch_invariance_bitwise(gpu, kernels):
    comps, _ = make_weight("q4a", 96, 576, 32, 5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    w = upload_parts(gpu, comps, 96)

    def go(rows):
        out = GpuArray.empty(gpu, (len(rows), 96))
        lin = Linear(kernels, "q4a", 96, 576, 32, [w], GpuArray.upload(gpu, x[rows]).binding, out.binding, 576, 96,
                     step_buf(gpu, len(rows)))
        run(gpu, lambda c: lin.encode(c, len(rows)))
        return out.read()

    alone = go([7])
    together = go(list(range(16)))
    assert np.array_equal(alone[0].view(np.uint32), together[7].view(np.uint32))


def test_gemv_swiglu_epilogue(gpu, kernels):
    f, k = 24, 96
    gc, gref = make_weight("q4", f, k, 32, 8)
    uc, uref = make_weight("q4", f, k, 32, 9)
    fused = {c: np.frombuffer(interleave_gate_up(split_rows(gc[c].tobytes(), f), split_rows(uc[c].tobytes(), f)),
                              np.uint8) for c in gc}
    x = np.random.default_rng(10).standard_normal((3, k)).astype(np.float32)
    out = GpuArray.empty(gpu, (3, f))
    lin = Linear(kernels, "q4", 2 * f, k, 32, [upload_parts(gpu, fused, 2 * f)], GpuArray.upload(gpu, x).binding,
                 out.binding, k, f, step_buf(gpu, 3), swiglu=True)
    run(gpu, lambda c: lin.encode(c, 3))
    g, u = x @ gref.T, x @ uref.T
    check_op(out, g / (1 + np.exp(-g)) * u, 1e-3, 1e-4, "swiglu")


@settings(max_examples=8, deadline=None)
@given(dtype=st.sampled_from(["q4", "q4a", "q8"]), n=st.integers(1, 300), k=st.integers(1, 300), t=st.integers(1, 5))
def test_gemv_hypothesis_shapes(gpu, kernels, dtype, n, k, t):
    out, ref, k = run_linear(gpu, kernels, dtype, n, k, t, seed=n * 7 + k)
    check_op(out, ref, *tol(k), name=f"{dtype} {n}x{k} T={t}")


@pytest.fixture(scope="module")
def lib_nosg():
    """A device without subgroups: the fallback path where every lane loads x itself."""
    import os

    from webinfer.gpu.native import request_device_sync
    from webinfer.kernels.library import KernelLibrary

    old = os.environ.get("WEBINFER_DISABLE_SUBGROUPS")
    os.environ["WEBINFER_DISABLE_SUBGROUPS"] = "1"
    try:
        dev = request_device_sync(limits="browser")
    finally:
        if old is None:
            os.environ.pop("WEBINFER_DISABLE_SUBGROUPS", None)
        else:
            os.environ["WEBINFER_DISABLE_SUBGROUPS"] = old
    assert not dev.caps.subgroups
    return KernelLibrary(dev)


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
def test_gemv_without_subgroups_matches(lib_nosg, dtype):
    for rows8 in (False, True):
        for t in (3, 9):  # tiles of 4, and of 8 with a partial second tile
            out, ref, k = run_linear(lib_nosg.device, lib_nosg, dtype, 301, 600, t, rows8=rows8)
            check_op(out, ref, *tol(k), name=f"no subgroups {dtype} rows8={rows8} T={t}")


def test_gemv_subgroup_path_is_active(gpu, kernels):
    if not gpu.caps.subgroups:
        pytest.skip("device has no subgroups")
    assert "subgroupBroadcast" in kernels.source("gemv", {"DTYPE": "q4"}, use_f16=False)


def run_norm_linear(dev, lib, dtype, n, k, t, swiglu=False, bias=False, seed=0, eps=1e-5):
    """Linear(norm=...) on raw rows x against numpy: W @ (x / sqrt(mean(x^2) + eps) * wn) (+ bias / swiglu)."""
    comps, wref = make_weight(dtype, n, k, 32, seed)
    rng = np.random.default_rng(seed + 1)
    xs = -(-k // 4) * 4
    x = np.full((t, xs), np.nan, np.float32)
    x[:, :k] = rng.standard_normal((t, k)) * 3 + 0.5  # not unit RMS: the norm must really be applied
    wn = np.zeros(xs, np.float32)
    wn[:k] = rng.uniform(0.5, 1.5, k)
    x64 = x[:, :k].astype(np.float64)
    xn = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps) * wn[:k]
    n_out = n // 2 if swiglu else n
    if swiglu:
        f = n // 2
        comps = {c: np.frombuffer(interleave_gate_up(split_rows(v[:f].tobytes(), f), split_rows(v[f:].tobytes(), f)),
                                  np.uint8) for c, v in comps.items()}
        g, u = xn @ wref[:f].T.astype(np.float64), xn @ wref[f:].T.astype(np.float64)
        ref = g / (1 + np.exp(-g)) * u
    else:
        ref = xn @ wref.T.astype(np.float64)
    b = None
    if bias:
        bnp = rng.standard_normal(n).astype(np.float32)
        ref = ref + bnp
        b = GpuArray.upload(dev, bnp).binding
    out = GpuArray.empty(dev, (t, n_out))
    lin = Linear(lib, dtype, n, k, 32, [upload_parts(dev, comps, n)], GpuArray.upload(dev, x).binding, out.binding,
                 xs, n_out, step_buf(dev, t), norm=(GpuArray.upload(dev, wn).binding, eps), swiglu=swiglu, bias=b)
    run(dev, lambda c: lin.encode(c, t))
    return out, ref.astype(np.float32), k


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
@pytest.mark.parametrize("n,k,t", [(37, 77, 1), (300, 576, 17), (8, 33, 2)])
def test_gemv_folded_rmsnorm(gpu, kernels, dtype, n, k, t):
    out, ref, k = run_norm_linear(gpu, kernels, dtype, n, k, t, seed=n + k)
    check_op(out, ref, *tol(k), name=f"norm {dtype} {n}x{k} T={t}")


def test_gemv_folded_rmsnorm_epilogues_and_fallback(gpu_f32, lib_nosg):
    from webinfer.kernels.library import KernelLibrary

    for lib in (KernelLibrary(gpu_f32), lib_nosg):
        out, ref, k = run_norm_linear(lib.device, lib, "q4a", 48, 200, 3, swiglu=True, seed=4)
        check_op(out, ref, 1e-3, 1e-4, name="norm + swiglu")
        out, ref, k = run_norm_linear(lib.device, lib, "q4a", 45, 130, 2, bias=True, seed=5)
        check_op(out, ref, *tol(k), name="norm + bias (q4a: mins, norm and bias bindings)")


def test_gemv_folded_rmsnorm_rejected_on_gemm(kernels):
    with pytest.raises(ValueError, match="gemv kernel only"):
        Linear(kernels, "q4", 4, 32, 32, [], None, None, 32, 4, None, kernel="gemm", norm=(None, 1e-5))


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("dtype,n,k,swiglu", [("q4a", 96, 576, True), ("q4", 70, 200, False), ("q8", 45, 77, False)])
def test_gemv_decode_tile_row_alone_vs_among_15_bitwise(gpu, kernels, dtype, n, k, swiglu):
    """Decode tiles share the unpacked weights only: a row alone (tile 1 variant) and the same row in slot 7 or 12
    of a 16-row step (tile 8 variant, two tiles), or among 17 rows, give identical bits; with the folded RMSNorm,
    the swiglu or the bias epilogue, and K not a multiple of 32 (the element-wise tail)."""
    comps, _ = make_weight(dtype, n, k, 32, 11)
    if swiglu:
        f = n // 2
        comps = {c: np.frombuffer(interleave_gate_up(split_rows(v[:f].tobytes(), f), split_rows(v[f:].tobytes(), f)),
                                  np.uint8) for c, v in comps.items()}
    rng = np.random.default_rng(12)
    xs = -(-k // 4) * 4
    x = np.full((17, xs), np.nan, np.float32)
    x[:, :k] = rng.standard_normal((17, k)) * 2
    wn = np.zeros(xs, np.float32)
    wn[:k] = rng.uniform(0.5, 1.5, k)
    w = upload_parts(gpu, comps, n)
    wn_b = GpuArray.upload(gpu, wn).binding
    bias = None if swiglu else GpuArray.upload(gpu, rng.standard_normal(n).astype(np.float32)).binding
    n_out = n // 2 if swiglu else n

    def go(rows, tile="auto"):
        out = GpuArray.empty(gpu, (len(rows), n_out))
        lin = Linear(kernels, dtype, n, k, 32, [w], GpuArray.upload(gpu, x[rows]).binding, out.binding, xs, n_out,
                     step_buf(gpu, len(rows)), norm=(wn_b, 1e-5), swiglu=swiglu, bias=bias, tile=tile)
        run(gpu, lambda c: lin.encode(c, len(rows)))
        return out.read()

    for r in (7, 12):
        alone = go([r])
        assert not np.isnan(alone).any()
        assert np.array_equal(_bits(alone[0]), _bits(go(list(range(16)))[r])), f"row {r} among 16"
        assert np.array_equal(_bits(alone[0]), _bits(go(list(range(17)))[r])), f"row {r} among 17"
        assert np.array_equal(_bits(alone[0]), _bits(go([r, 0, 1, 2], tile=4)[0])), f"row {r} in a tile of 4"
        assert np.array_equal(_bits(alone[0]), _bits(go([r], tile=8)[0])), f"row {r} alone in a tile of 8"


@pytest.mark.parametrize("tile", [1, 4, 8])
@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
def test_gemv_every_tile_matches_dequantized_matmul(gpu_f32, dtype, tile):
    # each variant on its own (auto would pick tile 8 for 17 rows only): 17 rows = partial last tile, odd N and K
    from webinfer.kernels.library import KernelLibrary

    lib = KernelLibrary(gpu_f32)
    n, k, t = 131, 99, 17
    comps, wref = make_weight(dtype, n, k, 32, 13)
    x = np.full((t, 100), np.nan, np.float32)
    x[:, :k] = np.random.default_rng(14).standard_normal((t, k))
    out = GpuArray.empty(gpu_f32, (t, n))
    lin = Linear(lib, dtype, n, k, 32, [upload_parts(gpu_f32, comps, n)], GpuArray.upload(gpu_f32, x).binding,
                 out.binding, 100, n, step_buf(gpu_f32, t), tile=tile)
    run(gpu_f32, lambda c: lin.encode(c, t))
    check_op(out, (x[:, :k].astype(np.float64) @ wref.T).astype(np.float32), *tol(k), name=f"tile {tile}")


def test_gemv_tile_choice_by_row_count(gpu, kernels):
    comps, _ = make_weight("q4", 8, 32, 32, 15)
    lin = Linear(kernels, "q4", 8, 32, 32, [upload_parts(gpu, comps, 8)], GpuArray.empty(gpu, (16, 32)).binding,
                 GpuArray.empty(gpu, (16, 8)).binding, 32, 8, step_buf(gpu, 16))
    picked = {}
    for rows in (1, 2, 4, 5, 8, 9, 16):
        class Rec:
            def dispatch(self, pipeline, bg, x, y, z, label):
                picked[rows] = (pipeline, y)
        lin.encode(Rec(), rows)
    tiles = {p: tt for p, tt, _ in lin._variants}
    assert {r: (tiles[p], gy) for r, (p, gy) in picked.items()} == {
        1: (1, 1), 2: (4, 1), 4: (4, 1), 5: (8, 1), 8: (8, 1), 9: (8, 2), 16: (8, 2)}
