"""Lazy pipelines (kernels/library.py LazyPipeline): an engine build compiles only what a single chat runs; the
larger gemv tiles (several chats decoding together), the attention reduce (decode contexts past one split) and the
plain decode kernel (speculative verification) are compiled at their first use or ahead of it by
KernelLibrary.create_deferred (the page runs that in the background after ready). Either way the WGSL is the same:
the tests check the ids against the numpy reference and the batched logits bit for bit against a sequence alone."""

import asyncio

import numpy as np
import pytest

from webinfer.engine.batch import SeqChunk, StepBatch

pytestmark = pytest.mark.gpu

SEQS = {0: list(range(5, 18)), 1: [7, 8, 9], 2: list(range(100, 130))}
TABLES = {0: [1, 2, 3, 4], 1: [5, 6], 2: [7, 8, 9, 10, 11, 12, 13, 14]}


def _runner(gpu, pkg):
    from tests.gpu_fixtures import load_runner

    # max_seqs=4 as in the page: gemv tiles (1, 4)
    return load_runner(pkg, device=gpu, num_blocks=32, block_size=4, max_batch_tokens=64, max_seqs=4)


def _step(runner, ids) -> list[np.ndarray]:
    """Prefill each sequence, then one decode token each, in one step per phase; the decode logits."""
    asyncio.run(runner.execute(StepBatch([SeqChunk(i, SEQS[i], 0, TABLES[i], True) for i in ids])))
    asyncio.run(runner.execute(StepBatch([SeqChunk(i, [11], len(SEQS[i]), TABLES[i], True) for i in ids])))
    return [np.array(r, np.float32).view(np.uint32) for r in asyncio.run(runner.logits(len(ids)))]


def test_build_defers_what_a_single_chat_does_not_run(gpu, tiny_llama):
    from tests.gpu_fixtures import generate_ids
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    runner = _runner(gpu, tiny_llama)
    lib = runner.lib
    built = [lib.spec(k)["label"] for k in lib._cache]
    deferred = [p["label"] for p in lib.deferred()]
    gemv1 = sorted(lb for lb in built if lb.startswith("gemv:"))
    assert gemv1 and all("TILE=1" in lb for lb in gemv1)
    # every TILE=1 gemv has its TILE=4 twin deferred; then the attention reduce (KERNEL=1) and, since the decode
    # kernel ropes (head_dim % 16 == 0), the plain decode kernel (KERNEL=0 without ROPE)
    assert sorted(lb for lb in deferred if lb.startswith("gemv:")) == [lb.replace("TILE=1", "TILE=4") for lb in gemv1]
    attn = [lb for lb in deferred if lb.startswith("attention:")]
    assert len(attn) == 2 and "KERNEL=1" in attn[0] and "KERNEL=0" in attn[1] and "ROPE" not in attn[1]
    assert len(deferred) == len(gemv1) + 2 and not set(deferred) & set(built)

    # a single chat (prefill + decode within one split) runs none of them, and its ids are the reference's
    prompt = [5, 17, 200, 33, 1, 9, 250]
    ref = generate(ReferenceModel.from_package(tiny_llama), prompt, 12, Sampler(0.0))
    assert generate_ids(tiny_llama, prompt, 12, runner=runner) == ref
    assert lib.created_on_use == 0 and [p["label"] for p in lib.deferred()] == deferred

    # three sequences decoding together pick the TILE=4 gemvs: compiled at first use, bits as alone (tile 1)
    alone = {i: _step(runner, [i])[0] for i in SEQS}
    together = _step(runner, [2, 0, 1])
    assert lib.created_on_use == len(gemv1)
    for j, i in enumerate([2, 0, 1]):
        assert np.array_equal(alone[i], together[j]), f"decode seq {i}"
    assert [p["label"] for p in lib.deferred()] == attn  # the attention kernels are still not needed


def test_create_deferred_gives_the_same_bits(gpu, tiny_llama):
    """Compiled ahead (create_deferred, the page's background path) or at first use: the same logits bits."""
    on_use = _runner(gpu, tiny_llama)
    want = _step(on_use, [2, 0, 1])
    ahead = _runner(gpu, tiny_llama)
    waits = []

    async def before_each():
        waits.append(1)

    n = asyncio.run(ahead.lib.create_deferred(before_each))
    assert n == len(waits) > 0 and ahead.lib.deferred() == [] and ahead.lib.created_on_use == 0
    got = _step(ahead, [2, 0, 1])
    assert ahead.lib.created_on_use == 0  # nothing left to compile at use
    for w, g in zip(want, got):
        assert np.array_equal(w, g)
