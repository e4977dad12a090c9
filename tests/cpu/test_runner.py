"""The CPU runner (webinfer/cpu/runner.py, the wasm module in wasmtime) against the numpy reference model.

Tiny random packages (fast): greedy ids equal the reference token for token in exact mode, also with the prompt
prefilled in chunks; logits agree to 1e-3; a sequence's logits are bit-identical alone and batched with others
(batch invariance); the fast mode (int8 activations) stays close; bad steps raise the GPU runner's errors.
Two, three and four threads (the threads build: q/k/v and attention split by heads, the other matrices by output
columns or, with split_k, o and down by input columns, each part's columns split again past two threads): the ids
and logits of one thread, also when the thread count changes between a block's segments, and a trap on a worker
thread fails the step instead of hanging it.
The real SmolLM2 (marked model/slow): exact-mode greedy ids equal the reference's teacher-forced argmax, on one
thread and on two.
"""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest

from tests.cpu.harness import read_by_draw
from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.errors import ContextOverflowError

PROMPTS = [[5, 17, 200, 33, 1, 9, 250], [42], list(range(3, 40))]




def _runner(pkg, mode="exact", variant="auto", **kw):
    from webinfer.cpu import load_cpu_runner

    kw = {"num_blocks": 24, "block_size": 8, "max_batch_tokens": 16, "max_seqs": 4, **kw}
    return asyncio.run(load_cpu_runner(pkg, mode=mode, variant=variant, **kw))


def _reference(pkg, prompt, n):
    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate

    return generate(ReferenceModel.from_package(pkg), prompt, n, Sampler(0.0))


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen"])
@pytest.mark.parametrize("variant", ["base", "relaxed"])
def test_greedy_ids_equal_reference(request, which, variant):
    from tests.gpu_fixtures import generate_ids

    pkg = request.getfixturevalue(which)
    runner = _runner(pkg, variant=variant)  # max_batch_tokens=16: the 37-token prompt goes in 3 chunks
    assert runner.host.variant == variant
    for prompt in PROMPTS:
        got = generate_ids(pkg, prompt, 20, runner=runner)
        assert got == _reference(pkg, prompt, 20), f"prompt {prompt[:5]}"


