"""Speculative decoding with a draft model (issue 13): a second package with the same tokenizer proposes tokens
with its own paged KV cache on the same device; the target verifies them. The output is the target's own, token
for token, whatever the draft proposes: a draft identical to the target (every greedy proposal accepted) and an
unrelated one (another seed: few accepted), greedy and seeded, alone and batched, against plain decoding.

Run: python -m pytest tests/test_speculative_draft.py -q
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = [pytest.mark.gpu]

REQS = [{"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0},
        {"prompt": "Once upon", "max_tokens": 20, "temperature": 0.8, "seed": 7},
        {"prompt": "A B A B A B", "max_tokens": 16, "temperature": 0, "speculative_tokens": 0}]


@pytest.fixture(scope="module")
def other_llama(tmp_path_factory):
    from tests.conftest import _pack_tiny

    return _pack_tiny(tmp_path_factory, "llama_seed5", arch="llama", seed=5)


def _open(pkg, gpu, **kw):
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    return open_llm(pkg, "native", device=gpu, options=EngineOptions(context_tokens=512, max_seqs=3, **kw))


def _run(llm, reqs):
    async def main():
        return await asyncio.gather(*(llm.completions.create(**r) for r in reqs))
    return asyncio.run(main())


@pytest.mark.parametrize("draft", ["same", "other"])
def test_draft_proposals_give_the_targets_own_tokens(tiny_llama, other_llama, gpu, draft):
    plain = _open(tiny_llama, gpu, decode_block=1)
    # every proposal verified (the engine's measured choice of length is tested in test_speculative.py)
    spec = _open(tiny_llama, gpu, speculative=str(tiny_llama if draft == "same" else other_llama),
                 speculative_tokens=4, adaptive_proposals=False)
    want = [r["choices"][0]["token_ids"] for r in _run(plain, [dict(r, speculative_tokens=0) for r in REQS])]
    steps0 = spec.engine.steps
    got = _run(spec, REQS)
    assert [r["choices"][0]["token_ids"] for r in got] == want
    assert spec.engine.proposer_errors == 0 and spec.engine.proposer.steps > 0
    q = got[0]["usage"]["speculative"]
    if draft == "same":  # the target's own greedy tokens: all accepted, far fewer target steps
        assert q["accepted_tokens"] == q["proposed_tokens"] > 10, q
        alone = _run(spec, [REQS[0]])[0]["usage"]["speculative"]
        assert alone["accepted_tokens"] >= 16
    else:
        assert q["proposed_tokens"] > 0
    assert "speculative" not in got[2]["usage"]  # the request that opted out
    assert spec.engine.steps > steps0
    # the draft's KV is given back with each request
    assert not spec.engine.proposer.kv.tables


def test_draft_with_another_vocabulary_is_refused(tiny_llama, tmp_path_factory, gpu):
    from tests.conftest import _pack_tiny
    from webinfer.errors import WebinferError

    other_vocab = _pack_tiny(tmp_path_factory, "llama_v320", arch="llama", vocab_size=320)
    with pytest.raises(WebinferError, match="tokenizer differs"):
        _open(tiny_llama, gpu, speculative=str(other_vocab))
