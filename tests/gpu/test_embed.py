"""Embedding gather (shaders/embed.wgsl) against quant.dequantize rows: exact (same f32 products).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_embed.py -q
"""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.embed import Embed
from webinfer_packager.pack.quant import dequantize, quantize

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["q8", "q4", "q4a"])
@pytest.mark.parametrize("vocab,k,ids", [(50, 576, [3, 0, 49, 3]), (7, 37, [6]), (300, 100, list(range(17)))])
def test_embed_matches_dequantized_rows(gpu, kernels, dtype, vocab, k, ids):
    e = np.random.default_rng(k).standard_normal((vocab, k)).astype(np.float32)
    c = quantize(dtype, e, 32)
    ref = dequantize(dtype, c, [vocab, k], 32, None)
    stride = k + 3  # an output row stride wider than K: the gap must stay untouched
    out = GpuArray.empty(gpu, (len(ids), stride))
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    emb = Embed(kernels, dtype, vocab, k, 32, up(c["qweight"]), up(c["scales"]), up(np.array(ids, np.uint32)),
                out.binding, stride, up(np.array([len(ids), 0, 0, 0], np.uint32)), mins=up(c["mins"]) if "mins" in c else None)
    run(gpu, lambda cm: emb.encode(cm, len(ids)))
    want = np.full((len(ids), stride), np.nan, np.float32)
    want[:, :k] = ref[ids]
    check_op(out, want, 0, 0, f"embed {dtype}")


def test_embed_out_of_range_id_reads_row_zero(gpu, kernels):
    e = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    c = quantize("q8", e, 32)
    ref = dequantize("q8", c, [4, 32], 32, None)
    out = GpuArray.empty(gpu, (1, 32))
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    emb = Embed(kernels, "q8", 4, 32, 32, up(c["qweight"]), up(c["scales"]), up(np.array([99], np.uint32)),
                out.binding, 32, up(np.array([1, 0, 0, 0], np.uint32)))
    run(gpu, lambda cm: emb.encode(cm, 1))
    check_op(out, ref[[0]], 0, 0, "oob id")
