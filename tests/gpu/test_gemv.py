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
from webinfer_packager.quant import dequantize, quantize

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
        out, ref, k = run_linear(lib_nosg.device, lib_nosg, dtype, 301, 600, 3, rows8=rows8)
        check_op(out, ref, *tol(k), name=f"no subgroups {dtype} rows8={rows8}")


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
