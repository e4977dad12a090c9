"""The CPU engine's kernels (wasm/kernels.c, the .wasm the page loads) in wasmtime against numpy.

Every weight format against a numpy decoder of the formats.py spec (tests/cpu/formats_np.py): dequantization is
bit-exact; the exact-mode GEMV/GEMM agrees with float64 numpy; the fast mode agrees with numpy's model of it (int8
activations per 32-block) and is bit-identical between the base and relaxed-SIMD builds; a row gives the same bits
alone and in a batch. RMSNorm, RoPE, paged attention, SwiGLU and exp against webinfer_packager.reference; sampling
against a numpy statement of the GPU sampler's rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cpu.formats_np import decode, random_components
from tests.cpu.harness import WasmMem, check, read_by_draw
from webinfer.formats import k_padded
from webinfer.kernels.sampling import SampleRow, pack
from webinfer.kernels.sampling import uniform
from webinfer_packager.reference import model as ref

LOW_BIT = [("q3k", 256), ("q2k", 256), ("iq4nl", 32), ("iq4xs", 256)]  # GGUF Q3_K, Q2_K, IQ4_NL, IQ4_XS
FORMATS = [("q4", 32), ("q4", 128), ("q4a", 32), ("q4a", 64), ("q8", 32), ("q5_0", 32), ("q5_1", 32), ("q4k", 256),
           ("q5k", 256), ("q6k", 256), *LOW_BIT, ("f32", None)]
# the formats the runner repacks into the packed GEMV layout (wi_repack; q4k as q4a, q5_0, iq4nl and iq4xs as q8,
# q6k as q8 with a scale per half, q5_1 and q5k as bytes with a b term, q2k and q3k as nibbles with (a, b) per
# half): tested in both layouts (q4 and q4a at groups over 32 keep the package layout)
PACKED = [("q4", 32), ("q4a", 32), ("q8", 32), ("q5_0", 32), ("q5_1", 32), ("q4k", 256), ("q5k", 256), ("q6k", 256),
          *LOW_BIT]
LAYOUTS = [(d, g, False) for d, g in FORMATS] + [(d, g, True) for d, g in PACKED]
SIGNED_CODES = ("q5_0", "q6k")  # packed as q8's signed bytes, q - 16 and q - 32


@pytest.fixture(scope="module", params=["base", "relaxed"])
def mem(request):
    return WasmMem(request.param)


@pytest.fixture(scope="module")
def both():
    return WasmMem("base"), WasmMem("relaxed")


def _weight(mem, dtype, gs, n, k, seed, bias=None, packed=False):
    rng = np.random.default_rng(seed)
    comps = random_components(dtype, n, k, gs, rng)
    return mem.weight(dtype, n, k, gs, comps, bias, packed), decode(dtype, comps, n, k, gs)


@pytest.mark.parametrize("dtype,gs,packed", LAYOUTS)
def test_dequant_bit_exact(mem, dtype, gs, packed):
    n, k = 7, 300  # K not a multiple of any group: padding columns must not leak; 7 rows: a partial packed group
    w, (want, _, _, _) = _weight(mem, dtype, gs, n, k, 1, packed=packed)
    out = mem.empty((n, k))
    mem.call("wi_dequant_rows", w, 0, n, out.off)
    got = out.read()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        f"{dtype}: first mismatch at {np.argwhere(got != want)[:1]}"


def _quantize_x(x, kp, qmax=127):
    """Fast mode's activations: per 32-element block d = amax / qmax, q = round(x / d) (numpy's rint = the wasm's);
    qmax 127 (int8) or 32767 (int16, the down projection's)."""
    xp = np.zeros((x.shape[0], kp), np.float32)
    xp[:, : x.shape[1]] = x
    blocks = xp.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(qmax)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv)
    return (q * d).reshape(x.shape[0], kp)[:, : x.shape[1]]


@pytest.mark.parametrize("dtype,gs,packed", LAYOUTS)
@pytest.mark.parametrize("fast", [0, 1, 2])
def test_linear(mem, dtype, gs, packed, fast):
    n, k, rows = 37, 300, 6  # 6 rows: one GEMM tile (packed) or a tile of 4 and two single rows; 37: a partial group
    rng = np.random.default_rng(2)
    bias = rng.standard_normal(n).astype(np.float32)
    w, (_, q, a, b) = _weight(mem, dtype, gs, n, k, 3, bias, packed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    xa = mem.put(x)
    y0 = rng.standard_normal((rows, n)).astype(np.float32)
    y = mem.put(y0)
    kp = k if dtype == "f32" else k_padded(k, gs)
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", rows, kp))
    mem.call("wi_linear", w, xa.off, k, y.off, n, rows, 1, fast, scratch.off)
    x64, aq = x.astype(np.float64), (a.astype(np.float64) * q)
    if fast and dtype != "f32":  # a * q against the int8 activations, b against the exact ones
        xq = _quantize_x(x, kp, 32767 if fast == 2 else 127).astype(np.float64)
        want = xq @ aq.T + x64 @ b.astype(np.float64).T
        if packed and dtype in SIGNED_CODES:  # a * (q - z) as one signed code: b meets the int8 activations too
            want = xq @ (aq + b).T
    else:
        want = x64 @ (aq + b).T
    want = want + bias + y0
    scale = np.abs(x64) @ np.abs(aq + b).T  # the size of the terms summed: the rounding error scales with it
    got = y.read()
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-5), f"{dtype}: max err {np.abs(got - want).max()}"
    # batch invariance: each row alone gives the same bits as inside the 6-row batch
    for r in range(rows):
        one = mem.put(y0[r:r + 1])
        mem.call("wi_linear", w, xa.off + 4 * k * r, k, one.off, n, 1, 1, fast, scratch.off)
        assert np.array_equal(one.read()[0], got[r]), f"{dtype}: row {r} alone differs from the batch"


# sampled rows the two-pass head takes (kernels.c head_cut): min_p alone and with top-k / top-p, a wide band (T 2),
# top-k alone (head_topk_floor); and rows it must leave wholly exact: top-p without min_p, temperature alone (top-k =
# the vocabulary keeps every id too)
HEAD_SAMPLED = [dict(temperature=1.0, min_p=0.1), dict(temperature=0.5, top_k=40, top_p=0.9, min_p=0.05),
                dict(temperature=2.0, top_p=0.5, min_p=0.02), dict(temperature=0.3, top_k=3, min_p=0.2),
                dict(temperature=1.0, top_k=40), dict(temperature=2.0, top_k=7)]
