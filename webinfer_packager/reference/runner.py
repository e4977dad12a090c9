"""A ModelRunner over the numpy reference model: the engine, API and server with a real model, without a GPU.

The KV cache is paged exactly like the GPU model's: K/V of position p of a chunk live in physical block
block_table[p // block_size], slot p % block_size (one numpy array per block, all layers). Each chunk gathers its
history from the block table, runs ReferenceModel.forward over the new tokens, and scatters their K/V back, so
prefix-cache hits, preemption and block reuse behave as on the GPU, and a wrong block table gives a wrong answer.

Sampling: greedy is argmax (lowest id on ties); otherwise the reference Sampler's distribution (temperature ->
top-k -> top-p) and the GPU sampler's own uniform draw, `uniform(seed, sample_index)` (the PCG hash in
shaders/sample.wgsl), at the same place of the inverse CDF: one seed gives the same tokens on every backend, and a
request's draws do not depend on what else is in the batch or on preemption.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from webinfer.engine.batch import Sampled, StepBatch
from webinfer.kernels.sampling import uniform
from webinfer_packager.reference.model import ReferenceModel, Sampler


def inverse_cdf(p: np.ndarray, u: float) -> tuple[int, float]:
    """The GPU sampler's draw from probabilities p [V] at u in [0, 1): the smallest id whose cumulative mass passes
    u * total; and how far u * total lies from the nearest CDF step (under ~1e-5 the shader's f32 sums may land on
    the other side)."""
    cdf = np.cumsum(p)
    x = u * cdf[-1]
    return int(min(np.searchsorted(cdf, x, side="right"), p.size - 1)), float(np.min(np.abs(cdf[p > 0] - x)))


def sample(logits: np.ndarray, temperature: float, top_p: float, top_k: int, seed: int, sample_index: int, *,
           min_p: float = 0.0, logit_bias=(), mask: bytes | None = None, frequency_penalty: float = 0.0,
           presence_penalty: float = 0.0, repetition_penalty: float = 1.0, prompt_ids=(), output_ids=(),
           logprobs: int | None = None):
    """logits [V] -> token id (or with logprobs=k: (id, (logprob, [(id, logprob)] of the top k, rank))); mask: allowed
    tokens as little-endian u32 words (structured output); prompt_ids / output_ids: the history the penalties see."""
    sm = Sampler(temperature, top_k, top_p, seed, min_p=min_p, logit_bias=dict(logit_bias),
                 frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                 repetition_penalty=repetition_penalty)
    allowed = None
    if mask is not None:
        bits = np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")  # bit t of word t/32 = token t
        allowed = bits[: logits.size].astype(bool)
    counts = np.bincount(np.asarray(output_ids, np.int64), minlength=logits.size) if len(output_ids) else None
    logits = sm.process(logits, counts, prompt_ids, allowed=allowed)      # [V] float64
    if temperature == 0.0:
        tok = int(np.argmax(logits))
    else:
        tok = inverse_cdf(sm.probs(logits), uniform(seed, sample_index))[0]
    if logprobs is None:
        return tok
    lsm, top = Sampler.logprobs(logits, logprobs)                         # [V], [k]
    return tok, (float(lsm[tok]), [(int(t), float(lsm[t])) for t in top], Sampler.rank(logits, tok))


class ReferenceRunner:
    kind = "reference"

    def __init__(self, model: ReferenceModel, num_blocks: int = 129, block_size: int = 16,
                 max_model_len: int | None = None, in_thread: bool = True):
        c = model.cfg
        self.model = model
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = min(max_model_len or c.max_position_embeddings, c.max_position_embeddings)
        self.vocab_size = c.vocab_size
        self.in_thread = in_thread
        # block id -> [2 (k, v), layers, block_size, kv_heads, head_dim]; allocated on first write
        self.blocks: dict[int, np.ndarray] = {}
        self._shape = (2, c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim)

    @classmethod
    def from_package(cls, package, **kw) -> "ReferenceRunner":
        return cls(ReferenceModel.from_package(Path(package) if isinstance(package, str) else package), **kw)

    def _gather(self, table: list[int], n: int) -> np.ndarray:
        """K/V of positions [0, n): [2, layers, n, kv_heads, head_dim]."""
        bs = self.block_size
        parts = [self.blocks[table[b]][:, :, : min(bs, n - b * bs)] for b in range(-(-n // bs))]
        if not parts:
            return np.zeros(self._shape[:2] + (0,) + self._shape[3:], np.float32)
        return np.concatenate(parts, axis=2)

    def _scatter(self, table: list[int], start: int, kv: np.ndarray) -> None:
        bs = self.block_size
        for i in range(kv.shape[2]):
            p = start + i
            blk = self.blocks.get(table[p // bs])
            if blk is None:
                blk = self.blocks[table[p // bs]] = np.zeros(self._shape, np.float32)
            blk[:, :, p % bs] = kv[:, :, i]

    def execute_sync(self, batch: StepBatch) -> list[int]:
        if batch.steps > 1:
            raise ValueError("the reference runner runs single steps (max_steps = 1)")
        batch.check_scores(self.vocab_size)
        m, out, lps, scores = self.model, [], [], []
        for c in batch.chunks:
            past = self._gather(c.block_table, c.start_pos)                # [2, L, S, Hkv, hd]
            m.k_cache, m.v_cache = list(past[0]), list(past[1])
            logits = m.forward(list(c.token_ids), c.start_pos)             # [T, V]
            new = np.stack([np.stack([k[c.start_pos:] for k in m.k_cache]),
                            np.stack([v[c.start_pos:] for v in m.v_cache])])  # [2, L, T, Hkv, hd]
            self._scatter(c.block_table, c.start_pos, new)
            rows = []
            for j, t in enumerate(c.score_ids):  # prompt logprobs: row j's raw log-softmax at the next token
                lsm, top = Sampler.logprobs(logits[j], c.score_top)               # [V], [k]
                rows.append((float(lsm[t]), [(int(i), float(lsm[i])) for i in top], Sampler.rank(logits[j], t)))
            scores.append(rows or None)
            if c.sample:
                hist, n_p = c.history or [], c.num_prompt
                r = sample(logits[-1], c.temperature, c.top_p, c.top_k, c.seed, c.sample_index, min_p=c.min_p,
                           logit_bias=c.logit_bias, mask=c.mask, frequency_penalty=c.frequency_penalty,
                           presence_penalty=c.presence_penalty, repetition_penalty=c.repetition_penalty,
                           prompt_ids=hist[:n_p], output_ids=hist[n_p:n_p + c.sample_index], logprobs=c.logprobs)
                tok, lp = r if c.logprobs is not None else (r, None)
                out.append(tok)
                lps.append(lp)
        m.reset()
        if any(sc is not None for sc in scores):
            return Sampled(out, lps if any(lp is not None for lp in lps) else None, scores)
        return Sampled(out, lps) if any(lp is not None for lp in lps) else out

    async def execute(self, batch: StepBatch) -> list[int]:
        if self.in_thread:  # keep the server's event loop answering while numpy works
            return await asyncio.to_thread(self.execute_sync, batch)
        return self.execute_sync(batch)
