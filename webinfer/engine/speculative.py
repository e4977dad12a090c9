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