HEAD_EXACT = [dict(temperature=0.7, top_p=0.95), dict(temperature=1.5, top_k=40, top_p=0.5), dict(temperature=0.25),
              dict(temperature=0.5, top_k=384)]


@pytest.mark.parametrize("dtype,gs", PACKED)
def test_two_pass_head_samples_as_the_one_pass_head(mem, dtype, gs):
    """The LM head's two passes for sampled rows (kernels.c head_cut): the logits row it leaves (candidates' groups
    exact, bounds above the logits elsewhere) holds every logit the sampler reads exact (min_p's kept ones, top-k
    alone's k) and samples the one-pass head's ids, for every packed format, the sampled settings the cut covers and
    16 seeds each; the cut leaves rows out (else the test would not test it). Top-p without min_p and temperature
    alone sum every id's term: their cut leaves the whole row exact.
    Logits spread ~4 apart (x scaled to it), so each band holds some of the 384 rows and not all."""
    n, k = 384, 600
    rng = np.random.default_rng(17)
    w = mem.weight(dtype, n, k, gs, random_components(dtype, n, k, gs, rng), packed=True)
    kp = k_padded(k, gs)
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", 1, kp))
    left_out = [0] * len(HEAD_SAMPLED)
    for xi in range(3):
        x = rng.standard_normal(k).astype(np.float32)
        for _ in range(2):  # scale x until the logits' spread is ~4
            xa, e = mem.put(x), mem.empty((1, n))
            mem.call("wi_linear", w, xa.off, k, e.off, n, 1, 0, 0, scratch.off)
            x = (x * 4.0 / max(float(e.read().std()), 1e-30)).astype(np.float32)
        xa = mem.put(x)
        mem.call("wi_linear", w, xa.off, k, e.off, n, 1, 0, 0, scratch.off)
        exact = e.read()[0]
        for ci, c in enumerate(HEAD_SAMPLED + HEAD_EXACT):
            rows = [SampleRow(0, seed=seed, index=3 * seed + xi, **c) for seed in range(16)]
            y = mem.empty((1, n))
            mem.call("wi_head_two_pass", w, xa.off, y.off, scratch.off,
                     mem.put(np.frombuffer(pack(rows[:1], n).params, np.uint8)).off)
            g = y.read()[0]
            same = g.view(np.uint32) == exact.view(np.uint32)
            assert (g[~same] > exact[~same]).all(), (dtype, c)
            filters = c.get("top_k", 0), c.get("top_p", 1.0), c.get("min_p", 0.0)
            read = read_by_draw(exact, c["temperature"], *filters)
            assert same[read].all(), f"{dtype} {c}: a logit the sampler reads is a bound"
            if c in HEAD_SAMPLED:
                left_out[ci] += int((~same).sum())
            assert _sample(mem, y, n, rows) == _sample(mem, e, n, rows), (dtype, c, xi)
    narrow = [lo for c, lo in zip(HEAD_SAMPLED, left_out) if c["temperature"] < 2]  # (T 2: the wide band)
    assert all(narrow), f"{dtype}: a setting's cut left no row out: {list(zip(HEAD_SAMPLED, left_out))}"


@pytest.mark.parametrize("dtype,gs,packed", [("q4a", 32, False), ("q6k", 256, False), ("f32", None, False),
                                             ("q4a", 32, True), ("q8", 32, True), ("q6k", 256, True),
                                             ("q4k", 256, True), ("q5_0", 32, True), ("q2k", 256, False),
                                             ("iq4nl", 32, False), ("q3k", 256, True), ("q2k", 256, True),
                                             ("iq4xs", 256, True)])
