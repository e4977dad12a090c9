"""GEMM kernel (shaders/gemm.wgsl via Linear(kernel="gemm")) for every weight format against numpy: random codes
(tests/gpu/quant_ref.py), reference = x @ W.T in float64.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_gemm.py -q
Tolerance as test_gemv (f32 sums in chunk order): atol 4e-4 * sqrt(K), rtol 1e-4.
"""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.quant_ref import FORMAT_NAMES, interleave, random_weight, upload_weight
from webinfer.kernels.linear import Epilogue, Linear, LinearIO

pytestmark = pytest.mark.gpu


def run_gemm(dev, lib, dtype, n, k, t, start=0, gs=32, seed=0, bias=False, accumulate=False, swiglu=False, tt=8,
             wrows=None):
    comps, wref = random_weight(dtype, n, k, gs, seed)
    if swiglu:
        comps = interleave(comps, n // 2)
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
    lin = Linear(lib, upload_weight(dev, dtype, n, k, comps, gs),
                 LinearIO(GpuArray.upload(dev, x).binding, out.binding, xs, n_out, step, count_index=3, start_index=2),
                 kernel="gemm", epilogue=Epilogue(bias=b, accumulate=accumulate, swiglu=swiglu), tiles=(tt,),
                 rows=wrows)
    run(dev, lambda c: lin.encode(c, t))
    return out, want, k


def tol(k):
    return 4e-4 * np.sqrt(k), 1e-4


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
@pytest.mark.parametrize("n,k,t,start", [(37, 77, 17, 3), (130, 576, 33, 0)])
def test_gemm_matches_numpy(gpu, kernels, dtype, n, k, t, start):
    out, want, k = run_gemm(gpu, kernels, dtype, n, k, t, start, seed=n + k)
    check_op(out, want, *tol(k), name=f"{dtype} {n}x{k} T={t}")


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
def test_gemm_epilogues_f32_tt4_and_without_subgroups(gpu_f32, lib_nosg, dtype):
    from webinfer.kernels.library import KernelLibrary

    lib = KernelLibrary(gpu_f32)
    for kw in (dict(bias=True), dict(accumulate=True), dict(swiglu=True)):
        out, want, k = run_gemm(gpu_f32, lib, dtype, 144, 300, 19, 2, **kw)
        check_op(out, want, *tol(k) if "swiglu" not in kw else (2e-3, 1e-4), name=f"{dtype} {kw}")
    out, want, k = run_gemm(gpu_f32, lib, dtype, 72, 100, 11, 1, tt=4, swiglu=True)
    check_op(out, want, 2e-3, 1e-4, name=f"{dtype} TT=4")
    out, want, k = run_gemm(lib_nosg.device, lib_nosg, dtype, 70, 100, 11, 1, accumulate=True)
    check_op(out, want, *tol(k), name=f"{dtype} no subgroups")


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
def test_gemm_8_rows_per_invocation(gpu, kernels, lib_nosg, dtype):
    """8 weight rows per invocation (two blocks of 4): N = 300 ends inside an invocation's second block; the
    output is bit for bit that of 4 rows per invocation (same chunk sums), with and without subgroups."""
    for lib in (kernels, lib_nosg):
        got = {}
        for rows in (4, 8):
            out, want, k = run_gemm(lib.device, lib, dtype, 300, 200, 13, 2, seed=9, wrows=rows, accumulate=True)
            check_op(out, want, *tol(k), name=f"{dtype} rows={rows}")
            got[rows] = out.read()
        assert np.array_equal(got[4].view(np.uint32), got[8].view(np.uint32)), dtype


def test_gemm_rows_choice():
    from webinfer.kernels.linear import QuantWeight, WeightPart, gemm_rows

    def w(n):
        return QuantWeight("q4a", n, 576, 32, (WeightPart(0, n, None, None),))

    # 8 rows unless its workgroups (512 rows) leave more lanes idle than 4 rows' (256): SmolLM2's 576 -> 4
    assert [gemm_rows(w(n)) for n in (576, 960, 1536, 64)] == [4, 8, 8, 4]


@pytest.mark.parametrize("dtype", ["q4", "q4k", "q6k", "q2k", "iq4xs"])
def test_gemm_batch_invariance_bitwise(gpu, kernels, dtype):
    comps, _ = random_weight(dtype, 100, 576, seed=5)
    x = np.random.default_rng(6).standard_normal((40, 576)).astype(np.float32)
    w = upload_weight(gpu, dtype, 100, 576, comps)

    def go(xx):
        out = GpuArray.empty(gpu, (len(xx), 100))
        step = GpuArray.upload(gpu, np.array([0, 0, 0, len(xx)], np.uint32)).binding
        lin = Linear(kernels, w, LinearIO(GpuArray.upload(gpu, xx).binding, out.binding, 576, 100, step,
                                          count_index=3, start_index=2), kernel="gemm")
        run(gpu, lambda c: lin.encode(c, len(xx)))
        return out.read()

    # rows 21..25 alone (tile positions 0..4) vs inside 40 rows (other tiles, other positions)
    assert np.array_equal(go(x[21:26]).view(np.uint32), go(x)[21:26].view(np.uint32))