def _logits_alone_and_batched(runner, prompts):
    """Prefill each prompt alone (own blocks), then all together in one step on fresh blocks: logits rows."""
    alone, chunks = [], []
    runner.full_logits = True
    for i, p in enumerate(prompts):
        table = [1 + 2 * i, 2 + 2 * i]
        asyncio.run(runner.execute(StepBatch([SeqChunk(i, p, 0, table, True)])))
        alone.append(np.asarray(runner.logits(1)[0]))
        chunks.append(SeqChunk(i, p, 0, [11 + 2 * i, 12 + 2 * i], True))
    asyncio.run(runner.execute(StepBatch(chunks)))
    return alone, [np.asarray(r) for r in runner.logits(len(prompts))]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_one_token_rows_give_the_bits_of_a_chunk(tiny_llama, mode):
    """What CpuRunner.rows_match_chunks declares (the scheduler then lets a recompute or a prefix hit mix paths):
    the last row's logits are the same bits whether the prompt went in one chunk, in chunks, or ended (or went
    wholly) as one-token rows."""
    runner = _runner(tiny_llama, mode, num_blocks=40, max_batch_tokens=64)
    assert runner.rows_match_chunks
    runner.full_logits = True
    prompt = [(7 * i + 11) % 250 + 3 for i in range(23)]

    def last_row(cuts):
        pos = 0
        for j, n in enumerate(cuts):
            chunk = SeqChunk(0, prompt[pos:pos + n], pos, list(range(1, 9)), j == len(cuts) - 1)
            asyncio.run(runner.execute(StepBatch([chunk])))
            pos += n
        return np.asarray(runner.logits(1)[0])

    whole = last_row([23])
    for cuts in ([21, 2], [22, 1], [20, 1, 1, 1], [1] * 23):
        assert np.array_equal(last_row(cuts), whole), cuts


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_batch_invariance_and_logits(tiny_llama, mode):
    from webinfer_packager.reference.model import ReferenceModel

    runner = _runner(tiny_llama, mode)
    prompts = [[5, 17, 200, 33, 1], [42], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
    alone, together = _logits_alone_and_batched(runner, prompts)
    for a, b in zip(alone, together):
        assert np.array_equal(a, b), "a sequence's logits changed when batched"
    ref = ReferenceModel.from_package(tiny_llama)
    for p, got in zip(prompts, alone):
        ref.reset()
        want = ref.forward(p, 0)[-1]
        if mode == "exact":
            assert np.abs(got - want).max() < 1e-3, f"max logit error {np.abs(got - want).max()}"
        else:  # int8 activations: measured 4 % on this tiny random model (d=64); a wrong scale gives ~100 %
            rel = float(np.sqrt(np.mean((got - want) ** 2) / np.mean((want - want.mean()) ** 2)))
            assert rel < 0.08, f"fast mode: relative RMS logit error {rel:.4f}"


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("variant", ["base", "relaxed"])
@pytest.mark.parametrize("which", ["tiny_qwen", "tiny_llama"])
def test_threads_give_the_ids_of_one(request, which, mode, variant, threads):
    """The threads build on 2-4 threads: the ids of one thread, alone and batched (3 sequences decoding together),
    and in exact mode the reference's; logits bit-identical. tiny_qwen (head_dim 12: o's half of the heads is not
    whole 32-units) splits every matrix's output columns; tiny_llama takes split_k (o and down in two parts by
    input columns, each thread its own residual; past two threads each part's output columns and units of f split
    among its threads), which one thread computes the same way. (On this 2-core CI machine 3 and 4 threads
    outnumber the cores: their barriers block at once, kernels.c team_wait with spins_for's 0.)"""
    from tests.gpu_fixtures import generate_ids

    pkg = request.getfixturevalue(which)
    one, two = _runner(pkg, mode, variant), _runner(pkg, mode, variant, threads=threads)
    assert one.split_in_parts == two.split_in_parts == (which == "tiny_llama")
    workers = two.host._workers
    assert two.host.threads == threads and [w.tid for w in workers] == list(range(1, threads))
    assert all(w.thread.is_alive() for w in workers)
    try:
        for prompt in PROMPTS[:2]:
            got = generate_ids(pkg, prompt, 12, runner=two)
            assert got == generate_ids(pkg, prompt, 12, runner=one), f"prompt {prompt[:5]}"
            if mode == "exact":
                assert got == _reference(pkg, prompt, 12)
        _assert_same_logits(one, two, [[5, 17, 200, 33, 1], [42], [7, 8, 9, 10, 11, 12, 13, 14, 15]])
    finally:
        two.close()
    assert not any(w.thread.is_alive() for w in workers), "a worker thread did not leave on close"


@pytest.mark.parametrize("variant", ["base", "relaxed"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_two_pass_head_leaves_each_drawn_logit_exact(tiny_llama, variant, threads):
    """kernels.c's LM head in two passes (exact mode, runner.full_logits off): each sampled row's id and its group
    of 4 carry the full head's bits, every other entry is the exact logit or an upper bound of it (not a logit:
    logits() refuses to read it), and the ids are those of full logits; one greedy row, then three greedy
    sequences together (three rows), then four rows sampled with min_p, min_p and top-p, top-k alone and min_p with
    top-k (their cuts: head_cut), on 1-3 threads (every thread merges the threads' lower bounds and top-k floors
    and runs the second pass on its share). A step with a row sampled with top-p alone or temperature alone takes
    the one-pass head: every logit exact (their sums take every id's term)."""
    r = _runner(tiny_llama, variant=variant, threads=threads, max_seqs=5)
    V = r.vocab_size
    try:
        steps = [[SeqChunk(0, [5, 17, 200, 33], 0, [1, 2], True)],
                 [SeqChunk(i, p, 0, [3 + 2 * i, 4 + 2 * i], True) for i, p in enumerate(([42], [7, 8, 9], [250, 3]))],
                 [SeqChunk(i, p, 0, [3 + 2 * i, 4 + 2 * i], True, seed=i + 3, sample_index=5, **kw)
                  for i, (p, kw) in enumerate((([42, 9], dict(temperature=0.3, min_p=0.4)),  # (the model's
                                               ([7, 8, 9], dict(temperature=0.5, min_p=0.3)),  # logits: std ~1)
                                               ([250, 3], dict(temperature=0.6, top_p=0.8, min_p=0.2)),
                                               ([11, 12], dict(temperature=1.5, top_k=12)),
                                               ([30, 31], dict(temperature=0.8, top_k=20, min_p=0.5))))]]
        one_pass = [[SeqChunk(i, p, 0, [3 + 2 * i, 4 + 2 * i], True, seed=i + 3, sample_index=5, **kw)
                     for i, (p, kw) in enumerate((([42, 9], dict(temperature=0.5, min_p=0.3)),
                                                  ([7, 8, 9], dict(temperature=0.1, top_p=0.9))))],
                    [SeqChunk(0, [30, 31], 0, [3, 4], True, seed=3, sample_index=5, temperature=0.1)]]
        for chunks in steps + one_pass:
            n, out = len(chunks), {}
            for full in (False, True):  # the same step twice (its K/V rewritten with the same values)
                r.full_logits = full
                ids = asyncio.run(r.execute(StepBatch(chunks)))
                out[full] = ids, np.frombuffer(r.host.read(r.logits_off, 4 * V * n), np.float32).reshape(n, V).copy()
                if not full:
                    with pytest.raises(ValueError, match="full_logits"):
                        r.logits(n)
            (ids_g, g), (ids_f, f) = out[False], out[True]
            assert ids_g == ids_f
            if all(c.temperature == 0 for c in chunks):
                assert ids_f == [int(i) for i in np.argmax(f, axis=1)]
            elif chunks not in one_pass:  # the draws are not all the argmax (or the sampled rows test little)
                assert ids_f != [int(i) for i in np.argmax(f, axis=1)]
            for j, (i, c) in enumerate(zip(ids_f, chunks)):
                same = g[j].view(np.uint32) == f[j].view(np.uint32)
                assert same[i - i % 4: i - i % 4 + 4].all(), f"row {j}: the sampled id's group is not exact"
                if c.temperature > 0:  # every logit the sampler reads exact (harness.read_by_draw)
                    read = read_by_draw(f[j], c.temperature, c.top_k, c.top_p, c.min_p)
                    assert same[read].all(), f"row {j}: a logit the sampler reads is a bound"
                if chunks in one_pass:
                    assert same.all(), f"row {j}: the step took two passes"
                    continue
                assert (~same).any(), "the two-pass head did not run"
                assert (g[j][~same] > f[j][~same]).all()
    finally:
        r.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_wide_band_takes_the_one_pass_head_next(tiny_llama, threads):
    """kernels.c head_band: a sampled row whose cut let more than HEAD_WIDE (0.25) of the rows into the second pass
    (T 1 min_p 0.13 on the tiny model: its logits' std ~1, the cut 2 below the max, ~30 % of the rows) makes its
    slot's next step take the one-pass head (every logit exact with full_logits off), and a narrow row (T 0.5 min_p
    0.5) brings the two passes back on the step after; the ids are full logits' all along (a row the prediction was
    made for, and one it was not: the batch's second row). Top-k alone over half the vocabulary is wide the same way.
    Temperature alone takes one pass whatever its band (its sums take every term)."""
    r = _runner(tiny_llama, threads=threads)
    V = r.vocab_size
    wide, narrow = dict(temperature=1.0, min_p=0.13), dict(temperature=0.5, min_p=0.5)
    try:
        def step(kw, n=1, first=42):
            chunks = [SeqChunk(i, [first + i, 9], 0, [3 + 2 * i, 4 + 2 * i], True, seed=5, **kw) for i in range(n)]
            out = {}
            for full in (False, True):
                r.full_logits = full
                ids = asyncio.run(r.execute(StepBatch(chunks)))
                out[full] = ids, np.frombuffer(r.host.read(r.logits_off, 4 * V * n), np.float32).reshape(n, V).copy()
            assert out[False][0] == out[True][0]
            return (out[False][1] == out[True][1]).all(axis=1)  # per row: every logit exact (the one-pass head)

        assert not step(narrow).any() and r.host.call("wi_test_head_band", 0) < 0.25
        assert not step(wide).any(), "a first wide step takes the two passes (nothing predicted it)"
        assert 0.25 < r.host.call("wi_test_head_band", 0) < 0.9
        assert step(wide).all(), "the step after a wide one took the two passes"
        assert step(narrow).all(), "the prediction is the last step's (wide)"
        assert not step(narrow, 2).any(), "a narrow step brings the two passes back"
        assert r.host.call("wi_test_head_band", 1) < 0.25
        # top-k alone: its band is the rows at or above its floor after two passes, k / vocab after one
        big_k, small_k = dict(temperature=1.0, top_k=V // 2), dict(temperature=1.0, top_k=5)
        step(big_k)
        assert r.host.call("wi_test_head_band", 0) >= 0.5
        assert step(big_k).all(), "the step after a wide top-k one took the two passes"
        assert r.host.call("wi_test_head_band", 0) == 0.5
        assert step(small_k).all() and not step(small_k).any(), "top-k 5 of 300 does not bring the two passes back"
        cold = dict(temperature=0.02)
        assert step(cold).all() and step(cold).all(), "temperature alone took two passes"
        # the limit is the Model's (CpuRunner.set_head_wide; calibrate_head measures it)
        r.set_head_wide(0.95)
        step(wide)
        assert not step(wide).any(), "a band under the Model's limit took one pass"
        r.set_head_wide(0.0)
        assert step(narrow).all() and step(narrow).all(), "a limit of 0 let a sampled row take two passes"
        assert not step(dict(temperature=0)).all(), "greedy rows take two passes whatever the limit"
    finally:
        r.close()


def _assert_same_logits(one, two, prompts):
    """Every prompt's logits, alone and batched together, bit for bit the same on runner `two` as on `one`."""
    a1, b1 = _logits_alone_and_batched(one, prompts)
    a2, b2 = _logits_alone_and_batched(two, prompts)
    for x, y in zip(a1 + b1, a2 + b2):
        assert np.array_equal(x, y), "the threads' logits differ from one thread's"


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("heads", [{"num_key_value_heads": 1}, {"num_attention_heads": 6, "num_key_value_heads": 3},
                                   {"head_dim": 6}], ids=["one_kv_head", "three_kv_heads", "head_dim_6"])
def test_threads_with_shared_or_unsplit_heads(tmp_path, heads, threads):
    """KV heads the threads do not divide (one on two threads, as Gemma 3's; three of six query heads, as SmolLM2's
    three of nine): each thread computes a shared KV head into its own k/v rows and all write the same cache rows;
    a head's q/k/v columns not whole groups of 4 (the packed layout's): the step splits the q/k/v columns evenly
    with a barrier before attention (kernels.c by_heads = 0). Three threads split 4 or 6 heads unevenly. The ids
    and logits are one thread's and the reference's either way."""
    from tests.gpu_fixtures import generate_ids
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    pkg = pack(write_hf(tmp_path / "hf", arch="llama", **heads), tmp_path / "pkg", progress=False)
    one, two = _runner(pkg), _runner(pkg, threads=threads)
    try:
        got = generate_ids(pkg, PROMPTS[0], 8, runner=two)
        assert got == generate_ids(pkg, PROMPTS[0], 8, runner=one) == _reference(pkg, PROMPTS[0], 8)
        _assert_same_logits(one, two, [[5, 17, 200, 33, 1], [42]])
    finally:
        two.close()


@pytest.mark.parametrize("threads,failing", [(2, 1), (3, 2)])
def test_a_worker_failing_fails_the_step(tiny_llama, threads, failing):
    """A trap on a worker thread makes the team quit: thread 0's step returns and raises naming the thread (no
    hang), every worker leaves, and close works."""
    import struct

    from webinfer.cpu.wasm import BUFS_WORDS
    from webinfer.errors import WebinferError

    runner = _runner(tiny_llama, threads=threads)
    team = runner.host.team
    bufs = struct.unpack("<I", runner.host.read(team + 4 * 9, 4))[0]  # kernels.c Team.bufs
    # the failing thread's scratch (Bufs.work) out of memory
    runner.host.write(bufs + 4 * BUFS_WORDS * (failing - 1), (0xFFFFFFF0).to_bytes(4, "little"))
    with pytest.raises(WebinferError, match=f"thread {failing} failed"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [5, 17, 200], 0, [1], True)])))
    for w in runner.host._workers:
        w.thread.join(timeout=10)
        assert not w.thread.is_alive(), f"thread {w.tid} still runs"
    runner.close()


