"""The engine over the paged numpy reference runner with a tiny random-weight transformer: batched, chunked,
prefix-cached and preempted generation must give exactly the ids of the plain (unpaged) reference model run alone.
Run: python -m pytest tests/test_engine_reference.py -q"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from webinfer.engine.engine import AsyncEngine
from webinfer.engine.stopping import SamplingParams
from webinfer_packager.reference.model import ReferenceModel
from webinfer_packager.reference.runner import ReferenceRunner, sample


class IdTokenizer:
    def decode(self, ids):
        return " ".join(map(str, ids))

    def encode(self, text):
        return [int(t) for t in text.split()]


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    d = tmp_path_factory.mktemp("tiny")
    write_hf(d / "hf", arch="llama")
    pack(d / "hf", d / "pkg", progress=False)
    return d / "pkg"


def alone(model: ReferenceModel, prompt, max_tokens, temperature=0.0, seed=0):
    """Unpaged: one growing KV cache, one token at a time after the prompt."""
    model.reset()
    logits = model.forward(list(prompt), 0)[-1]
    out = []
    while True:
        t = sample(logits, temperature, 1.0, 0, seed, len(out))
        out.append(t)
        if len(out) == max_tokens:
            return out
        logits = model.forward([t], len(prompt) + len(out) - 1)[-1]


def test_paged_reference_runner_matches_unpaged_model(tiny_package):
    runner = ReferenceRunner.from_package(tiny_package, num_blocks=12, block_size=4, in_thread=False)
    plain = ReferenceModel.from_package(tiny_package)
    rng = random.Random(0)
    shared = [rng.randrange(3, 300) for _ in range(9)]
    prompts = [shared + [rng.randrange(3, 300) for _ in range(rng.randrange(1, 6))] for _ in range(5)]
    params = [SamplingParams(max_tokens=6, temperature=[0.0, 0.9][i % 2], seed=i, ignore_eos=True) for i in range(5)]

    async def main():
        engine = AsyncEngine(runner, eos_ids=(), max_num_batched_tokens=10, max_num_seqs=4)

        async def one(p, sp):
            return sum([o.token_ids async for o in engine.generate(p, sp)], [])
        res = await asyncio.gather(*(one(p, sp) for p, sp in zip(prompts, params)))
        return res, engine.stats()

    res, stats = asyncio.run(main())
    for p, sp, got in zip(prompts, params, res):
        assert got == alone(plain, p, 6, sp.temperature, sp.seed)
    assert stats["prefix_hit_tokens"] > 0 and stats["preemptions"] > 0 and stats["blocks_used"] == 0


def test_sample_rules():
    logits = np.array([1.0, 3.0, 3.0, -1.0], np.float32)
    assert sample(logits, 0.0, 1.0, 0, 0, 0) == 1  # lowest id on ties
    # top_k=1 is greedy whatever the temperature; the same (seed, index) always draws the same
    assert {sample(logits, 1.5, 1.0, 1, s, i) for s in range(5) for i in range(5)} == {1}
    draws = [sample(logits, 1.0, 1.0, 0, 7, i) for i in range(200)]
    assert draws == [sample(logits, 1.0, 1.0, 0, 7, i) for i in range(200)]
    assert 3 in draws and draws.count(1) > 50  # p(3) ~ 1.5 %, p(1) = p(2) ~ 47 %
