"""RoPE + paged KV write (shaders/rope.wgsl) against reference.rope and a numpy scatter into the cache layout
[num_blocks, block_size, n_kv_heads, head_dim]. Tolerance 2e-5 abs / 1e-5 rel: GPU sin/cos vs numpy's."""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.rope import Rope, inv_freq
from webinfer_packager.reference.model import rope, rope_inv_freq

pytestmark = pytest.mark.gpu

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 2.0}])
def test_inv_freq_matches_reference(scaling):
    np.testing.assert_allclose(np.float32(inv_freq(64, 1e5, scaling)), rope_inv_freq(1e5, 64, scaling), rtol=1e-6)


@pytest.mark.parametrize("kv_f16", [False, True])
@pytest.mark.parametrize("h,hkv,hd,t,scaling", [(9, 3, 64, 17, None), (4, 4, 16, 1, LLAMA3), (2, 1, 6, 3, None)])
def test_rope_and_cache_write(gpu, kernels, h, hkv, hd, t, scaling, kv_f16):
    """kv_f16: the cache holds f16; compared with the f32 reference rounded to f16 (tolerance 1e-3 rel)."""
    if kv_f16 and not gpu.caps.f16:
        pytest.skip("no shader-f16")
    kvt = np.float16 if kv_f16 else np.float32
    rng = np.random.default_rng(h * hd + t)
    qd, kvd = h * hd, hkv * hd
    stride = qd + 2 * kvd
    qkv = rng.standard_normal((t, stride)).astype(np.float32)
    pos = rng.integers(0, 300, t).astype(np.uint32)
    nb, bs = 6, 4
    slots = rng.permutation(nb * bs)[:t].astype(np.uint32)
    kc = GpuArray.upload(gpu, np.zeros((nb, bs, hkv, hd), kvt))
    vc = GpuArray.upload(gpu, np.zeros((nb, bs, hkv, hd), kvt))
    buf = GpuArray.upload(gpu, qkv)
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    r = Rope(kernels, h, hkv, hd, buf.binding, stride, kc.binding, vc.binding, up(pos), up(slots),
             up(np.float32(inv_freq(hd, 1e5, scaling))), up(np.array([t, 0, 0, 0], np.uint32)), kv_f16=kv_f16)
    run(gpu, lambda c: r.encode(c, t))
    q_ref = rope(qkv[:, :qd].reshape(t, h, hd), pos, 1e5, hd, scaling).reshape(t, qd)
    k_ref = rope(qkv[:, qd:qd + kvd].reshape(t, hkv, hd), pos, 1e5, hd, scaling)
    want_qkv = qkv.copy()
    want_qkv[:, :qd] = q_ref
    want_k = np.zeros((nb * bs, hkv, hd), np.float32)
    want_v = np.zeros((nb * bs, hkv, hd), np.float32)
    want_k[slots] = k_ref
    want_v[slots] = qkv[:, qd + kvd:].reshape(t, hkv, hd)
    check_op(buf, want_qkv, 2e-5, 1e-5, "q in place (k, v columns unchanged)")
    ktol = (1e-3, 1e-3) if kv_f16 else (2e-5, 1e-5)
    check_op(kc, want_k.reshape(nb, bs, hkv, hd).astype(kvt), *ktol, "k cache")
    check_op(vc, want_v.reshape(nb, bs, hkv, hd).astype(kvt), 0, 0, "v cache")


def test_rope_row_range(gpu, kernels):
    """start_index: only rows step[start] .. + step[count] (a step's prefill rows; the attention decode kernel ropes
    the decode rows itself): the rows before and after stay as they were, their cache slots untouched."""
    h, hkv, hd, t, start, n = 4, 2, 16, 9, 3, 4
    rng = np.random.default_rng(1)
    stride = (h + 2 * hkv) * hd
    qkv = rng.standard_normal((t, stride)).astype(np.float32)
    pos = rng.integers(0, 100, t).astype(np.uint32)
    slots = rng.permutation(24)[:t].astype(np.uint32)
    kc = GpuArray.upload(gpu, np.zeros((6, 4, hkv, hd), np.float32))
    vc = GpuArray.upload(gpu, np.zeros((6, 4, hkv, hd), np.float32))
    buf = GpuArray.upload(gpu, qkv)
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    r = Rope(kernels, h, hkv, hd, buf.binding, stride, kc.binding, vc.binding, up(pos), up(slots),
             up(np.float32(inv_freq(hd, 1e4))), up(np.array([0, n, start, 0], np.uint32)), count_index=1,
             start_index=2)
    run(gpu, lambda c: r.encode(c, n))
    rows = slice(start, start + n)
    want = qkv.copy()
    want[rows, : h * hd] = rope(qkv[rows, : h * hd].reshape(n, h, hd), pos[rows], 1e4, hd).reshape(n, h * hd)
    want_k = np.zeros((24, hkv, hd), np.float32)
    want_k[slots[rows]] = rope(qkv[rows, h * hd:(h + hkv) * hd].reshape(n, hkv, hd), pos[rows], 1e4, hd)
    check_op(buf, want, 2e-5, 1e-5, "q of rows start .. start + n only")
    check_op(kc, want_k.reshape(6, 4, hkv, hd), 2e-5, 1e-5, "k cache of those rows only")
