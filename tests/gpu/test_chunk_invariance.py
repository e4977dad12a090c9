"""A prompt's result does not depend on how the scheduler cuts it into chunks (scheduler.py, module docstring).

Multi-token chunks give every row the same bits however the prompt is cut: the prefill GEMM and attention compute
each row alone. A one-token chunk takes the decode path (the GEMV with the RMSNorm folded in, the split-K
attention), whose last bits differ, so the scheduler never feeds a prompt one token at a time; the engine test
below fails on the rule before it (a prompt alone was cut [8, 1], beside another request [5, 4]). Nor does a
request's result depend on a preemption (its generated tokens are recomputed as one-token rows) or on a prefix-cache
hit on an earlier answer (whose decoded blocks a new prompt does not take): the tests past the middle, each failing
with the scheduler told that rows match chunks."""

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


def _llm(runner, **kw):
    from webinfer.factory import EngineOptions, llm_for

    return llm_for(runner.package, runner, EngineOptions(max_batch_tokens=64, max_seqs=4, decode_block=1, **kw))


async def _complete(llm, prompt, n, **kw):
    kw.setdefault("temperature", 0)
    r = await llm.completions.create(prompt=prompt, max_tokens=n, ignore_eos=True, logprobs=3, **kw)
    c = r["choices"][0]
    return c["token_ids"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"]


def test_the_gpu_rows_differ_from_chunks_here(gpu, tiny_llama):
    """The premise of the two tests below (and of GPUModel not declaring rows_match_chunks): on this model a token
    fed as a one-token row gets other bits than inside a chunk. If a kernel change ever makes them equal, the GPU
    model can declare rows_match_chunks and keep a chat's answer in the prefix cache."""
    from tests.gpu_fixtures import load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64)
    prompt = [(7 * i + 11) % 250 + 3 for i in range(23)]
    assert not np.array_equal(_last_row_logits(runner, prompt, [21, 1, 1]), _last_row_logits(runner, prompt, [23]))


def test_a_prompt_repeating_an_answer_gives_a_fresh_engines_bits(gpu, tiny_llama):
    """A chat's second turn repeats the first turn's answer, whose KV the decode path wrote and the prefix cache
    holds. The turn's logprobs are the floats an engine without that cache gives: the answer's blocks are computed
    as a prompt (only the first turn's prompt blocks are reused)."""
    from tests.gpu_fixtures import load_runner

    turn1 = [(5 * i + 7) % 250 + 3 for i in range(18)]
    runners = [load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=4)
               for _ in range(2)]

    async def warm():
        llm = _llm(runners[0])
        answer, _, _ = await _complete(llm, turn1, 20)
        turn2 = turn1 + answer + [9, 10, 11]
        got = await _complete(llm, turn2, 6)
        return turn2, got, llm.engine.scheduler.kv.hit_tokens

    async def cold(turn2):
        llm = _llm(runners[1], enable_prefix_caching=False)
        return await _complete(llm, turn2, 6)

    turn2, got, hits = asyncio.run(warm())
    assert hits == 16  # the first turn's two full prompt blocks, not the answer's
    assert got == asyncio.run(cold(turn2))


def test_a_preempted_request_gives_its_bits_alone(gpu, tiny_llama):
    """Three requests in a pool too small for them: the scheduler preempts, and a preempted request recomputes its
    prompt and the tokens it had generated (as one-token rows, as they were first computed). Every token's logprobs
    are the floats of the request alone, with penalties (their counts rebuilt on recompute) and seeded sampling."""
    from tests.gpu_fixtures import load_runner

    prompts = [[(3 * i + 5 * j) % 250 + 3 for i in range(10)] for j in range(3)]
    controls = [{}, dict(temperature=0.9, seed=4, top_p=0.9), dict(frequency_penalty=0.8, repetition_penalty=1.3)]
    small = load_runner(tiny_llama, device=gpu, num_blocks=9, block_size=8, max_batch_tokens=64, max_seqs=4)
    roomy = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=4)

    async def together():
        llm = _llm(small, enable_prefix_caching=False)  # (recomputed from scratch: no cached block to hide the rows)
        got = await asyncio.gather(*[_complete(llm, p, 24, **c) for p, c in zip(prompts, controls)])
        return got, llm.engine.scheduler.num_preemptions

    async def alone():
        llm = _llm(roomy)
        return [await _complete(llm, p, 24, **c) for p, c in zip(prompts, controls)]

    got, preemptions = asyncio.run(together())
    assert preemptions > 0
    assert got == asyncio.run(alone())


@pytest.mark.model
@pytest.mark.slow
def test_next_turn_bench_measures_both_rules(gpu, smollm2_package):
    """webinfer_packager.bench.next_turn (docs/performance.md, "What exactness costs a chat's next turn") on the
    real model, whose answers tokenize back to their ids: the reusing chats' second turns hit the answer's full
    blocks, the computing ones none of the answer, on one engine whose rule is put back afterwards."""
    from webinfer.factory import EngineOptions
    from webinfer.factory import open as open_llm
    from webinfer_packager.bench.next_turn import measure

    llm = open_llm(smollm2_package, backend="native", device=gpu, options=EngineOptions(decode_block=1))
    bs = llm.engine.scheduler.kv.block_size
    res = asyncio.run(measure(llm, chats=2, answer=2 * bs))
    (r,), (c,) = res["reuse"], res["compute"]
    assert r["answer_tokens"] == c["answer_tokens"] == 2 * bs
    assert c["cached_tokens"] <= c["prompt_tokens"] - c["answer_tokens"]  # none of the answer
    assert r["cached_tokens"] >= c["cached_tokens"] + bs  # the answer's full blocks too
    assert not llm.engine.scheduler.rows_match_chunks
