"""Vocabularies larger than one storage binding: synthetic 151,936 x 896 (Qwen) and 262,144 x 640 (Gemma) INT8
tables split by rows at the device's binding limit, as the package splits them. The embedding gather of a few
rows on both sides of the split must equal the formats.py values exactly, the LM head (GEMV over every binding)
on 2 rows must match numpy, and the GPU sampler must take the argmax over the whole vocabulary.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_big_vocab.py -q
"""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.quant_ref import random_weight
from webinfer.formats import row_bytes
from webinfer.kernels.embed import Embed
from webinfer.kernels.linear import Linear, LinearIO, QuantWeight, WeightPart, pack_meta

pytestmark = pytest.mark.gpu

BLOCK = 8192  # rows generated at a time (keeps the int64 temporaries of the generator small)


def big_table(dev, dtype, vocab, k, x, keep_rows):
    """Random table of `vocab` rows uploaded in bindings of at most the device's limit; returns (QuantWeight,
    float64 x @ W.T, {row: values} for keep_rows)."""
    limit = dev.caps.max_binding_bytes
    per_binding = limit // row_bytes(dtype, "qweight", k, 32) // BLOCK * BLOCK
    assert per_binding < vocab, "the test table must need more than one binding"
    y = np.zeros((x.shape[0], vocab))
    kept, parts = {}, []
    for row0 in range(0, vocab, per_binding):
        rows = min(per_binding, vocab - row0)
        comps = {}
        for b0 in range(row0, row0 + rows, BLOCK):
            nb = min(BLOCK, row0 + rows - b0)
            c, vals = random_weight(dtype, nb, k, seed=b0)
            y[:, b0 : b0 + nb] = x.astype(np.float64) @ vals.T.astype(np.float64)
            for r in keep_rows:
                if b0 <= r < b0 + nb:
                    kept[r] = vals[r - b0]
            for name, v in c.items():
                comps.setdefault(name, []).append(v)
        comps = {name: np.concatenate(v) for name, v in comps.items()}
        meta = np.frombuffer(pack_meta(dtype, {c: v.tobytes() for c, v in comps.items()}, rows), np.uint32)
        parts.append(WeightPart(row0, rows, GpuArray.upload(dev, comps["qweight"], guard=False).binding,
                                GpuArray.upload(dev, meta, guard=False).binding))
        del comps, meta
    return QuantWeight(dtype, vocab, k, 32, tuple(parts)), y, kept


@pytest.mark.parametrize("vocab,k", [(151936, 896), (262144, 640)])
def test_big_vocab_embed_lm_head_and_sampler(gpu, kernels, vocab, k):
    from webinfer.kernels.sampling import GpuSampler, SampleRow, buffers, pack_rows

    rng = np.random.default_rng(vocab)
    x = rng.standard_normal((2, k)).astype(np.float32)
    ids = [0, 5, vocab - 1, 149000, 150000, vocab // 2 + 3]
    table, y_ref, kept = big_table(gpu, "q8", vocab, k, x, ids)
    assert len(table.parts) == 2
    up = lambda a: GpuArray.upload(gpu, a).binding  # noqa: E731
    step = up(np.array([len(ids), 2, 0, 0], np.uint32))
    # embedding gather: rows from both bindings, exact
    out = GpuArray.empty(gpu, (len(ids), k))
    emb = Embed(kernels, table, up(np.array(ids, np.uint32)), out.binding, k, step, count_index=0)
    run(gpu, lambda c: emb.encode(c, len(ids)))
    check_op(out, np.stack([kept[i] for i in ids]), 0, 0, f"embed {vocab}x{k}")
    # LM head on 2 rows (step[1]), one dispatch per binding into one logits row
    logits = GpuArray.empty(gpu, (2, vocab))
    head = Linear(kernels, table, LinearIO(up(x), logits.binding, k, vocab, step, count_index=1), label="lm_head")
    run(gpu, lambda c: head.encode(c, 2))
    got = check_op(logits, y_ref.astype(np.float32), 4e-4 * np.sqrt(k), 1e-4, f"lm head {vocab}x{k}")
    # greedy sampling over the whole vocabulary, from the logits on the GPU
    sampler = GpuSampler(kernels, vocab)
    params, out_ids = buffers(gpu, 2)
    binding = sampler.bind(logits.binding, params, out_ids)
    gpu.write_buffer(params, 0, pack_rows([SampleRow(0), SampleRow(1)]))
    run(gpu, lambda c: sampler.encode(c, binding, 2))
    import asyncio

    sampled = np.frombuffer(asyncio.run(gpu.read_buffer(out_ids, 0, 8)), np.uint32)
    assert sampled.tolist() == [int(np.argmax(got[0])), int(np.argmax(got[1]))]
