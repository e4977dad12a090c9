"""Acceptance: the native GPU model on the real SmolLM2-135M package equals the numpy reference model.

Run: XDG_RUNTIME_DIR=/tmp/xdg WEBINFER_TEST_PACKAGE=/path/to/packed/SmolLM2 python -m pytest tests/test_native_generate.py -q
(without WEBINFER_TEST_PACKAGE the smollm2_package fixture packs the model first, ~1 min).

Greedy ids of the GPU model must equal the reference's for 64 tokens on five varied prompts. The reference is run
teacher-forced: one causal forward over prompt + GPU output, whose argmax at every position must be the GPU's next
token. That is the same condition as token-for-token greedy equality (the first mismatch would be caught at its
position), at the cost of one numpy prefill per prompt instead of 64 decode steps.
Batch invariance: the five prompts generated together in shared steps give the same ids as alone.
"""

import asyncio

import numpy as np
import pytest

from webinfer.engine.batch import SeqChunk, StepBatch

pytestmark = [pytest.mark.gpu, pytest.mark.model, pytest.mark.slow]

N_TOKENS = 64
TEXTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):\n    ",
         "1, 2, 3, 5, 8, 13,", None]  # None: the chat-templated prompt
CHAT = [{"role": "user", "content": "What is the tallest mountain in the world? Answer in one sentence."}]


@pytest.fixture(scope="module")
def setup(smollm2_package, gpu):
    from tokenizers import Tokenizer

    from webinfer.package import Package
    from tests.gpu_fixtures import load_runner
    from webinfer.chat_template import render

    pkg = Package.open(smollm2_package)
    tok = Tokenizer.from_str(pkg.read_file(pkg.manifest["tokenizer"]["file"]).decode())
    prompts = []
    for t in TEXTS:
        if t is None:
            t = render(pkg.chat_template, CHAT, add_generation_prompt=True)
            assert "<|im_start|>" in t
        prompts.append(tok.encode(t, add_special_tokens=False).ids)
    runner = load_runner(pkg, device=gpu, num_blocks=64, block_size=16, max_batch_tokens=128, max_seqs=8,
                         max_model_len=256)
    return pkg, prompts, runner


def _generate_together(runner, prompts, n):
    """All prompts in shared steps: one prefill step, then one decode step per token for every sequence."""
    per = -(-(max(map(len, prompts)) + n) // runner.block_size)
    tables = [list(range(1 + i * per, 1 + (i + 1) * per)) for i in range(len(prompts))]
    chunks = [SeqChunk(i, p, 0, tables[i], True) for i, p in enumerate(prompts)]
    outs = [[t] for t in asyncio.run(runner.execute(StepBatch(chunks)))]
    while len(outs[0]) < n:
        chunks = [SeqChunk(i, [o[-1]], len(p) + len(o) - 1, tables[i], True) for i, (p, o) in enumerate(zip(prompts, outs))]
        for o, t in zip(outs, asyncio.run(runner.execute(StepBatch(chunks)))):
            o.append(t)
    return outs


@pytest.fixture(scope="module")
def alone(setup):
    from tests.gpu_fixtures import generate_ids

    pkg, prompts, runner = setup
    return [generate_ids(pkg, p, N_TOKENS, runner=runner) for p in prompts]


def test_greedy_equals_reference(setup, alone):
    from webinfer_packager.reference.model import ReferenceModel

    pkg, prompts, _ = setup
    ref = ReferenceModel.from_package(pkg, max_seq_len=512)
    for p, got in zip(prompts, alone):
        assert len(got) == N_TOKENS
        ref.reset()
        logits = ref.forward(p + got[:-1], 0)[len(p) - 1:]  # logits predicting got[0..63]
        want = [int(i) for i in np.argmax(logits, axis=-1)]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert first is None, f"prompt {p[:6]}...: GPU and reference diverge at token {first}: {got[first]} vs {want[first]}"


def test_batch_invariance(setup, alone):
    _, prompts, runner = setup
    assert _generate_together(runner, prompts, N_TOKENS) == alone
