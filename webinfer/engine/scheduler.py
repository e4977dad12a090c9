"""Continuous batching over a paged KV cache. Plain data in, plain data out; no GPU, no asyncio.

One invariant drives everything (as in vLLM v1): a request has `all_token_ids` (prompt + generated) and
`num_computed_tokens`, the prefix whose KV is in the cache. Each step the scheduler hands each request a chunk
that moves num_computed_tokens towards len(all_token_ids): a whole or partial prefill, or the one last sampled
token when decoding. When a chunk reaches the end of the known tokens the runner samples a new token.

A step holds every running request's next chunk (oldest first), then admits waiting requests, while the token
budget (`max_num_batched_tokens`) and `max_num_seqs` allow. When the pool runs dry, the most recently admitted
running request is preempted: its blocks are freed and it goes back to the front of the queue with
num_computed_tokens = 0; it later recomputes prompt + generated tokens (often from the prefix cache) and
continues exactly where it was, because sampling depends only on (history, seed, sample_index) and every
position's KV is recomputed down the path that first wrote it (below).

Speculative decoding rides on the same invariant. A decoding request may carry proposed next tokens
(`Request.proposal`, set before schedule() by a proposer such as prompt lookup). The step then feeds the last
token and k proposals as k + 1 one-token chunks (decode rows: the GEMV path, so each row's bits equal an
unspeculated step's) and samples after each. update() accepts the sampled tokens while each equals the proposal it
verifies, plus the first one that does not (the model's own token): exactly the tokens the request would have
produced one step at a time, greedy or sampled, because a draw depends only on (history, seed, sample_index).
num_computed_tokens advances past the accepted tokens only; the KV slots of rejected proposals lie beyond it and
are overwritten when those positions are computed again.

Every position's KV is written down one path, whatever the budget, the other requests or the cache hold: a prompt
in multi-token chunks, a generated token as a one-token row. The GPU model takes one-token chunks down its decode
path (the GEMV with the RMSNorm folded in, the split-K attention with RoPE fused), whose arithmetic differs from
the prefill path's in the last bits, while multi-token chunks give each row the same bits however the prompt is
cut (tests/gpu/test_chunk_invariance.py). So:
- a prompt is never fed one token at a time unless it is one token long: the scheduler shortens a chunk that would
  leave one token for later, skips a running prompt for a step rather than feed it one token, and takes
  prefix-cache hits that leave at least two prompt tokens to compute;
- a request recomputed after a preemption feeds its prompt in chunks and its generated tokens as one-token rows
  (several a step, as verification rows are), not in the prompt's chunks;
- a prefix-cache key counts the block's slots the decode path wrote (kv_cache.py), so a prompt that repeats a
  chat's earlier answer computes it as a prompt rather than reuse the answer's decoded KV.
A request's result then does not depend on the token budget, the other requests, preemptions or the prefix cache.
A runner whose rows have the same bits either way (`rows_match_chunks`: the CPU engine) skips the last two. Not
covered: a budget too small for the first (max_num_batched_tokens < max_num_seqs + 2: a prompt may then go a token
at a time).

Prompt logprobs (params.prompt_logprobs: a completions request with echo) ride on the prompt's chunks: each chunk
asks the runner to score its rows whose next token is a prompt token (SeqChunk.score_ids), and update() keeps the
results by position in `Request.prompt_logprobs`. Until they are complete the request takes no prefix-cache hit
(a cached position has no logits); a preemption before then scores its prompt again from the start (the same
bits: a prompt's rows do not depend on its chunks).

A decode block (schedule(max_steps=K)) is the same rule run K times on the GPU without the host in between: when
every running request is decoding, none waits, and none speculates or is constrained, each gets KV room for K more
tokens and the runner feeds each step's sampled ids to the next step itself. update() then takes the K tokens of
each request one by one as K plain steps would, up to a stop; the tokens a finished request sampled after its stop
are dropped and its blocks freed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.engine.kv_cache import KVCacheManager
from webinfer.engine.stopping import FINISH_ABORT, FINISH_STOP, SamplingParams, token_stop_reason
from webinfer.errors import ContextOverflowError

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1   # prefix-cache hit of the first admission (-1: not admitted yet)
    status: str = WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    proposal: list[int] = field(default_factory=list)   # speculative next tokens for the coming step only
    matcher: object = None        # structured output: a grammar.GrammarMatcher over this request's output
    num_proposed: int = 0         # proposals verified so far
    num_accepted: int = 0         # ... and accepted
    # params.prompt_logprobs: entry i is prompt token i + 1's (logprob, top, rank) under the logits of position i
    prompt_logprobs: list = field(default_factory=list, repr=False)
    # prompt + output, kept up to date by add_output(): the scheduler reads it every step, so it is not rebuilt
    all_token_ids: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.all_token_ids = self.prompt_ids + self.output_ids

    def add_output(self, tok: int) -> None:
        self.output_ids.append(tok)
        self.all_token_ids.append(tok)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def scoring(self) -> bool:
        """Whether the prompt's chunks still have prompt logprobs to compute."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1


