"""A step's recorded commands are reused for steps of the same shape (webinfer/engine/gpu_model.py _record): the
host's Python per step, which a real GPU's millisecond step would wait for. The reuse is keyed on the row counts
and the attention grids; these tests record every step shape afresh and compare, so a key that missed anything a
kernel's commands depend on (a grid, a branch, a variant) would hand a step another shape's commands and fail here.
"""

import pytest

from webinfer.engine.batch import SeqChunk, StepBatch

pytestmark = pytest.mark.gpu


def _shapes(one: int) -> list[StepBatch]:
    """Steps of many shapes, several of them equal in key (contexts within one attention split)."""
    t = list(range(1, 40))
    dec = [StepBatch([SeqChunk(0, [7], c - 1, t, True)]) for c in (2, 3, 9, one - 1, one, one + 1, one + 2, 2 * one - 6)]
    return dec + [
        StepBatch([SeqChunk(0, [7], 4, t, True), SeqChunk(1, [8], 40, t, True)]),     # two decode rows
        StepBatch([SeqChunk(0, [5, 6, 7, 8, 9], 0, t, True)]),                        # a prefill chunk
        StepBatch([SeqChunk(0, [5, 6, 7], 0, t, False)]),                             # nothing sampled
        StepBatch([SeqChunk(0, [7], 20, t, True), SeqChunk(1, [5, 6, 7], 3, t, True)]),  # mixed
        StepBatch([SeqChunk(0, [7], 20, t, False), SeqChunk(0, [9], 21, t, True)]),   # verification rows
        StepBatch([SeqChunk(0, [7], 20, t, False), SeqChunk(1, [9], 21, t, True)]),   # the same, two sequences
    ]


def _fresh_and_reused(runner, batch):
    from webinfer.kernels.attention import pack_step

    ids, _, _, rows, seqs, _, n_dec = runner._prepare(batch)
    shape = pack_step(seqs)[2]
    dec = [c.seq_id for c in batch.chunks if len(c.token_ids) == 1]
    shared = len(set(dec)) < len(dec)
    fresh, reused = runner.device.commands(), runner.device.commands()
    runner._record_graph(fresh, len(ids), n_dec, len(rows), shape, shared)
    runner._record(reused, len(ids), n_dec, len(rows), shape, shared)
    return fresh.ops, reused.ops


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # gemma3: two attention variants (sliding, global)
def test_reused_commands_equal_a_fresh_recording(gpu, tiny_llama, family, tmp_path):
    from tests.gpu_fixtures import load_runner

    if family == "llama":
        pkg = tiny_llama
    else:
        from tests.families import build, save
        from webinfer_packager.pack.build import pack

        pkg = pack(save(build("gemma3"), tmp_path / "hf"), tmp_path / "pkg", progress=False)
    runner = load_runner(pkg, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=4)
    batches = _shapes(runner.attention.one_split)
    for b in batches + batches[::-1]:  # the second round takes every shape from the reuse
        fresh, reused = _fresh_and_reused(runner, b)
        assert fresh == reused, [c.start_pos for c in b.chunks]
    # contexts 2, 3, 9 and one_split - 1 share one key: fewer recordings than shapes
    assert len(runner._recorded) < len(batches)
    assert any(op[-1].endswith(".reduce") for op in _fresh_and_reused(runner, batches[5])[1])


def test_the_reused_shapes_are_bounded(gpu, tiny_llama):
    from tests.gpu_fixtures import load_runner

    runner = load_runner(tiny_llama, device=gpu, num_blocks=40, block_size=8, max_batch_tokens=64, max_seqs=4)
    runner.RECORDED_SHAPES = 3
    batches = _shapes(runner.attention.one_split)
    for b in batches:
        fresh, reused = _fresh_and_reused(runner, b)
        assert fresh == reused
        assert len(runner._recorded) <= 3


def test_native_dispatches_skip_the_python_wrapper(gpu):
    """The pinned wgpu-py has the C functions native.py records dispatches with; a wgpu-py without them would
    silently fall back to the wrapped calls (~1 ms more a step): this says so instead."""
    assert gpu._raw is not None
