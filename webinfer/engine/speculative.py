"""Proposers for speculative decoding (the scheduler verifies their proposals; see scheduler.py).

Prompt lookup: the next tokens are guessed by finding the request's trailing n-gram earlier in its own prompt and
output and proposing what followed it there. No second model; strong where the answer quotes its context
(summaries, edits of code or text, RAG answers), useless in open chat, where the engine's ProposalBudget stops
verifying proposals that are not accepted.

Cost per step: O(k) to propose and O(new tokens x max_ngram) to index, because each request keeps a map from
every n-gram (n <= max_ngram) to the position after its latest earlier occurrence, extended as tokens arrive.
Pure Python (runs in Pyodide).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class _State:
    follows: dict[tuple, int] = field(default_factory=dict)  # n-gram -> position just after its latest occurrence
    indexed: int = 0        # n-grams ending before this position are in `follows`


class PromptLookup:
    """propose(request, k) -> up to k token ids (possibly none) for the request's next positions: what followed the
    latest earlier occurrence of the request's longest trailing n-gram, max_ngram >= n >= min_ngram.

    min_ngram = 2: a single shared token (a space, a comma) predicts little; on SmolLM2's code-editing prompt
    requiring a bigram proposed 68 tokens (33 accepted) where unigrams proposed 117 (36 accepted). How many
    proposals a step verifies is the engine's choice (ProposalBudget), from each request's acceptance and what rows
    cost on the device, so the proposer itself does not back off."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._states: dict[int, _State] = {}

    def forget(self, request_id: int) -> None:
        self._states.pop(request_id, None)

    def _index(self, st: _State, toks: list[int]) -> None:
        # n-grams that end at positions [st.indexed, len - 1): the last token's own n-grams are not indexed yet,
        # so a lookup of the trailing n-gram finds an earlier occurrence, never itself
        for end in range(st.indexed, len(toks) - 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    st.follows[tuple(toks[end + 1 - n:end + 1])] = end + 1
        st.indexed = max(st.indexed, len(toks) - 1)

    def propose(self, req, k_max: int) -> list[int]:
        st = self._states.setdefault(req.request_id, _State())
        toks = req.all_token_ids
        self._index(st, toks)
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            at = st.follows.get(tuple(toks[len(toks) - n:]))
            if at is not None:
                return toks[at:at + k_max]
        return []


class ProposalBudget:
    """How many proposals each speculating request should verify this step: the adaptive choice of proposal length
    from what this device charges for verification rows.

    Verifying k proposals adds k decode rows to a step. On a real GPU a decode step reads the weights once for all
    its rows, so rows are nearly free and every plausible proposal pays; on a compute-bound device they are not: a
    5-row step of SmolLM2 took 2.1-2.8x a 1-row step on lavapipe, so a proposal pays
    only when it is likely to be accepted, and in open chat the proposals that prompt lookup still makes cost more
    than they save. So the engine records a decode step's wall time by its number of rows (`observe_step`: a row
    count's price is the median of its last WINDOW steps, its first WARMUP steps not counted) and, per request, an
    acceptance rate a (accepted proposals over tried positions, the evidence halved at each look, prior
    1/2); `lengths` picks each k that maximises the step's expected tokens per second,
        (tokens the step yields so far + a + a^2 + ... + a^k) / t(rows so far + k),
    requests in turn. A step of an unmeasured number of decoding requests runs without proposals (its base price);
    an unmeasured larger row count costs what the nearest measured count below it costs (optimistic: a length is
    tried, then priced). A request cut to 0 drifts back to the prior while it waits (about 30 steps before it tries
    again at a 1.4x row cost: ~1 % of the time), so a passage it starts quoting later is still found.
    Why the first step of a row count is not a price: it pays one-off work, on the GPU the pipelines of that row
    count's kernels compiled on first use (SmolLM2 on lavapipe: a first 5-row step 449 ms, then 102 ms, against
    53 ms for one row); priced as it came, it made rows look 10x dearer than one, no request proposed again and
    prompt lookup was off for the rest of the run. Why a median: one slow step (a pause, another process) moves a
    moving average for good once it keeps a row count from being tried. Pure Python."""

    PRIOR = (1.0, 2.0)  # (accepted, tried): a = 1/2 before any evidence
    WARMUP = 1          # steps of each row count not priced
    WINDOW = 5          # steps of each row count whose median is its price

    def __init__(self, decay: float = 0.5, drift: float = 0.95):
        self.decay, self.drift = decay, drift
        self.row_s: dict[int, float] = {}  # rows -> a decode step's wall time (the median of the last WINDOW)
        self._seen: dict[int, int] = {}    # rows -> steps observed (the first WARMUP not priced)
        self._steps: dict[int, deque] = {}  # rows -> the last WINDOW priced steps' seconds
        self._acc: dict[int, list] = {}    # request id -> [accepted, tried, proposed seen, accepted seen]

    def forget(self, request_id: int) -> None:
        self._acc.pop(request_id, None)

    def observe_step(self, rows: int, seconds: float) -> None:
        self._seen[rows] = seen = self._seen.get(rows, 0) + 1
        if seen <= self.WARMUP:
            return
        last = self._steps.setdefault(rows, deque(maxlen=self.WINDOW))
        last.append(seconds)
        self.row_s[rows] = statistics.median(last)

    def cost(self, rows: int) -> float | None:
        """Estimated wall time of a decode step of `rows` rows; None before any step was measured."""
        if rows in self.row_s:
            return self.row_s[rows]
        below = [r for r in self.row_s if r < rows]
        above = [r for r in self.row_s if r > rows]
        if below and above:
            lo, hi = max(below), min(above)
            return self.row_s[lo] + (self.row_s[hi] - self.row_s[lo]) * (rows - lo) / (hi - lo)
        if below:
            return self.row_s[max(below)]
        return self.row_s[min(above)] if above else None

    def rate(self, req) -> float:
        """The request's acceptance rate per proposed position, updated from its counters since the last look."""
        st = self._acc.setdefault(req.request_id, [*self.PRIOR, req.num_proposed, req.num_accepted])
        proposed, accepted = req.num_proposed - st[2], req.num_accepted - st[3]
        st[2], st[3] = req.num_proposed, req.num_accepted
        if proposed:  # positions tried: the accepted ones and the first rejected one, if any
            st[0] = self.decay * st[0] + accepted
            st[1] = self.decay * st[1] + accepted + (accepted < proposed)
        else:  # not verified since: drift back towards the prior
            st[0] = self.PRIOR[0] + self.drift * (st[0] - self.PRIOR[0])
            st[1] = self.PRIOR[1] + self.drift * (st[1] - self.PRIOR[1])
        return st[0] / st[1]

    def lengths(self, wants: list, rows: int) -> list[int]:
        """wants: [(request, k_max)]; rows: the step's one-token rows before any proposal (its decoding requests).
        The number of proposals worth verifying for each request, in order."""
        out, tokens = [], float(rows)
        for req, k_max in wants:
            a = self.rate(req)
            if rows not in self.row_s:  # measure a step without proposals first: the price of the rows added
                out.append(0)
                continue
            best_k, best, best_gain, gain = 0, tokens / self.cost(rows), 0.0, 0.0
            for k in range(1, k_max + 1):
                gain += a ** k
                r = (tokens + gain) / self.cost(rows + k)
                if r > best:
                    best_k, best, best_gain = k, r, gain
            out.append(best_k)
            tokens += best_gain
            rows += best_k
        return out


class DraftModel:
    """Proposals from a second, smaller model with the same tokenizer, run on its own runner (the same device as
    the target in practice) with its own paged KV cache.

    Per step, for the requests that want proposals, two batched draft runs: a catch-up chunk per request (the
    tokens the draft has no KV for: the prompt at first, then the target's accepted tokens; its greedy sample is
    proposal 1), then a decode block of k - 1 greedy steps (proposals 2..k, one read-back). The draft remembers
    which tokens its KV holds; after verification its KV is valid up to the longest common prefix with the
    request's tokens, so rejected proposals are simply recomputed over. A request the draft cannot hold (its
    pool is full, or it is longer than the draft's context) gets no proposals: the target decodes it as usual.
    Greedy draft proposals are verified by the target's own sampling (scheduler.py), so the output is the target's
    exactly, whatever the draft proposes."""

    def __init__(self, runner, max_batch_tokens: int | None = None):
        from webinfer.engine.kv_cache import KVCacheManager

        self.runner = runner
        self.kv = KVCacheManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.max_tokens = max_batch_tokens or getattr(runner, "max_tokens", 256)
        self.max_rows = getattr(runner, "max_seqs", 16)
        self.fed: dict[int, list[int]] = {}   # request id -> the tokens whose KV the draft holds, in order
        self.steps = 0

    def forget(self, request_id: int) -> None:
        self.fed.pop(request_id, None)
        self.kv.free(request_id)

    async def propose_batch(self, wants: list) -> dict[int, list[int]]:
        """wants: [(request, k)] -> {request id: up to k proposed ids}."""
        jobs = []  # (request id, tokens, start, k)
        budget = self.max_tokens
        wants = wants[: self.max_rows]
        # one decode block serves every request: each needs KV room (and context) for the longest proposal
        k_max = min(max((k for _, k in wants), default=0), getattr(self.runner, "max_steps", 1) + 1)
        for req, k in wants:
            toks, rid = req.all_token_ids, req.request_id
            fed = self.fed.get(rid, [])
            common = 0
            for a, b in zip(fed, toks):
                if a != b:
                    break
                common += 1
            common = min(common, len(toks) - 1)  # feed at least the last token: its logits give proposal 1
            if (len(toks) + k_max - 1 > self.runner.max_model_len or len(toks) - common > budget
                    or not self.kv.allocate(rid, len(toks) + k_max - 1)):
                continue
            k = min(k, k_max)
            budget -= len(toks) - common
            self.fed[rid] = toks[:common]
            jobs.append((rid, toks, common, k))
        if not jobs:
            return {}
        try:
            return await self._run(jobs)
        except BaseException:  # the draft's KV is unknown after a failed step: start those requests afresh
            for rid, *_ in jobs:
                self.forget(rid)
            raise

    async def _run(self, jobs) -> dict[int, list[int]]:
        from webinfer.engine.batch import SeqChunk, StepBatch

        catch_up = StepBatch([SeqChunk(rid, toks[start:], start, list(self.kv.block_table(rid)), True)
                              for rid, toks, start, _ in jobs])
        first = list(await self.runner.execute(catch_up))
        self.steps += 1
        out = {rid: [t] for (rid, *_), t in zip(jobs, first)}
        for rid, toks, _, _ in jobs:
            self.fed[rid] = list(toks)
        steps = max(k for *_, k in jobs) - 1
        if steps > 0:
            block = StepBatch([SeqChunk(rid, [out[rid][0]], len(toks), list(self.kv.block_table(rid)), True)
                               for rid, toks, _, _ in jobs], steps=steps)
            ids = list(await self.runner.execute(block))
            self.steps += steps
            n = len(jobs)
            for i, (rid, toks, _, k) in enumerate(jobs):
                more = ids[i::n]
                self.fed[rid] = list(toks) + [out[rid][0]] + more[:-1]  # the block fed p1 .. p_{steps}
                out[rid] = (out[rid] + more)[:k]
        return out
