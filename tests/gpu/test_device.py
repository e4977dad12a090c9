"""The native device itself: browser-like limits, copy kernel, guard regions, validation errors."""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run, uniform
from webinfer.errors import GPUError

pytestmark = pytest.mark.gpu


def test_device_has_browser_limits(gpu):
    lim = gpu.caps.limits
    assert lim["max_storage_buffer_binding_size"] == 128 << 20
    assert gpu.caps.max_binding_bytes == 128 << 20  # the one place kernels read the binding limit from
    assert lim["max_storage_buffers_per_shader_stage"] == 8
    assert lim["max_compute_workgroup_storage_size"] == 16384
    assert lim["max_compute_invocations_per_workgroup"] == 256


def test_on_lavapipe_in_ci(gpu):
    import os

    if os.environ.get("CI", "").lower() in ("1", "true"):
        assert "llvmpipe" in gpu.info.name, f"CI expects Mesa lavapipe, got {gpu.info}"


@pytest.mark.parametrize("n_vec4", [1, 7, 1000, 4097])
def test_copy_kernel_exact_with_guards(gpu, kernels, n_vec4):
    src = np.random.default_rng(n_vec4).integers(0, 2**32, size=(n_vec4, 4), dtype=np.uint32)
    a = GpuArray.upload(gpu, src)
    out = GpuArray.empty(gpu, src.shape, np.uint32)
    p = kernels.pipeline("copy")
    u = uniform(gpu, "<4I", n_vec4, 0, 0, 0)
    run(gpu, lambda c: c.dispatch(p, gpu.create_bind_group(p, [a.binding, out.binding, u]), (n_vec4 + 1023) // 1024))
    check_op(out, src, 0, 0, "copy")


def test_guard_catches_out_of_bounds_write(gpu, kernels):
    # bind the output one vec4 too short: the kernel's last write must be dropped, so the last vec4 stays NaN
    src = np.arange(64, dtype=np.uint32).reshape(16, 4)
    a = GpuArray.upload(gpu, src)
    out = GpuArray.empty(gpu, (16, 4), np.uint32)
    p = kernels.pipeline("copy")
    u = uniform(gpu, "<4I", 17, 0, 0, 0)  # claims one more vector than exists
    run(gpu, lambda c: c.dispatch(p, gpu.create_bind_group(p, [a.binding, out.binding, u]), 1))
    got = out.read()  # guards intact: WebGPU robustness clamps/drops the stray access
    assert np.array_equal(got, src)


def test_shader_error_is_typed(gpu):
    with pytest.raises(GPUError, match="failed to compile"):
        gpu.create_pipeline("fn main( {", label="broken")
