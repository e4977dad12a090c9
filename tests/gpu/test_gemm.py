"""GEMM kernel (shaders/gemm.wgsl via Linear(kernel="gemm")) against quant.dequantize + numpy matmul.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_gemm.py -q
Tolerance as test_gemv (f32 sums in chunk order): atol 4e-4 * sqrt(K), rtol 1e-4.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.test_gemv import lib_nosg, make_weight, upload_parts  # noqa: F401 (lib_nosg: fixture)
from webinfer.kernels.linear import Linear, interleave_gate_up, split_rows

pytestmark = pytest.mark.gpu


def run_gemm(dev, lib, dtype, n, k, t, start=0, gs=32, seed=0, bias=False, accumulate=False, swiglu=False, tt=8):
    comps, wref = make_weight(dtype, n, k, gs, seed)
    if swiglu:
        f = n // 2
        comps = {c: np.frombuffer(interleave_gate_up(split_rows(v[:f].tobytes(), f), split_rows(v[f:].tobytes(), f)),
                                  np.uint8) for c, v in comps.items()}
    rng = np.random.default_rng(seed + 1)
    xs = -(-k // 4) * 4
    rows = start + t
    x = np.full((rows + 2, xs), np.nan, np.float32)  # rows outside [start, start+t) and columns >= K: never read
    x[start:rows, :k] = rng.standard_normal((t, k))
    ref = x[start:rows, :k].astype(np.float64) @ wref.T.astype(np.float64)
    n_out = n // 2 if swiglu else n
    if swiglu:
        g, u = ref[:, : n // 2], ref[:, n // 2:]
        ref = g / (1 + np.exp(-g)) * u
    y0 = rng.standard_normal((rows, n_out)).astype(np.float32)
    out = GpuArray.upload(dev, y0) if accumulate else GpuArray.empty(dev, (rows, n_out))
    want = y0.copy() if accumulate else np.full((rows, n_out), np.nan, np.float32)
    b = None
    if bias:
        bnp = rng.standard_normal(n).astype(np.float32)
        ref = ref + bnp
        b = GpuArray.upload(dev, bnp).binding
    want[start:rows] = ref + (y0[start:rows] if accumulate else 0)
    step = GpuArray.upload(dev, np.array([0, 0, start, t], np.uint32)).binding
    lin = Linear(lib, dtype, n, k, gs, [upload_parts(dev, comps, n)], GpuArray.upload(dev, x).binding, out.binding,
                 xs, n_out, step, count_index=3, start_index=2, bias=b, accumulate=accumulate, swiglu=swiglu,
                 kernel="gemm", gemm_tokens=tt)
    run(dev, lambda c: lin.encode(c, t))
    return out, want, k


def tol(k):
    return 4e-4 * np.sqrt(k), 1e-4


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
@pytest.mark.parametrize("n,k,t,start", [(1, 32, 1, 0), (37, 77, 17, 3), (130, 576, 33, 0), (64, 1000, 6, 5)])
def test_gemm_matches_dequantized_matmul(gpu, kernels, dtype, n, k, t, start):
    out, want, k = run_gemm(gpu, kernels, dtype, n, k, t, start)
    check_op(out, want, *tol(k), name=f"{dtype} {n}x{k} T={t}")


def test_gemm_epilogues(gpu_f32):
    from webinfer.kernels.library import KernelLibrary

    lib = KernelLibrary(gpu_f32)
    for kw in (dict(bias=True), dict(accumulate=True), dict(swiglu=True)):
        out, want, k = run_gemm(gpu_f32, lib, "q4a", 144, 200, 19, 2, gs=64, **kw)
        check_op(out, want, *tol(k), name=str(kw))


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
def test_gemm_4_rows_per_tile_and_without_subgroups(gpu, kernels, lib_nosg, dtype):
    # TT=4 tiles; and the fallback where every lane loads its activation vectors itself (SwiftShader-free browsers)
    out, want, k = run_gemm(gpu, kernels, dtype, 72, 100, 11, 1, tt=4, swiglu=dtype == "q4a")
    check_op(out, want, *tol(k), name=f"{dtype} TT=4")
    out, want, k = run_gemm(lib_nosg.device, lib_nosg, dtype, 70, 100, 11, 1, accumulate=True)
    check_op(out, want, *tol(k), name=f"{dtype} no subgroups")


def test_gemm_batch_invariance_bitwise(gpu, kernels):
    comps, _ = make_weight("q4", 100, 576, 32, 5)
    x = np.random.default_rng(6).standard_normal((40, 576)).astype(np.float32)
    w = upload_parts(gpu, comps, 100)

    def go(xx):
        out = GpuArray.empty(gpu, (len(xx), 100))
        lin = Linear(kernels, "q4", 100, 576, 32, [w], GpuArray.upload(gpu, xx).binding, out.binding, 576, 100,
                     GpuArray.upload(gpu, np.array([0, 0, 0, len(xx)], np.uint32)).binding, count_index=3,
                     start_index=2, kernel="gemm")
        run(gpu, lambda c: lin.encode(c, len(xx)))
        return out.read()

    # rows 21..25 alone (tile positions 0..4) vs inside 40 rows (other tiles, other positions)
    assert np.array_equal(go(x[21:26]).view(np.uint32), go(x)[21:26].view(np.uint32))


@settings(max_examples=6, deadline=None)
@given(dtype=st.sampled_from(["q4", "q4a", "q8"]), n=st.integers(1, 200), k=st.integers(1, 200), t=st.integers(1, 40))
def test_gemm_hypothesis_shapes(gpu, kernels, dtype, n, k, t):
    out, want, k = run_gemm(gpu, kernels, dtype, n, k, t, seed=n + 3 * k)
    check_op(out, want, *tol(k), name=f"{dtype} {n}x{k} T={t}")
