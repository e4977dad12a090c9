"""GPU sampling (shaders/sample.wgsl) against numpy: argmax with ties, top-k / top-p / temperature draws.

Run: python -m pytest tests/gpu/test_sampling.py -q

The oracle for a draw is `webinfer_packager.reference.model.Sampler.probs` (the filtered distribution, float64) and the
shader's own uniform u (mirrored in Python by `webinfer.kernels.sampling.uniform`): the expected id is the inverse
CDF of the numpy distribution at u. f32 vs f64 can only disagree when u lands within ~1e-5 of a CDF step; such draws
are skipped (and counted: they must be rare). A chi-square test over many seeds checks the distribution itself.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gpu.check_op import GpuArray, check_op, run
from webinfer.kernels.library import KernelLibrary
from webinfer.kernels.sampling import GpuSampler, SampleRow, pack_rows, uniform
from webinfer_packager.reference.model import Sampler
from webinfer_packager.reference.runner import inverse_cdf

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def lib(gpu_f32):
    return KernelLibrary(gpu_f32)


def _sample(dev, lib, logits: np.ndarray, rows: list[SampleRow]) -> np.ndarray:
    logits = np.ascontiguousarray(logits, np.float32).reshape(-1, logits.shape[-1])
    s = GpuSampler(lib, logits.shape[1])
    gl = GpuArray.upload(dev, logits)
    gp = GpuArray.upload(dev, np.frombuffer(pack_rows(rows), np.uint8))
    out = GpuArray.empty(dev, (len(rows),), np.uint32)
    b = s.bind(gl.binding, gp.binding, out.binding)
    run(dev, lambda c: s.encode(c, b, len(rows)))
    return out


def _expected(logits: np.ndarray, r: SampleRow) -> tuple[int, bool]:
    """(expected id, trustworthy): inverse CDF of the reference distribution at the shader's u."""
    if r.temperature == 0 or r.top_k == 1:
        return int(np.argmax(logits)), True
    j, gap = inverse_cdf(Sampler(r.temperature, r.top_k, r.top_p).probs(logits), uniform(r.seed, r.index))
    return j, gap >= 1e-5


def test_uniform_mirror_known_values():
    # pinned values: a change of the hash changes every seeded draw (the exact-id tests below show the shader
    # computes the same u as this mirror)
    assert (uniform(0, 0), uniform(123, 7), uniform(2**32 - 1, 2**32 - 1)) == (
        0.19039934873580933, 0.3366304039955139, 0.019744455814361572)
    assert 0.0 <= uniform(0, 0) < 1.0 and uniform(0, 0) != uniform(0, 1) and uniform(1, 0) != uniform(0, 0)
    u = np.array([uniform(7, i) for i in range(4000)])
    assert abs(u.mean() - 0.5) < 0.02 and u.min() >= 0 and u.max() < 1


