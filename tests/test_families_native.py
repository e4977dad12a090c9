"""Each model family (tests/families.py) packed and run by the GPU model (webinfer/engine/gpu_model.py) on the native
backend: greedy ids over 32 tokens equal the numpy reference (itself equal to transformers: test_families.py),
and the logits of a prefill and of decode steps agree to 1e-3.

Small blocks and a small max_batch_tokens make the sliding windows (6 positions) cross block and prefill-chunk
boundaries, and the 32-token generation runs far past the window in decode.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.families import FAMILIES

pytestmark = [pytest.mark.gpu, pytest.mark.oracle]

PROMPTS = [[5, 77, 123, 9, 250, 31, 14, 200], [42], list(range(3, 24))]


@pytest.fixture(scope="module")
def family_package(tmp_path_factory):
    from webinfer_packager.pack.build import pack
    from tests.families import build, save

    out = {}

    def get(family):
        if family not in out:
            tmp = tmp_path_factory.mktemp(family)
            out[family] = pack(save(build(family), tmp / "hf"), tmp / "pkg", progress=False)
        return out[family]

    return get


def _reference(pkg, prompt, n):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    return generate(ReferenceModel.from_package(pkg), prompt, n, Sampler(0.0))


@pytest.mark.parametrize("family", FAMILIES)
def test_native_greedy_equals_reference(gpu, family_package, family):
    from tests.gpu_fixtures import generate_ids, load_runner

    pkg = family_package(family)
    runner = load_runner(pkg, device=gpu, num_blocks=24, block_size=4, max_batch_tokens=8)
    for prompt in PROMPTS:
        got = generate_ids(pkg, prompt, 32, runner=runner)
        assert got == _reference(pkg, prompt, 32), f"{family} prompt={prompt[:5]}"


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral", "phi3"])
def test_native_logits_equal_reference(gpu, family_package, family):
    """Prefill over 21 tokens (window 6: most keys masked) and decode steps after it, against the reference."""
    from webinfer.engine.batch import SeqChunk, StepBatch
    from tests.gpu_fixtures import load_runner
    from webinfer_packager.reference.model import ReferenceModel

    pkg = family_package(family)
    runner = load_runner(pkg, device=gpu, num_blocks=16, block_size=4, max_batch_tokens=32)
    ref = ReferenceModel.from_package(pkg)
    prompt, table = list(range(10, 31)), [3, 1, 5, 2, 7, 9, 4, 6, 8]  # scattered blocks
    want = [ref.forward(prompt, 0)[-1]]
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt, 0, table, True)])))
    got = [np.array(asyncio.run(runner.logits(1))[0], np.float32)]
    for j, tok in enumerate([7, 99, 150, 3, 250, 11, 12, 13]):
        pos = len(prompt) + j
        want.append(ref.forward([tok], pos)[-1])
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [tok], pos, table, True)])))
        got.append(np.array(asyncio.run(runner.logits(1))[0], np.float32))
    np.testing.assert_allclose(np.stack(got), np.stack(want), atol=1e-3, rtol=1e-3)