@dataclass
class StepOutput:
    """What one step did to one request: the tokens it produced ([] for a prefill chunk that did not sample; more
    than one when proposals were accepted or a decode block ran), and their logprobs when the request asked."""
    request: Request
    new_tokens: list[int]
    finish_reason: str | None
    logprobs: list | None = None


class Scheduler:
    SPEC_BLOCK = 8  # decode steps a block may take while a running request speculates (see _block_steps)

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, eos_ids=(),
                 max_num_batched_tokens: int = 256, max_num_seqs: int = 16, enable_prefix_caching: bool = True,
                 max_num_chunks: int | None = None, rows_match_chunks: bool = False):
        """max_num_chunks: chunks one step may hold (the runner's rows of sequences; default max_num_seqs):
        proposals only use what the running requests leave of it.
        rows_match_chunks: the runner gives a token the same bits fed as a one-token chunk (its decode path) as
        inside a multi-token chunk (its prefill path): the CPU engine does, the GPU model does not. Where it does
        not, a recomputed request's generated tokens go as one-token rows and prefix-cache keys tell decoded slots
        apart (module docstring)."""
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        # a request can never hold more than the whole pool, so that is a context limit too
        self.max_len = min(max_model_len, self.kv.capacity_tokens)
        self.max_model_len = max_model_len
        self.eos_ids = frozenset(eos_ids)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_chunks = max(max_num_chunks or max_num_seqs, max_num_seqs)
        # a prompt is never cut into a one-token chunk (module docstring) where the budget always leaves it three
        # tokens beside every other running request's one: two would stall a three-token prompt for good
        self.whole_prompt_rows = max_num_batched_tokens >= max_num_seqs + 2
        self.rows_match_chunks = rows_match_chunks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # in admission order; preemption takes from the end
        self.requests: dict[int, Request] = {}
        # (request, tokens computed, proposals verified, fed as one-token rows)
        self._scheduled: list[tuple[Request, int, int, bool]] = []
        self.num_preemptions = 0

    # ---- requests in and out

    def check_prompt(self, n: int) -> None:
        """Raise ContextOverflowError (naming both lengths) if an n-token prompt could never run."""
        if n == 0:
            raise ValueError("the prompt is empty: at least one token is needed")
        if n + 1 > self.max_model_len:
            raise ContextOverflowError(n, self.max_model_len - 1, "context length (minus one token to generate)")
        if n + 1 > self.max_len:
            raise ContextOverflowError(n, self.max_len - 1, "KV cache capacity (minus one token to generate)")

    def add_request(self, req: Request) -> None:
        self.check_prompt(len(req.prompt_ids))
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id} is already in use")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish_request(self, request_id: int, reason: str = FINISH_ABORT) -> None:
        """Abort or finish (e.g. a stop string matched) at any time: the blocks are freed at once.
        Safe to call for unknown or already finished ids."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if req.status == RUNNING:
            self.running.remove(req)
        elif req.status == WAITING:
            self.waiting.remove(req)
        self.kv.free(request_id)
        req.status, req.finish_reason = FINISHED, reason

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step

    def _preempt_last(self) -> Request:
        victim = self.running.pop()
        self.kv.free(victim.request_id)
        victim.num_computed_tokens = 0
        victim.status = WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _chunks(self, req: Request, n: int, k: int, rows: bool) -> list[SeqChunk]:
        """The request's chunk of n tokens for this step; or its n tokens as one-token rows and then k proposals,
        the row at position p sampling output p + 1 - len(prompt) (the last known token's row, and every
        proposal's)."""
        start = req.num_computed_tokens
        p = req.params
        table = list(self.kv.block_table(req.request_id))
        bias = tuple(sorted(p.logit_bias.items()))
        ctl = dict(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed, min_p=p.min_p,
                   logit_bias=bias, logprobs=p.logprobs)
        if p.penalized:
            ctl.update(frequency_penalty=p.frequency_penalty, presence_penalty=p.presence_penalty,
                       repetition_penalty=p.repetition_penalty, history=req.all_token_ids,
                       num_prompt=len(req.prompt_ids))
        last = start + n - 1
        sample = last == req.num_tokens - 1
        mask = req.matcher.mask_words() if sample and req.matcher is not None else None
        if not rows:
            score = ()
            if req.scoring:  # the rows whose next token is a prompt token
                score = tuple(req.prompt_ids[start + 1:min(start + n, len(req.prompt_ids) - 1) + 1])
            return [SeqChunk(seq_id=req.request_id, token_ids=req.all_token_ids[start:start + n], start_pos=start,
                             block_table=table, sample=sample, sample_index=len(req.output_ids), mask=mask,
                             score_ids=score, score_top=p.prompt_logprobs or 0, **ctl)]
        fed = req.all_token_ids[start:start + n] + req.proposal[:k]
        return [SeqChunk(seq_id=req.request_id, token_ids=[t], start_pos=start + j, block_table=table,
                         sample=sample and start + j >= last, sample_index=start + j + 1 - len(req.prompt_ids),
                         mask=mask if start + j == last else None, **ctl)
                for j, t in enumerate(fed)]

    def _decode_from(self, req: Request) -> int:
        """The first position whose KV the runner's decode path writes for req: past its prompt, which goes in
        multi-token chunks (a one-token prompt is itself a one-token chunk)."""
        return len(req.prompt_ids) if len(req.prompt_ids) >= 2 else 0

    def _key_from(self, req: Request) -> int | None:
        """decode_from for the prefix cache's keys (kv_cache.py); None where the runner's paths give the same bits."""
        return None if self.rows_match_chunks else self._decode_from(req)

    def _prompt_end(self, req: Request) -> int | None:
        """Where req's tokens that go in prompt chunks (never one token at a time) end: its prompt's end, or the
        last token while nothing is generated; None for a recompute where rows match chunks (one chunk, no rule)."""
        if not req.output_ids:
            return req.num_tokens
        return None if self.rows_match_chunks else self._decode_from(req)

    def _next(self, req: Request, budget: int, computed: int, room: int) -> tuple[int, bool]:
        """Tokens of req's next feed within the token budget and `room` chunks (0: none this step), and whether
        they go as one-token rows. A decoding request feeds its last token as a row. A request recomputed after a
        preemption feeds its prompt in chunks and, where the runner's paths differ, its generated tokens as rows,
        as they were first computed (else in the same chunks)."""
        left = req.num_tokens - computed
        end = self._prompt_end(req)
        if end is not None and computed < end:
            return self._prompt_chunk(end - computed, budget), False
        if left == 1 or not self.rows_match_chunks:
            return min(left, budget, room), True
        return min(left, budget), False

    def _prompt_chunk(self, left: int, budget: int) -> int:
        """Tokens of a prompt's next chunk with `left` to go: 0 where that would feed it one token at a time."""
        n = min(left, budget)
        if not self.whole_prompt_rows or n == left:
            return n
        if left - n == 1:
            n -= 1  # leave two for the next chunk, not one
        return n if n >= 2 else 0

    def _prefix(self, req: Request) -> list[int]:
        """req's prefix-cache hit, short of leaving its prompt one token to compute (which would go down the
        decode path: _prompt_chunk)."""
        if req.scoring:
            return []  # its prompt's positions must be computed for their logits
        hit = self.kv.find_prefix(req.request_id, req.all_token_ids, self._key_from(req))
        end = self._prompt_end(req)
        if hit and self.whole_prompt_rows and end is not None and end - len(hit) * self.kv.block_size == 1:
            hit.pop()
        return hit

    def _num_proposals(self, req: Request, budget: int, room: int) -> int:
        """How many of req's proposals this step verifies: they fit the token budget, the chunk room, max_tokens
        (each accepted proposal is an output token, and one more comes after it) and the context."""
        if (not req.proposal or req.num_tokens - req.num_computed_tokens != 1 or req.matcher is not None
                or req.params.penalized):
            return 0  # a constrained or penalized request's next row depends on the accepted tokens: no speculation
        return max(0, min(len(req.proposal), budget - 1, room, req.params.max_tokens - len(req.output_ids) - 1,
                          self.max_len - req.num_tokens - 1))

    def _block_steps(self, max_steps: int) -> int:
        """How many decode steps the running requests can take as one block (< 2: none). A speculating request
        with nothing to verify this step (its proposer found nothing, or the engine's budget said proposals do not
        pay) joins a block of at most SPEC_BLOCK steps, so that it is offered proposals again soon: where it never
        has any (open chat) it still decodes in blocks, not one host round trip a token."""
        if max_steps < 2 or self.waiting or not self.running:
            return 0
        k = max_steps
        for r in self.running:
            if r.num_tokens - r.num_computed_tokens != 1 or r.proposal or r.matcher is not None:
                return 0
            if r.params.speculative_tokens:
                k = min(k, self.SPEC_BLOCK)
            # no request samples past max_tokens or feeds a position past the context
            k = min(k, r.params.max_tokens - len(r.output_ids), self.max_len - r.num_tokens)
        if k < 2 or len(self.running) > self.max_num_batched_tokens:
            return 0
        if not all(self.kv.allocate(r.request_id, r.num_computed_tokens + k) for r in self.running):
            return 0  # the pool is short: plain steps (which may preempt) instead; blocks taken stay with their owner
        return k

    def schedule(self, max_steps: int = 1) -> StepBatch:
        """The next step's batch; with max_steps > 1, a decode block of up to max_steps steps when possible."""
        assert not self._scheduled, "update() must follow every schedule()"
        k = self._block_steps(max_steps)
        if k:
            self._scheduled = [(r, 1, 0, True) for r in self.running]
            return StepBatch([c for r in self.running for c in self._chunks(r, 1, 0, True)], steps=k)
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int, int, bool]] = []
        preemptions_before = self.num_preemptions
        chunks = 0

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            room = self.max_num_chunks - chunks - (len(self.running) - i - 1)  # one chunk kept for each after it
            n, rows = self._next(req, budget, req.num_computed_tokens, room)
            if n == 0:  # a prompt's one-token chunk: it waits for the next step
                i += 1
                continue
            k = self._num_proposals(req, budget, room - 1)
            rows = rows or k > 0  # (a prompt's last token too: it and its proposals go as rows)
            while not self.kv.allocate(req.request_id, req.num_computed_tokens + n + k):
                if self._preempt_last() is req:
                    break
            if req.status != RUNNING:  # it preempted itself: everything after it is gone too
                break
            scheduled.append((req, n, k, rows))
            budget -= n + k
            chunks += (n if rows else 1) + k
            i += 1

        # after a preemption the pool is tight: admitting someone now would only preempt again next step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and chunks < self.max_num_chunks \
                and (self.num_preemptions == preemptions_before or not scheduled):
            req = self.waiting[0]
            prefix = self._prefix(req)
            computed = len(prefix) * self.kv.block_size
            n, rows = self._next(req, budget, computed, self.max_num_chunks - chunks)
            if n == 0 or not self.kv.allocate(req.request_id, computed + n, prefix):
                break  # first come, first served: wait for blocks rather than overtake
            self.waiting.popleft()
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed
                self.kv.record_prefix_lookup(len(req.prompt_ids), computed)
            req.num_computed_tokens = computed
            req.status = RUNNING
            self.running.append(req)
            scheduled.append((req, n, 0, rows))
            budget -= n
            chunks += n if rows else 1

        self._scheduled = scheduled
        batch = StepBatch([c for r, n, k, rows in scheduled for c in self._chunks(r, n, k, rows)])
        for r in self.running:
            r.proposal = []  # proposals are for one step; the proposer makes new ones from the new tokens
        return batch

    def update(self, batch: StepBatch, sampled: list[int]) -> list[StepOutput]:
        """Apply the runner's sampled ids (one per chunk with sample=True) to the requests of the last schedule()."""
        scheduled, self._scheduled = self._scheduled, []
        n_sample = sum(1 for c in batch.chunks if c.sample) * batch.steps
        if len(sampled) != n_sample:
            raise ValueError(f"the runner returned {len(sampled)} token ids for {n_sample} sampling chunks")
        lps = getattr(sampled, "logprobs", None) or [None] * len(sampled)
        scores = getattr(sampled, "scores", None) or [None] * len(batch.chunks)
        if len(scores) != len(batch.chunks):
            raise ValueError(f"the runner returned scores for {len(scores)} chunks of {len(batch.chunks)}")
        for c, sc in zip(batch.chunks, scores):
            if len(sc or ()) != len(c.score_ids):
                raise ValueError(f"the runner returned {len(sc or ())} scores for {len(c.score_ids)} score ids")
        if batch.steps > 1:  # a block: request i's tokens are sampled[i], sampled[i + n], ...
            n = len(batch.chunks)
            per_req = [(list(sampled[i::n]), lps[i::n]) for i in range(n)]
        chunks, ids = iter(zip(batch.chunks, scores)), iter(zip(sampled, lps))
        outs = []
        for i, (req, n, k, rows) in enumerate(scheduled):
            fed_scores = [next(chunks) for _ in range((n if rows else 1) + k)]
            fed = [c for c, _ in fed_scores]
            if batch.steps > 1:
                got, got_lp = per_req[i]
            else:
                pairs = [next(ids) for c in fed if c.sample]
                got, got_lp = [t for t, _ in pairs], [lp for _, lp in pairs]
            if req.status != RUNNING:  # aborted while the step ran
                continue
            for c, sc in fed_scores:
                if sc:  # by position: a prompt scored again after a preemption overwrites its own values
                    req.prompt_logprobs[c.start_pos:c.start_pos + len(sc)] = sc
            new: list[int] = []
            reason = None
            for j, tok in enumerate(got):
                new.append(tok)
                req.add_output(tok)
                reason = token_stop_reason(tok, len(req.output_ids), req.num_tokens, req.params, self.eos_ids, self.max_len)
                if req.matcher is not None and reason is None:
                    if not req.matcher.accept(tok):  # the runner ignored the mask (a bug): end, do not emit junk
                        reason = FINISH_ABORT
                    elif req.matcher.is_terminated():
                        reason = FINISH_STOP  # the grammar is complete: nothing more may follow
                if reason is not None or (batch.steps == 1 and (j == k or tok != fed[j + 1].token_ids[0])):
                    break
            req.num_proposed += k
            req.num_accepted += len(new) - 1 if k else 0
            # computed: the fed tokens whose KV is now valid (the last one fed, every accepted proposal, each kept
            # token of a block)
            req.num_computed_tokens += len(new) if k or batch.steps > 1 else n
            self.kv.cache_computed(req.request_id, req.all_token_ids, req.num_computed_tokens, self._key_from(req))
            if reason is not None:
                self.finish_request(req.request_id, reason)
            outs.append(StepOutput(req, new, reason, got_lp[:len(new)] if req.params.logprobs is not None else None))
        return outs

    def step_failed(self) -> list[int]:
        """The runner raised during the last scheduled step: its KV is unknown, so its requests are finished
        (abort) and their blocks freed. Returns their ids."""
        scheduled, self._scheduled = self._scheduled, []
        ids = [r.request_id for r, *_ in scheduled]
        for rid in ids:
            self.finish_request(rid, FINISH_ABORT)
        return ids

    def stats(self) -> dict:
        s = self.kv.stats()
        s.update(waiting=len(self.waiting), running=len(self.running), preemptions=self.num_preemptions)
        return s
