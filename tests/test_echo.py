"""Prompt logprobs and completions' `echo`: what lm-evaluation-harness and perplexity tools send
(`prompt` as token ids, `echo: true`, `logprobs: k`, `max_tokens` 0 or 1), end to end.

- The values, against transformers running the same GGUF (SmolLM2-135M; the CPU engine, the engine of the page
  without a fast GPU, and the numpy reference runner), every prompt position's logprob and top ids.
- The plumbing, on the fake runner (tests/fake_model.py: a row's score is a hash of its KV history and the id it
  scores): the scheduler's chunks, preemptions and prefix cache; the API's shapes, streamed and not, arrays of
  prompts, n, max_tokens 0, and the errors.
The GPU model's rows: tests/gpu/test_prompt_logprobs.py; the official client: tests/test_openai_client.py.

Run: python -m pytest tests/test_echo.py -q
"""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.fake_model import FakeRunner, fake_llm, prompt_scores

VOCAB = 40


def _fake(**kw):
    runner = FakeRunner(num_blocks=kw.pop("num_blocks", 64), block_size=4, max_model_len=256, vocab=VOCAB,
                        split_paths=False)
    return runner, fake_llm(runner, VOCAB, **kw)


def _create(llm, **req):
    async def main():
        r = await llm.completions.create(**req)
        if req.get("stream"):
            return [c async for c in r]
        return r
    return asyncio.run(main())


def test_echo_returns_the_prompt_then_the_completion_with_every_prompt_position_scored():
    _, llm = _fake(max_num_batched_tokens=5, max_num_seqs=2)  # a 13-token prompt in chunks of 5
    prompt = "hello world, again"  # the fake tokenizer: one id per character
    r = _create(llm, prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0)
    c = r["choices"][0]
    ids = r["prompt_token_ids"]
    assert c["text"].startswith(prompt) and len(c["text"]) == len(prompt) + len(c["token_ids"]) == len(prompt) + 3
    lp = c["logprobs"]
    assert lp["tokens"] == list(prompt) + [c["text"][len(prompt) + j] for j in range(3)]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:len(ids)] == [s for s, *_ in prompt_scores(ids)]  # each row, its own history
    assert lp["text_offset"] == list(range(len(prompt) + 3))
    # without logprobs: only the text
    plain = _create(llm, prompt=prompt, max_tokens=3, echo=True, temperature=0)["choices"][0]
    assert plain["text"] == c["text"] and "logprobs" not in plain


def test_max_tokens_0_scores_the_prompt_only():
    runner, llm = _fake()
    r = _create(llm, prompt=[3, 1, 4, 1, 5, 9, 2, 6], max_tokens=0, echo=True, logprobs=0)
    c = r["choices"][0]
    assert c["text"] == "dbebfjcg" and c["token_ids"] == [] and c["finish_reason"] == "length"
    assert c["logprobs"]["token_logprobs"] == [None] + [s for s, *_ in prompt_scores([3, 1, 4, 1, 5, 9, 2, 6])]
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == 8
    with pytest.raises(Exception) as e:  # 0 without echo asks for nothing
        _create(llm, prompt="abc", max_tokens=0)
    assert e.value.param == "max_tokens"


