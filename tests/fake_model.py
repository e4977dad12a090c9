"""A deterministic fake model runner for scheduler/engine/server tests (no GPU, no numpy, microseconds a step).

The next token is a hash of the sequence's whole token history, and the runner rebuilds that history only from
what the paged KV cache would hold: every fed token is written to (block_table[p // bs], p % bs) together with its
position, and reading positions < start_pos goes back through the block table. A wrong block table, a stale or
overwritten block, a wrong start_pos or a reordered chunk changes the history and hence every later token.

Like the GPU model (scheduler.py's docstring), a token's KV also depends on its path by default (split_paths): a
one-token chunk (the decode path) writes other "bits" than a row of a multi-token chunk, so a prompt fed a token at
a time, a generated token recomputed inside a chunk, or a prompt that reuses a block some request decoded changes
every later token. generate_alone's reference takes the paths of a request alone: its prompt as one chunk (one
token: a row), each generated token as a row.
"""

from __future__ import annotations

import asyncio
import hashlib

from webinfer.engine.batch import Sampled, StepBatch
from webinfer.tokenizer import Tokenizer


def _kv(tok: int, row: bool, split_paths: bool) -> int:
    """What the history holds for a token: itself, or where paths differ a different value for a row's KV."""
    return -1 - tok if split_paths and row else tok


def next_token(history: list[int], vocab: int, temperature: float = 0.0, seed: int = 0, sample_index: int = 0) -> int:
    """Greedy: a function of the history only. Sampling: also of (seed, sample_index), like a counter-based RNG."""
    h = hashlib.sha256(",".join(map(str, history)).encode())
    if temperature > 0:
        h.update(f"|{seed}|{sample_index}|{temperature}".encode())
    return int.from_bytes(h.digest()[:8], "little") % vocab


def score(history: list[int], target: int) -> tuple[float, list, int]:
    """A prompt-logprob row's fake result (batch.py SeqChunk.score_ids): a function of the KV history through the
    row and the id it scores, so a row scored with the wrong history or the wrong next token gives another value
    (the logprob and the rank)."""
    h = hashlib.sha256((",".join(map(str, history)) + f"->{target}").encode()).digest()
    return -int.from_bytes(h[:4], "little") / 2**32, [], 2 + h[4] % 40


def prompt_scores(prompt: list[int]) -> list[tuple[float, list, int]]:
    """What a request's prompt logprobs must be: every prompt token after the first scored under the prompt before
    it, as rows of multi-token chunks write it."""
    return [score(prompt[:i + 1], prompt[i + 1]) for i in range(len(prompt) - 1)]


class KVCorruption(AssertionError):
    pass


