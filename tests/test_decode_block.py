"""Decode blocks give the same tokens as one step at a time: greedy and seeded sampling, logit_bias, penalties and
logprobs, requests that finish inside a block (max_tokens, stop strings) beside ones that go on, and requests
arriving mid-run. On the native GPU engine a block is the GPU-resident decode loop (K steps per read-back, sampled
ids fed back on the GPU); on the CPU engine (wasmtime, two threads) K steps in one call of the module, each fed the
ids the step before sampled there.

Run: python -m pytest tests/test_decode_block.py -q
"""

from __future__ import annotations

import asyncio

import pytest

REQS = [
    {"prompt": "The quick brown fox", "max_tokens": 21, "temperature": 0},
    {"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0.8, "seed": 3},          # ends inside a block
    {"prompt": "A", "max_tokens": 30, "temperature": 1.0, "seed": 11, "top_k": 20, "top_p": 0.9},
    {"prompt": "Numbers: 1 2 3", "max_tokens": 17, "temperature": 0, "logit_bias": {"5": 3.0, "17": -100}},
    {"prompt": "the the the", "max_tokens": 19, "temperature": 0, "frequency_penalty": 0.8, "presence_penalty": 0.4,
     "logprobs": 3},
]


@pytest.fixture(scope="module", params=[pytest.param("native", marks=pytest.mark.gpu), "cpu"])
def llms(request, tiny_llama):
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    backend = request.param
    device = request.getfixturevalue("gpu") if backend == "native" else None
    opts = dict(context_tokens=512, max_seqs=4)
    # the CPU engine's blocks on two threads (its team runs every step of the block in the module) against single
    # steps on one: the same ids either way
    two = {"cpu_threads": 2} if backend == "cpu" else {}
    return (open_llm(tiny_llama, backend, device=device, options=EngineOptions(**opts, decode_block=1)),
            open_llm(tiny_llama, backend, device=device,
                     options=EngineOptions(**opts, **two, decode_block=8, decode_block_ms=0)))


def _run(llm, reqs, stagger: float = 0.0):
    async def one(i, r):
        await asyncio.sleep(stagger * i)
        return await llm.completions.create(**r)

    async def main():
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    return asyncio.run(main())


def _ids(resp):
    return [c["token_ids"] for c in resp["choices"]]


def _logprobs(resp):
    return [c["logprobs"] for c in resp["choices"]]


def test_blocks_equal_single_steps_alone_and_batched(llms):
    single, block = llms
    want = [_ids(_run(single, [r])[0]) for r in REQS]
    assert all(len(w[0]) == r["max_tokens"] for w, r in zip(want, REQS))
    b0 = block.engine.blocks
    got = _run(block, REQS)
    assert [_ids(g) for g in got] == want
    assert block.engine.blocks > b0, "no decode block ran"
    assert _logprobs(got[-1]) == _logprobs(_run(single, [REQS[-1]])[0])  # logprobs come back with a block's ids
    for r, w in zip(REQS, want):  # alone, in blocks
        assert _ids(_run(block, [r])[0]) == w


def test_blocks_with_arrivals_and_stop_strings(llms):
    single, block = llms
    text = _run(single, [REQS[0]])[0]["choices"][0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]  # a stop string met in the middle of the output
    reqs = [dict(REQS[0], stop=[stop]), *REQS[1:]]
    want = _run(single, reqs)
    got = _run(block, reqs, stagger=0.05)  # later requests join while earlier ones decode in blocks
    for w, g in zip(want, got):
        assert g["choices"][0]["text"] == w["choices"][0]["text"]
        assert g["choices"][0]["finish_reason"] == w["choices"][0]["finish_reason"]
        assert _ids(g) == _ids(w)
    assert got[0]["choices"][0]["finish_reason"] == "stop" and stop not in got[0]["choices"][0]["text"]
    # every KV block came back: nothing leaked by tokens sampled past a stop
    assert block.engine.scheduler.kv.stats()["blocks_used"] == 0


def test_runner_rejects_a_block_it_cannot_run(llms, tiny_llama):
    from webinfer.engine.batch import SeqChunk, StepBatch

    runner = llms[1].engine.runner
    prefill = StepBatch([SeqChunk(1, [1, 2], 0, [1], True)], steps=2)
    with pytest.raises(ValueError, match="one-token chunks"):
        asyncio.run(runner.execute(prefill))
    too_long = StepBatch([SeqChunk(1, [1], 0, [1, 2], True)], steps=runner.max_steps + 1)
    with pytest.raises(ValueError, match="max_steps"):
        asyncio.run(runner.execute(too_long))
