"""Standalone SwiGLU (shaders/swiglu.wgsl) against reference.swiglu. Tolerance 1e-6 abs / 1e-5 rel (exp differs)."""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.swiglu import SwiGLU
from webinfer_packager.reference.model import swiglu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("t,f", [(1, 1536), (17, 65), (2, 3)])
def test_swiglu(gpu, kernels, t, f):
    gu = np.random.default_rng(f).standard_normal((t, 2 * f)).astype(np.float32) * 4
    out = GpuArray.empty(gpu, (t, f))
    s = SwiGLU(kernels, f, GpuArray.upload(gpu, gu).binding, out.binding, 2 * f, f,
               GpuArray.upload(gpu, np.array([t, 0, 0, 0], np.uint32)).binding)
    run(gpu, lambda c: s.encode(c, t))
    check_op(out, swiglu(gu[:, :f], gu[:, f:]), 1e-6, 1e-5, "swiglu")
