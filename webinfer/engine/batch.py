"""The plain data the scheduler hands to the model each step, and the protocol the model implements.

This is the whole contract between the engine (pure Python, also in Pyodide) and a model runner (the GPU
model, the numpy reference, or the fake in tests). Nothing here touches a GPU.

KV layout: the runner writes the K/V of every fed token at position p into physical block
`block_table[p // block_size]`, slot `p % block_size`, and attends causally over positions [0, p].
Block 0 is reserved as a null block: the KV cache manager never hands it out, so a runner may use it
for padding rows (writes there are garbage nobody reads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

NULL_BLOCK = 0  # never allocated to a sequence; free for the runner to use as a padding target


@dataclass
class SeqChunk:
    seq_id: int
    token_ids: list[int]     # tokens fed this step: a prefill chunk, or the single last token when decoding
    start_pos: int           # absolute position of token_ids[0]; KV for positions < start_pos is already in the cache
    block_table: list[int]   # physical KV block ids covering positions [0, start_pos + len(token_ids))
    sample: bool             # whether to sample a next token from the logits of the last fed token
    temperature: float = 0.0 # 0 = greedy (argmax, lowest id on ties)
    top_p: float = 1.0
    top_k: int = 0           # 0 = off
    seed: int = 0
    sample_index: int = 0    # how many tokens this request has sampled so far (RNG counter: seed+index -> same draw)
    min_p: float = 0.0
    logit_bias: tuple = ()   # ((token id, bias), ...)
    mask: bytes | None = None  # allowed tokens (structured output): ceil(vocab/32) little-endian u32 words
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the top k (0..20)
    # penalized chunks only: the request's prompt + output ids (the scheduler's live list: read, never kept) and
    # the prompt's length, so a runner can (re)build the sequence's token counts when it has none for it
    history: list[int] | None = None
    num_prompt: int = 0
    # prompt logprobs (a completions request with echo and logprobs): score_ids[j] is the id that follows the
    # chunk's token j (rows 0 .. len(score_ids) - 1, a prefix of the chunk); the runner returns, per such row, that
    # id's log-softmax under the row's raw logits and the top `score_top` (0..20) in Sampled.scores
    score_ids: tuple = ()
    score_top: int = 0

    @property
    def penalized(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1


class Sampled(list):
    """What execute() may return instead of a plain list of ids when some chunk asked for logprobs or scores: the
    ids, and per id (same order) None or (logprob of the sampled token, [(id, logprob), ...] of the top k, best
    first); scores: per chunk (batch order) None or, per scored row, (logprob of its score id, top k) as above.
    A runner must return one when a chunk has score_ids, even if no chunk samples."""

    def __init__(self, ids, logprobs: list | None = None, scores: list | None = None):
        super().__init__(ids)
        self.logprobs = logprobs
        self.scores = scores


@dataclass
class StepBatch:
    """One step, or with steps = K > 1 a decode block: K decode steps run back to back, step j feeding each chunk
    the token step j - 1 sampled for it at position start_pos + j with sample_index + j (step 0 feeds token_ids).
    A block holds only one-token chunks that sample, without a mask, whose block tables cover start_pos + K."""

    chunks: list[SeqChunk]
    steps: int = 1

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    def unrolled(self, j: int, token_ids: list[int]) -> "StepBatch":
        """Step j of a decode block as a plain step, feeding token_ids (one per chunk)."""
        return StepBatch([replace(c, token_ids=[t], start_pos=c.start_pos + j, sample_index=c.sample_index + j)
                          for c, t in zip(self.chunks, token_ids)])

    def check_block(self) -> None:
        if self.steps > 1 and not all(len(c.token_ids) == 1 and c.sample and c.mask is None and not c.score_ids
                                      for c in self.chunks):
            raise ValueError("a decode block holds only one-token chunks that sample, without a mask or scores")

    def check_scores(self, vocab: int) -> None:
        """score_ids: a prefix of the chunk's rows (the last row of a sampling chunk is its sample, not a score),
        ids in the vocabulary, score_top in 0..20."""
        for c in self.chunks:
            if not c.score_ids:
                continue
            if len(c.score_ids) > len(c.token_ids) - c.sample or not 0 <= c.score_top <= 20:
                raise ValueError(f"sequence {c.seq_id}: {len(c.score_ids)} score ids for a chunk of "
                                 f"{len(c.token_ids)} tokens (sample={c.sample}), top {c.score_top}")
            if any(not 0 <= t < vocab for t in c.score_ids):
                raise ValueError(f"sequence {c.seq_id}: a score id outside the vocabulary of {vocab}")


class ModelRunner(Protocol):
    block_size: int
    num_blocks: int       # including the null block 0
    max_model_len: int
    vocab_size: int       # token ids must lie in [0, vocab_size)
    max_steps: int        # longest decode block execute() takes (optional attribute; absent = 1)
    kind: str             # what runs the model: "gpu" (WebGPU), "cpu" (the wasm engine), "reference" (numpy)
    rows_match_chunks: bool  # a one-token chunk's row has the bits it has inside a multi-token chunk (optional;
                             # absent = False: the scheduler then keeps each position on the path it first took)

    async def execute(self, batch: StepBatch) -> list[int]:
        """One sampled token id per chunk with sample=True, in chunk order; for a decode block (steps = K) the
        K steps' ids one after the other (step-major), exactly what K plain steps would sample."""
        ...
