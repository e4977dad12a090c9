"""Embedding gather (shaders/embed.wgsl) for every weight format against the formats.py values of random codes
(tests/gpu/quant_ref.py): exact (the same f32 operations), also for tables split over several bindings, for
random GGUF Q2_K / Q3_K / IQ4_NL / IQ4_XS blocks against gguf.quants.dequantize, and for synthetic 151,936 x 896
and 262,144 x 640 vocabularies (more than one 128 MiB binding at INT8).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_embed.py -q
"""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.quant_ref import FORMAT_NAMES, random_weight, upload_weight
from webinfer.kernels.embed import Embed

pytestmark = pytest.mark.gpu


def gather(dev, lib, weight, ids, stride):
    out = GpuArray.empty(dev, (len(ids), stride))
    up = lambda a: GpuArray.upload(dev, a).binding  # noqa: E731
    emb = Embed(lib, weight, up(np.array(ids, np.uint32)), out.binding, stride,
                up(np.array([len(ids), 0, 0, 0], np.uint32)))
    run(dev, lambda cm: emb.encode(cm, len(ids)))
    return out


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
@pytest.mark.parametrize("vocab,k,ids,splits", [(50, 576, [3, 0, 49, 3], ()), (7, 37, [6], ()),
                                                (300, 100, list(range(0, 300, 17)), (100, 250))])
def test_embed_matches_formats_values(gpu, kernels, dtype, vocab, k, ids, splits):
    comps, ref = random_weight(dtype, vocab, k, seed=k)
    stride = k + 3  # an output row stride wider than K: the gap must stay untouched
    out = gather(gpu, kernels, upload_weight(gpu, dtype, vocab, k, comps, splits=splits), ids, stride)
    want = np.full((len(ids), stride), np.nan, np.float32)
    want[:, :k] = ref[ids]
    check_op(out, want, 0, 0, f"embed {dtype}")


@pytest.mark.parametrize("gguf_type,k", [("Q2_K", 768), ("Q3_K", 512), ("IQ4_NL", 800), ("IQ4_XS", 768)])
def test_embed_random_gguf_blocks_exact(gpu, kernels, gguf_type, k):
    """Random GGUF blocks re-laid by quant_ref.from_gguf, split over two bindings: the gather is bit-identical to
    gguf.quants.dequantize (the formats.py formula, operation for operation)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from tests.gpu.quant_ref import GGUF_TYPES, from_gguf, random_gguf

    vocab, ids = 20, [0, 6, 7, 19, 7, 12]
    raw = random_gguf(gguf_type, vocab, k, seed=k + 1)
    dtype = GGUF_TYPES[gguf_type]
    out = gather(gpu, kernels, upload_weight(gpu, dtype, vocab, k, from_gguf(gguf_type, raw, k), splits=(7,)), ids, k)
    want = dequantize(raw[ids], GGMLQuantizationType[gguf_type]).astype(np.float32)
    got = check_op(out, want, 0, 0, f"embed {gguf_type}")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "signs of zeros differ"


def test_embed_out_of_range_id_reads_row_zero(gpu, kernels):
    comps, ref = random_weight("q8", 4, 32, seed=0)
    out = gather(gpu, kernels, upload_weight(gpu, "q8", 4, 32, comps, splits=(2,)), [99], 32)
    check_op(out, ref[[0]], 0, 0, "oob id")