def test_llm_close_stops_the_workers(tiny_llama):
    """LLM.close() ends the CPU engine's worker threads (not only at garbage collection or exit)."""
    import webinfer
    from webinfer.factory import EngineOptions

    async def main():
        llm = await webinfer.load(tiny_llama, backend="cpu", options=EngineOptions(cpu_threads=3, context_tokens=64))
        r = await llm.completions.create(prompt=[5, 17, 200], max_tokens=3, temperature=0)
        workers = llm.engine.runner.host._workers
        assert len(workers) == 2 and all(w.thread.is_alive() for w in workers)
        assert len(r["choices"][0]["token_ids"]) == 3
        await llm.close()
        return workers

    assert not any(w.thread.is_alive() for w in asyncio.run(main())), "a worker still runs after LLM.close()"


def test_decode_after_prefill_uses_the_cache(tiny_llama):
    """A decode step reads the K/V a previous step wrote through the block table (a wrong table -> wrong ids)."""
    runner = _runner(tiny_llama)
    p = [5, 17, 200, 33, 1, 9, 250, 3, 4]  # 9 tokens: crosses a block boundary (block_size 8)
    first = asyncio.run(runner.execute(StepBatch([SeqChunk(0, p, 0, [3, 7], True)])))
    nxt = asyncio.run(runner.execute(StepBatch([SeqChunk(0, first, len(p), [3, 7], True)])))
    assert first + nxt == _reference(tiny_llama, p, 2)


