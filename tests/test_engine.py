"""AsyncEngine over the fake paged runner. Run: python -m pytest tests/test_engine.py -q"""

from __future__ import annotations

import asyncio
import random
from contextlib import aclosing

import pytest

from tests.fake_model import FakeRunner, FakeTokenizer, generate_alone
from webinfer.engine.engine import AsyncEngine, EngineStepError
from webinfer.engine.stopping import SamplingParams, TextStream
from webinfer.errors import ContextOverflowError
from webinfer.tokenizer import Tokenizer
from webinfer.tokenizer.common import BYTE_TO_CHAR

VOCAB, EOS = 40, (0,)


def make(num_blocks=40, block_size=4, max_len=128, **kw):
    runner = FakeRunner(num_blocks, block_size, max_len, vocab=VOCAB)
    return runner, AsyncEngine(runner, eos_ids=EOS, **kw)


def text_stream(params):
    return TextStream(FakeTokenizer(VOCAB).decode_stream(), params.stop, frozenset() if params.ignore_eos else EOS)


async def collect(engine, prompt, params):
    ids, text, last = [], "", None
    async for out in engine.generate(prompt, params, text_stream(params)):
        ids += out.token_ids
        text += out.text
        last = out
    return ids, text, last


def test_concurrent_requests_equal_alone_and_free_everything():
    async def main():
        runner, engine = make(num_blocks=14, max_num_batched_tokens=12, max_num_seqs=6)
        rng = random.Random(0)
        prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(10)]
        params = [SamplingParams(max_tokens=rng.randrange(1, 15), temperature=rng.choice([0.0, 1.0]), seed=i)
                  for i in range(10)]
        res = await asyncio.gather(*(collect(engine, p, sp) for p, sp in zip(prompts, params)))
        for p, sp, (ids, text, last) in zip(prompts, params, res):
            want, reason = generate_alone(p, sp.max_tokens, VOCAB, EOS, temperature=sp.temperature, seed=sp.seed)
            assert ids == want and last.finish_reason == reason
            assert text == FakeTokenizer(VOCAB).decode([t for t in ids if t not in EOS])
            assert last.num_output_tokens == len(ids) and last.ttft_s >= 0 and last.decode_s >= 0
            if len(ids) > 1:  # each output carries its own timing values
                assert last.time_per_output_token_s == pytest.approx(last.decode_s / (len(ids) - 1))
        s = engine.stats()
        assert s["blocks_used"] == 0 and s["running"] == 0 and s["waiting"] == 0
        assert s["preemptions"] > 0  # 13 blocks of 4 for 10 requests: the pool was tight
        await engine.close()
    asyncio.run(main())


def test_consumer_that_leaves_or_is_cancelled_frees_blocks():
    async def main():
        runner, engine = make()
        runner.delay_s = 0.001
        async with aclosing(engine.generate([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=100, ignore_eos=True))) as g:
            async for out in g:
                if out.num_output_tokens == 3:
                    break
        assert engine.stats()["blocks_used"] == 0 and not engine.scheduler.has_work()

        task = asyncio.create_task(collect(engine, [7] * 9, SamplingParams(max_tokens=100, ignore_eos=True)))
        while engine.tokens_generated < 6:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.stats()["blocks_used"] == 0
        # the engine still serves
        ids, _, _ = await collect(engine, [1, 2], SamplingParams(max_tokens=4))
        assert ids == generate_alone([1, 2], 4, VOCAB, EOS)[0]
        await engine.close()
    asyncio.run(main())


def test_stop_string_is_trimmed_and_never_streamed():
    async def main():
        runner, engine = make()
        prompt = [5, 6, 7]
        full, _ = generate_alone(prompt, 30, VOCAB, (), temperature=0.0)
        text = FakeTokenizer(VOCAB).decode(full)
        stop = text[10:13]  # three characters from the middle of the greedy answer
        first = text.find(stop)
        ids, got, last = await collect(engine, prompt, SamplingParams(max_tokens=30, stop=[stop], ignore_eos=True))
        assert got == text[:first] and last.finish_reason == "stop"
        assert len(ids) == first + len(stop)  # generation ended on the token that completed the stop string
        assert engine.stats()["blocks_used"] == 0
        await engine.close()
    asyncio.run(main())


def test_text_stream_holds_back_partial_stop_strings():
    # id b <-> byte b, so ASCII ids are the characters' code points
    byte_tok = Tokenizer.from_json({"model": {"type": "BPE", "vocab": {BYTE_TO_CHAR[b]: b for b in range(256)}, "merges": []},
                                    "decoder": {"type": "ByteLevel"}})
    ts = TextStream(byte_tok.decode_stream(), ["END"])
    deltas = [ts.push([ord(c)])[0] for c in "abcEN"]
    assert "".join(deltas) == "abc"  # "EN" may still become "END"
    assert ts.push([ord("X")]) == ("ENX", False)
    assert ts.push([ord(c) for c in "yEND"])[0] == "y" and ts.stopped
    # U+FFFD of a split UTF-8 character is held until complete
    raw = "é".encode()
    dec = byte_tok.decode_stream()
    assert dec.add(raw[0]) == "" and dec.add(raw[1]) == "é"


def test_overflow_and_failing_runner():
    async def main():
        runner, engine = make(num_blocks=5, block_size=4, max_len=100)  # 16 tokens of KV
        with pytest.raises(ContextOverflowError):
            await collect(engine, list(range(1, 17)), SamplingParams())
        real = runner.execute_sync
        calls = {"n": 0}

        def flaky(batch):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("device lost")
            return real(batch)
        runner.execute_sync = flaky
        with pytest.raises(EngineStepError, match="device lost"):
            await collect(engine, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        assert engine.stats()["blocks_used"] == 0
        ids, _, _ = await collect(engine, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        assert ids == generate_alone([1, 2, 3], 5, VOCAB, ())[0]
        await engine.close()
    asyncio.run(main())


@pytest.mark.parametrize("delay_s, budget_ms, blocks", [(0.002, 50, True), (0.03, 50, False), (0.03, 0, True)])
def test_decode_blocks_shrink_to_single_steps_when_a_step_is_slow(delay_s, budget_ms, blocks):
    """A block amortizes per-step read-backs, which matter when steps are short; when a step is long it only delays
    streaming and Stop: with decode_block_ms the engine measures a decode step and caps the block at that budget."""
    import asyncio

    from tests.fake_model import FakeRunner, generate_alone
    from webinfer.engine.engine import AsyncEngine
    from webinfer.engine.stopping import SamplingParams

    runner = FakeRunner(num_blocks=64, block_size=4, max_model_len=128, vocab=40, delay_s=delay_s)

    async def main():
        eng = AsyncEngine(runner, decode_block=8, decode_block_ms=budget_ms)
        ids = [t async for o in eng.generate([1, 2, 3], SamplingParams(max_tokens=24, ignore_eos=True))
               for t in o.token_ids]
        await eng.close()
        return ids
    assert asyncio.run(main()) == generate_alone([1, 2, 3], 24, 40)[0]
    assert (runner.blocks > 0) == blocks
