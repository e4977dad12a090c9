"""A prompt's result does not depend on how the scheduler cuts it into chunks (scheduler.py, module docstring).

Multi-token chunks give every row the same bits however the prompt is cut: the prefill GEMM and attention compute
each row alone. A one-token chunk takes the decode path (the GEMV with the RMSNorm folded in, the split-K
attention), whose last bits differ, so the scheduler never feeds a prompt one token at a time; the engine test
below fails on the rule before it (a prompt alone was cut [8, 1], beside another request [5, 4])."""

import asyncio

import numpy as np
import pytest

from webinfer.engine.batch import SeqChunk, StepBatch

pytestmark = pytest.mark.gpu


def _last_row_logits(runner, prompt, cuts):
    table = list(range(1, 9))
    pos = 0
    for j, n in enumerate(cuts):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt[pos:pos + n], pos, table, j == len(cuts) - 1)])))
        pos += n
    return np.array(asyncio.run(runner.logits(1))[0], np.float32)


def test_multi_token_chunks_give_the_same_bits(gpu, tiny_llama):
    from tests.gpu_fixtures import load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64)
    prompt = [(7 * i + 11) % 250 + 3 for i in range(23)]
    whole = _last_row_logits(runner, prompt, [23])
    for cuts in ([21, 2], [18, 5], [2, 19, 2], [3, 3, 3, 3, 3, 3, 5], [8, 8, 7]):
        assert np.array_equal(_last_row_logits(runner, prompt, cuts), whole), cuts


def test_a_prompt_alone_and_beside_another_request_gives_the_same_bits(gpu, tiny_llama):
    """A 9-token prompt with a budget of 8 tokens a step: alone and while another request decodes beside it, the
    first token's logprobs (the prompt's last row, log-softmaxed) are the same floats."""
    from tests.gpu_fixtures import load_runner
    from webinfer.factory import EngineOptions, llm_for
    from webinfer.package import Package

    pkg = Package.open(tiny_llama)
    runner = load_runner(pkg, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=8, max_seqs=4)
    llm = llm_for(pkg, runner, EngineOptions(max_batch_tokens=8, max_seqs=4, decode_block=1,
                                             enable_prefix_caching=False))
    prompt = [(7 * i + 11) % 250 + 3 for i in range(9)]
    req = dict(prompt=prompt, max_tokens=1, temperature=0, logprobs=5)

    async def alone():
        return await llm.completions.create(**req)

    async def beside():  # the other request decodes when this one arrives: its prompt gets 7 of the 8 tokens
        other = await llm.completions.create(prompt=[5, 6, 7], max_tokens=12, temperature=0, ignore_eos=True,
                                             stream=True)
        await other.__anext__()
        got = await llm.completions.create(**req)
        async for _ in other:
            pass
        return got

    a, b = asyncio.run(alone()), asyncio.run(beside())
    la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    assert la["token_logprobs"] == lb["token_logprobs"]
    assert la["top_logprobs"] == lb["top_logprobs"]