@pytest.mark.parametrize("threads", [1, 2])
def test_warm_up_between_steps_changes_nothing(tiny_llama, threads):
    """The page's kernel warm-up (CpuRunner.warm_up, after ready) before a request and between its steps writes
    only the null block: every step's logits are bit for bit those of a runner without it, and the ids the
    reference's (a warm-up writing a request's block, e.g. block 1, changes the logits)."""
    plain, warmed = _runner(tiny_llama, threads=threads), _runner(tiny_llama, threads=threads)
    try:
        p, ids = [5, 17, 200, 33, 1, 9, 250, 3, 4], {}
        for r in (plain, warmed):
            r.full_logits = True
            out, logits, chunk, start = [], [], p, 0
            for i in range(3):  # prefill, then two decode steps
                if r is warmed:
                    m0 = r.module_ms
                    r.warm_up(steps=1 + 2 * i)  # (the page runs slices of 8 steps)
                    assert r.module_ms == m0  # a warm-up is not a request's step time (the page's chat stats)
                out += asyncio.run(r.execute(StepBatch([SeqChunk(0, chunk, start, [1, 2], True)])))
                logits.append(r.logits(1)[0].tobytes())
                start, chunk = start + len(chunk), out[-1:]
            ids[r] = out, logits
        assert ids[warmed] == ids[plain]
        assert ids[plain][0] == _reference(tiny_llama, p, 3)
    finally:
        plain.close()
        warmed.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_start_up_warm_up_leaves_the_memory_to_the_runner(tiny_qwen, threads):
    """The page's start-up warm-up (webinfer/cpu/browser.py warm_kernels: a q4a matrix and its GEMVs in the memory
    the runner then places its model in) leaves nothing the runner reads: its ids are the reference's and its
    logits bit for bit a fresh host's."""
    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu import WasmtimeHost, load_cpu_runner
    from webinfer.cpu.browser import warm_kernels

    host = WasmtimeHost("auto", threads=threads)
    assert warm_kernels(host) > 0 and any(host.read(host.heap_base, 4096))  # (where the runner places its model)
    kw = {"num_blocks": 24, "block_size": 8, "max_batch_tokens": 16, "max_seqs": 4}
    warmed = asyncio.run(load_cpu_runner(tiny_qwen, host=host, **kw))
    fresh = _runner(tiny_qwen, threads=threads)
    try:
        for prompt in PROMPTS[:2]:
            assert generate_ids(tiny_qwen, prompt, 8, runner=warmed) == _reference(tiny_qwen, prompt, 8)
        _assert_same_logits(fresh, warmed, [[5, 17, 200, 33, 1], [42]])
    finally:
        warmed.close()
        fresh.close()


