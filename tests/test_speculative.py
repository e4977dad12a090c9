"""Speculative decoding gives exactly the tokens of decoding without it (greedy and seeded sampling), with
continuous batching, preemption, the prefix cache and stop strings; prompt lookup proposes what brute force finds.

The fake runner's next token is a hash of the whole KV history (tests/fake_model.py), so a wrongly rolled-back slot
or a wrong position after acceptance changes every later token. An oracle proposer that knows the true
continuation, corrupted at random, exercises full, partial and zero acceptance.

Run: python -m pytest tests/test_speculative.py -q
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fake_model import FakeRunner, FakeTokenizer, generate_alone
from webinfer.engine.engine import AsyncEngine
from webinfer.engine.speculative import PromptLookup
from webinfer.engine.stopping import SamplingParams, TextStream

VOCAB, EOS = 40, (0,)


class OracleProposer:
    """Proposes the request's true continuation (from generate_alone), with each token corrupted at `noise`."""

    def __init__(self, noise: float, seed: int = 0):
        self.noise, self.rng = noise, random.Random(seed)
        self.proposed = 0

    def propose(self, req, k):
        p = req.params
        full, _ = generate_alone(req.prompt_ids, p.max_tokens, VOCAB, () if p.ignore_eos else EOS,
                                 temperature=p.temperature, seed=p.seed)
        nxt = full[len(req.output_ids):len(req.output_ids) + k]
        out = [t if self.rng.random() > self.noise else (t + 1) % VOCAB for t in nxt]
        self.proposed += len(out)
        return out

    def forget(self, request_id):
        pass


async def _run(engine, prompt, params):
    ids, text, last = [], "", None
    ts = TextStream(FakeTokenizer(VOCAB).decode_stream(), params.stop, frozenset() if params.ignore_eos else EOS)
    async for out in engine.generate(prompt, params, ts):
        ids += out.token_ids
        text += out.text
        last = out
    return ids, text, last


@pytest.mark.parametrize("noise", [0.0, 0.3, 1.0])
def test_speculative_equals_plain_decoding(noise):
    rng = random.Random(1)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 14))] for _ in range(8)]
    params = [SamplingParams(max_tokens=rng.randrange(2, 24), temperature=rng.choice([0.0, 0.8]), seed=i,
                             speculative_tokens=rng.choice([1, 3, 6])) for i in range(8)]

    async def main(proposer):
        # a tight pool (preemptions) and a budget that cuts proposals short
        runner = FakeRunner(14, 4, 128, vocab=VOCAB)
        engine = AsyncEngine(runner, eos_ids=EOS, max_num_batched_tokens=12, max_num_seqs=6, proposer=proposer,
                             clock=runner.clock)
        res = await asyncio.gather(*(_run(engine, p, sp) for p, sp in zip(prompts, params)))
        stats = engine.stats()
        await engine.close()
        return res, stats, runner.steps

    plain, _, _ = asyncio.run(main(None))
    oracle = OracleProposer(noise)
    spec, stats, steps = asyncio.run(main(oracle))
    for (a_ids, a_text, a_last), (b_ids, b_text, b_last), p, sp in zip(plain, spec, prompts, params):
        want, reason = generate_alone(p, sp.max_tokens, VOCAB, EOS, temperature=sp.temperature, seed=sp.seed)
        assert a_ids == b_ids == want and a_text == b_text
        assert a_last.finish_reason == b_last.finish_reason == reason
        assert a_last.num_output_tokens == b_last.num_output_tokens == len(want)
    assert stats["blocks_used"] == 0 and oracle.proposed > 0


class SometimesProposer(OracleProposer):
    """The oracle's proposals every other time it is asked, nothing in between (prompt lookup with no match)."""

    def __init__(self):
        super().__init__(0.0)
        self.asked = 0

    def propose(self, req, k):
        self.asked += 1
        return super().propose(req, k) if self.asked % 2 else []


def test_speculating_requests_without_proposals_decode_in_short_blocks():
    """With decode blocks on, a speculating request that has nothing to verify this step joins a block of at most
    Scheduler.SPEC_BLOCK steps (one host round trip, not one a token), then is offered proposals again: the ids
    stay those of plain decoding, blocks and verification steps both happen, no block is longer."""
    from webinfer.engine.scheduler import Scheduler

    rng = random.Random(5)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 10))] for _ in range(3)]
    params = [SamplingParams(max_tokens=40, temperature=rng.choice([0.0, 0.8]), seed=i, speculative_tokens=3)
              for i in range(3)]

    async def main(proposer):
        runner = FakeRunner(64, 4, 128, vocab=VOCAB)
        # (8 rows: room for the 3 requests' proposals beside their own rows)
        engine = AsyncEngine(runner, eos_ids=EOS, max_num_seqs=8, proposer=proposer, clock=runner.clock,
                             decode_block=16)
        spec = 3 if proposer else 0  # (the API refuses speculative_tokens without a proposer)
        res = await asyncio.gather(*(_run(engine, p, replace(sp, speculative_tokens=spec))
                                     for p, sp in zip(prompts, params)))
        await engine.close()
        return [r[0] for r in res], runner, sum(r[2].num_accepted for r in res)

    plain, plain_runner, _ = asyncio.run(main(None))
    spec, runner, accepted = asyncio.run(main(SometimesProposer()))
    assert spec == plain
    assert plain_runner.max_block > Scheduler.SPEC_BLOCK  # (without speculation the blocks are longer)
    assert runner.blocks > 0 and runner.max_block <= Scheduler.SPEC_BLOCK and accepted > 0


