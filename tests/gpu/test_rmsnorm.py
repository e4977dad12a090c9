"""RMSNorm (+ residual add, + row gather) against the numpy reference rmsnorm (packager/reference.py).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_rmsnorm.py -q
Tolerance 1e-5 abs / 1e-5 rel: f32 sums in a different order than numpy's mean.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.norm import RMSNorm
from webinfer_packager.reference.model import rmsnorm

pytestmark = pytest.mark.gpu


def _step(gpu, t):
    return GpuArray.upload(gpu, np.array([t, 0, 0, 0], np.uint32)).binding


@pytest.mark.parametrize("t,k", [(1, 576), (17, 63), (3, 1), (2, 1000)])
def test_rmsnorm_plain(gpu, kernels, t, k):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((t, k)).astype(np.float32) * 3
    w = rng.standard_normal(k).astype(np.float32)
    out = GpuArray.empty(gpu, (t, k))
    n = RMSNorm(kernels, k, 1e-5, GpuArray.upload(gpu, x).binding, GpuArray.upload(gpu, w).binding, out.binding,
                k, k, _step(gpu, t))
    run(gpu, lambda c: n.encode(c, t))
    check_op(out, rmsnorm(x, w, 1e-5), 1e-5, 1e-5, "rmsnorm")


def test_rmsnorm_fused_residual_add(gpu, kernels):
    t, k = 5, 576
    rng = np.random.default_rng(1)
    x, r = rng.standard_normal((2, t, k)).astype(np.float32)
    w = rng.standard_normal(k).astype(np.float32)
    out, res = GpuArray.empty(gpu, (t, k)), GpuArray.upload(gpu, r)
    n = RMSNorm(kernels, k, 1e-6, GpuArray.upload(gpu, x).binding, GpuArray.upload(gpu, w).binding, out.binding,
                k, k, _step(gpu, t), residual=res.binding)
    run(gpu, lambda c: n.encode(c, t))
    check_op(out, rmsnorm(x + r, w, 1e-6), 1e-5, 1e-5, "y")
    check_op(res, x + r, 0, 0, "new residual")


def test_rmsnorm_row_gather(gpu, kernels):
    k = 64
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, k)).astype(np.float32)
    w = rng.standard_normal(k).astype(np.float32)
    rows = np.array([8, 0, 4], np.uint32)
    out = GpuArray.empty(gpu, (3, k))
    n = RMSNorm(kernels, k, 1e-5, GpuArray.upload(gpu, x).binding, GpuArray.upload(gpu, w).binding, out.binding,
                k, k, GpuArray.upload(gpu, np.array([9, 3, 0, 0], np.uint32)).binding, count_index=1,
                row_map=GpuArray.upload(gpu, rows).binding)
    run(gpu, lambda c: n.encode(c, 3))
    check_op(out, rmsnorm(x[rows], w, 1e-5), 1e-5, 1e-5, "gather")


def test_rmsnorm_batch_invariant_bitwise(gpu, kernels):
    k = 576
    x = np.random.default_rng(3).standard_normal((16, k)).astype(np.float32)
    w = np.ones(k, np.float32)

    def go(xx):
        out = GpuArray.empty(gpu, xx.shape)
        n = RMSNorm(kernels, k, 1e-5, GpuArray.upload(gpu, xx).binding, GpuArray.upload(gpu, w).binding,
                    out.binding, k, k, _step(gpu, len(xx)))
        run(gpu, lambda c: n.encode(c, len(xx)))
        return out.read()

    assert np.array_equal(go(x[5:6]).view(np.uint32), go(x)[5:6].view(np.uint32))


@settings(max_examples=6, deadline=None)
@given(t=st.integers(1, 6), k=st.integers(1, 700))
def test_rmsnorm_hypothesis(gpu, kernels, t, k):
    rng = np.random.default_rng(t * 1000 + k)
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = rng.standard_normal(k).astype(np.float32)
    out = GpuArray.empty(gpu, (t, k))
    n = RMSNorm(kernels, k, 1e-5, GpuArray.upload(gpu, x).binding, GpuArray.upload(gpu, w).binding, out.binding,
                k, k, _step(gpu, t))
    run(gpu, lambda c: n.encode(c, t))
    check_op(out, rmsnorm(x, w, 1e-5), 1e-5, 1e-5, "rmsnorm")