def test_sampling_is_the_gpu_rule(tiny_llama):
    """Sampled ids: the same draw for the same (seed, index), whatever the batch; greedy when top_k=1."""
    runner = _runner(tiny_llama)
    c = lambda i, t: SeqChunk(i, [5, 17, 200], 0, [1 + i], True, 0.9, 0.9, 20, 7, t)  # noqa: E731
    one = asyncio.run(runner.execute(StepBatch([c(0, 3)])))
    both = asyncio.run(runner.execute(StepBatch([c(1, 5), c(2, 3)])))
    assert both[1] == one[0]
    greedy = asyncio.run(runner.execute(StepBatch([SeqChunk(0, [5, 17, 200], 0, [1], True)])))
    topk1 = asyncio.run(runner.execute(StepBatch([SeqChunk(0, [5, 17, 200], 0, [1], True, 1.5, 1.0, 1, 3, 0)])))
    assert greedy == topk1


def test_bad_steps_raise(tiny_llama):
    runner = _runner(tiny_llama, max_model_len=32)
    with pytest.raises(ContextOverflowError):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [1] * 10, 30, [1, 2, 3, 4, 5], True)])))
    with pytest.raises(ValueError, match="block id"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [1, 2], 0, [99], True)])))
    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [100000], 0, [1], True)])))


