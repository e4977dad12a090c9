"""Continuous batching scheduler against the fake paged runner.
Run: python -m pytest tests/test_scheduler.py -q

The reference for every output is `generate_alone` (the request run with nothing else around, no paging)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fake_model import FakeRunner, generate_alone, prompt_scores
from webinfer.engine.scheduler import Request, Scheduler
from webinfer.engine.stopping import SamplingParams
from webinfer.errors import ContextOverflowError

VOCAB = 40
EOS = (0,)


def run_to_end(sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000, block: int = 1) -> None:
    for _ in range(max_steps):
        if not sched.has_work():
            return
        batch = sched.schedule(block)
        assert batch.num_tokens <= sched.max_num_batched_tokens
        sched.update(batch, runner.execute_sync(batch))
    raise AssertionError("scheduler did not drain")


def test_batched_outputs_equal_alone_with_chunked_prefill_and_prefix_hits():
    runner = FakeRunner(num_blocks=64, block_size=4, max_model_len=128, vocab=VOCAB)
    sched = Scheduler(64, 4, 128, eos_ids=EOS, max_num_batched_tokens=16, max_num_seqs=4)
    system = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    prompts = [system + [20 + i] * (i + 1) for i in range(6)] + [[3] * 30]
    reqs = [Request(i, p, SamplingParams(max_tokens=10)) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add_request(r)
    run_to_end(sched, runner)
    for r, p in zip(reqs, prompts):
        assert (r.output_ids, r.finish_reason) == generate_alone(p, 10, VOCAB, EOS)
    assert max(runner.batch_sizes) == 4 and max(runner.tokens_per_step) == 16
    st_ = sched.stats()
    assert st_["prefix_hit_tokens"] >= 8 * 3  # later requests reuse the 2 full system-prompt blocks
    assert st_["blocks_used"] == 0 and st_["blocks_free"] == 63


def test_preemption_under_a_tiny_pool_gives_the_same_answers():
    runner = FakeRunner(num_blocks=9, block_size=2, max_model_len=64, vocab=1000)
    sched = Scheduler(9, 2, 64, eos_ids=(), max_num_batched_tokens=8, max_num_seqs=4)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
    reqs = [Request(i, p, SamplingParams(max_tokens=6, temperature=0.8, seed=i)) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add_request(r)
    run_to_end(sched, runner)
    assert sched.num_preemptions > 0
    for r, p in zip(reqs, prompts):
        assert r.output_ids == generate_alone(p, 6, 1000, (), temperature=0.8, seed=r.request_id)[0]
    assert sched.kv.pool.num_free == 8


@pytest.mark.parametrize("rows_match", [False, True])
def test_a_prompt_repeating_an_earlier_answer(rows_match):
    """A chat's next turn repeats the answer, whose KV the decode path wrote. Where the runner's paths differ, the
    new prompt computes those blocks as a prompt (the fake's split paths give another answer if it reused them)
    and hits only the first turn's prompt block; where they match, it reuses the answer's blocks too."""
    runner = FakeRunner(num_blocks=40, block_size=4, max_model_len=64, vocab=VOCAB, split_paths=not rows_match)
    sched = Scheduler(40, 4, 64, eos_ids=(), max_num_batched_tokens=16, max_num_seqs=4, rows_match_chunks=rows_match)
    first = Request(0, [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=14))
    sched.add_request(first)
    run_to_end(sched, runner)
    turn2 = first.prompt_ids + first.output_ids + [11, 12]
    second = Request(1, turn2, SamplingParams(max_tokens=6))
    sched.add_request(second)
    run_to_end(sched, runner)
    assert second.output_ids == generate_alone(turn2, 6, VOCAB, split_paths=not rows_match)[0]
    assert second.num_cached_tokens == (16 if rows_match else 4)


def test_prompt_that_can_never_fit_names_both_lengths():
    sched = Scheduler(num_blocks=5, block_size=4, max_model_len=100)  # 16 tokens of KV
    with pytest.raises(ContextOverflowError) as e:
        sched.add_request(Request(1, list(range(16)), SamplingParams()))
    assert "16" in str(e.value) and "15" in str(e.value)
    sched2 = Scheduler(num_blocks=100, block_size=4, max_model_len=10)
    with pytest.raises(ContextOverflowError) as e:
        sched2.add_request(Request(1, list(range(10)), SamplingParams()))
    assert e.value.n_prompt == 10 and e.value.n_ctx == 9
    # the largest prompt that fits generates exactly one token, then stops for length
    runner = FakeRunner(num_blocks=100, block_size=4, max_model_len=10, vocab=1000)
    r = Request(2, list(range(9)), SamplingParams(max_tokens=50))
    sched2.add_request(r)
    run_to_end(sched2, runner)
    assert len(r.output_ids) == 1 and r.finish_reason == "length"


def test_abort_frees_blocks_at_once():
    sched = Scheduler(20, 4, 64)
    runner = FakeRunner(20, 4, 64)
    sched.add_request(Request(1, list(range(1, 12)), SamplingParams(max_tokens=30)))
    b = sched.schedule()
    sched.update(b, runner.execute_sync(b))
    assert sched.kv.stats()["blocks_used"] == 3
    sched.finish_request(1)
    assert sched.kv.stats()["blocks_used"] == 0 and not sched.has_work()
    sched.finish_request(1)  # twice is harmless


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 14), block_size=st.integers(1, 4), budget=st.integers(1, 12),
                max_seqs=st.integers(1, 5), max_len=st.integers(6, 40), rows_match=st.booleans())
    def setup(self, num_blocks, block_size, budget, max_seqs, max_len, rows_match):
        # rows_match: a runner like the CPU engine; else like the GPU model, whose one-token rows write other KV
        # than a chunk's rows: the fake then holds every position to the path a request alone takes, except where
        # the budget is too small for a prompt's rule (max_num_batched_tokens < max_num_seqs + 2)
        self.runner = FakeRunner(num_blocks, block_size, max_len, vocab=VOCAB,
                                 split_paths=not rows_match and budget >= max_seqs + 2)
        # (chunk room beyond max_seqs: proposals' verification rows, a recomputed request's rows)
        self.sched = Scheduler(num_blocks, block_size, max_len, eos_ids=EOS, max_num_batched_tokens=budget,
                               max_num_seqs=max_seqs, max_num_chunks=max_seqs + 3, rows_match_chunks=rows_match)
        self.next_id = 0
        self.live: dict[int, Request] = {}
        self.done: list[Request] = []
        self.cancelled: set[int] = set()
        self.initial_free = self.sched.kv.pool.num_free

    @rule(prefix=st.sampled_from([[], [1, 2, 3, 4, 5], [1, 2, 3, 9]]),
          tail=st.lists(st.integers(1, VOCAB - 1), max_size=12), max_tokens=st.integers(1, 10),
          temperature=st.sampled_from([0.0, 0.9]), seed=st.integers(0, 3), spec=st.sampled_from([0, 0, 2, 4]),
          scored=st.sampled_from([None, None, 2]))
    def add(self, prefix, tail, max_tokens, temperature, seed, spec, scored):
        self._add(prefix + tail or [7], SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed,
                                                       speculative_tokens=spec, prompt_logprobs=scored))

    @precondition(lambda self: self.done)
    @rule(pick=st.integers(0, 10**6), tail=st.lists(st.integers(1, VOCAB - 1), max_size=3),
          max_tokens=st.integers(1, 6))
    def follow_up(self, pick, tail, max_tokens):
        """A chat's next turn: an earlier request's prompt and answer, and more (the answer's blocks are cached)."""
        r = self.done[pick % len(self.done)]
        self._add(r.prompt_ids + r.output_ids + tail, SamplingParams(max_tokens=max_tokens))

    def _add(self, prompt, params):
        r = Request(self.next_id, prompt, params)
        self.next_id += 1
        try:
            self.sched.add_request(r)
        except ContextOverflowError:
            assert len(prompt) + 1 > self.sched.max_len
            return
        assert len(prompt) + 1 <= self.sched.max_len
        self.live[r.request_id] = r

    @precondition(lambda self: self.sched.has_work())
    @rule(block=st.sampled_from([1, 1, 2, 5, 12]), noise=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 9))
    def step(self, block, noise, seed):
        # speculating requests get proposals as the engine gives them (before schedule): the true continuation with
        # each token wrong at `noise`, or (every third request, as prompt lookup without a match) none
        rng = random.Random(seed)
        for r in self.sched.running:
            r.proposal = []
            if r.params.speculative_tokens and r.num_tokens - r.num_computed_tokens == 1 and r.request_id % 3:
                p = r.params
                full, _ = generate_alone(r.prompt_ids, p.max_tokens, VOCAB, EOS, self.sched.max_len, p.temperature,
                                         p.seed, self.runner.split_paths)
                nxt = full[len(r.output_ids):len(r.output_ids) + p.speculative_tokens]
                r.proposal = [t if rng.random() >= noise else (t + 1) % VOCAB for t in nxt]
        batch = self.sched.schedule(block)
        assert batch.steps <= block
        assert batch.num_tokens <= self.sched.max_num_batched_tokens
        assert len(batch.chunks) <= self.sched.max_num_chunks
        if any(r.params.speculative_tokens for r in self.sched.running):
            assert batch.steps <= Scheduler.SPEC_BLOCK
        if self.sched.whole_prompt_rows:  # a prompt is never fed one token at a time (but a one-token prompt)
            for c in batch.chunks:
                r = self.sched.requests[c.seq_id]
                recompute = r.output_ids and self.sched.rows_match_chunks
                assert recompute or len(r.prompt_ids) < 2 or c.start_pos >= len(r.prompt_ids) or \
                    len(c.token_ids) >= 2, (c.start_pos, r.prompt_ids)
        for out in self.sched.update(batch, self.runner.execute_sync(batch)):
            if out.finish_reason:
                self.done.append(self.live.pop(out.request.request_id))

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6))
    def cancel(self, pick):
        rid = sorted(self.live)[pick % len(self.live)]
        self.sched.finish_request(rid)
        self.cancelled.add(rid)
        del self.live[rid]

    @invariant()
    def ref_counts_match_tables(self):
        if not hasattr(self, "sched"):
            return
        pool = self.sched.kv.pool
        refs = [0] * pool.num_blocks
        for table in self.sched.kv.tables.values():
            for b in table:
                refs[b] += 1
        assert [b.ref_cnt for b in pool.blocks] == refs
        assert set(pool.free) == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
        assert pool.blocks[0].ref_cnt == 0 and 0 not in pool.free

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        run_to_end(self.sched, self.runner)
        self.done += [r for r in self.live.values()]
        for r in self.done:
            p = r.params
            want = generate_alone(r.prompt_ids, p.max_tokens, VOCAB, EOS, self.sched.max_len, p.temperature, p.seed,
                                  self.runner.split_paths)
            assert (r.output_ids, r.finish_reason) == want, f"request {r.request_id}"
            # prompt logprobs: every prompt position scored once its prompt is done, whatever the chunks,
            # preemptions and prefix hits (which a scoring request must not take: a cached position has no logits)
            assert r.prompt_logprobs == (prompt_scores(r.prompt_ids) if p.prompt_logprobs is not None else []), \
                f"request {r.request_id}"
        assert self.sched.kv.pool.num_free == self.initial_free
        assert not self.sched.kv.tables


SchedulerMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None,
                                              suppress_health_check=list(HealthCheck))
test_scheduler_state_machine = SchedulerMachine.TestCase


@pytest.mark.parametrize("block", [2, 3, 8])
def test_decode_blocks_give_the_same_answers_and_stop_mid_block(block):
    """Requests of different lengths (some end inside a block: max_tokens, EOS) decoded in blocks: the same ids and
    finish reasons as alone, every block freed, and blocks really ran."""
    runner = FakeRunner(num_blocks=40, block_size=4, max_model_len=60, vocab=VOCAB)
    sched = Scheduler(40, 4, 60, eos_ids=EOS, max_num_batched_tokens=16, max_num_seqs=4)
    reqs = [Request(i, [1 + i, 2, 3 + i] * (i + 1), SamplingParams(max_tokens=3 + 5 * i, temperature=0.9 * (i % 2),
                                                                    seed=i)) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    free0 = sched.kv.pool.num_free
    run_to_end(sched, runner, block=block)
    assert runner.blocks > 0
    for r in reqs:
        want = generate_alone(r.prompt_ids, r.params.max_tokens, VOCAB, EOS, 60, r.params.temperature, r.params.seed)
        assert (r.output_ids, r.finish_reason) == want, r.request_id
    assert sched.kv.pool.num_free == free0 and not sched.kv.tables


def test_no_block_while_a_request_waits():
    sched = Scheduler(40, 4, 60, eos_ids=EOS, max_num_batched_tokens=16, max_num_seqs=1)
    runner = FakeRunner(40, 4, 60, vocab=VOCAB)
    a, b = Request(1, [1, 2, 3], SamplingParams(max_tokens=20)), Request(2, [4, 5], SamplingParams(max_tokens=20))
    sched.add_request(a)
    sched.update(batch := sched.schedule(8), runner.execute_sync(batch))  # a's prefill
    sched.add_request(b)  # waits: max_num_seqs=1
    assert sched.schedule(8).steps == 1
