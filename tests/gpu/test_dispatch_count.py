"""Dispatches per decode step of the GPU model (webinfer/engine/gpu_model.py): the fixed cost per token on a real
GPU. A llama decode step must take at most 5 per layer (qkv GEMV with the folded RMSNorm, attention decode with
RoPE and the KV write, o, gate_up with SwiGLU, down) plus embed and <= 3 for the final norm, LM head and
sampling, while the context fits one attention split; the ids stay those of the numpy reference model."""

import pytest

from webinfer.engine.batch import SeqChunk, StepBatch

pytestmark = pytest.mark.gpu


def test_llama_decode_dispatches_per_layer(gpu, tiny_llama):
    from tests.gpu_fixtures import generate_ids, load_runner
    from webinfer.package import Package
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    runner = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64)
    layers = Package.open(tiny_llama).config.num_hidden_layers
    one = runner.attention.one_split  # contexts up to this are one attention split
    decode = StepBatch([SeqChunk(0, [7], one - 1, list(range(1, 17)), True)])
    labels = [op[-1] for op in runner.encode_step(decode)[0].ops if op[0] == "dispatch"]
    assert runner.dispatch_count(decode) == len(labels) <= 1 + 5 * layers + 3, labels
    assert [x for x in labels if "rope" in x or "norm" in x and "final" not in x] == [], labels
    assert labels.count("attn.decode") == layers and "attn.reduce" not in labels, labels
    # a context past one split adds only the reduce, once per layer
    longer = StepBatch([SeqChunk(0, [7], one, list(range(1, 18)), True)])
    assert runner.dispatch_count(longer) == len(labels) + layers
    # and the fused path still decodes the reference's ids
    prompt = list(range(5, 5 + one - 2))  # decode crosses the one-split boundary
    ref = generate(ReferenceModel.from_package(tiny_llama), prompt, 6, Sampler(0.0))
    assert generate_ids(tiny_llama, prompt, 6, runner=runner) == ref


@pytest.mark.parametrize("max_seqs, tiles", [(1, (1,)), (4, (1, 4)), (5, (1, 4, 8)), (16, (1, 4, 8))])
def test_only_the_decode_tiles_a_step_can_pick_are_built(gpu, tiny_llama, max_seqs, tiles):
    """Every GEMV pipeline costs a compile at load (seconds each on SwiftShader): a model whose steps hold at most
    max_seqs decode rows builds no larger tile than the one that holds them, and still decodes the same ids."""
    from tests.gpu_fixtures import generate_ids, load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=max_seqs)
    lins = [runner.lm_head] + [lin.gemv for ly in runner.layers for lin in (*ly.qkv, ly.o, *ly.gate_up, ly.down)]
    assert {lin.tiles for lin in lins} == {tiles}
    if max_seqs == 4:
        full = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=16)
        prompt = [5, 9, 11, 200]
        assert generate_ids(tiny_llama, prompt, 8, runner=runner) == generate_ids(tiny_llama, prompt, 8, runner=full)