def test_model_too_big_for_wasm32(tiny_llama):
    from webinfer.cpu import WasmMemoryError

    with pytest.raises(WasmMemoryError, match="4 GiB"):
        _runner(tiny_llama, num_blocks=3_000_000)  # a KV cache of ~6 GiB


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_smollm2_greedy_equals_reference(smollm2_package, threads):
    """Exact mode on the real model: 32 greedy tokens on three prompts equal the reference's teacher-forced argmax,
    on one thread, two and three (split_k's parts on unequal thread groups: {0, 1} and {2})."""
    from tokenizers import Tokenizer

    from webinfer.package import Package
    from tests.gpu_fixtures import generate_ids
    from webinfer_packager.reference.model import ReferenceModel

    pkg = Package.open(smollm2_package)
    tok = Tokenizer.from_str(pkg.read_file(pkg.manifest["tokenizer"]["file"]).decode())
    runner = _runner(pkg, num_blocks=32, block_size=16, max_batch_tokens=64, max_seqs=4, max_model_len=256,
                     threads=threads)
    ref = ReferenceModel.from_package(pkg, max_seq_len=256)
    for text in ["Once upon a time", "The capital of France is", "def fibonacci(n):\n    "]:
        p = tok.encode(text, add_special_tokens=False).ids
        got = generate_ids(pkg, p, 32, runner=runner)
        ref.reset()
        want = [int(i) for i in np.argmax(ref.forward(p + got[:-1], 0)[len(p) - 1:], axis=-1)]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert first is None, f"{text!r}: CPU and reference diverge at token {first}"
    assert tok.decode(generate_ids(pkg, tok.encode("Once upon a time").ids, 12, runner=runner)).startswith(
        ", the city of Nova Haven")
    runner.close()



def test_smollm2_long_context_equals_reference(smollm2_package):
    """Exact mode after a ~600-token prompt, where the softmax drops weights below 2^-64 of the maximum's (kernels.c
    softmax_exp: subnormal arithmetic cost x86 ~100x): 8 greedy tokens equal the reference's teacher-forced argmax,
    and the prompt's last logits are within the short prompts' error of the reference (float64 softmax, nothing
    dropped)."""
    from tokenizers import Tokenizer

    from webinfer.package import Package
    from tests.gpu_fixtures import generate_ids
    from webinfer_packager.reference.model import ReferenceModel

    pkg = Package.open(smollm2_package)
    tok = Tokenizer.from_str(pkg.read_file(pkg.manifest["tokenizer"]["file"]).decode())
    facts = ["The river rises in the northern hills and runs south for two hundred miles.",
             "Its water feeds three towns, a paper mill and a long canal built in 1820.",
             "In spring the snow melts and the river floods the low meadows near the mill.",
             "The canal was closed in 1950, and its locks are now a walking path.",
             "Fishermen catch trout in the upper river and carp near the old town bridge."]
    text = " ".join(facts[(7 * i) % 5] for i in range(34)) + " Question: where do fishermen catch carp? Answer:"
    p = tok.encode(text, add_special_tokens=False).ids
    assert 560 <= len(p) <= 640, len(p)
    runner = _runner(pkg, num_blocks=48, block_size=16, max_batch_tokens=128, max_seqs=2, max_model_len=704)
    ref = ReferenceModel.from_package(pkg, max_seq_len=704)
    got = generate_ids(pkg, p, 8, runner=runner)
    logits = ref.forward(p + got[:-1], 0)
    want = [int(i) for i in np.argmax(logits[len(p) - 1:], axis=-1)]
    assert got == want, (got, want)
    table = list(range(1, 1 + -(-len(p) // 16)))
    runner.full_logits = True
    for c in range(0, len(p), 128):  # (the prompt's own prefill, chunk by chunk, fresh blocks)
        chunk = p[c:c + 128]
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, chunk, c, table[: -(-(c + len(chunk)) // 16)],
                                                       c + 128 >= len(p))])))
    err = float(np.abs(np.asarray(runner.logits(1)[0]) - logits[len(p) - 1]).max())
    assert err < 2e-3, err  # (measured 5.5e-5; a floor of e^-2 instead of 2^-64 changes the greedy ids)
    runner.close()


def test_a_model_too_big_packed_loads_in_its_package_layouts(tiny_qwen, monkeypatch):
    """The packed GEMV layouts hold more bytes than the package's; when the module's memory (here a lowered limit,
    in the page the tab's or the 4 GiB wasm32 ceiling) fits the model only in its package layouts, load lays it out
    again in them: it runs, slower, with the reference's ids; below even that, the memory error names what did not
    fit."""
    from webinfer.cpu import load_cpu_runner
    from webinfer.cpu.runner import Arena
    from webinfer.cpu.wasm import WasmMemoryError

    kw = {"num_blocks": 24, "max_model_len": 64, "max_seqs": 4}
    packed = asyncio.run(load_cpu_runner(tiny_qwen, **kw))
    assert packed.packed_weights and packed.pack_reason == "packed GEMV layouts"
    top_packed = packed.arena.top
    monkeypatch.setattr(Arena, "LIMIT", top_packed - 1)
    small = asyncio.run(load_cpu_runner(tiny_qwen, **kw))
    assert not small.packed_weights and "did not fit" in small.pack_reason, small.pack_reason
    assert small.arena.top < top_packed
    from tests.gpu_fixtures import generate_ids

    assert generate_ids(tiny_qwen, PROMPTS[0], 8, runner=small) == _reference(tiny_qwen, PROMPTS[0], 8)
    monkeypatch.setattr(Arena, "LIMIT", small.arena.top - 1)
    with pytest.raises(WasmMemoryError, match="does not fit"):
        asyncio.run(load_cpu_runner(tiny_qwen, **kw))