def test_an_array_of_prompts_with_n_as_lm_eval_sends_them():
    runner, llm = _fake(max_num_batched_tokens=6, max_num_seqs=3)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]]
    r = _create(llm, prompt=prompts, max_tokens=2, echo=True, logprobs=1, n=2, temperature=0.8, seed=5)
    assert [c["index"] for c in r["choices"]] == list(range(6)) and r["prompt_token_ids"] == prompts
    for c in r["choices"]:
        p = prompts[c["index"] // 2]
        want = [None] + [s for s, *_ in prompt_scores(p)]
        assert c["logprobs"]["token_logprobs"][:len(p)] == want, c["index"]  # (choice 1: choice 0's, not rescored)
        assert len(c["logprobs"]["token_logprobs"]) == len(p) + 2
    assert r["usage"]["prompt_tokens"] == sum(map(len, prompts)) and r["usage"]["completion_tokens"] == 12
    # a prompt's choices 0 and 1 differ by seed only, as a single prompt's do
    alone = _create(llm, prompt=prompts[1], max_tokens=2, n=2, temperature=0.8, seed=5)
    assert [c["token_ids"] for c in alone["choices"]] == [c["token_ids"] for c in r["choices"][2:4]]
    # strings too
    r = _create(llm, prompt=["ab", "cde"], max_tokens=1, echo=True)
    assert [c["text"][:-1] for c in r["choices"]] == ["ab", "cde"]


def test_echo_streams_the_prompt_in_each_choices_first_chunk():
    _, llm = _fake()
    chunks = _create(llm, prompt=["abcd", "xyz"], max_tokens=3, echo=True, logprobs=1, stream=True, n=2,
                     temperature=0.5, seed=1)
    whole = _create(llm, prompt=["abcd", "xyz"], max_tokens=3, echo=True, logprobs=1, n=2, temperature=0.5, seed=1)
    for c in whole["choices"]:
        mine = [ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["index"] == c["index"]]
        assert "".join(m["text"] for m in mine) == c["text"]
        assert sum((m["logprobs"]["token_logprobs"] for m in mine), []) == c["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("req, param", [
    (dict(prompt=["ok", 5]), "prompt"), (dict(prompt=["ok", ""]), "prompt[1]"), (dict(prompt=[[1, 2], [99]]), "prompt[1]"),
    (dict(prompt=["a"] * 33), "prompt"), (dict(prompt=["a"] * 20, n=4), "prompt"), (dict(echo="yes"), "echo"),
    (dict(max_tokens=-1, echo=True), "max_tokens"),
])
def test_bad_echo_and_prompt_arrays_are_400s_naming_the_field(req, param):
    from webinfer.errors import InvalidRequestError

    _, llm = _fake()
    with pytest.raises(InvalidRequestError) as e:
        _create(llm, **{"prompt": "abc", "max_tokens": 2, **req})
    assert e.value.param == param, e.value


def test_what_one_request_may_keep_of_prompt_logprobs_is_bounded():
    from webinfer.api import Limits
    from webinfer.errors import InvalidRequestError

    _, llm = _fake(limits=Limits(max_prompt_logprobs=60))
    ok = _create(llm, prompt=["abcdefghij", "klmnopqrst"], max_tokens=0, echo=True, logprobs=2)  # 20 x 3
    assert len(ok["choices"]) == 2
    with pytest.raises(InvalidRequestError) as e:  # 20 x 4
        _create(llm, prompt=["abcdefghij", "klmnopqrst"], max_tokens=0, echo=True, logprobs=3)
    assert e.value.param == "logprobs" and "80" in e.value.problem
    assert _create(llm, prompt="abcdefghij" * 20, max_tokens=1, logprobs=20)  # (no echo: nothing kept)


def test_scoring_survives_preemption_and_skips_the_prefix_cache():
    """A pool so small that the scoring requests preempt each other, beside a request that fills the prefix cache
    with the same prompt: every prompt is still scored whole, each position under its own history."""
    runner, llm = _fake(num_blocks=9, max_num_batched_tokens=6, max_num_seqs=3)
    prompt = list(range(1, 15))

    async def main():
        warm = await llm.completions.create(prompt=prompt, max_tokens=2)  # its blocks go to the prefix cache
        rs = await asyncio.gather(*(llm.completions.create(prompt=prompt[:k], max_tokens=6, echo=True, logprobs=0,
                                                           ignore_eos=True) for k in (14, 13, 12)))
        return warm, rs

    warm, rs = asyncio.run(main())
    assert llm.engine.scheduler.num_preemptions > 0
    for r, k in zip(rs, (14, 13, 12)):
        assert r["choices"][0]["logprobs"]["token_logprobs"][:k] == [None] + [s for s, *_ in prompt_scores(prompt[:k])]
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


# ------------------------------------------------------------------------------------------------ real model


TEXTS = ["The capital of France is Paris. The capital of Italy is Rome, and the capital of Spain is",
         "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))  # prints 5\n" * 2]


