"""The lean GEMV of webinfer_packager/bench/gemv_ceiling.py computes the GEMV it stands for (against numpy), so
the ceiling it reports is a real GEMV's, not a kernel's that skips work."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_the_lean_gemv_is_a_gemv(gpu):
    from tests.gpu.check_op import GpuArray
    from webinfer_packager.bench.gemv_ceiling import C, K, N, stripped

    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**32, (N * C, 4), dtype=np.uint32)
    x = rng.standard_normal(K).astype(np.float32)
    scales = rng.uniform(0.5, 2.0, (N * C // 4, 4)).astype(np.float32)
    y = GpuArray.empty(gpu, (N,), np.float32)
    runs = stripped(gpu, GpuArray.upload(gpu, words), GpuArray.upload(gpu, x.reshape(-1, 4)), y,
                    GpuArray.upload(gpu, scales))
    cmds = gpu.commands()
    runs["both"](cmds)
    gpu.submit(cmds)
    got = y.read()
    # element 8w + j of a chunk is nibble j of its word w
    codes = ((words.reshape(N, C, 4, 1) >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(N, C, 32)
    s = scales[:, 0].reshape(N, C // 4).repeat(4, axis=1)  # row n's scale for chunk c: scales[n * C / 4 + c / 4].x
    ref = (s * np.einsum("ncj,cj->nc", codes.astype(np.float64), x.reshape(C, 32))).sum(1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-2)