LOW_BIT = ("q3k", "q2k", "iq4nl", "iq4xs")


@pytest.fixture(scope="module")
def low_bit_packages(tmp_path_factory):
    """Tiny llamas with every matrix (the tied embedding / LM head too) in one of the low-bit GGUF formats: d = 256
    and f = 512, whole super-blocks of 256."""
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack

    tmp = tmp_path_factory.mktemp("low_bit")
    write_hf(tmp / "hf", arch="llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64)
    return {q: pack(tmp / "hf", tmp / q, quant=q, embedding=q, progress=False) for q in LOW_BIT}


@pytest.mark.parametrize("quant", LOW_BIT)
@pytest.mark.parametrize("variant,packed,threads", [("base", True, 1), ("relaxed", True, 1), ("relaxed", False, 1),
                                                    ("relaxed", True, 2)])
def test_low_bit_formats_follow_the_reference(low_bit_packages, quant, variant, packed, threads):
    """q3k, q2k, iq4nl and iq4xs end to end (the embedding gather, every GEMV and prefill GEMM, the LM head), in
    the packed layouts and in the package layouts, on one thread and on two (split_k's part matrices): exact mode's
    greedy ids are the reference's, its logits within 1e-3; fast mode's within the int8 activations' error
    (test_batch_invariance_and_logits)."""
    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu.runner import CpuRunner
    from webinfer.cpu.wasm import WasmtimeHost
    from webinfer.package import Package
    from webinfer_packager.reference.model import ReferenceModel

    pkg = Package.open(low_bit_packages[quant])
    assert {t.dtype for t in pkg.tensors.values() if len(t.shape) == 2} == {quant}
    kw = {"num_blocks": 24, "block_size": 8, "max_batch_tokens": 16, "max_seqs": 4}
    runners = {}
    for mode in ("exact", "fast"):
        host = WasmtimeHost(variant, threads=threads)
        runners[mode] = asyncio.run(CpuRunner._load(host, pkg, pack=packed, mode=mode, **kw))
        assert runners[mode].packed_weights == packed
    for prompt in PROMPTS:
        assert generate_ids(pkg, prompt, 12, runner=runners["exact"]) == _reference(pkg, prompt, 12), prompt[:5]
    ref = ReferenceModel.from_package(pkg)
    prompts = [[5, 17, 200, 33, 1], list(range(3, 14))]
    for mode, runner in runners.items():
        for p, got in zip(prompts, _logits_alone_and_batched(runner, prompts)[0]):
            ref.reset()
            want = ref.forward(p, 0)[-1]
            if mode == "exact":
                assert np.abs(got - want).max() < 1e-3, f"max logit error {np.abs(got - want).max()}"
            else:
                rel = float(np.sqrt(np.mean((got - want) ** 2) / np.mean((want - want.mean()) ** 2)))
                assert rel < 0.08, f"fast mode: relative RMS logit error {rel:.4f}"
        runner.close()


def test_barrier_polls_follow_the_step_thread_count(tiny_llama):
    """Threads that outnumber the cores block at barriers at once (a poller only delays the partner waiting for its
    core); a step on fewer of them polls again: the Team's spins follow each count the runner switches to."""
    import struct

    from webinfer.cpu.wasm import SPINS

    runner = _runner(tiny_llama, threads=4)
    runner.host.cores = 2  # as on a 2-core machine, whatever this one has

    def team():  # kernels.c Team: nth, spins
        return struct.unpack("<2I", runner.host.read(runner.host.team, 8))

    try:
        for n, want in ((2, (2, SPINS)), (4, (4, 0)), (1, (4, 0)), (3, (3, 0)), (2, (2, SPINS))):
            runner._use_threads(n)
            assert team() == want and runner.threads_used == n, (n, team())
            asyncio.run(runner.execute(StepBatch([SeqChunk(0, [5, 17, 200], 0, [1], True)])))  # (a step runs)
    finally:
        runner.close()


def test_kv_f16_is_refused_not_ignored(tiny_llama):
    """The CPU engine has no f16 KV cache: asking for one is an error naming the option (it used to load the f32
    cache silently, twice the memory the caller planned for)."""
    import webinfer
    from webinfer.errors import WebinferError
    from webinfer.factory import EngineOptions

    with pytest.raises(WebinferError, match="kv_f16=True: the CPU engine keeps its KV cache in f32"):
        asyncio.run(webinfer.load(tiny_llama, backend="cpu", options=EngineOptions(kv_f16=True, context_tokens=64)))


def test_calibrate_head_sets_the_models_band_limit(tiny_llama):
    """CpuRunner.calibrate_head times the exact LM head in one pass and in two (a greedy row) on a real activation
    row and writes the break-even band (1 - two / one, within [0, 0.5]; 0 below HEAD_WIDE_MIN) into the Model, which
    two_pass_head reads (test_a_wide_band_takes_the_one_pass_head_next pins it); the engine's native load
    (webinfer.factory) runs it."""
    from tests.gpu_fixtures import generate_ids
    from webinfer.cpu.runner import _HEAD_WIDE_WORD, HEAD_WIDE, HEAD_WIDE_MIN
    from webinfer.factory import EngineOptions, load_cpu_runner
    from webinfer.package import Package

    r = _runner(tiny_llama)
    try:
        before = generate_ids(tiny_llama, [5, 17, 200], 8, runner=r)
        assert r.head_wide == HEAD_WIDE
        cal = r.calibrate_head()
        assert cal["one_ms"] > 0 and cal["two_ms"] > 0 and 0.0 <= cal["break_even"] <= 0.5, cal
        assert cal["break_even"] == pytest.approx(min(0.5, max(0.0, 1 - cal["two_ms"] / cal["one_ms"])),
                                                  abs=0.002 + 1e-4 / cal["one_ms"])  # (ms rounded to 4 places)
        assert cal["head_wide"] == (cal["break_even"] if cal["break_even"] >= HEAD_WIDE_MIN else 0.0), cal
        word = struct.unpack("<f", r.host.read(r.model_off + 4 * _HEAD_WIDE_WORD, 4))[0]
        assert word == pytest.approx(cal["head_wide"]) and r.head_wide == cal["head_wide"]
        assert generate_ids(tiny_llama, [5, 17, 200], 8, runner=r) == before  # (the null block only)
    finally:
        r.close()
    r = asyncio.run(load_cpu_runner(Package.open(tiny_llama), EngineOptions(context_tokens=256)))
    try:
        assert r.head_calibration is not None, "the native load did not calibrate"
        word = struct.unpack("<f", r.host.read(r.model_off + 4 * _HEAD_WIDE_WORD, 4))[0]
        assert word == pytest.approx(r.head_calibration["head_wide"]) and 0.0 <= word <= 0.5
    finally:
        r.close()


def _prompt_scores(pkg, runner, prompts):
    """Each prompt's prompt logprobs (top 3) through the engine, chunks of 16 and score groups of 4 rows."""
    from tests.gpu_fixtures import prompt_logprobs_of

    return prompt_logprobs_of(pkg, runner, prompts, budget=16, seqs=4, top=3)


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen"])
def test_prompt_logprobs_on_threads_give_the_bits_of_one(request, which):
    """Prompt logprobs (kernels.c wi_head: the LM head's columns split among the step's threads, thread 0 samples)
    on 2 and 3 threads: bit-identical to one thread, which is the numpy reference's within 1e-4 (tiny_llama: the
    split_k residual each thread keeps)."""
    import math

    from webinfer_packager.reference.runner import ReferenceRunner

    pkg = request.getfixturevalue(which)
    prompts = [PROMPTS[2], PROMPTS[0]]  # 37 tokens: 3 chunks, 9 groups of 4 scored rows
    want = _prompt_scores(pkg, ReferenceRunner.from_package(str(pkg), in_thread=False), prompts)
    one = _prompt_scores(pkg, _runner(pkg), prompts)
    for p, w, g in zip(prompts, want, one):
        assert len(g) == len(p) - 1
        assert all(math.isclose(lg, lw, abs_tol=1e-4) for (lw, *_), (lg, *_) in zip(w, g)), (w, g)
        assert [rw for *_, rw in w] == [rg for *_, rg in g]  # each prompt token's rank in the vocabulary
    for threads in (2, 3):
        assert _prompt_scores(pkg, _runner(pkg, threads=threads), prompts) == one, threads