def test_accepted_proposals_save_steps_and_stop_strings_cut_exactly():
    prompt, n = [3, 9, 27], 30
    full, _ = generate_alone(prompt, n, VOCAB, (), temperature=0.0)
    text = FakeTokenizer(VOCAB).decode(full)
    stop = text[11:14]

    async def main(proposer, stop_strings):
        runner = FakeRunner(40, 4, 128, vocab=VOCAB)
        engine = AsyncEngine(runner, eos_ids=EOS, max_num_seqs=8, proposer=proposer, clock=runner.clock)
        sp = SamplingParams(max_tokens=n, ignore_eos=True, stop=stop_strings, speculative_tokens=7)
        r = await _run(engine, prompt, sp)
        await engine.close()
        return r, runner.steps

    (ids, _, last), steps_plain = asyncio.run(main(None, []))
    (sids, _, slast), steps_spec = asyncio.run(main(OracleProposer(0.0), []))
    assert ids == sids == full and steps_spec < steps_plain / 3  # 1 prefill + ~n/8 verification steps
    # a stop string completed in the middle of a step's accepted tokens ends the output at that token
    (a, at, al), _ = asyncio.run(main(None, [stop]))
    (b, bt, bl), _ = asyncio.run(main(OracleProposer(0.0), [stop]))
    assert (a, at, al.finish_reason, al.num_output_tokens) == (b, bt, bl.finish_reason, bl.num_output_tokens)
    assert at == text[:text.find(stop)] and len(b) == text.find(stop) + len(stop)


@pytest.mark.parametrize("noise, adaptive", [(1.0, True), (1.0, False), (0.0, True), (0.3, True)])
def test_proposals_are_verified_only_where_they_pay(noise, adaptive):
    """A device where each verification row costs half a step (lavapipe-like): proposals that are always rejected
    stop being verified (no slowdown beyond 5 %), proposals that are accepted keep being verified (fewer, cheaper
    steps overall). Time is the fake runner's virtual clock, so the check is exact, not a timing."""
    prompts = [[5, 7, 11], [2, 4, 6, 8]]

    async def main(proposer, **kw):
        runner = FakeRunner(64, 4, 256, vocab=VOCAB, step_cost=(1.0, 0.5))
        engine = AsyncEngine(runner, eos_ids=EOS, max_num_seqs=8, proposer=proposer, clock=runner.clock, **kw)
        res = []
        for p in prompts:  # batch 1, one after the other
            # 96 tokens, the bench's open chat: the budget's one-time costs (pricing each row count from its second
            # step) weigh on a short run what they would not on a served one
            res.append(await _run(engine, p, SamplingParams(max_tokens=96, ignore_eos=True, speculative_tokens=4)))
        assert engine.budget is None or not engine.budget._acc  # nothing kept for finished requests
        await engine.close()
        return [r[0] for r in res], runner.now, sum(r[2].num_proposed for r in res)

    plain_ids, plain_t, _ = asyncio.run(main(None))
    ids, t, verified = asyncio.run(main(OracleProposer(noise), adaptive_proposals=adaptive))
    assert ids == plain_ids
    if noise == 1.0 and adaptive:
        assert t <= 1.05 * plain_t and verified < 40
    elif noise == 1.0:
        assert t > 1.5 * plain_t  # verifying everything: what the budget avoids
    elif noise == 0.0:
        assert t < 0.6 * plain_t
    else:
        assert t < plain_t


