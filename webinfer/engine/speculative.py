"""Proposers for speculative decoding (the scheduler verifies their proposals; see scheduler.py).

Prompt lookup: the next tokens are guessed by finding the request's trailing n-gram earlier in its own prompt and
output and proposing what followed it there. No second model; strong where the answer quotes its context
(summaries, edits of code or text, RAG answers), useless in open chat, where the adaptive length backs off.

Cost per step: O(k) to propose and O(new tokens x max_ngram) to index, because each request keeps a map from
every n-gram (n <= max_ngram) to the position after its latest earlier occurrence, extended as tokens arrive.
Pure Python (runs in Pyodide).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _State:
    follows: dict[tuple, int] = field(default_factory=dict)  # n-gram -> position just after its latest occurrence
    indexed: int = 0        # n-grams ending before this position are in `follows`
    k: int = 0              # current proposal length (adaptive)
    misses: int = 0         # consecutive verifications that accepted nothing
    rest: int = 0           # steps to skip proposing after misses
    seen: tuple[int, int] = (0, 0)  # (num_proposed, num_accepted) of the request at the last look


class PromptLookup:
    """propose(request, k) -> up to k token ids (possibly none) for the request's next positions."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
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

    def _adapt(self, st: _State, req, k_max: int) -> None:
        """Grow k while proposals are accepted whole; shrink it and rest a while after misses."""
        proposed, accepted = req.num_proposed - st.seen[0], req.num_accepted - st.seen[1]
        st.seen = (req.num_proposed, req.num_accepted)
        if st.k == 0:
            st.k = k_max
        if proposed == 0:
            return
        if accepted == 0:
            st.misses += 1
            st.k = max(1, st.k // 2)
            st.rest = min(2 ** st.misses, 16)
        else:
            st.misses = 0
            st.k = min(k_max, st.k + 1) if accepted == proposed else max(1, accepted + 1)

    def propose(self, req, k_max: int) -> list[int]:
        st = self._states.setdefault(req.request_id, _State())
        self._adapt(st, req, k_max)
        if st.rest > 0:
            st.rest -= 1
            return []
        toks = req.all_token_ids
        self._index(st, toks)
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            at = st.follows.get(tuple(toks[len(toks) - n:]))
            if at is not None:
                return toks[at:at + st.k]
        return []


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
        from webinfer.engine.batch import SeqChunk, StepBatch

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
