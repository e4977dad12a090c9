"""Speculative decoding on the real SmolLM2 and the native GPU engine: the same ids as without it, greedy and
seeded sampling, alone and batched with plain requests, and it saves steps where the answer quotes the prompt.

Run: python -m pytest tests/test_speculative_gpu.py -q
"""

from __future__ import annotations

import asyncio

import pytest

from webinfer_packager.bench.speculative import PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def llms(smollm2_package, gpu):
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    plain = open_llm(smollm2_package, "native", device=gpu, options=EngineOptions(context_tokens=2048, max_seqs=4))
    spec = open_llm(smollm2_package, "native", device=gpu, options=EngineOptions(
        context_tokens=2048, max_seqs=4, speculative="prompt-lookup", speculative_tokens=5,
        adaptive_proposals=False))  # every proposal verified: the step counts below do not depend on timings
    return plain, spec


def _run(llm, reqs):
    async def main():
        return await asyncio.gather(*(llm.chat.completions.create(**r) for r in reqs))
    return asyncio.run(main())


def test_same_ids_as_plain_decoding_and_fewer_steps(llms):
    plain, spec = llms
    reqs = [{"messages": PROMPTS["quote"], "max_tokens": 48, "temperature": 0},
            {"messages": PROMPTS["code_edit"], "max_tokens": 40, "temperature": 0.7, "seed": 5},
            {"messages": PROMPTS["open_chat"], "max_tokens": 24, "temperature": 0},
            # a plain request in the same batch as the speculating ones
            {"messages": PROMPTS["quote"], "max_tokens": 24, "temperature": 0, "speculative_tokens": 0}]
    want = [_run(plain, [r])[0] for r in reqs]  # alone
    steps0 = spec.engine.steps
    got = _run(spec, reqs)                     # together
    for w, g in zip(want, got):
        assert g["choices"][0]["token_ids"] == w["choices"][0]["token_ids"]
        assert g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"]
    q = got[0]["usage"]["speculative"]
    assert q["accepted_tokens"] > 10, q  # the quoted passage is proposed and accepted
    assert "speculative" not in got[3]["usage"]
    alone_steps = spec.engine.steps
    _run(spec, [reqs[0]])
    plain_steps0 = plain.engine.steps
    _run(plain, [reqs[0]])
    assert spec.engine.steps - alone_steps < plain.engine.steps - plain_steps0, "speculation saved no steps"
    assert spec.engine.stats()["blocks_used"] == 0 and steps0 >= 0
