"""The plain data the scheduler hands to the model each step, and the protocol the model implements.

This is the whole contract between the engine (pure Python, also in Pyodide) and a model runner (the GPU
model, the numpy reference, or the fake in tests). Nothing here touches a GPU.

KV layout: the runner writes the K/V of every fed token at position p into physical block
`block_table[p // block_size]`, slot `p % block_size`, and attends causally over positions [0, p].
Block 0 is reserved as a null block: the KV cache manager never hands it out, so a runner may use it
for padding rows (writes there are garbage nobody reads).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class StepBatch:
    chunks: list[SeqChunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


class ModelRunner(Protocol):
    block_size: int
    num_blocks: int       # including the null block 0
    max_model_len: int
    vocab_size: int       # token ids must lie in [0, vocab_size)

    async def execute(self, batch: StepBatch) -> list[int]:
        """One sampled token id per chunk with sample=True, in chunk order."""
        ...
