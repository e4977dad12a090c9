"""The GPU model (webinfer/engine/gpu_model.py) on tiny synthetic packages, against the numpy reference model.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/test_native_generate_tiny.py -q
Fast (tiny random models, a few seconds on lavapipe): greedy ids must equal the reference token for token,
logits must agree to 1e-3, and a sequence must get bit-identical logits alone and batched with others.
"""

import asyncio

import numpy as np
import pytest

from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.package import Package

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 200, 33, 1, 9, 250], [42], list(range(3, 40))]


def _reference(pkg, prompt, n):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    return generate(ReferenceModel.from_package(pkg), prompt, n, Sampler(0.0))


@pytest.mark.parametrize("which,fuse,kv_f16,ksplit", [("tiny_llama", True, False, 1), ("tiny_llama", False, False, 1),
                                                      ("tiny_qwen", True, False, 1), ("tiny_llama", True, True, 1),
                                                      ("tiny_llama", True, False, 8), ("tiny_qwen", False, False, 32)])
def test_greedy_ids_equal_reference(gpu, request, which, fuse, kv_f16, ksplit):
    """ksplit: the decode GEMVs' lanes per row group (gemv.wgsl KSPLIT; a GPU's default is 8, lavapipe's 1)."""
    from tests.gpu_fixtures import generate_ids, load_runner

    if kv_f16 and not gpu.caps.f16:
        pytest.skip("no shader-f16")
    pkg = request.getfixturevalue(which)
    # max_batch_tokens=16: the 37-token prompt is prefilled in 3 chunks. An f16 KV cache rounds k/v to 11 bits,
    # which could flip a near-tie in principle; with these weights and prompts the greedy ids still match exactly
    runner = load_runner(pkg, device=gpu, num_blocks=12, block_size=8, max_batch_tokens=16, fuse=fuse, kv_f16=kv_f16,
                         gemv_ksplit=ksplit)
    assert runner.lm_head.pick(1).variant.key.ksplit == ksplit
    for prompt in PROMPTS:
        got = generate_ids(pkg, prompt, 16, runner=runner)
        assert got == _reference(pkg, prompt, 16), f"{which} fuse={fuse} prompt={prompt[:5]}"


def test_prefill_logits_match_reference(gpu, tiny_qwen):
    from tests.gpu_fixtures import load_runner
    from webinfer_packager.reference.model import ReferenceModel

    runner = load_runner(tiny_qwen, device=gpu, num_blocks=8, block_size=8, max_batch_tokens=32)
    prompt = list(range(10, 31))
    ref = ReferenceModel.from_package(tiny_qwen).forward(prompt, 0)[-1]
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, prompt, 0, [3, 1, 5], True)])))  # scattered blocks
    got = np.array(asyncio.run(runner.logits(1))[0], np.float32)
    np.testing.assert_allclose(got, ref, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("ksplit", [1, 8])
def test_batch_invariance_bitwise(gpu, tiny_llama, ksplit):
    """The same sequences alone and together in one step (mixed prefill + decode) give bit-identical logits, with
    one lane or eight per GEMV row group."""
    from tests.gpu_fixtures import load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=32, block_size=4, max_batch_tokens=64, gemv_ksplit=ksplit)
    seqs = {0: list(range(5, 18)), 1: [7, 8, 9], 2: list(range(100, 130))}
    tables = {0: [1, 2, 3, 4], 1: [5, 6], 2: [7, 8, 9, 10, 11, 12, 13, 14]}

    def step(ids):
        chunks = [SeqChunk(i, seqs[i], 0, tables[i], True) for i in ids]
        asyncio.run(runner.execute(StepBatch(chunks)))
        pre = [np.array(r, np.float32) for r in asyncio.run(runner.logits(len(ids)))]
        # then one decode token each (positions len(prompt))
        chunks = [SeqChunk(i, [11], len(seqs[i]), tables[i], True) for i in ids]
        asyncio.run(runner.execute(StepBatch(chunks)))
        dec = [np.array(r, np.float32) for r in asyncio.run(runner.logits(len(ids)))]
        return pre, dec

    alone = {i: step([i]) for i in seqs}
    pre, dec = step([2, 0, 1])
    for j, i in enumerate([2, 0, 1]):
        assert np.array_equal(alone[i][0][0].view(np.uint32), pre[j].view(np.uint32)), f"prefill seq {i}"
        assert np.array_equal(alone[i][1][0].view(np.uint32), dec[j].view(np.uint32)), f"decode seq {i}"


