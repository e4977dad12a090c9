"""Penalties and logprobs end to end (issue 11): the native GPU engine (counts and log-softmax on the GPU, decode
blocks on) against the numpy reference runner (webinfer_packager.reference: the reference Sampler's penalties and
logprobs on float64 logits of the reference model), through the same API, alone and in a mixed batch of penalized,
logprob, constrained and plain requests.

Run: python -m pytest tests/test_sampling_controls.py -q
"""

from __future__ import annotations

import asyncio
import math

import pytest

pytestmark = [pytest.mark.gpu]

PEN = {"frequency_penalty": 1.2, "presence_penalty": 0.6, "repetition_penalty": 1.4}
REQS = [
    {"prompt": "the the the the the", "max_tokens": 20, "temperature": 0, **PEN},
    {"prompt": "Once upon a time", "max_tokens": 18, "temperature": 0.9, "seed": 4, "frequency_penalty": 2.0},
    {"prompt": "A B C", "max_tokens": 12, "temperature": 0, "logprobs": 5},
    {"prompt": "Numbers", "max_tokens": 15, "temperature": 0.7, "seed": 9, "repetition_penalty": 0.7, "logprobs": 3},
    {"prompt": "plain", "max_tokens": 10, "temperature": 0},
    {"prompt": "Letters:", "max_tokens": 8, "temperature": 0.6, "seed": 2,                # constrained (mask)
     "response_format": {"type": "regex", "regex": "[a-e]{3,6}"}},
]


@pytest.fixture(scope="module")
def llms(tiny_llama, gpu):
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    opts = EngineOptions(context_tokens=512, max_seqs=4, decode_block_ms=0)  # blocks of 8 however slow
    return open_llm(tiny_llama, "native", device=gpu, options=opts), open_llm(tiny_llama, "reference", options=opts)


def _run(llm, reqs, kind="completion"):
    async def main():
        return await asyncio.gather(*(llm.create(kind, dict(r)) for r in reqs))
    return asyncio.run(main())


def _ids(r):
    return r["choices"][0]["token_ids"]


def test_penalties_and_logprobs_equal_the_reference_alone_and_batched(llms):
    native, ref = llms
    want = [_run(ref, [r])[0] for r in REQS]
    # the penalties change the output: the first request repeats itself without them
    plain = _run(ref, [{k: v for k, v in REQS[0].items() if k not in PEN}])[0]
    assert _ids(plain) != _ids(want[0])
    alone = [_run(native, [r])[0] for r in REQS]
    batched = _run(native, REQS)
    assert native.engine.blocks > 0, "no decode block ran: the GPU counts were not exercised across a block"
    import re

    assert re.fullmatch("[a-e]{3,6}", batched[-1]["choices"][0]["text"])
    for w, a, b in zip(want, alone, batched):
        assert _ids(a) == _ids(w) and _ids(b) == _ids(w)
        assert a["choices"][0]["text"] == w["choices"][0]["text"]
        lw = w["choices"][0].get("logprobs")
        for got in (a, b):
            lg = got["choices"][0].get("logprobs")
            assert (lg is None) == (lw is None)
            if lw is None:
                continue
            assert lg["tokens"] == lw["tokens"] and lg["text_offset"] == lw["text_offset"]
            assert lg["token_logprobs"] == pytest.approx(lw["token_logprobs"], abs=2e-3)
            for tg, tw in zip(lg["top_logprobs"], lw["top_logprobs"]):
                assert list(tg) == list(tw)  # the same alternatives, best first
                assert list(tg.values()) == pytest.approx(list(tw.values()), abs=2e-3)


def test_chat_logprobs_shape_and_values(llms):
    native, ref = llms
    req = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 9, "temperature": 0,
           "logprobs": True, "top_logprobs": 4}
    (n,), (r,) = _run(native, [req], "chat"), _run(ref, [req], "chat")
    content = n["choices"][0]["logprobs"]["content"]
    assert len(content) == len(n["choices"][0]["token_ids"]) == len(r["choices"][0]["token_ids"])
    for c, w in zip(content, r["choices"][0]["logprobs"]["content"]):
        assert set(c) == {"token", "logprob", "bytes", "top_logprobs"} and len(c["top_logprobs"]) == 4
        assert c["token"] == w["token"] and c["logprob"] == pytest.approx(w["logprob"], abs=2e-3)
        assert c["logprob"] <= 0 and c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][-1]["logprob"]
        # greedy: the sampled token is the best alternative
        assert c["top_logprobs"][0]["token"] == c["token"] and math.isclose(
            c["top_logprobs"][0]["logprob"], c["logprob"], abs_tol=1e-6)
    # not asked: no logprobs key
    plain = _run(native, [{**req, "logprobs": False, "top_logprobs": None}], "chat")[0]
    assert "logprobs" not in plain["choices"][0]


def test_streamed_logprobs_cover_every_token(llms):
    native, _ = llms

    async def main():
        chunks = [c async for c in await native.create("completion", {**REQS[2], "stream": True})]
        return chunks
    chunks = asyncio.run(main())
    toks = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    lps = [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert len(toks) == len(lps) == REQS[2]["max_tokens"]


@pytest.mark.parametrize("req, field", [
    ({"frequency_penalty": 3}, "frequency_penalty"), ({"presence_penalty": "x"}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"logprobs": 21}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_bad_values_name_the_field(llms, req, field):
    from webinfer.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=field):
        _run(llms[0], [{"prompt": "x", "max_tokens": 2, **req}])