@pytest.mark.parametrize("fast", [0, 1, 2])
def test_split_linear_equals_the_whole(mem, dtype, gs, packed, fast):
    """Two threads' shares of a matrix (wi_linear_part: output columns [0, n0) and [n0, n), n0 a multiple of 4, as
    the threads build splits every matrix) give the whole GEMV's bits, each share writing only its columns."""
    n, k, rows = 37, 300, 5
    rng = np.random.default_rng(6)
    w, _ = _weight(mem, dtype, gs, n, k, 7, rng.standard_normal(n).astype(np.float32), packed)
    x = mem.put(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = rng.standard_normal((rows, n)).astype(np.float32)
    whole = mem.put(y0)
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", rows, k_padded(k, gs) if gs else k))
    mem.call("wi_linear", w, x.off, k, whole.off, n, rows, 1, fast, scratch.off)
    for n0 in (0, 20, 36):
        parts = mem.put(y0)
        mem.call("wi_linear_part", w, x.off, k, parts.off, n, rows, 1, fast, scratch.off, 0, n0)
        first = parts.read()
        assert np.array_equal(first[:, n0:], y0[:, n0:]), f"the share [0, {n0}) wrote past its columns"
        mem.call("wi_linear_part", w, x.off, k, parts.off, n, rows, 1, fast, scratch.off, n0, n)
        assert np.array_equal(parts.read(), whole.read()), f"{dtype}: split at {n0} differs from the whole"


@pytest.mark.parametrize("dtype,gs", PACKED)
def test_packed_parts_are_the_column_ranges(mem, dtype, gs):
    """wi_repack_part (the runner's split_k o and down: two matrices by input columns, each packed on its own): a
    part of units [u0, u1) decodes bit for bit to those columns of the whole, its GEMV (every mode) agrees with
    numpy on those columns alone, and nothing is written outside its bytes and descriptor."""
    from webinfer.cpu.runner import WEIGHT_WORDS

    n, k, rows = 37, 300, 3  # a partial packed group; K not a multiple of a unit: part 1 ends in the padding
    rng = np.random.default_rng(11)
    comps = random_components(dtype, n, k, gs, rng)
    want = decode(dtype, comps, n, k, gs)[0]
    src = mem.weight(dtype, n, k, gs, comps)
    total, nu = mem.call("wi_repack_bytes", src), k_padded(k, gs) // 32
    x = rng.standard_normal((rows, k)).astype(np.float32)
    for u0, u1 in ((0, 3), (3, nu)):
        dst = mem.scratch(total // nu * (u1 - u0))
        desc = mem.empty((WEIGHT_WORDS,), np.uint32)
        mem.call("wi_repack_part", src, dst.off, u0, u1, desc.off)
        dst.read(), desc.read()  # (their guards)
        c0, c1 = 32 * u0, min(k, 32 * u1)
        out = mem.empty((n, c1 - c0))
        mem.call("wi_dequant_rows", desc.off, 0, n, out.off)
        assert np.array_equal(out.read().view(np.uint32), want[:, c0:c1].view(np.uint32)), f"part {u0}..{u1}"
        xa = mem.put(np.ascontiguousarray(x[:, c0:c1]))
        scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", rows, 32 * (u1 - u0)))
        for fast in (0, 1, 2):
            y = mem.empty((rows, n))
            mem.call("wi_linear", desc.off, xa.off, c1 - c0, y.off, n, rows, 0, fast, scratch.off)
            got, x64 = y.read(), x[:, c0:c1].astype(np.float64)
            ref64 = x64 @ want[:, c0:c1].astype(np.float64).T
            scale = np.abs(x64) @ np.abs(want[:, c0:c1].astype(np.float64)).T
            tol = 1e-5 if fast == 0 else 2e-2 if fast == 1 else 1e-4  # int8 / int16 activations
            assert np.all(np.abs(got - ref64) <= tol * scale + 1e-5), f"part {u0}..{u1} fast {fast}"


@pytest.mark.parametrize("dtype,gs", PACKED)
@pytest.mark.parametrize("fast", [0, 1, 2])
def test_packed_gemm_equals_gemv_bitwise(mem, dtype, gs, fast):
    """The packed GEMM (tiles of up to 16 activation rows, integer sums of 16 units held before their float steps)
    against the 1-row GEMV, bit for bit, for every row count 1..37 (whole tiles, short last tiles, a single last
    row): decode and prefill rows must give the same bits (batch invariance). K = 600: 19 units, more than one
    chunk of 16; 37 weight rows: a partial packed group."""
    n, k, T = 37, 600, 37
    rng = np.random.default_rng(7)
    w, _ = _weight(mem, dtype, gs, n, k, 8, rng.standard_normal(n).astype(np.float32), packed=True)
    x = mem.put((rng.standard_normal((T, k)) * rng.uniform(0.01, 10, (T, 1))).astype(np.float32))
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", T, k_padded(k, gs)))
    one = []
    for r in range(T):
        y = mem.empty((1, n))
        mem.call("wi_linear", w, x.off + 4 * k * r, k, y.off, n, 1, 0, fast, scratch.off)
        one.append(y.read()[0])
    one = np.stack(one)
    for rows in range(1, T + 1):
        y = mem.empty((rows, n))
        mem.call("wi_linear", w, x.off, k, y.off, n, rows, 0, fast, scratch.off)
        got = y.read()
        bad = np.argwhere(got.view(np.uint32) != one[:rows].view(np.uint32))
        assert not len(bad), f"{dtype} mode {fast}: {rows} rows, row {bad[0][0]} differs from its GEMV"


def test_every_format_has_a_kernel_code():
    """runner.DTYPE_CODES (kernels.c's F_* enum) names every format of webinfer/formats.py, each code once."""
    from webinfer.cpu.runner import DTYPE_CODES
    from webinfer.formats import FORMATS

    assert set(DTYPE_CODES) == set(FORMATS) and len(set(DTYPE_CODES.values())) == len(DTYPE_CODES)


@pytest.mark.parametrize("dtype,gs", LOW_BIT)
@pytest.mark.parametrize("packed", [False, True])
def test_gguf_blocks_decode_as_gguf_quants(mem, dtype, gs, packed):
    """Random GGUF blocks of the low-bit types (quant_ref.random_gguf: finite d of either sign, values of unit size)
    re-laid into the spec's components (quant_ref.from_gguf, ggml's block structs, shared with the GPU tests): the
    module's dequantization (the embedding gather) equals gguf.quants.dequantize bit for bit in both layouts, as does
    the spec decoder; the GEMV and a 5-row prefill agree with float64 numpy on those values in exact mode and with
    numpy's int8 model of fast mode."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize as gguf_dequantize

    from tests.gpu.quant_ref import GGUF_TYPES, from_gguf, random_gguf

    n, k, rows = 23, 512, 5
    rng = np.random.default_rng(31)
    gguf_type = {v: t for t, v in GGUF_TYPES.items()}[dtype]
    blocks = random_gguf(gguf_type, n, k, seed=31)
    want = gguf_dequantize(blocks, T[gguf_type]).astype(np.float32)
    comps = {c: v.tobytes() for c, v in from_gguf(gguf_type, blocks, k).items()}
    v, q, a, b = decode(dtype, comps, n, k, gs)
    assert np.array_equal(v.view(np.uint32), want.view(np.uint32)), "formats_np against gguf.quants"
    w = mem.weight(dtype, n, k, gs, comps, packed=packed)
    out = mem.empty((n, k))
    mem.call("wi_dequant_rows", w, 0, n, out.off)
    got = out.read()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        f"{dtype}: first mismatch at {np.argwhere(got.view(np.uint32) != want.view(np.uint32))[:1]}"
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    xa = mem.put(x)
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", rows, k))
    x64, w64 = x.astype(np.float64), want.astype(np.float64)
    scale = np.abs(x64) @ np.abs(w64).T
    for fast in (0, 1):
        y = mem.empty((rows, n))
        mem.call("wi_linear", w, xa.off, k, y.off, n, rows, 0, fast, scratch.off)
        if fast:
            xq = _quantize_x(x, k).astype(np.float64)
            aq = a.astype(np.float64) * q
            ref64 = xq @ aq.T + x64 @ b.astype(np.float64).T
            if packed and dtype in SIGNED_CODES:
                ref64 = xq @ (aq + b).T
        else:
            ref64 = x64 @ w64.T
        err = np.abs(y.read() - ref64)
        assert np.all(err <= 1e-5 * scale + 1e-6), f"{dtype} fast {fast}: max err {err.max()}"


def test_bench_switch_skips_linear_and_resets(mem):
    """wi_bench_skip_linear (the step profile's remainder): while on, wi_linear leaves y untouched; off, it writes."""
    n, k = 8, 64
    w, _ = _weight(mem, "q4a", 32, n, k, 9, packed=True)
    x = mem.put(np.random.default_rng(9).standard_normal((1, k)).astype(np.float32))
    y0 = np.full((1, n), 7.0, np.float32)
    y = mem.put(y0)
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", 1, k))
    mem.call("wi_bench_skip_linear", 1)
    try:
        mem.call("wi_linear", w, x.off, k, y.off, n, 1, 0, 0, scratch.off)
        assert np.array_equal(y.read(), y0)
    finally:
        mem.call("wi_bench_skip_linear", 0)
    mem.call("wi_linear", w, x.off, k, y.off, n, 1, 0, 0, scratch.off)
    assert not np.array_equal(y.read(), y0)


def _exact_and_greedy(mem, w, n, k, kp, x):
    """The one-pass exact head's logits (wi_linear, exact mode) and the greedy head's (wi_greedy_head) for each row
    of x: [(exact row, greedy head's logits row, its id)]"""
    scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", 1, kp))
    out = []
    for row in x:
        xa = mem.put(row.astype(np.float32))
        y, g = mem.empty((1, n)), mem.empty((n,))
        mem.call("wi_linear", w, xa.off, k, y.off, n, 1, 0, 0, scratch.off)
        i = mem.call("wi_head_two_pass", w, xa.off, g.off, scratch.off, 0)
        out.append((y.read()[0], g.read(), i))
    return out


@pytest.mark.parametrize("dtype,gs", PACKED)
def test_greedy_head_picks_the_exact_heads_argmax(mem, dtype, gs):
    """kernels.c's greedy LM head (a bound pass on the high digits, then the candidates' groups again in full exact
    mode) against the one-pass exact head: the same id (lowest on ties), the candidates' groups bit for bit, every
    other row an upper bound of its exact logit. Rows in near-ties: 60 of 64 weight rows copy 4 base rows with one
    code changed, so many logits lie within the bound of the largest; x at scales 1e-3 .. 1e3, one row all zero
    (every logit equal: all candidates, id 0)."""
    n, k = 64, 600
    rng = np.random.default_rng(11)
    comps = random_components(dtype, n, k, gs, rng)
    q = np.frombuffer(comps["qweight"], np.uint8).reshape(n, -1).copy()
    for r in range(4, n):  # near-copies of rows 0-3: one byte of the codes changed
        q[r] = q[r % 4]
        q[r, rng.integers(q.shape[1])] ^= 1 << rng.integers(8)
    comps["qweight"] = q.tobytes()
    for c in ("scales", "mins", "super", "qhigh"):  # the same scales as the copied row (a code decides the order)
        if c in comps:
            a = np.frombuffer(comps[c], np.uint8).reshape(n, -1).copy()
            a[4:] = a[np.arange(4, n) % 4]
            comps[c] = a.tobytes()
    w = mem.weight(dtype, n, k, gs, comps, packed=True)
    x = rng.standard_normal((12, k)) * np.geomspace(1e-3, 1e3, 12)[:, None]
    x[5] = 0.0
    for e, g, i in _exact_and_greedy(mem, w, n, k, k_padded(k, gs), x.astype(np.float32)):
        assert i == int(np.argmax(e)), (dtype, i, int(np.argmax(e)))
        same = g.view(np.uint32) == e.view(np.uint32)
        assert same[i - i % 4: i - i % 4 + 4].all()  # the argmax's group computed exactly
        assert (g[~same] > e[~same]).all()  # elsewhere bounds above the exact logits


def test_greedy_head_keeps_rows_the_high_digits_alone_would_drop(mem):
    """x in exact mode is X = hi * 256 + lo per element (X = rint(x / D)); the first pass sees hi only. Row 1's
    logit is a * D * 256 (one code on X = 256: hi 1), row 2's a * D * 381 (three on X = 127: hi 0, lo 127): row 1
    leads the first pass, row 2 the exact head. A bound that ignored the low digits (or a second pass over the first
    pass's leader alone) returns 1; the head must return 2, as the one-pass head does."""
    n, k = 8, 64
    codes = np.zeros((n, k), np.int8)
    codes[1, 3], codes[2, 9] = 1, 3
    comps = {"qweight": codes.tobytes(), "scales": np.full(n * k // 32, 0.01, np.float16).tobytes()}
    w = mem.weight("q8", n, k, 32, comps, packed=True)
    x = np.zeros((1, k), np.float32)
    x[0, 0] = 127 * 65536 * 2.0 ** -20  # the block's amax: D = amax / (127 * 65536) = 2^-20
    x[0, 3], x[0, 9] = 256 * 2.0 ** -20, 127 * 2.0 ** -20
    [(e, g, i)] = _exact_and_greedy(mem, w, n, k, k, x)
    assert int(np.argmax(e)) == 2 and e[2] > e[1] > 0
    assert i == 2


@pytest.mark.parametrize("dtype,gs,packed", [("q4a", 32, False), ("q6k", 256, False), ("q5k", 256, False),
                                             ("q8", 32, False), ("q4a", 32, True), ("q4", 32, True), ("q8", 32, True),
                                             ("q6k", 256, True), ("q4k", 256, True), ("q5_0", 32, True),
                                             ("q5_1", 32, True), ("q5k", 256, True)] +
                         [(d, g, p) for d, g in LOW_BIT for p in (False, True)])
@pytest.mark.parametrize("fast", [0, 1, 2])
def test_base_and_relaxed_builds_agree_bitwise(both, dtype, gs, packed, fast):
    n, k, rows = 20, 512, 5
    x = np.random.default_rng(4).standard_normal((rows, k)).astype(np.float32)
    outs = []
    for mem in both:
        w, _ = _weight(mem, dtype, gs, n, k, 5, packed=packed)
        y = mem.empty((rows, n))
        scratch = mem.scratch(mem.call("wi_linear_scratch_bytes", rows, k))
        mem.call("wi_linear", w, mem.put(x).off, k, y.off, n, rows, 0, fast, scratch.off)
        outs.append(y.read())
    assert np.array_equal(outs[0], outs[1])


def test_rmsnorm(mem):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((3, 100)).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    y = mem.empty((3, 100))
    mem.call("wi_rmsnorm", mem.put(x).off, 100, mem.put(w).off, y.off, 100, 3, 100, 1e-5)
    check(y, ref.rmsnorm(x, w, 1e-5), atol=1e-6, rtol=1e-5, name="rmsnorm")


@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope(mem, scaling):
    from webinfer.cpu.runner import rope_tables

    hd, heads, npos = 16, 3, 300
    cos_b, sin_b = rope_tables(hd, 10000.0, scaling, npos)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, heads * hd)).astype(np.float32)
    pos = np.array([0, 1, 77, 299], np.uint32)
    xa = mem.put(x)
    mem.call("wi_rope", xa.off, 4, heads * hd, heads, hd, mem.put(np.frombuffer(cos_b, np.float32)).off,
             mem.put(np.frombuffer(sin_b, np.float32)).off, mem.put(pos).off)
    want = ref.rope(x.reshape(4, heads, hd), pos, 10000.0, hd, scaling).reshape(4, heads * hd)
    check(xa, want, atol=2e-5, rtol=1e-5, name="rope")


# hd 16: scores 4 positions at a time; 70: per position, and P.V in two 8-vector passes, one 1-vector pass and 2
# scalar elements. q x 40: most exp arguments below -87 (expf_'s own path: tiny and zero results). The family
# options: a query pre-attention scale (mul), soft-capped scores (Gemma 2), a sliding window of 3 (Mistral, Gemma),
# which leaves every query row's first keys out, across the table's blocks.
@pytest.mark.parametrize("hd,qscale,mul,cap,window", [(16, 1.0, 0.0, 0.0, 0), (70, 1.0, 0.0, 0.0, 0),
                                                      (16, 40.0, 0.0, 0.0, 0), (16, 3.0, 0.3, 2.0, 0),
                                                      (16, 1.0, 0.0, 0.0, 3), (70, 2.0, 0.2, 1.5, 5)])
def test_paged_attention(mem, hd, qscale, mul, cap, window):
    H, Hkv, bs, nb = 6, 2, 4, 12
    rng = np.random.default_rng(8)
    S, start = 10, 7  # positions 0..9; query rows for positions 7, 8, 9
    k, v = rng.standard_normal((2, S, Hkv, hd)).astype(np.float32)
    table = [9, 2, 5]  # positions 0-3 in block 9, 4-7 in block 2, 8-9 in block 5
    kc, vc = np.zeros((nb, bs, Hkv, hd), np.float32), np.zeros((nb, bs, Hkv, hd), np.float32)
    for p in range(S):
        kc[table[p // bs], p % bs], vc[table[p // bs], p % bs] = k[p], v[p]
    q = (rng.standard_normal((S - start, H, hd)) * qscale).astype(np.float32)
    out = mem.empty((S - start, H * hd))
    scores = mem.empty((2 * (S + 4),))  # (kernels.c attend_row: the scores, then the positions' cache offsets)
    mem.call("wi_attention", mem.put(q).off, out.off, S - start, mem.put(kc).off, mem.put(vc).off,
             mem.put(np.array(table, np.uint32)).off, start, H, Hkv, hd, bs, scores.off, mul, cap, window)
    want = ref.attention(q, k, v, np.arange(start, S), scale=mul or None, window=window or None,
                         cap=cap or None).reshape(S - start, H * hd)
    check(out, want, atol=1e-5, rtol=1e-4, name="attention")


def test_geglu_and_softcap(mem):
    """Gemma's MLP activation and soft-capping, over the range where tanh saturates and near 0 (its series)."""
    rng = np.random.default_rng(10)
    g, u = (rng.standard_normal((2, 1000)) * 6).astype(np.float32)
    g[:50] = np.linspace(-0.3, 0.3, 50, dtype=np.float32)
    ga = mem.put(g)
    mem.call("wi_geglu", ga.off, mem.put(u).off, 1000)
    # 1 + tanh cancels where tanh nears -1 (in the reference too): the error bound scales with 0.5 |g u|, the
    # factor the tanh's rounding (a few ulp of 1: measured 3.2e-7 of it at most, both sides' f32 tanh) multiplies
    err = np.abs(ga.read() - ref.geglu(g, u))
    assert np.all(err <= 1e-6 + 5e-7 * np.abs(0.5 * g * u)), float((err / (1e-6 + np.abs(0.5 * g * u))).max())
    x = np.concatenate([np.linspace(-200, 200, 4001), np.linspace(-1, 1, 2001)]).astype(np.float32)
    for cap in (5.0, 30.0):
        xa = mem.put(x)
        mem.call("wi_softcap", xa.off, x.size, cap)
        check(xa, ref.softcap(x, cap), atol=3e-6 * cap, rtol=1e-6, name=f"softcap {cap}")


def test_swiglu_and_exp(mem):
    rng = np.random.default_rng(9)
    g, u = (rng.standard_normal((2, 1000)) * 6).astype(np.float32)
    ga = mem.put(g)
    mem.call("wi_swiglu", ga.off, mem.put(u).off, 1000)
    check(ga, ref.swiglu(g, u), atol=1e-6, rtol=1e-5, name="swiglu")
    x = np.concatenate([np.linspace(-110, 89, 20001, dtype=np.float32), [-np.inf, 0.0]]).astype(np.float32)
    y = mem.empty(x.shape)
    mem.call("wi_exp", mem.put(x).off, y.off, x.size)
    got, want = y.read(), np.exp(x.astype(np.float64))
    big = want > float(np.finfo(np.float32).max)
    normal = (want > 1.2e-38) & ~big
    assert np.all(np.abs(got[normal] - want[normal]) <= 3e-7 * want[normal])  # ~2 ulp
    assert np.all(np.abs(got[want <= 1.2e-38] - want[want <= 1.2e-38]) <= 1e-44)
    assert np.all(np.isposinf(got[big]))



def test_softmax_exp_vector_and_scalar_agree_and_drop_weights_below_2_to_the_minus_64(mem):
    """attend_row's softmax exp (kernels.c softmax_exp, and expf4 4 at a time): expf_ bit for bit where x - mx >=
    -64 ln 2, exactly 0 below (subnormal weights cost x86 ~100x per operation: a long context's attention time);
    the vector path's bits equal the scalar path's everywhere."""
    x = np.concatenate([np.linspace(-120, 0, 40000, dtype=np.float32), [-np.inf, -44.3614, -44.3615, -87.0, 0.0,
                        -0.0, -1e-30, -1e30]]).astype(np.float32)
    x = np.concatenate([x, np.zeros((-x.size) % 4, np.float32)])
    for mx in (0.0, 3.5, -20.0):
        d = x - np.float32(mx)
        plain, scalar, vec = mem.empty(x.shape), mem.empty(x.shape), mem.empty(x.shape)
        mem.call("wi_exp", mem.put(d).off, plain.off, x.size)
        mem.call("wi_softmax_exp", mem.put(x).off, scalar.off, x.size, mx, 0)
        mem.call("wi_softmax_exp", mem.put(x).off, vec.off, x.size, mx, 1)
        p, a, b = plain.read(), scalar.read(), vec.read()
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))[:8]
        kept = d >= np.float32(-44.3614196)
        assert np.array_equal(a[kept].view(np.uint32), p[kept].view(np.uint32))
        assert not a[~kept].any() and (~kept).sum() > 1000 and kept.sum() > 1000
        assert a[kept].min() >= 2.0 ** -64 * 0.99  # (nothing kept is subnormal)


def _kept(logits, temperature, top_k, top_p):
    """The GPU sampler's rule (webinfer/kernels/sampling.py) in numpy float64, up to the draw: every id's term
    exp((l - max) / T) and which ids top-k and top-p keep."""
    V = logits.size
    e = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    order = np.lexsort((np.arange(V), -logits))
    keep = order[:top_k] if 0 < top_k < V else order
    if top_p < 1:
        c = np.cumsum(e[keep])
        keep = keep[: int(np.searchsorted(c, top_p * c[-1])) + 1]
    kept = np.zeros(V, bool)
    kept[keep] = True
    return e, kept


def _rule(logits, temperature, top_k, top_p, seed, index):
    """The GPU sampler's rule in numpy float64: the inverse CDF in id order over _kept's ids."""
    if temperature <= 0 or top_k == 1:
        return int(np.argmax(logits))
    e, kept = _kept(logits, temperature, top_k, top_p)
    cdf = np.cumsum(np.where(kept, e, 0))
    r = uniform(seed, index) * cdf[-1]
    return int(min(np.searchsorted(cdf, r, side="right"), np.flatnonzero(kept).max()))


def _sample(mem, la, V, rows, counts=None, logprobs=None):
    """wi_sample over the logits at `la` for SampleRows, packed as the runner packs them (sampling.pack); counts /
    logprobs: WasmArrays of the token counts slots and the logprob words (None: none)."""
    packed = pack(rows, V)
    out = mem.empty((len(rows),), np.uint32)
    scratch = mem.scratch(21 * V + 64)
    mem.call("wi_sample", la.off, V, mem.put(np.frombuffer(packed.params, np.uint8)).off,
             mem.put(np.frombuffer(packed.aux, np.uint8)).off, len(rows), out.off, scratch.off,
             counts.off if counts is not None else 0, logprobs.off if logprobs is not None else 0)
    return out.read().tolist()


def test_sampling_matches_rule(mem):
    V = 1000
    rng = np.random.default_rng(10)
    logits = (rng.standard_normal((4, V)) * 3).astype(np.float32)
    logits[0, [17, 400]] = 50.0  # a tie at the maximum: the lowest id wins
    cases = [(0, 0.0, 0, 1.0), (1, 0.8, 0, 1.0), (2, 1.0, 40, 1.0), (3, 0.7, 0, 0.9), (1, 1.3, 100, 0.5),
             (2, 0.5, 1, 1.0), (0, 1.0, 2, 1.0)]
    la = mem.put(logits)
    for seed in range(5):
        rows = [(r, t, k, p, seed, 3 * seed + i) for i, (r, t, k, p) in enumerate(cases)]
        got = _sample(mem, la, V, [SampleRow(*row) for row in rows])
        want = [_rule(logits[r], t, k, p, s, i) for r, t, k, p, s, i in rows]
        assert got == want
    assert want[0] == 17 and want[-1] in (17, 400)


def test_draws_over_a_262k_vocabulary_are_the_float64_rules(mem):
    """Gemma 3's vocabulary (262,144) with a long tail: temperature alone (every id's term in the sums) and top-p
    whose goal is a fraction of the whole mass. The sums were floats, summed in id order: a term under half an ulp
    of the running sum rounded away, and with a quarter of the tokens there the mass and the walk were off by ~1e-3
    of the total (Gemma 3 at T 1.5: the first token hundreds of ids from the reference's). In doubles, the ids are
    the float64 rule's but for draws that land within 1e-7 of a CDF step (the terms are f32 exps)."""
    from webinfer_packager.reference.runner import inverse_cdf

    rng = np.random.default_rng(262)
    V = 262144
    lg = np.empty((3, V), np.float32)
    lg[0] = rng.standard_normal(V) * 2.5 - 40.0  # a few strong tokens over a long tail (real logits' shape)
    lg[0, rng.integers(0, V, 60)] += rng.uniform(4.0, 9.0, 60).astype(np.float32)
    lg[1] = rng.standard_normal(V) * 4 - 40.0  # broad
    lg[2] = -40.0 - 17.5 * rng.uniform(0.99, 1.0, V)  # one id at the top, every other term just under the head
    lg[2, 77] = -40.0
    la = mem.put(lg)
    cases = [(0, 1.5, 1.0), (0, 1.0, 1.0), (1, 2.0, 1.0), (0, 2.0, 0.99), (1, 0.7, 0.95), (0, 1.0, 0.95),
             (2, 1.0, 0.99999), (2, 1.0, 1.0)]
    rows, want, unsure = [], [], 0
    for i, (r, t, p) in enumerate(cases):
        e, keep = _kept(lg[r], t, 0, np.float32(p))  # (top_p as the module reads it)
        prob = np.where(keep, e, 0.0) / e[keep].sum()
        for seed in range(4):
            rows.append(SampleRow(r, t, 0, p, seed=seed, index=9 * i + seed))
            tid, gap = inverse_cdf(prob, uniform(seed, 9 * i + seed))
            want.append(tid if gap > 1e-7 else None)
            unsure += gap <= 1e-7
    got = _sample(mem, la, V, rows)
    bad = [(row, g, w) for row, g, w in zip(rows, got, want) if w is not None and g != w]
    assert not bad, f"{len(bad)} of {len(rows)} draws are not the rule's, e.g. {bad[:3]}"
    assert unsure <= 3 and len(set(got)) > 20


def test_sampling_controls_match_reference(mem):
    """Structured-output mask, logit_bias and min_p: the reference Sampler's processed logits and distribution
    (webinfer_packager.reference.model.Sampler, float64), drawn by inverse CDF in id order at uniform(seed, index)
    as the GPU sampler draws."""
    V = 700
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((3, V)) * 2).astype(np.float32)
    la = mem.put(logits)
    allowed = rng.random(V) < 0.3
    allowed[[5, 699]] = True
    mask = np.packbits(np.pad(allowed, (0, -V % 32)).reshape(-1, 8)[:, ::-1]).tobytes()  # bit i of word i // 32
    bias = ((3, 8.0), (450, 5.5), (699, -2.0), (10, -100.0))
    cases = [dict(logit_bias=bias), dict(mask=mask), dict(mask=mask, logit_bias=bias), dict(min_p=0.05),
             dict(min_p=0.3, top_k=50), dict(min_p=0.1, mask=mask, logit_bias=bias, top_p=0.8)]
    for seed in range(4):
        for temperature in (0.0, 0.7, 1.5):
            rows, want = [], []
            for i, c in enumerate(cases):
                row = SampleRow(i % 3, temperature, c.get("top_k", 0), c.get("top_p", 1.0), seed, 5 * seed + i,
                                min_p=c.get("min_p", 0.0), logit_bias=c.get("logit_bias", ()), mask=c.get("mask"))
                rows.append(row)
                s = ref.Sampler(temperature, row.top_k, row.top_p, min_p=row.min_p, logit_bias=dict(row.logit_bias))
                z = s.process(logits[row.logit_row], allowed=allowed if row.mask is not None else None)
                if temperature == 0:
                    want.append(int(np.argmax(z)))
                    continue
                cdf = np.cumsum(s.probs(z))
                want.append(int(np.searchsorted(cdf, uniform(seed, row.index) * cdf[-1], side="right")))
            got = _sample(mem, la, V, rows)
            assert got == want, (seed, temperature)
            assert all(allowed[t] for t, r in zip(got, rows) if r.mask is not None)


def _draw_rows(V, rng):
    """Logit rows for draw()'s head (kernels.c HEAD_X): a peaked row, a flat one, a long tail straddling the head's
    edge at every temperature tested, ties (at the maximum and inside the head), and a row mostly -inf."""
    peaked = rng.standard_normal(V) * 2
    peaked[[3, 900]] += 25.0
    flat = rng.standard_normal(V) * 0.01
    tail = 10.0 + rng.uniform(-12.0, -5.0, V)
    tail[[7, 1000, 2999]] = 10.0
    ties = np.round(rng.standard_normal(V) * 3)
    ties[[11, 12, 2500]] = ties.max() + 1.0
    masked = np.full(V, -np.inf)
    masked[rng.choice(V, 30, replace=False)] = rng.standard_normal(30) * 4
    return np.stack([peaked, flat, tail, ties, masked]).astype(np.float32)


def test_draw_sorts_only_the_head(mem):
    """With top-p or top-k, draw() sorts only the sampler's head (ids whose term can change a sorted mass: kernels.c
    HEAD_X) where that gives what sorting every id gives (wi_test_sort_all: the rule as written): the same ids, over
    rows built to reach the head's edges, temperatures from 0.3 to 1.5 (the tail row's terms on both sides of the
    edge), top-p 1 / 0.95 / 0.5, top-k off / 5 / 40 / 2500 (past the head), min_p off / 0.05, 12 seeds."""
    V = 3000
    logits = _draw_rows(V, np.random.default_rng(13))
    la = mem.put(logits)
    rows = [SampleRow(r, t, k, p, seed, 7 * seed + r, min_p=m)
            for r in range(len(logits)) for t in (0.3, 0.7, 1.5) for p in (1.0, 0.95, 0.5) for k in (0, 5, 40, 2500)
            for m in (0.0, 0.05) for seed in range(12)]
    head = _sample(mem, la, V, rows)
    mem.call("wi_test_sort_all", 1)
    try:
        every = _sample(mem, la, V, rows)
    finally:
        mem.call("wi_test_sort_all", 0)
    diff = [(r, a, b) for r, a, b in zip(rows, head, every) if a != b]
    assert not diff, f"{len(diff)} of {len(rows)} draws differ, e.g. {diff[:3]}"
    assert len(set(every)) > 100  # (draws spread over many ids: the comparison can see a changed mass)


def test_draw_skips_only_terms_that_round_away(mem):
    """With every id kept, draw() and the logprobs' log-sum-exp skip a term below TINY_X once their running sum (a
    double) is >= 2^-60 (kernels.c tiny_term: expf_'s subnormal multiplies are slow): the same ids and logprob bits
    as summing every term (wi_test_sort_all), over rows whose terms fall deep into and past the subnormal range
    before and after the max, a sum still below 2^-60 when the first tiny terms come (the max last), and -inf;
    temperatures 0.5 / 1 / 2, 24 seeds, top-k = V (every id kept too), logprobs."""
    from webinfer.kernels.sampling import LOGPROB_BYTES, uniform

    V, rng = 3000, np.random.default_rng(21)
    deep = rng.uniform(-230.0, -40.0, V)  # (x = deep / T: past -104 at T 2, into the subnormals at T 0.5-2)
    deep[1500] = 0.0
    last = rng.uniform(-200.0, -80.0, V)  # the max last: the sum is a few subnormals until then
    last[V - 1] = 0.0
    mixed = rng.standard_normal(V) * 40
    mixed[rng.choice(V, 200, replace=False)] = -np.inf
    logits = np.stack([deep, last, mixed]).astype(np.float32)
    la = mem.put(logits)
    rows = [SampleRow(r, t, k, 1.0, seed, 5 * seed + r, logprobs=3)
            for r in range(len(logits)) for t in (0.5, 1.0, 2.0) for k in (0, V) for seed in range(24)]
    # uniform(0, 4666037) == 0: the walk stops at the first id whose term is > 0, a subnormal one in row `last`,
    # while its sum is still below 2^-60 (skipping every tiny term would stop at the first term >= e^TINY_X)
    zero = [SampleRow(1, t, 0, 1.0, 0, 4666037, logprobs=3) for t in (1.0, 2.0)]
    assert uniform(0, 4666037) == 0.0
    rows += zero

    def draws():
        lp = mem.empty((len(rows), LOGPROB_BYTES // 4), np.uint32)
        return _sample(mem, la, V, rows, logprobs=lp), lp.read().copy()

    ids, lp = draws()
    mem.call("wi_test_sort_all", 1)
    try:
        every, lp_every = draws()
    finally:
        mem.call("wi_test_sort_all", 0)
    assert ids == every and np.array_equal(lp, lp_every)
    for t, i in zip((1.0, 2.0), ids[-2:]):  # the first id with a subnormal term (x = (l - max) / T > -103.97)
        assert i == int(np.argmax(last / t > -103.97)) and (last[:i] / t > -87.0).sum() == 0, (t, i)
    x = (logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    assert ((x / 2.0 < mem.call("wi_test_tiny_x")) & (x / 2.0 > -103.0)).sum() > 1000  # (subnormal terms: many)


def test_sum_terms_four_at_a_time_is_one_at_a_time(mem):
    """draw()'s sum over every id (kernels.c sum_terms: exps 4 at a time where x is in [TINY_X, 0], tiny terms
    skipped) gives the bits of summing every term one at a time with expf_ (wi_test_sort_all), for the mass and for
    the walk's id at 64 points r, over rows of every kind (spread, deep, the max first / last, NaN, -inf, a length
    not a multiple of 4), temperatures 0.3-2; mass_terms (the mass in four accumulators) agrees within 1e-14."""
    rng = np.random.default_rng(5)
    V = 4099
    rows = [rng.standard_normal(V) * s for s in (0.5, 3, 20, 60)] + [rng.uniform(-300, 0, V)]
    rows[4][[0, V - 1]] = 0.0
    nan = rng.standard_normal(V) * 4
    nan[77] = np.nan
    ninf = rng.standard_normal(V) * 4
    ninf[rng.choice(V, 500, replace=False)] = -np.inf
    out = mem.empty((1,), np.uint32)
    for row in rows + [nan, ninf]:
        la = mem.put(row.astype(np.float32))
        mx = float(np.nanmax(row.astype(np.float32)))
        for t in (0.3, 1.0, 2.0):
            got = {}
            for every in (0, 1):
                mem.call("wi_test_sort_all", every)
                try:
                    mass = np.float64(mem.call("wi_test_sum_terms", la.off, V, mx, 1.0 / t, -1.0, out.off))
                    ids = []
                    for u in np.linspace(0, 1, 64, endpoint=False):
                        mem.call("wi_test_sum_terms", la.off, V, mx, 1.0 / t, float(u * mass), out.off)
                        ids.append(int(out.read()[0]))
                finally:
                    mem.call("wi_test_sort_all", 0)
                got[every] = mass.view(np.uint64), ids
            assert got[0][0] == got[1][0] and got[0][1] == got[1][1], (t, row[:3])
            # mass_terms (four double accumulators, the mass draw() walks to): the same mass but for the last ulps
            quick = mem.call("wi_test_mass_terms", la.off, V, mx, 1.0 / t)
            whole = got[0][0].view(np.float64)
            assert (np.isnan(quick) and np.isnan(whole)) or abs(quick - whole) <= 1e-14 * whole, (t, quick, whole)


def test_tiny_terms_round_away(mem):
    """The premise of kernels.c tiny_term: every expf_(x) below TINY_X is under 2^-124, and adding it to a double
    sum >= 2^-60 rounds back to the same double (checked on expf_ itself, wi_exp, down to -inf)."""
    tx = np.float32(mem.call("wi_test_tiny_x"))
    below = np.nextafter(tx, np.float32(-np.inf))
    x = np.concatenate([[below], np.linspace(below, -110.0, 20001, dtype=np.float32), [-np.inf]]).astype(np.float32)
    xa, y = mem.put(x), mem.empty((len(x),))
    mem.call("wi_exp", xa.off, y.off, len(x))
    t = y.read().astype(np.float64)
    assert t.max() < 2.0 ** -124 and (t > 0).sum() > 10000  # (subnormal results, as the draws compute them)
    lo = 2.0 ** -60
    for m in (lo, np.nextafter(lo, 1.0), 1.5 * lo, 1.0, 7.25, 262144.0):
        assert (np.float64(m) + t == m).all()
    assert not (np.float64(2.0 ** -75) + t == 2.0 ** -75).all()  # (a float threshold of 2^-100 would not do)


def test_penalties_and_logprobs_match_reference(mem):
    """Repetition / frequency / presence penalties from a counts slot (sampling.counts_slot_init: prompt marked,
    output counted) and logprobs, against the reference Sampler's process() and logprobs() in float64; the sampled
    id is counted in its slot."""
    from webinfer.kernels.sampling import LOGPROB_BYTES, counts_slot_init, unpack_logprobs

    V = 500
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal((2, V)) * 3).astype(np.float32)
    la = mem.put(logits)
    a0, a1 = (int(i) for i in logits.argmax(axis=1))
    prompt, output = [3, 7, 7, 400, 499, a1], [7, 12, 12, 12, 250, a0, a0]  # penalize both rows' best tokens
    cases = [dict(repetition_penalty=1.6), dict(frequency_penalty=0.8, presence_penalty=0.5, logprobs=5),
             dict(repetition_penalty=0.7, frequency_penalty=-0.4, logprobs=20), dict(logprobs=0),
             dict(repetition_penalty=1.3, presence_penalty=2.0, logprobs=3, logit_bias=((12, 4.0),))]
    counts = np.bincount(output, minlength=V)
    # a slot per row (the engine never samples two rows of one sequence in a step), all alike
    slots = np.frombuffer(counts_slot_init(V, prompt, output) * len(cases), np.uint32)
    changed = 0  # greedy rows whose penalties change the argmax: the test can tell penalties from none
    for seed in range(3):
        for temperature in (0.0, 0.8):
            rows = [SampleRow(i % 2, temperature, 0, 0.9 if i == 4 else 1.0, seed, 3 * seed + i,
                              counts_slot=i if any(k.endswith("penalty") for k in c) else None, **c)
                    for i, c in enumerate(cases)]
            ca, lpa = mem.put(slots), mem.empty((len(rows), LOGPROB_BYTES // 4), np.uint32)
            got = _sample(mem, la, V, rows, ca, lpa)
            lps = unpack_logprobs(lpa.read().tobytes(), len(rows))
            added = np.zeros(len(cases) * V, np.int64)
            for row, t in zip(rows, got):
                s = ref.Sampler(temperature, 0, row.top_p, frequency_penalty=row.frequency_penalty,
                                presence_penalty=row.presence_penalty, repetition_penalty=row.repetition_penalty,
                                logit_bias=dict(row.logit_bias))
                pen = row.counts_slot is not None
                z = s.process(logits[row.logit_row], counts if pen else None, prompt if pen else ())
                if temperature == 0:
                    assert t == int(np.argmax(z))
                    changed += pen and t != int(np.argmax(logits[row.logit_row]))
                else:
                    cdf = np.cumsum(s.probs(z))
                    assert t == int(np.searchsorted(cdf, uniform(seed, row.index) * cdf[-1], side="right"))
                if pen:
                    added[row.counts_slot * V + t] += 1
                if row.logprobs is not None:
                    lsm, top = ref.Sampler.logprobs(z, row.logprobs)
                    lp, alts, rank = lps[rows.index(row)]
                    assert lp == pytest.approx(lsm[t], abs=1e-4)
                    assert rank == ref.Sampler.rank(z, t)
                    assert [i for i, _ in alts] == top.tolist()
                    assert [v for _, v in alts] == pytest.approx(lsm[top].tolist(), abs=1e-4)
            assert np.array_equal(ca.read().astype(np.int64), slots.astype(np.int64) + added)
    assert changed


def test_read_bandwidth_kernel_sums(mem):
    data = np.arange(64 * 4, dtype=np.uint32)
    assert mem.call("wi_read_bw", mem.put(data).off, data.nbytes, 2) == (2 * int(data.sum())) & 0xFFFFFFFF
