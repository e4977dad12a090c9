"""Prompt logprobs on the GPU model (gpu_model.py _encode_scores: the scored rows in groups of max_seqs through the
final norm, the LM head's GEMV tiles and the sampler with a score id) against the numpy reference runner, and the
same bits however the prompt is cut into chunks and groups and whatever runs beside it. A tiny llama, and Gemma 2
(its final logit soft-cap runs on the scored rows too).

Run: python -m pytest tests/gpu/test_prompt_logprobs.py -q
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.gpu]

PROMPTS = [list(range(3, 40)), [5, 77, 123, 9, 250, 31, 14, 200], [42, 43]]


@pytest.fixture(scope="module")
def packages(tiny_llama, tmp_path_factory):
    from tests.families import build, save
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("gemma2")
    return {"llama": tiny_llama, "gemma2": pack(save(build("gemma2"), tmp / "hf"), tmp / "pkg", progress=False)}


def _scores(pkg, runner, prompts, *, budget: int, seqs: int, beside: bool = False):
    """Each prompt's prompt logprobs (top 4) through the engine; beside: with a plain request running next to it."""
    from tests.gpu_fixtures import prompt_logprobs_of

    return prompt_logprobs_of(pkg, runner, prompts, budget=budget, seqs=seqs, top=4, beside=beside)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_prompt_logprobs_equal_the_reference_and_do_not_depend_on_chunks(gpu, packages, family):
    from tests.gpu_fixtures import load_runner
    from webinfer_packager.reference.runner import ReferenceRunner

    pkg = packages[family]
    want = _scores(pkg, ReferenceRunner.from_package(str(pkg), in_thread=False), PROMPTS, budget=64, seqs=4)
    # 37-token prompt, 4 rows a group: 9 score groups in one chunk
    wide = _scores(pkg, load_runner(pkg, device=gpu, max_batch_tokens=64, max_seqs=4), PROMPTS, budget=64, seqs=4)
    for p, w, g in zip(PROMPTS, want, wide):
        assert len(g) == len(p) - 1
        for i, ((lw, tw, rw), (lg, tg, rg)) in enumerate(zip(w, g)):
            assert math.isclose(lg, lw, abs_tol=1e-4), (family, i, lg, lw)
            assert rg == rw, (family, i, rg, rw)  # the rank in the vocabulary
            assert [t for t, _ in tg] == [t for t, _ in tw] or all(  # (near ties may swap)
                math.isclose(a, b, abs_tol=1e-4) for (_, a), (_, b) in zip(tg, tw)), (family, i, tg, tw)
    # chunks of 6 tokens, groups of 2 rows, with another request in the steps: the same bits
    narrow = _scores(pkg, load_runner(pkg, device=gpu, max_batch_tokens=6, max_seqs=2), PROMPTS, budget=6, seqs=2,
                     beside=True)
    assert narrow == wide