class FakeRunner:
    def __init__(self, num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256, vocab: int = 50,
                 delay_s: float = 0.0, step_cost: tuple[float, float] = (1.0, 0.0), cold_cost: float = 0.0,
                 split_paths: bool = True):
        self.split_paths = split_paths
        self.rows_match_chunks = not split_paths  # what the engine tells its scheduler (batch.py)
        self.num_blocks, self.block_size, self.max_model_len, self.vocab = num_blocks, block_size, max_model_len, vocab
        self.vocab_size = vocab
        self.delay_s = delay_s
        # a virtual clock (pass runner.clock to the engine): each step costs base + per_row * its one-token rows,
        # so what the engine measures does not depend on this Python fake's own speed
        self.step_cost, self.now = step_cost, 0.0
        # and the first step of each row count costs cold_cost more (a GPU compiling that shape's pipelines)
        self.cold_cost, self._warm_rows = cold_cost, set()
        self.slots: dict[tuple[int, int], tuple[int, int]] = {}  # (block, slot) -> (KV value, position)
        self.steps = 0
        self.max_steps = 16  # decode blocks: run as plain steps, each checked like any other
        self.blocks = 0
        self.batch_sizes: list[int] = []
        self.tokens_per_step: list[int] = []

    def execute_sync(self, batch: StepBatch) -> list[int]:
        if batch.steps > 1:
            batch.check_block()
            self.blocks += 1
            self.max_block = max(getattr(self, "max_block", 0), batch.steps)
            ids, out = [c.token_ids[0] for c in batch.chunks], []
            for j in range(batch.steps):
                ids = self.execute_sync(batch.unrolled(j, ids))
                out += ids
            return out
        bs = self.block_size
        out, lps, scores = [], [], []
        self.steps += 1
        self.now += self.step_cost[0] + self.step_cost[1] * len(batch.chunks)
        if len(batch.chunks) not in self._warm_rows:
            self._warm_rows.add(len(batch.chunks))
            self.now += self.cold_cost
        self.batch_sizes.append(len(batch.chunks))
        self.tokens_per_step.append(batch.num_tokens)
        for c in batch.chunks:
            end = c.start_pos + len(c.token_ids)
            if len(c.token_ids) == 0:
                raise KVCorruption(f"seq {c.seq_id}: empty chunk")
            if len(c.block_table) * bs < end:
                raise KVCorruption(f"seq {c.seq_id}: block table covers {len(c.block_table) * bs} positions, needs {end}")
            if 0 in c.block_table:
                raise KVCorruption(f"seq {c.seq_id}: the null block 0 is in a block table")
            if len(set(c.block_table)) != len(c.block_table):
                raise KVCorruption(f"seq {c.seq_id}: a block appears twice in one table: {c.block_table}")
            history = []
            for p in range(c.start_pos):
                tok, pos = self.slots.get((c.block_table[p // bs], p % bs), (None, None))
                if pos != p:
                    raise KVCorruption(f"seq {c.seq_id}: position {p} holds KV of position {pos}")
                history.append(tok)
            fed = [_kv(t, len(c.token_ids) == 1, self.split_paths) for t in c.token_ids]
            for i, t in enumerate(fed):
                p = c.start_pos + i
                self.slots[(c.block_table[p // bs], p % bs)] = (t, p)
            scores.append([score(history + fed[:j + 1], t) for j, t in enumerate(c.score_ids)] or None)
            history += fed
            if c.sample:
                out.append(next_token(history, self.vocab, c.temperature, c.seed, c.sample_index))
                lps.append(score(history, out[-1]) if c.logprobs is not None else None)
        if any(scores) or any(lps):
            return Sampled(out, lps if any(lps) else None, scores if any(scores) else None)
        return out

    def clock(self) -> float:
        return self.now

    async def execute(self, batch: StepBatch) -> list[int]:
        await asyncio.sleep(self.delay_s)  # yields to the event loop like a real GPU wait
        return self.execute_sync(batch)


def generate_alone(prompt: list[int], max_tokens: int, vocab: int, eos_ids=(), max_len: int = 10**9,
                   temperature: float = 0.0, seed: int = 0, split_paths: bool = True) -> tuple[list[int], str]:
    """What a request produces with nothing else around: the reference the batched outputs must equal."""
    hist, out = [_kv(t, len(prompt) == 1, split_paths) for t in prompt], []
    while True:
        t = next_token(hist, vocab, temperature, seed, len(out))
        out.append(t)
        hist.append(_kv(t, True, split_paths))
        if t in eos_ids:
            return out, "stop"
        if len(out) >= max_tokens or len(hist) >= max_len:
            return out, "length"


class FakeTokenizer(Tokenizer):
    """id i <-> one character: a real webinfer Tokenizer (so the engine streams through the real decoder) over a
    tiny vocabulary without merges; enough to test text deltas and stop strings."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,!?ABCDEFGHIJKLMNOPQRSTUVWXYZ"

    def __init__(self, vocab: int = 50):
        assert vocab <= len(self.ALPHABET)
        super().__init__({"model": {"type": "BPE", "vocab": {c: i for i, c in enumerate(self.ALPHABET[:vocab])},
                                    "merges": []}, "decoder": {"type": "Fuse"}})


def fake_llm(runner, vocab: int, eos_ids=(), chat_template: str | None = None, name: str = "fake", limits=None,
             add_bos: bool = False, bos_id: int | None = None, **engine_kw):
    """The API over the fake runner and tokenizer, wired as webinfer.factory wires a real package."""
    from webinfer.api import LLM
    from webinfer.engine.engine import AsyncEngine
    from webinfer.prompt import Prompter

    tok = FakeTokenizer(vocab)
    prompter = Prompter(tok, chat_template, {"add_bos_token": add_bos}, bos_id, eos_ids, vocab)
    return LLM(AsyncEngine(runner, eos_ids=eos_ids, **engine_kw), tok, prompter, name, limits)
