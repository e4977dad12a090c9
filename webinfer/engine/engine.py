"""The async engine: one background asyncio task steps the scheduler and awaits the runner, while any number of
`generate()` calls stream their own outputs. Pure Python + asyncio, so it runs in Pyodide too.

    engine = AsyncEngine(runner, eos_ids=[2])
    async for out in engine.generate(prompt_ids, SamplingParams(max_tokens=32)):
        print(out.token_ids)

The engine speaks token ids. A caller that wants text passes a TextStream (stopping.py) with the request: the
engine pushes each new id through it right after the step, so a stop string ends the request before the next
step is scheduled, and the outputs carry the text deltas.

Requests join and leave at step boundaries. A consumer that stops iterating (or whose task is cancelled) aborts
its request: its blocks are freed before the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator

from webinfer.engine.batch import ModelRunner
from webinfer.engine.scheduler import Request, Scheduler
from webinfer.engine.speculative import ProposalBudget
from webinfer.engine.stopping import FINISH_ABORT, FINISH_STOP, SamplingParams, TextStream
from webinfer.errors import WebinferError


class EngineStepError(WebinferError):
    """The model runner failed during a step; the requests in that step were aborted."""


@dataclass
class RequestOutput:
    request_id: int
    token_ids: list[int]           # ids produced since the previous output (EOS included when it ends the request)
    text: str                      # text delta ("" without a TextStream; stop strings and EOS never appear)
    finish_reason: str | None      # None while running, then "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_output_tokens: int         # total so far
    num_cached_tokens: int         # prompt tokens found in the prefix cache
    ttft_s: float | None           # arrival -> first token
    decode_s: float = 0.0          # first token -> this output's token (TPOT = decode_s / (num_output_tokens - 1))
    num_proposed: int = 0          # speculative proposals verified so far
    num_accepted: int = 0          # ... and accepted
    logprobs: list | None = None   # params.logprobs set: per token of token_ids, (logprob, [(id, logprob), ...],
                                   # rank in the vocabulary)
    prompt_logprobs: list | None = None  # params.prompt_logprobs set, on the first output only: per prompt token
                                         # after the first, (logprob, [(id, logprob), ...], rank) as logprobs

    @property
    def time_per_output_token_s(self) -> float | None:
        return self.decode_s / (self.num_output_tokens - 1) if self.num_output_tokens > 1 else None


class _Stream:
    def __init__(self, req: Request, text: TextStream | None, t0: float):
        self.req, self.text, self.t0 = req, text, t0
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t_first: float | None = None
        self.done = False


class AsyncEngine:
    def __init__(self, runner: ModelRunner, eos_ids=(), max_num_batched_tokens: int = 256, max_num_seqs: int = 16,
                 enable_prefix_caching: bool = True, clock=time.perf_counter, proposer=None, decode_block: int = 1,
                 decode_block_ms: float = 0.0, adaptive_proposals: bool = True):
        """proposer: speculative decoding's proposer (speculative.PromptLookup) for requests whose
        params.speculative_tokens > 0; their proposals use the runner's rows the running requests leave free.
        adaptive_proposals: verify only as many proposals as pay for their rows on this device, from measured step
        times and each request's acceptance rate (speculative.ProposalBudget); off: verify all proposed.
        decode_block: when every running request is decoding (none waiting, verifying proposals or constrained),
        run up to this many decode steps as one block on the runner (sampled ids stay on the GPU between them; one
        read-back per block; Scheduler.SPEC_BLOCK at most while a request speculates). Capped by the runner's
        max_steps; the tokens are the same as one step at a time.
        decode_block_ms > 0: also cap a block at about this much time, from the measured time of a decode step. A
        block saves the fixed cost of each step's read-back, which matters when steps are short (a real GPU); when a
        step is long (a software GPU), a block only delays streaming and Stop, so it shrinks to one step."""
        self.runner = runner
        self.decode_block = max(1, min(decode_block, getattr(runner, "max_steps", 1)))
        self.decode_block_ms = decode_block_ms
        self._step_s: float | None = None  # moving average of a decode step's wall time (decode-only steps)
        self.eos_ids = frozenset(eos_ids)
        self.proposer = proposer
        self.budget = ProposalBudget() if proposer is not None and adaptive_proposals else None
        self.scheduler = Scheduler(runner.num_blocks, runner.block_size, runner.max_model_len, self.eos_ids,
                                   max_num_batched_tokens, max_num_seqs, enable_prefix_caching,
                                   max_num_chunks=getattr(runner, "max_seqs", None),
                                   rows_match_chunks=getattr(runner, "rows_match_chunks", False))
        self.clock = clock
        self._ids = itertools.count(1)
        self._streams: dict[int, _Stream] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.blocks = 0                # decode blocks run (each batch.steps steps)
        self.between_s = 0.0           # host time from a step's result to the next step's start (idle not counted)
        self._step_end: float | None = None
        self.proposer_errors = 0       # proposer failures (the step went on without proposals)
        self.tokens_generated = 0
        self.requests_aborted = 0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps, for tokens/s
        self.dead: BaseException | None = None  # what stopped the loop for good (health checks report it)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_len

    # ---- requests

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                       text: TextStream | None = None, matcher=None) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request. Raises ContextOverflowError at once if the prompt can never fit.
        text: turns the ids into text deltas and ends the request at a stop string.
        matcher: a grammar.GrammarMatcher: each step samples only tokens it allows; the request stops when the
        grammar is complete."""
        params = params or SamplingParams()
        if self.dead is not None:
            raise EngineStepError(f"the engine stopped: {type(self.dead).__name__}: {self.dead}")
        req = Request(next(self._ids), list(prompt_ids), params, matcher=matcher)
        self.scheduler.add_request(req)
        st = _Stream(req, text, self.clock())
        self._streams[req.request_id] = st
        self._start()
        try:
            while True:
                item = await st.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not st.done:  # the consumer left early or was cancelled
                self.abort(req.request_id)

    def abort(self, request_id: int) -> None:
        st = self._streams.pop(request_id, None)
        if st is not None:
            st.done = True
            self.requests_aborted += 1
        self.scheduler.finish_request(request_id, FINISH_ABORT)
        self._forget(request_id)

    # ---- the loop

    def _forget(self, request_id: int) -> None:
        """Drop what the proposer and the proposal budget keep for a request that ended (any way it ends)."""
        if self.proposer is not None:
            self.proposer.forget(request_id)
        if self.budget is not None:
            self.budget.forget(request_id)

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    async def close(self) -> None:
        for rid in list(self._streams):
            st = self._streams[rid]
            self.abort(rid)
            st.queue.put_nowait(EngineStepError("the engine was closed"))
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def _fail(self, request_ids, e: BaseException, what: str) -> None:
        for rid in request_ids:
            self.scheduler.finish_request(rid, FINISH_ABORT)
            self._forget(rid)
            st = self._streams.pop(rid, None)
            if st is not None:
                st.done = True
                st.queue.put_nowait(EngineStepError(f"{what}: {type(e).__name__}: {e}"))

    async def _loop(self) -> None:
        try:
            await self._steps()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a bug outside any one request: say so to everyone waiting, and to /health
            self.dead = e
            self._fail(list(self._streams), e, "the engine stopped")
            raise

    async def _steps(self) -> None:
        while True:
            if not self.scheduler.has_work():
                self._step_end = None  # waiting for work is not host time between steps
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.proposer is not None:
                await self._propose()
            batch = self.scheduler.schedule(self._block_steps())
            if not batch.chunks:
                await asyncio.sleep(0)
                continue
            t0 = self.clock()
            if self._step_end is not None:
                self.between_s += t0 - self._step_end
            try:
                sampled = await self.runner.execute(batch)
            except asyncio.CancelledError:
                self.scheduler.step_failed()
                raise
            except Exception as e:  # one failing step must not kill the engine: fail only its requests
                self._fail(self.scheduler.step_failed(), e, "the model failed in a step")
                self._step_end = None
                continue
            self.steps += batch.steps
            self.blocks += batch.steps > 1
            now = self._step_end = self.clock()
            if all(len(c.token_ids) == 1 for c in batch.chunks):
                dt = (now - t0) / batch.steps
                self._step_s = dt if self._step_s is None else 0.8 * self._step_s + 0.2 * dt
                if self.budget is not None:
                    self.budget.observe_step(len(batch.chunks), dt)
            vocab = getattr(self.runner, "vocab_size", 0)
            rows = [c for c in batch.chunks if c.sample] * batch.steps
            bad = sorted({c.seq_id for c, t in zip(rows, sampled) if vocab and not 0 <= t < vocab})
            if bad:  # a runner bug must not reach the text: fail those requests, keep the others
                self._fail(bad, ValueError(f"the runner sampled a token id outside the vocabulary of {vocab}"),
                           "the model failed in a step")
            try:
                outs = self.scheduler.update(batch, sampled)
            except Exception as e:  # the runner's output does not fit the batch: fail this step's requests only
                self._fail([c.seq_id for c in batch.chunks], e, "the step's output could not be used")
                continue
            self._emit(outs, now)
            self._recent.append((now, len(sampled)))
            while self._recent and now - self._recent[0][0] > 10.0:
                self._recent.popleft()
            await asyncio.sleep(0)  # let consumers and new arrivals in between steps

    def _block_steps(self) -> int:
        """The decode block to ask for: decode_block, capped by the time budget once a step's time is known."""
        if self.decode_block_ms <= 0 or self.decode_block == 1:
            return self.decode_block
        if self._step_s is None:
            return 1  # measure a plain decode step first
        return max(1, min(self.decode_block, int(self.decode_block_ms / 1e3 / max(self._step_s, 1e-6))))

    async def _propose(self) -> None:
        """Give each decoding request that asked for it this step's speculative proposals (a proposer with
        propose_batch, e.g. a draft model, is asked once for all of them)."""
        wants = [(r, r.params.speculative_tokens) for r in self.scheduler.running
                 if r.params.speculative_tokens and r.num_tokens - r.num_computed_tokens == 1
                 and r.matcher is None and not r.params.penalized]
        if not wants:
            return
        if self.budget is not None:
            rows = sum(r.num_tokens - r.num_computed_tokens == 1 for r in self.scheduler.running)
            ks = self.budget.lengths(wants, rows)
            for r, _ in wants:
                r.proposal = []
            wants = [(r, k) for (r, _), k in zip(wants, ks) if k > 0]
            if not wants:
                return
        if hasattr(self.proposer, "propose_batch"):
            try:
                got = await self.proposer.propose_batch(wants)
            except Exception:  # a failing draft must not fail the target's requests: decode without proposals
                self.proposer_errors += 1
                return
            for r, k in wants:
                r.proposal = got.get(r.request_id, [])[:k]
        else:
            for r, k in wants:
                r.proposal = self.proposer.propose(r, k)

    def _emit(self, outs, now: float) -> None:
        for o in outs:
            try:
                self._emit_one(o, now)
            except Exception as e:  # e.g. a sampled id outside the vocabulary: only this request fails
                self._fail([o.request.request_id], e, "its output could not be decoded")

    def _emit_one(self, o, now: float) -> None:
        st = self._streams.get(o.request.request_id)
        if st is None or not o.new_tokens:
            return
        first = st.t_first is None
        if first:
            st.t_first = now
        reason = o.finish_reason
        toks, delta, dropped, lps = o.new_tokens, "", 0, o.logprobs
        if st.text is not None:
            # one token at a time, so that a stop string ends the output at the token that completed it,
            # also when one step produced several tokens (accepted proposals)
            for j, t in enumerate(toks):
                d, stopped = st.text.push([t], final=reason is not None and j == len(toks) - 1)
                delta += d
                if stopped:
                    dropped, toks = len(toks) - j - 1, toks[:j + 1]
                    lps = lps[:j + 1] if lps is not None else None
                    if reason is None or dropped:
                        reason = FINISH_STOP
                        self.scheduler.finish_request(st.req.request_id, FINISH_STOP)
                    break
        self.tokens_generated += len(toks)
        if reason is not None:
            st.done = True
            del self._streams[st.req.request_id]
            self._forget(st.req.request_id)
        r = st.req
        st.queue.put_nowait(RequestOutput(
            r.request_id, toks, delta, reason, len(r.prompt_ids), len(r.output_ids) - dropped,
            max(r.num_cached_tokens, 0), st.t_first - st.t0, now - st.t_first, r.num_proposed, r.num_accepted, lps,
            list(r.prompt_logprobs) if first and r.params.prompt_logprobs is not None else None))

    def stats(self) -> dict:
        s = self.scheduler.stats()
        now = self.clock()
        recent = [(t, n) for t, n in self._recent if now - t <= 10.0]
        span = (now - recent[0][0]) if len(recent) > 1 else 0.0
        s.update(steps=self.steps, decode_blocks=self.blocks, tokens_generated=self.tokens_generated,
                 requests_aborted=self.requests_aborted,
                 tokens_per_s=(sum(n for _, n in recent[1:]) / span) if span > 0 else 0.0)
        return s