def test_bad_inputs_raise(gpu, tiny_llama):
    from webinfer.errors import ContextOverflowError
    from tests.gpu_fixtures import load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=4, block_size=4, max_batch_tokens=8, max_model_len=16)
    with pytest.raises(ValueError, match="does not cover"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [1, 2, 3, 4, 5], 0, [1], True)])))
    with pytest.raises(ValueError, match="max_batch_tokens"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, list(range(9)), 0, [1, 2, 3], True)])))
    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [10**6], 0, [1], True)])))
    with pytest.raises(ContextOverflowError):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [1], 16, [1, 2, 3, 1, 2], True)])))


def test_seeded_sampling_reproducible(gpu, tiny_llama):
    """temperature > 0 goes through the GPU sampler: same seed -> same ids, and the ids are valid tokens."""
    from tests.gpu_fixtures import generate_ids, load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=8, block_size=8, max_batch_tokens=16)
    a = generate_ids(tiny_llama, [5, 6, 7], 12, temperature=1.0, top_p=0.9, top_k=50, seed=3, runner=runner)
    b = generate_ids(tiny_llama, [5, 6, 7], 12, temperature=1.0, top_p=0.9, top_k=50, seed=3, runner=runner)
    c = generate_ids(tiny_llama, [5, 6, 7], 12, temperature=1.0, top_p=0.9, top_k=50, seed=4, runner=runner)
    assert a == b and len(a) == 12 and all(0 <= t < 300 for t in a)
    assert a != c  # 12 draws at T=1 from a 300-token random model: a different seed must change something


def test_load_through_async_reader(gpu, tiny_llama):
    """The browser provides tensor bytes through an awaitable reader: load must accept one (and use only it)."""
    from webinfer.engine.gpu_model import GPUModel
    from tests.gpu_fixtures import generate_ids

    pkg = Package.open(tiny_llama)
    calls = []

    async def read(name, component, binding):
        calls.append((name, component, binding))
        await asyncio.sleep(0)
        return pkg.read_component(name, component, binding)

    runner = asyncio.run(GPUModel.load(gpu, pkg, num_blocks=8, block_size=8, max_batch_tokens=16, read=read))
    assert ("embed", "qweight", 0) in calls and ("layers.1.down", "scales", 0) in calls
    got = generate_ids(tiny_llama, PROMPTS[0], 8, runner=runner)
    assert got == _reference(tiny_llama, PROMPTS[0], 8)


def test_cli_gemv_ksplit_reaches_the_engine(tiny_llama, capsys):
    """`webinfer generate --gemv-ksplit 8` runs the split-K GEMVs (on lavapipe, whose default is 1) and still
    gives the reference's greedy ids; a value outside KSPLITS is refused by the parser."""
    import json

    from webinfer_packager.cli.main import main

    argv = ["generate", str(tiny_llama), "--backend", "native", "--prompt", "hello world and more", "--max-tokens",
            "12", "--json", "--gemv-ksplit", "8"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["backend"] == "native" and r["gemv_ksplit"] == 8
    ref = _reference(tiny_llama, r["prompt_ids"], 12)
    got = r["output_ids"]
    assert got == ref[:len(got)] and (len(got) == 12) == (r["finish_reason"] == "length")
    with pytest.raises(SystemExit):
        main(argv[:-1] + ["3"])