# few distinct vocab sizes: each one is a pipeline compile (seconds on lavapipe)
@pytest.mark.parametrize("vocab", [1, 257, 3000, 49152, 50001])
def test_greedy_matches_argmax_with_ties(gpu_f32, lib, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.integers(-3, 4, size=(4, vocab)).astype(np.float32)  # many exact ties at the max
    logits[1] = -np.inf if vocab > 1 else 0.0
    logits[1, vocab // 2] = 0.0
    logits[2, :] = 1.5  # all equal: id 0
    rows = [SampleRow(i) for i in range(4)] + [SampleRow(3, temperature=0.7, top_k=1, seed=9)]
    ref = np.array([np.argmax(logits[i]) for i in (0, 1, 2, 3, 3)], np.uint32)
    check_op(_sample(gpu_f32, lib, logits, rows), ref, 0, 0, "argmax")


def test_big_vocabularies_scan_before_sampling(gpu_f32, lib):
    """From SCAN_MIN_VOCAB tokens on, a scan dispatch (one workgroup per SCAN_CHUNK logits) takes each chunk's
    argmax before the sampler: two dispatches, chunks = ceil(vocab / SCAN_CHUNK); below it, one. The ids it gives
    are checked by the tests at 49152, 50001 and 262144 (ties at the max spread over every chunk)."""
    from webinfer.kernels.sampling import SCAN_CHUNK, SCAN_MIN_VOCAB

    for vocab, chunks in [(3000, 0), (SCAN_MIN_VOCAB - 1, 0), (SCAN_MIN_VOCAB, 4), (50001, 13), (262144, 64)]:
        s = GpuSampler(lib, vocab)
        assert s.chunks == chunks and -(-vocab // SCAN_CHUNK) >= chunks, vocab
        out = GpuArray.empty(gpu_f32, (2,), np.uint32)
        b = s.bind(GpuArray.empty(gpu_f32, (2, vocab)).binding, GpuArray.empty(gpu_f32, (2, 16), np.uint32).binding,
                   out.binding)
        cmds = gpu_f32.commands()
        s.encode(cmds, b, 2)
        grids = [op[3:6] for op in cmds.ops if op[0] == "dispatch"]
        assert grids == ([(chunks, 2, 1)] if chunks else []) + [(2, 1, 1)], (vocab, grids)


def test_sampled_ids_match_reference_inverse_cdf(gpu_f32, lib):
    rng = np.random.default_rng(0)
    V = 3000
    logits = (rng.standard_normal((6, V)) * 3).astype(np.float32)
    logits[5, :100] = logits[5, 100]  # a block of ties for top-k/top-p boundaries
    rows, skipped = [], 0
    configs = [(1.0, 0, 1.0), (0.7, 50, 1.0), (1.3, 0, 0.9), (0.8, 40, 0.8), (2.0, 2999, 0.5), (1.0, 150, 0.95)]
    for s in range(8):
        for i, (t, k, p) in enumerate(configs):
            rows.append(SampleRow(i, t, k, p, seed=1234 + s, index=s * 3))
    got = _sample(gpu_f32, lib, logits, rows).read()
    for r, g in zip(rows, got):
        want, sure = _expected(logits[r.logit_row].astype(np.float64), r)
        if not sure:
            skipped += 1
            continue
        assert g == want, f"{r}: got {g}, want {want}"
    assert skipped <= 2


def test_sampling_full_vocab_49152(gpu_f32, lib):
    """SmolLM2's vocabulary (one workgroup loops over 49152 logits): exact ids vs the reference inverse CDF."""
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((2, 49152)) * 4).astype(np.float32)
    rows = [SampleRow(0, 1.0, 0, 0.9, seed=3), SampleRow(1, 0.7, 40, 1.0, seed=4, index=5),
            SampleRow(1, 1.2, 100, 0.8, seed=5, index=9), SampleRow(0, 1.0, 0, 1.0, seed=6)]
    got = _sample(gpu_f32, lib, logits, rows).read()
    for r, g in zip(rows, got):
        want, sure = _expected(logits[r.logit_row].astype(np.float64), r)
        assert g == want or not sure, f"{r}: got {g}, want {want}"


def _check_rows(dev, lib, logits, rows, max_unsure=0):
    got = _sample(dev, lib, logits, rows).read()
    unsure = 0
    for r, g in zip(rows, got):
        want, sure = _expected(logits[r.logit_row].astype(np.float64), r)
        unsure += not sure
        assert g == want or not sure, f"{r}: got {g}, want {want}"
    assert unsure <= max_unsure


def test_candidate_cutoff_edges_vocab_49152(gpu_f32, lib):
    """The histogram cut-off (shaders/sample.wgsl compact_candidates) at its edges, exact ids vs the reference:
    row 0 peaked (nucleus of a few tokens), row 1 flat (top-p 0.99: thousands of candidates), row 2 a huge range
    with -inf and most tokens in the last (catch-all) bucket, row 3 ties of the k-th value spread over ids,
    row 4 every token tied. The last two configurations (temperature alone) take the range-sum path."""
    rng = np.random.default_rng(21)
    V = 49152
    lg = np.empty((5, V), np.float32)
    lg[0] = rng.standard_normal(V) * 6
    lg[1] = rng.standard_normal(V) * 0.5
    lg[2] = rng.standard_normal(V) * 40
    lg[2, rng.integers(0, V, 500)] = -np.inf
    lg[3] = np.round(rng.standard_normal(V) * 2, 1)  # coarse values: many exact ties everywhere
    lg[4] = 0.25
    rows = []
    for i, (t, k, p) in enumerate([(1.0, 0, 0.9), (1.0, 0, 0.99), (0.7, 0, 0.999), (1.0, 0, 0.5), (1.0, 0, 0.3),
                                   (1.0, 30000, 1.0), (1.5, 3000, 0.97), (2.0, 40, 0.9), (1.0, 777, 1.0),
                                   (1.0, 100, 0.6), (1.0, 0, 1.0), (0.5, 0, 1.0)]):
        for row in range(5):
            rows.append(SampleRow(row, t, k, p, seed=100 + i, index=row))
    # flat and all-tied rows put CDF steps ~1/V apart, so some draws land within 1e-5 of one (unverifiable)
    _check_rows(gpu_f32, lib, lg, rows, max_unsure=len(rows) // 4)


def test_top_p_on_a_262k_vocabulary(gpu_f32, lib):
    """Gemma 3's vocabulary (262,144: 13 fraction bits for the histogram's fixed-point masses). With a long tail
    of tokens far below the max, summing each token's own mass in fixed point counted the tail as 0, top-p 0.95
    never reached its goal and the whole vocabulary became candidates: ~21 passes of 4096 elements a lane, past
    llvmpipe's 65 535 loop iterations per invocation, and lavapipe sampled id 0 every time. The bound is now taken
    relative to each bucket, and the candidate passes visit four elements per loop iteration, so a near-1 top-p
    or a high temperature (a long candidate list) stays within that budget too. Exact ids vs the reference."""
    rng = np.random.default_rng(262)
    V = 262144
    lg = np.empty((2, V), np.float32)
    lg[0] = rng.standard_normal(V) * 2.5 - 40.0  # real logits' shape: a few strong tokens over a long tail
    lg[0, rng.integers(0, V, 60)] += rng.uniform(4.0, 9.0, 60).astype(np.float32)
    lg[1] = rng.standard_normal(V) * 4 - 40.0  # broader: T 2, top-p 0.99 keeps 165k of the tokens
    rows = []
    for i, (t, p) in enumerate([(0.7, 0.95), (1.0, 0.95), (0.7, 0.9999), (2.0, 0.99), (1.0, 0.5)]):
        for row in range(2):
            rows += [SampleRow(row, t, 0, p, seed=7 + i, index=j) for j in range(2)]
    _check_rows(gpu_f32, lib, lg, rows, max_unsure=4)  # 3 of these 20 draws land within 1e-5 of a CDF step


@pytest.mark.parametrize("vocab", [50001, 262144])
def test_temperature_alone_draws_from_the_scans_chunk_masses(gpu_f32, lib, vocab):
    """A temperature alone on a big vocabulary (sample.wgsl sample_chunks): the scan sums each chunk's masses
    relative to its max, the sampler picks the chunk, then the lane range, then the id. Exact ids vs the reference
    over rows built for its edges: a long tail (real logits' shape), a spread row, a row whose first, a middle and
    (at 50001: the partial) last chunk are all -inf, the max in the last chunk, ties at the max in two chunks; T
    0.5-2; mixed in one dispatch with rows that take other paths (greedy, top-p, a mask: no chunk masses)."""
    from webinfer.kernels.sampling import SCAN_CHUNK

    rng = np.random.default_rng(vocab)
    lg = np.empty((5, vocab), np.float32)
    lg[0] = rng.standard_normal(vocab) * 2.5 - 40.0
    lg[0, rng.integers(0, vocab, 60)] += rng.uniform(4.0, 9.0, 60).astype(np.float32)
    lg[1] = rng.standard_normal(vocab) * 5
    lg[2] = rng.standard_normal(vocab) * 5
    last = (vocab - 1) // SCAN_CHUNK
    for c in (0, last // 2, last):
        lg[2, c * SCAN_CHUNK:(c + 1) * SCAN_CHUNK] = -np.inf
    lg[3] = rng.standard_normal(vocab) * 3
    lg[3, vocab - 3] = 16.0  # the max in the last chunk
    lg[4] = np.round(rng.standard_normal(vocab) * 4, 1)
    lg[4, [5, vocab // 2]] = 19.0  # tied at the max, chunks apart
    rows = []
    for r, temps in enumerate(((1.0, 2.0), (0.5, 1.0), (0.7, 1.0), (0.5, 1.0), (0.5, 1.0))):
        for i, t in enumerate(temps):
            rows += [SampleRow(r, t, 0, 1.0, seed=31 + i, index=j) for j in range(3)]
    rows += [SampleRow(0, 0.0), SampleRow(1, 1.0, 0, 0.9, seed=3), SampleRow(4, 1.0, 0, 1.0, seed=4),
             SampleRow(3, 0.7, vocab, 1.0, seed=5)]  # (top-k = the vocabulary: every id kept too)
    # (up to 8 of the 34 draws land within 1e-5 of a CDF step: the f32 sums cannot decide those)
    _check_rows(gpu_f32, lib, lg, rows, max_unsure=8)
    assert len({int(g) for g in _sample(gpu_f32, lib, lg, rows).read()}) > 15


def test_more_rows_than_out_ids_is_rejected(gpu_f32, lib):
    s = GpuSampler(lib, 257)
    gl = GpuArray.upload(gpu_f32, np.zeros((2, 257), np.float32))
    gp = GpuArray.upload(gpu_f32, np.frombuffer(pack_rows([SampleRow(0)] * 2), np.uint8))
    out = GpuArray.empty(gpu_f32, (1,), np.uint32)
    b = s.bind(gl.binding, gp.binding, out.binding)
    with pytest.raises(ValueError, match="out_ids holds 1"):
        s.encode(gpu_f32.commands(), b, 2)
    big = GpuArray.empty(gpu_f32, (70000,), np.uint32)  # 70000 rows x 257 x 8 bytes > 128 MiB of candidates
    with pytest.raises(ValueError, match="candidate space"):
        s.bind(gl.binding, gp.binding, big.binding)


def test_seeded_determinism_and_batch_invariance(gpu_f32, lib):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 777)).astype(np.float32)
    rows = [SampleRow(r, 0.9, 20, 0.9, seed=42, index=i) for r in range(3) for i in range(5)]
    a = _sample(gpu_f32, lib, logits, rows).read()
    b = _sample(gpu_f32, lib, logits, rows[::-1]).read()[::-1]
    assert np.array_equal(a, b)
    alone = _sample(gpu_f32, lib, logits, rows[7:8]).read()
    assert alone[0] == a[7]
    assert len(set(a[:5].tolist())) > 1, "different sample indices should not all give the same token"


@pytest.mark.slow
def test_distribution_chi_square(gpu_f32, lib):
    """Many seeds over a small vocab: the sampled frequencies follow the numpy filtered distribution."""
    rng = np.random.default_rng(5)
    V, n = 257, 2500  # top_k=8 below leaves a small category count
    logits = rng.standard_normal((1, V)).astype(np.float32)
    r0 = SampleRow(0, 0.8, 8, 0.9)
    p = Sampler(r0.temperature, r0.top_k, r0.top_p).probs(logits[0].astype(np.float64))
    rows = [SampleRow(0, r0.temperature, r0.top_k, r0.top_p, seed=s, index=0) for s in range(n)]
    got = _sample(gpu_f32, lib, logits, rows).read()
    counts = np.bincount(got, minlength=V)
    assert counts[p == 0].sum() == 0, "sampled a token the filters removed"
    keep = p > 0
    exp = p[keep] * n
    chi2 = float(((counts[keep] - exp) ** 2 / exp).sum())
    assert 2 <= keep.sum() <= 8
    # chi-square with (kept - 1) <= 7 degrees of freedom: 99.9 % quantile is 24.3
    assert chi2 < 24.3, f"chi2={chi2:.1f}, counts={counts[keep]}, expected={exp.round(1)}"


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([2, 257, 3000]), st.floats(0.2, 2.0), st.integers(0, 60), st.floats(0.3, 1.0), st.integers(0, 2**32 - 1))
def test_sampling_hypothesis(gpu_f32, lib, V, temp, top_k, top_p, seed):
    logits = (np.random.default_rng(seed % 1000).standard_normal((1, V)) * 2).astype(np.float32)
    r = SampleRow(0, temp, top_k, top_p, seed=seed, index=seed % 97)
    g = int(_sample(gpu_f32, lib, logits, [r]).read()[0])
    want, sure = _expected(logits[0].astype(np.float64), r)
    if sure:
        assert g == want, f"{r}: got {g}, want {want}"


# -- per-row controls: mask, logit_bias, penalties (GPU token counts), min_p, logprobs ---------------------------------

from webinfer.kernels.sampling import LOGPROB_WORDS, PROMPT_BIT, pack, unpack_logprobs  # noqa: E402

V_CTL = 3000


def _sample_ctl(dev, lib, logits: np.ndarray, rows: list[SampleRow], counts: np.ndarray | None = None):
    """Run the sampler with aux / counts / logprobs bound: (ids, counts after, [(logprob, top, rank)] per row)."""
    logits = np.ascontiguousarray(logits, np.float32).reshape(-1, logits.shape[-1])
    V = logits.shape[1]
    s = GpuSampler(lib, V)
    packed = pack(rows, V)
    gl = GpuArray.upload(dev, logits)
    gp = GpuArray.upload(dev, np.frombuffer(packed.params, np.uint8))
    ga = GpuArray.upload(dev, np.frombuffer(packed.aux, np.uint8))
    gc = GpuArray.upload(dev, np.zeros((1, V), np.uint32) if counts is None else counts.astype(np.uint32))
    glp = GpuArray.empty(dev, (len(rows), LOGPROB_WORDS), np.uint32)
    out = GpuArray.empty(dev, (len(rows),), np.uint32)
    b = s.bind(gl.binding, gp.binding, out.binding, ga.binding, gc.binding, glp.binding)
    run(dev, lambda c: s.encode(c, b, len(rows)))
    lp = glp.read()  # guards checked; rows without logprobs leave the guard pattern
    return out.read(), gc.read(), unpack_logprobs(lp.tobytes(), len(rows))


def _reference(r: SampleRow, logits: np.ndarray, counts: np.ndarray | None) -> tuple[Sampler, np.ndarray]:
    """The reference sampler for row r and its processed logits (float64)."""
    ref = Sampler(r.temperature, r.top_k, r.top_p, min_p=r.min_p, frequency_penalty=r.frequency_penalty,
                  presence_penalty=r.presence_penalty, repetition_penalty=r.repetition_penalty,
                  logit_bias=dict(r.logit_bias))
    allowed = None
    if r.mask is not None:
        words, ids = np.frombuffer(r.mask, np.uint32), np.arange(logits.shape[-1])
        allowed = ((words[ids // 32] >> (ids % 32)) & 1).astype(bool)
    c = counts[r.counts_slot] if r.counts_slot is not None else None
    z = ref.process(logits[r.logit_row].astype(np.float64), None if c is None else c & 0x7FFFFFFF,
                    [] if c is None else np.nonzero(c & PROMPT_BIT)[0].tolist(), allowed)
    return ref, z


def _expected_ctl(r: SampleRow, logits, counts) -> tuple[int, bool]:
    ref, z = _reference(r, logits, counts)
    if r.temperature == 0 or r.top_k == 1:
        return int(np.argmax(z)), True
    j, gap = inverse_cdf(ref.probs(z), uniform(r.seed, r.index))
    return j, gap >= 1e-5


def _mask_words(allowed: np.ndarray) -> bytes:
    V = allowed.size
    bits = np.zeros(((V + 31) // 32) * 32, np.uint64)
    bits[:V] = allowed
    words = (bits.reshape(-1, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(np.uint32)
    return words.tobytes()


def _control_rows(rng, n_rows: int, n_slots: int) -> list[SampleRow]:
    rows = []
    for i in range(n_rows):
        t = [0.0, 0.8, 1.2][i % 3]
        allowed = rng.random(V_CTL) < [1.0, 0.3, 0.02, 0.001][i % 4]
        allowed[rng.integers(0, V_CTL)] = True
        bias = {int(k): float(rng.normal() * 5) for k in rng.integers(0, V_CTL, size=[0, 3, 40][i % 3])}
        rows.append(SampleRow(i % 4, t, [0, 40, 0][i % 3], [1.0, 0.9, 1.0][i % 3], seed=77 + i, index=i,
                              min_p=[0.0, 0.05, 0.2][(i // 3) % 3], frequency_penalty=[0.0, 0.7, -0.3][i % 3],
                              presence_penalty=[0.0, 0.5, 1.5][(i + 1) % 3], repetition_penalty=[1.0, 1.3, 0.8][i % 3],
                              logit_bias=tuple(bias.items()), counts_slot=i % n_slots,
                              mask=_mask_words(allowed) if i % 4 else None))
    return rows


def test_controls_match_reference(gpu_f32, lib):
    """Mask, logit_bias, the three penalties (prompt bits and output counts on the GPU), min_p, with greedy and
    sampled rows: exact ids vs the numpy reference; counts gain exactly the sampled ids."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((4, V_CTL)) * 3).astype(np.float32)
    n_slots = 24
    counts = rng.integers(0, 3, size=(n_slots, V_CTL)).astype(np.uint32) * (rng.random((n_slots, V_CTL)) < 0.05)
    counts |= (rng.random((n_slots, V_CTL)) < 0.02).astype(np.uint32) * PROMPT_BIT
    rows = _control_rows(rng, n_slots, n_slots)  # one row per slot: no two rows count into the same slot
    ids, after, _ = _sample_ctl(gpu_f32, lib, logits, rows, counts)
    unsure = 0
    for r, g in zip(rows, ids):
        want, sure = _expected_ctl(r, logits, counts)
        unsure += not sure
        assert g == want or not sure, f"{r}: got {g}, want {want}"
        if r.mask is not None:
            assert np.frombuffer(r.mask, np.uint32)[g // 32] >> (g % 32) & 1, "sampled a masked token"
    assert unsure <= 2
    expect = counts.copy()
    for r, g in zip(rows, ids):
        expect[r.counts_slot, g] += 1
    assert np.array_equal(after, expect)


@pytest.mark.parametrize("V", [257, V_CTL])  # 257: lanes hold fewer tokens than top_logprobs asks for
def test_logprobs_match_numpy(gpu_f32, lib, V):
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((2, V)) * 2).astype(np.float32)
    logits[1, 10:30] = logits[1].max()  # ties at the top: lowest ids first
    allowed = rng.random(V) < 0.5
    allowed[5] = True
    rows = [SampleRow(0, 0.0, logprobs=5), SampleRow(0, 1.0, seed=5, logprobs=20), SampleRow(1, 0.7, 30, 0.9, seed=6,
            logprobs=20), SampleRow(1, 0.0, logprobs=0), SampleRow(0, 1.0, seed=7, logprobs=3, mask=_mask_words(allowed),
            logit_bias=((5, 30.0),)), SampleRow(1, 0.0),
            SampleRow(1, 0.0, logprobs=2, score_id=15), SampleRow(0, 0.0, logprobs=1, score_id=V - 1)]
    ids, _, lps = _sample_ctl(gpu_f32, lib, logits, rows)
    for r, g, (lp, top, rank) in zip(rows, ids, lps):
        if r.logprobs is None:
            continue
        _, z = _reference(r, logits, None)
        lsm, best = Sampler.logprobs(z, r.logprobs)
        x = g if r.score_id is None else r.score_id  # the reported id: its logprob and its rank in the vocabulary
        assert abs(lp - lsm[x]) < 1e-4, (r, lp, lsm[x])
        assert rank == Sampler.rank(z, x), (r, rank)
        assert [i for i, _ in top] == best.tolist(), r
        assert np.allclose([v for _, v in top], lsm[best], atol=1e-4)
    assert lps[4][1][0][0] == 5 and ids[4] == 5  # a bias of +30 makes token 5 the best by far
    assert all(allowed[i] for i, _ in lps[4][1]), "top_logprobs of a constrained row list only allowed tokens"
    assert lps[6][2] == 1 + (logits[1, :15] == logits[1].max()).sum() >= 6  # id 15 among the tied maxima: after
    # the lower ids 10..14 (and the row's own maximum where it was below 15)


def test_controls_batch_invariance(gpu_f32, lib):
    """A mixed batch (constrained, penalized, logprob and plain rows): every row equals its run alone."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((4, V_CTL)) * 3).astype(np.float32)
    counts = (rng.random((8, V_CTL)) < 0.05).astype(np.uint32) * 2
    rows = _control_rows(rng, 8, 8)
    rows = [SampleRow(**{**r.__dict__, "logprobs": [None, 4, 20][i % 3]}) for i, r in enumerate(rows)]
    rows.append(SampleRow(2, 0.9, 0, 1.0, seed=3))  # plain
    ids, after, lps = _sample_ctl(gpu_f32, lib, logits, rows, counts)
    for i in (0, 3, 5, 8):
        one, after1, lp1 = _sample_ctl(gpu_f32, lib, logits, [rows[i]], counts)
        assert one[0] == ids[i]
        if rows[i].logprobs is not None:
            assert lp1[0] == lps[i]
        if rows[i].counts_slot is not None:
            assert np.array_equal(after1[rows[i].counts_slot], after[rows[i].counts_slot])


def test_grammar_mask_constrains_sampling(gpu_f32, lib):
    """The grammar engine's mask words, uploaded as they are: every sampled token is one the grammar allows."""
    from webinfer.grammar import GrammarMatcher, TokenMasks, TokenVocab, json_schema_grammar

    pieces = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'"}', b"true", b"false", b"12", b", "]
    vocab = TokenVocab(pieces + [None] * (V_CTL - len(pieces)))
    stop = V_CTL - 1
    m = GrammarMatcher(TokenMasks(json_schema_grammar({"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "integer"}}, "required": ["a", "b"]}).compile(), vocab), [stop])
    rng = np.random.default_rng(6)
    text = b""
    for step in range(40):
        logits = (rng.standard_normal((1, V_CTL)) * 2).astype(np.float32)
        ids, _, _ = _sample_ctl(gpu_f32, lib, logits, [SampleRow(0, 1.0, seed=step, mask=m.mask_words())])
        t = int(ids[0])
        assert m.accept(t), f"sampled {t}, which the grammar forbids after {text!r}"
        if m.is_terminated():
            break
        text += vocab.token_bytes[t]
    json.loads(text)  # a prefix walk may end early (40 steps); when it ended it parses


def test_pack_and_counts_slot_init():
    from webinfer.kernels.sampling import ROW_BYTES, counts_slot_init

    p = pack([SampleRow(0, logit_bias={7: 1.5, 3: -2.0}, mask=b"\xff" * 8), SampleRow(1, logprobs=2)], 50)
    assert len(p.params) == 2 * ROW_BYTES
    words = np.frombuffer(p.aux, np.uint32)
    assert words[:2].tolist() == [0xFFFFFFFF] * 2 and words[2::2].tolist() == [3, 7]  # mask, then bias by id
    assert np.frombuffer(p.aux, np.float32)[3::2].tolist() == [-2.0, 1.5]
    for bad in [SampleRow(0, mask=b"\0" * 4), SampleRow(0, frequency_penalty=0.5), SampleRow(0, logprobs=21),
                SampleRow(0, logit_bias={50: 1.0}), SampleRow(0, min_p=1.5)]:
        with pytest.raises(ValueError):
            pack([bad], 50)
    with pytest.raises(ValueError, match="need pack"):
        pack_rows([SampleRow(0, logit_bias={1: 1.0})])
    c = np.frombuffer(counts_slot_init(10, [1, 2, 2], [2, 5, 5]), np.uint32)
    assert c.tolist() == [0, PROMPT_BIT, PROMPT_BIT + 1, 0, 0, 2, 0, 0, 0, 0]
