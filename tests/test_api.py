"""OpenAI-shaped API over the engine with the fake runner. Run: python -m pytest tests/test_api.py -q"""

from __future__ import annotations

import asyncio

import pytest

from tests.fake_model import FakeRunner, FakeTokenizer, fake_llm, generate_alone
from webinfer.errors import ContextOverflowError, InvalidRequestError

VOCAB, EOS = 40, (0,)
TEMPLATE = "{% for m in messages %}{{ m.role[0] }} {{ m.content }}.{% endfor %}{% if add_generation_prompt %}a {% endif %}"


def make_llm(num_blocks=40, max_len=128):
    return fake_llm(FakeRunner(num_blocks, 4, max_len, vocab=VOCAB), VOCAB, EOS, TEMPLATE)


def test_chat_plain_and_stream_agree_with_the_model_alone():
    async def main():
        llm = make_llm()
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
        r = await llm.chat.completions.create(messages=msgs, max_tokens=12, temperature=0)
        prompt = FakeTokenizer(VOCAB).encode("s be brief.u hi there.a ")
        want, reason = generate_alone(prompt, 12, VOCAB, EOS)
        ch = r["choices"][0]
        assert r["object"] == "chat.completion" and r["model"] == "fake" and r["id"].startswith("chatcmpl-")
        assert ch["token_ids"] == want and ch["finish_reason"] == reason
        assert ch["message"] == {"role": "assistant", "content": FakeTokenizer(VOCAB).decode([t for t in want if t])}
        u = r["usage"]
        assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (len(prompt), len(want), len(prompt) + len(want))
        assert u["ttft_s"] >= 0
        chunks = [c async for c in await llm.chat.completions.create(messages=msgs, max_tokens=12, temperature=0, stream=True)]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == ch["message"]["content"]
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == reason
        assert chunks[-1]["usage"]["completion_tokens"] == len(want)
        # the second identical request hit the prefix cache
        assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4
        await llm.engine.close()
    asyncio.run(main())


def test_completion_with_stop_and_seeded_sampling():
    async def main():
        llm = make_llm()
        a = await llm.completions.create(prompt="once upon", max_tokens=8, temperature=0.7, seed=3)
        b = await llm.completions.create(prompt="once upon", max_tokens=8, temperature=0.7, seed=3)
        want, _ = generate_alone(FakeTokenizer(VOCAB).encode("once upon"), 8, VOCAB, EOS, temperature=0.7, seed=3)
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"] == want
        assert a["object"] == "text_completion" and isinstance(a["choices"][0]["text"], str)
        await llm.engine.close()
    asyncio.run(main())


@pytest.mark.parametrize("kw, param", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=10**6), "max_tokens"), (dict(temperature=2.5), "temperature"),
    (dict(top_p=0), "top_p"), (dict(top_k=-1), "top_k"), (dict(stop=["x"] * 9), "stop"), (dict(max_tokens="9"), "max_tokens"),
])
def test_bad_parameters_name_the_field(kw, param):
    async def main():
        llm = make_llm()
        with pytest.raises(InvalidRequestError) as e:
            await llm.chat.completions.create(messages=[{"role": "user", "content": "x"}], **kw)
        assert e.value.param == param
    asyncio.run(main())


def test_bad_messages_and_overflow_fail_before_streaming():
    async def main():
        llm = make_llm(num_blocks=5, max_len=100)  # 16 tokens of KV
        for msgs in ([], [{"role": "user"}], [{"role": "robot", "content": "x"}], "hi"):
            with pytest.raises(InvalidRequestError):
                await llm.chat.completions.create(messages=msgs, stream=True)
        with pytest.raises(ContextOverflowError) as e:
            await llm.completions.create(prompt="a" * 20, stream=True)
        assert (e.value.n_prompt, e.value.n_ctx) == (20, 15)
        assert not llm.engine.scheduler.has_work()
    asyncio.run(main())


def test_token_id_prompts_are_checked_against_the_runner_vocabulary():
    async def main():
        llm = make_llm()
        vocab = llm.engine.runner.vocab_size
        with pytest.raises(InvalidRequestError) as e:
            await llm.completions.create(prompt=[1, vocab], max_tokens=2)
        assert e.value.param == "prompt" and str(vocab) in str(e.value)
        ok = await llm.completions.create(prompt=[1, vocab - 1], max_tokens=2)
        assert ok["usage"]["prompt_tokens"] == 2
    asyncio.run(main())