@pytest.mark.model
@pytest.mark.oracle
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_prompt_logprobs_equal_transformers(smollm2_package, smollm2_hf, backend):
    """Every prompt position's logprob within 5e-4 of transformers' log-softmax (the same GGUF in float32), and the
    top 5 ids the same up to near ties; chunks of 24 tokens, so rows go through several steps and score groups."""
    import torch

    from webinfer.engine.stopping import SamplingParams
    from webinfer.factory import EngineOptions
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(smollm2_package, backend, options=EngineOptions(context_tokens=512, max_seqs=4, max_batch_tokens=24))
    prompts = [llm.prompter.prompt_ids(t) for t in TEXTS]
    assert len(prompts[1]) > 48

    async def main():
        outs = []
        for p in prompts:
            async for o in llm.engine.generate(p, SamplingParams(max_tokens=1, prompt_logprobs=5)):
                outs.append(o.prompt_logprobs)
                break
        await llm.close()
        return outs

    got = asyncio.run(main())
    worst, ranks = 0.0, []
    for p, scores in zip(prompts, got):
        assert len(scores) == len(p) - 1
        with torch.no_grad():
            want = torch.log_softmax(smollm2_hf[0](torch.tensor([p])).logits[0].double(), -1).numpy()  # [T, V]
        for i, (lp, top, rank) in enumerate(scores):
            worst = max(worst, abs(lp - want[i, p[i + 1]]))
            assert math.isclose(lp, want[i, p[i + 1]], abs_tol=5e-4), (i, lp, want[i, p[i + 1]])
            w = want[i, p[i + 1]]  # the rank in the vocabulary, up to tokens within the logprobs' tolerance of it
            assert 1 + (want[i] > w + 1e-3).sum() <= rank <= 1 + (want[i] > w - 1e-3).sum(), (i, rank)
            ranks.append(rank)
            fifth = sorted(want[i])[-5]
            assert len(top) == 5 and all(want[i, t] >= fifth - 5e-4 for t, _ in top), (i, top)
            assert all(math.isclose(v, want[i, t], abs_tol=5e-4) for t, v in top)
    assert min(ranks) == 1 and max(ranks) > 20, ranks  # (the likely tokens and some far down the vocabulary)
    print(f"{backend}: largest |logprob - transformers'| {worst:.2e}")


def test_vllm_prompt_logprobs_without_echo_on_completions_and_chat():
    """vLLM's `prompt_logprobs: k` extension: per choice (completions) or on the response (chat) a list with None
    for the first prompt token, then {id: {logprob, rank, decoded_token}} holding the prompt token; the text is not
    echoed; each prompt of an array gets its own, every choice of a prompt the same."""
    _, llm = _fake(max_num_batched_tokens=5, max_num_seqs=2)
    r = _create(llm, prompt=["hello", "worlds"], max_tokens=2, prompt_logprobs=0, n=2, temperature=0.5, seed=3)
    for c in r["choices"]:
        ids = r["prompt_token_ids"][c["index"] // 2]
        assert len(c["text"]) == 2 and "logprobs" not in c  # (no echo, no completion logprobs asked)
        want = [None] + [{t: {"logprob": s, "rank": rank, "decoded_token": chr(ord("a") + t)}}
                         for t, (s, _, rank) in zip(ids[1:], prompt_scores(ids))]
        assert c["prompt_logprobs"] == want, c["index"]

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = fake_llm(FakeRunner(block_size=4, vocab=VOCAB, split_paths=False), VOCAB, chat_template=template)

    async def main():
        return await chat.chat.completions.create(messages=[{"role": "user", "content": "abcabc"}], max_tokens=1,
                                                  prompt_logprobs=1)
    r = asyncio.run(main())
    ids = r["prompt_token_ids"]
    assert ids == [0, 1, 2, 0, 1, 2] and "prompt_logprobs" not in r["choices"][0]
    assert r["prompt_logprobs"] == [None] + [{t: {"logprob": s, "rank": rank, "decoded_token": chr(ord("a") + t)}}
                                             for t, (s, _, rank) in zip(ids[1:], prompt_scores(ids))]


@pytest.mark.parametrize("req, problem", [
    (dict(prompt_logprobs=21), "between 0 and 20"), (dict(prompt_logprobs=True), "integer"),
    (dict(prompt_logprobs=1, stream=True), "stream"),
])
def test_bad_prompt_logprobs_are_400s(req, problem):
    from webinfer.errors import InvalidRequestError

    _, llm = _fake()
    with pytest.raises(InvalidRequestError) as e:
        _create(llm, prompt="abc", max_tokens=2, **req)
    assert e.value.param == "prompt_logprobs" and problem in e.value.problem, e.value


def test_prompt_logprobs_count_against_the_bound_under_their_own_name():
    from webinfer.api import Limits
    from webinfer.errors import InvalidRequestError

    _, llm = _fake(limits=Limits(max_prompt_logprobs=30))
    assert _create(llm, prompt="abcdefghij", max_tokens=1, prompt_logprobs=2)  # 10 x 3
    with pytest.raises(InvalidRequestError) as e:  # 10 x 4
        _create(llm, prompt="abcdefghij", max_tokens=1, prompt_logprobs=3)
    assert e.value.param == "prompt_logprobs" and "40" in e.value.problem
    with pytest.raises(InvalidRequestError) as e:  # echo's the larger: named
        _create(llm, prompt="abcdefghij", max_tokens=1, prompt_logprobs=1, echo=True, logprobs=3)
    assert e.value.param == "logprobs"