def test_a_cold_first_step_does_not_turn_speculation_off():
    """The first step of each row count costs 10 steps more (as a GPU compiling that shape's pipelines on first
    use: lavapipe's first 5-row SmolLM2 step took 449 ms, then 102): priced as it came, it made every proposal look
    too dear and prompt lookup never proposed again. Proposals that are always accepted must still pay off."""
    prompts = [[5, 7, 11], [2, 4, 6, 8]]

    async def main(proposer, **kw):
        runner = FakeRunner(64, 4, 256, vocab=VOCAB, step_cost=(1.0, 0.5), cold_cost=10.0)
        engine = AsyncEngine(runner, eos_ids=EOS, max_num_seqs=8, proposer=proposer, clock=runner.clock, **kw)
        res = [await _run(engine, p, SamplingParams(max_tokens=64, ignore_eos=True, speculative_tokens=4))
               for p in prompts]
        await engine.close()
        return [r[0] for r in res], runner.now

    plain_ids, plain_t = asyncio.run(main(None))
    ids, t = asyncio.run(main(OracleProposer(0.0), adaptive_proposals=True))
    assert ids == plain_ids
    assert t < 0.7 * plain_t, (t, plain_t)


def test_proposal_budget_prices_rows():
    from webinfer.engine.speculative import ProposalBudget

    class R:
        request_id, num_proposed, num_accepted = 1, 0, 0
    b = ProposalBudget()
    assert b.lengths([(R, 4)], rows=1) == [0]  # a plain step first: the price of one row
    b.observe_step(1, 3.0)  # a row count's first step pays one-off work (pipelines): not its price
    assert b.lengths([(R, 4)], rows=1) == [0]
    b.observe_step(1, 1.0)
    assert b.lengths([(R, 4)], rows=1) == [4]  # larger steps not priced yet: as cheap as the largest priced
    b.observe_step(5, 21.0)  # the first 5-row step, 10x a warm one (as lavapipe's first did): not priced
    assert b.lengths([(R, 4)], rows=1) == [4]
    b.observe_step(5, 2.1)
    assert b.cost(3) == pytest.approx(1.55) and b.cost(9) == 2.1 and b.cost(1) == 1.0
    b.observe_step(5, 50.0)  # one slow step among warm ones does not set the price
    assert b.cost(5) == pytest.approx((2.1 + 50.0) / 2)  # (two steps: their median is their mean)
    b.observe_step(5, 2.1)
    assert b.cost(5) == 2.1
    for _ in range(10):  # accepted whole, again and again: a -> 1
        R.num_proposed += 4
        R.num_accepted += 4
        assert b.lengths([(R, 4)], rows=1) == [4]
    looks = 0
    while b.lengths([(R, 4)], rows=1) != [0]:  # then rejected whole, again and again
        R.num_proposed += 4
        looks += 1
    assert 3 <= looks <= 6
    for _ in range(ProposalBudget.WINDOW):  # rows are free now (a real GPU): any chance of acceptance pays
        b.observe_step(5, 1.0)
    assert b.cost(5) == 1.0
    R.num_accepted += 1
    R.num_proposed += 4
    assert b.lengths([(R, 4)], rows=1) == [4]


class _Req:
    def __init__(self, toks):
        self.request_id, self.all_token_ids = 1, list(toks)
        self.num_proposed = self.num_accepted = 0


def _brute(toks, min_n, max_n, k):
    for n in range(min(max_n, len(toks)), min_n - 1, -1):
        tail = toks[len(toks) - n:]
        for start in range(len(toks) - n - 1, -1, -1):  # latest earlier occurrence
            if toks[start:start + n] == tail:
                return toks[start + n:start + n + k]
    return []


@pytest.mark.parametrize("min_n, max_n", [(1, 3), (2, 4)])
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 6))
def test_prompt_lookup_matches_brute_force(min_n, max_n, toks, k):
    """Growing the token list one token at a time, the incremental index proposes what a full scan finds."""
    pl = PromptLookup(max_ngram=max_n, min_ngram=min_n)
    req = _Req([])
    for t in toks:
        req.all_token_ids.append(t)
        got = pl.propose(req, k)
        assert got == _brute(req.all_token_ids, min_n, max_n, k)


def test_replay_prices_steps_by_rows():
    """The bench's replay (prompt lookup + ProposalBudget over a known output, no model): a quoted output takes
    few steps, an unrelated one loses little where rows are dear and nothing where they are free."""
    from webinfer_packager.bench.speculative import replay

    rng = random.Random(3)
    passage = [rng.randrange(100, 500) for _ in range(60)]
    prompt = [1, 2] + passage + [3]
    quoted = replay(prompt, passage, 4, {1: 1.0})
    assert quoted["accepted"] >= 45 and quoted["steps"] <= 15 and quoted["speedup"] > 3.5
    other = [rng.randrange(500, 900) for _ in range(60)]
    assert replay(prompt, other, 4, {1: 1.0})["speedup"] == 1.0  # nothing to propose from
    dear = {1: 1.0, 2: 1.4, 3: 1.6, 4: 1.85, 5: 2.1}
    assert replay(prompt, passage, 4, dear)["speedup"] > 1.8
    noisy = prompt[:20] + other[:40]  # starts quoting, then goes its own way
    assert replay(prompt, noisy, 4, dear)["speedup"] >= 0.95
