"""GEMV kernel (shaders/gemv.wgsl via webinfer.kernels.linear) for every weight format against numpy: weights from
random codes (tests/gpu/quant_ref.py, the formats.py formulas), reference = x @ W.T in float64.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m pytest tests/gpu/test_gemv.py -q
Tolerance: f32 accumulation over K in chunk order against float64: atol 4e-4 * sqrt(K) on outputs of magnitude
~sqrt(K) (weights and x of unit size), rtol 1e-4.
"""

import numpy as np
import pytest

from tests.gpu.check_op import GpuArray, check_op, run
from tests.gpu.quant_ref import FORMAT_NAMES, KQUANTS, interleave, random_weight, upload_weight
from webinfer.kernels.linear import Epilogue, Linear, LinearIO, LinearKey, linear_variant

pytestmark = pytest.mark.gpu


def step_buf(dev, *counts):
    return GpuArray.upload(dev, np.array(list(counts) + [0] * (4 - len(counts)), np.uint32)).binding


def tol(k):
    return 4e-4 * np.sqrt(k), 1e-4


def run_linear(dev, lib, dtype, n, k, t, gs=32, seed=0, bias=False, accumulate=False, swiglu=False, norm=False,
               tiles=None, eps=1e-5, ksplit=1):
    """One Linear(gemv) on random data; returns (out GpuArray, float32 reference)."""
    comps, wref = random_weight(dtype, n, k, gs, seed)
    if swiglu:
        comps = interleave(comps, n // 2)
    rng = np.random.default_rng(seed + 1)
    xs = -(-k // 4) * 4
    x = np.full((t, xs), np.nan, np.float32)  # padding beyond K must never be read
    x[:, :k] = rng.standard_normal((t, k)) * (3 if norm else 1) + (0.5 if norm else 0)
    x64 = x[:, :k].astype(np.float64)
    wn = None
    if norm:
        wn = np.zeros(xs, np.float32)
        wn[:k] = rng.uniform(0.5, 1.5, k)
        x64 = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps) * wn[:k]
    ref = x64 @ wref.T.astype(np.float64)
    n_out = n // 2 if swiglu else n
    if swiglu:
        g, u = ref[:, : n // 2], ref[:, n // 2:]
        ref = g / (1 + np.exp(-g)) * u
    y0 = rng.standard_normal((t, n_out)).astype(np.float32)
    out = GpuArray.upload(dev, y0) if accumulate else GpuArray.empty(dev, (t, n_out))
    if accumulate:
        ref = ref + y0
    b = None
    if bias:
        bnp = rng.standard_normal(n).astype(np.float32)
        ref = ref + bnp
        b = GpuArray.upload(dev, bnp).binding
    w = upload_weight(dev, dtype, n, k, comps, gs)
    ep = Epilogue(bias=b, accumulate=accumulate, swiglu=swiglu,
                  norm=(GpuArray.upload(dev, wn).binding, eps) if norm else None)
    lin = Linear(lib, w, LinearIO(GpuArray.upload(dev, x).binding, out.binding, xs, n_out, step_buf(dev, t)),
                 epilogue=ep, tiles=tiles, ksplit=ksplit)
    run(dev, lambda c: lin.encode(c, t))
    return out, ref.astype(np.float32)


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
@pytest.mark.parametrize("n,k,t", [(37, 77, 1), (130, 576, 9), (5, 600, 16)])
def test_gemv_matches_numpy(gpu, kernels, dtype, n, k, t):
    out, ref = run_linear(gpu, kernels, dtype, n, k, t, seed=n + k)
    check_op(out, ref, *tol(k), name=f"{dtype} {n}x{k} T={t}")


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
def test_gemv_group_64_and_128(gpu, kernels, dtype):
    for gs in (64, 128):
        out, ref = run_linear(gpu, kernels, dtype, 70, 300, 2, gs=gs, seed=gs)
        check_op(out, ref, *tol(300), name=f"{dtype} group {gs}")


@pytest.mark.parametrize("dtype", FORMAT_NAMES)
def test_gemv_epilogues_f32_and_without_subgroups(gpu_f32, lib_nosg, dtype):
    """bias, accumulate, swiglu and the folded RMSNorm (with swiglu, with bias) on the f32 device; accumulate on a
    device without subgroups, and norm + bias there for one format per family (the no-subgroup NORM variant is
    the slowest to compile on lavapipe: 15-100 s); decode tile 8 with a partial tile (3 rows) and K with a tail
    for the 32-chunk formats."""
    from webinfer.kernels.library import KernelLibrary

    k = 300 if dtype not in KQUANTS else 512
    lib32 = KernelLibrary(gpu_f32)
    cases = [(lib32, dict(bias=True)), (lib32, dict(accumulate=True)), (lib32, dict(swiglu=True)),
             (lib32, dict(norm=True, swiglu=True)), (lib32, dict(norm=True, bias=True)),
             (lib_nosg, dict(accumulate=True))]
    if dtype in ("q4a", "q5_0", "q6k", "q3k", "iq4xs"):
        cases.append((lib_nosg, dict(norm=True, bias=True)))
    for lib, kw in cases:
        out, ref = run_linear(lib.device, lib, dtype, 72, k, 3, seed=len(kw), tiles=(8,), **kw)
        check_op(out, ref, *tol(k) if not kw.get("swiglu") else (2e-3, 1e-4),
                 name=f"{dtype} {kw} sg={lib.device.caps.subgroups}")


def test_gemv_rows_beyond_step_count_untouched(gpu, kernels):
    # the kernel reads T from the step buffer: rows >= T must stay as they were (guard pattern = NaN)
    comps, wref = random_weight("q4k", 40, 256, seed=3)
    x = np.random.default_rng(4).standard_normal((4, 256)).astype(np.float32)
    out = GpuArray.empty(gpu, (4, 40))
    lin = Linear(kernels, upload_weight(gpu, "q4k", 40, 256, comps),
                 LinearIO(GpuArray.upload(gpu, x).binding, out.binding, 256, 40, step_buf(gpu, 2)))
    run(gpu, lambda c: lin.encode(c, 4))
    ref = np.full((4, 40), np.nan, np.float32)
    ref[:2] = x[:2] @ wref.T
    check_op(out, ref, *tol(256), "rows >= T")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("dtype,n,k,swiglu", [("q4a", 96, 576, True), ("q4", 70, 200, False), ("q8", 45, 77, False),
                                              ("q6k", 48, 300, True), ("q4k", 45, 512, False),
                                              ("q5_0", 45, 77, False), ("q3k", 48, 300, True),
                                              ("q2k", 45, 512, False), ("iq4nl", 45, 77, False),
                                              ("iq4xs", 48, 300, True)])
def test_gemv_decode_tile_row_alone_vs_among_15_bitwise(gpu, kernels, dtype, n, k, swiglu):
    """Decode tiles share the unpacked weights only: a row alone (tile 1 variant) and the same row in slot 7 or 12
    of a 16-row step (tile 8 variant, two tiles), or among 17 rows, give identical bits; with the folded RMSNorm,
    the swiglu or the bias epilogue, and K not a multiple of 32 (the element-wise tail)."""
    comps, _ = random_weight(dtype, n, k, seed=11)
    if swiglu:
        comps = interleave(comps, n // 2)
    rng = np.random.default_rng(12)
    xs = -(-k // 4) * 4
    x = np.full((17, xs), np.nan, np.float32)
    x[:, :k] = rng.standard_normal((17, k)) * 2
    wn = np.zeros(xs, np.float32)
    wn[:k] = rng.uniform(0.5, 1.5, k)
    w = upload_weight(gpu, dtype, n, k, comps)
    wn_b = GpuArray.upload(gpu, wn).binding
    bias = None if swiglu else GpuArray.upload(gpu, rng.standard_normal(n).astype(np.float32)).binding
    n_out = n // 2 if swiglu else n

    def go(rows, tiles=None):
        out = GpuArray.empty(gpu, (len(rows), n_out))
        lin = Linear(kernels, w, LinearIO(GpuArray.upload(gpu, x[rows]).binding, out.binding, xs, n_out,
                                          step_buf(gpu, len(rows))),
                     epilogue=Epilogue(bias=bias, swiglu=swiglu, norm=(wn_b, 1e-5)), tiles=tiles)
        run(gpu, lambda c: lin.encode(c, len(rows)))
        return out.read()

    for r in (7, 12):
        alone = go([r])
        assert not np.isnan(alone).any()
        assert np.array_equal(_bits(alone[0]), _bits(go(list(range(16)))[r])), f"row {r} among 16"
        assert np.array_equal(_bits(alone[0]), _bits(go(list(range(17)))[r])), f"row {r} among 17"
        assert np.array_equal(_bits(alone[0]), _bits(go([r, 0, 1, 2], tiles=(4,))[0])), f"row {r} in a tile of 4"
        assert np.array_equal(_bits(alone[0]), _bits(go([r], tiles=(8,))[0])), f"row {r} alone in a tile of 8"


@pytest.mark.parametrize("ksplit", [2, 8, 32])
def test_gemv_ksplit_matches_numpy(gpu, kernels, lib_nosg, ksplit):
    """KSPLIT lanes per row group (a GPU's layout): every format family, the epilogues (bias, accumulate, the
    folded RMSNorm with swiglu), K with a tail and fewer chunks than lanes (77: 2 chunks), N not a multiple of 4,
    partial tiles of 1, 4 and 8 rows, a tile past the row count (9 rows in tiles of 8: the second tile half empty),
    and once without subgroups. The 2-bit and codebook formats: K of several super-blocks (1100: 5, and 34
    chunks, so the lanes of KSPLIT 8 and 32 cross scale epochs and super-blocks at different chunks)."""
    cases = [("q4a", 130, 576, 9, {}), ("q4", 37, 77, 1, {}), ("q6k", 72, 512, 3, dict(norm=True, swiglu=True)),
             ("q4k", 70, 512, 5, dict(bias=True)), ("q8", 45, 300, 17, dict(accumulate=True, norm=True)),
             ("q5_0", 21, 200, 4, {}), ("q3k", 45, 1100, 2, dict(bias=True)),
             ("q2k", 72, 600, 3, dict(norm=True, swiglu=True)), ("iq4nl", 37, 77, 1, {}),
             ("iq4xs", 21, 1100, 9, dict(accumulate=True))]
    for dtype, n, k, t, kw in cases:
        out, ref = run_linear(gpu, kernels, dtype, n, k, t, seed=n, ksplit=ksplit, **kw)
        check_op(out, ref, *tol(k) if not kw.get("swiglu") else (2e-3, 1e-4), name=f"ksplit {ksplit} {dtype} {kw}")
    for dtype in ("q4a", "q2k"):
        out, ref = run_linear(lib_nosg.device, lib_nosg, dtype, 70, 300, 3, seed=5, ksplit=ksplit, norm=True, bias=True)
        check_op(out, ref, *tol(300), name=f"ksplit {ksplit} {dtype} without subgroups")


@pytest.mark.parametrize("dtype,n,k,swiglu", [("q4a", 96, 576, True), ("q5k", 45, 300, False)])
def test_gemv_ksplit_row_alone_vs_among_16_bitwise(gpu, kernels, dtype, n, k, swiglu):
    """With KSPLIT 8 a row's bits still depend only on the row: alone (tile 1), in slot 3 of 16 rows (tile 8) and
    of a tile of 4 give identical bits; they differ from KSPLIT 1's (another sum order), which is why one model
    uses one value."""
    comps, _ = random_weight(dtype, n, k, seed=21)
    if swiglu:
        comps = interleave(comps, n // 2)
    rng = np.random.default_rng(22)
    xs = -(-k // 4) * 4
    x = np.zeros((16, xs), np.float32)
    x[:, :k] = rng.standard_normal((16, k)) * 2
    wn = np.zeros(xs, np.float32)
    wn[:k] = rng.uniform(0.5, 1.5, k)
    w = upload_weight(gpu, dtype, n, k, comps)
    wn_b = GpuArray.upload(gpu, wn).binding
    n_out = n // 2 if swiglu else n

    def go(rows, tiles=None, ksplit=8):
        out = GpuArray.empty(gpu, (len(rows), n_out))
        lin = Linear(kernels, w, LinearIO(GpuArray.upload(gpu, x[rows]).binding, out.binding, xs, n_out,
                                          step_buf(gpu, len(rows))),
                     epilogue=Epilogue(swiglu=swiglu, norm=(wn_b, 1e-5)), tiles=tiles, ksplit=ksplit)
        run(gpu, lambda c: lin.encode(c, len(rows)))
        return out.read()

    alone = go([3])
    assert not np.isnan(alone).any()
    assert np.array_equal(_bits(alone[0]), _bits(go(list(range(16)))[3])), "row 3 among 16"
    assert np.array_equal(_bits(alone[0]), _bits(go([0, 1, 2, 3], tiles=(4,))[3])), "row 3 in a tile of 4"
    assert not np.array_equal(_bits(alone[0]), _bits(go([3], ksplit=1)[0])), "KSPLIT 8 and 1: the same sum order?"


@pytest.mark.parametrize("tile", [1, 4, 8])
@pytest.mark.parametrize("dtype", ["q4", "q5_1", "q5k"])
def test_gemv_every_tile_matches_numpy(gpu_f32, dtype, tile):
    # each variant on its own (auto would pick tile 8 for 17 rows only): 17 rows = partial last tile, odd N and K
    from webinfer.kernels.library import KernelLibrary

    out, ref = run_linear(gpu_f32, KernelLibrary(gpu_f32), dtype, 131, 99, 17, seed=13, tiles=(tile,))
    check_op(out, ref, *tol(99), name=f"tile {tile}")


@pytest.mark.parametrize("dtype", ["q6k", "q3k", "q2k", "iq4xs"])
def test_gemv_several_bindings(gpu, kernels, dtype):
    """A weight split by rows into 3 bindings (the package's bindings): one dispatch each, one output; each
    binding's meta holds its own rows' scales and super words (pack_meta offsets)."""
    n, k, t = 203, 256, 2
    comps, wref = random_weight(dtype, n, k, seed=21)
    x = np.random.default_rng(22).standard_normal((t, k)).astype(np.float32)
    out = GpuArray.empty(gpu, (t, n))
    lin = Linear(kernels, upload_weight(gpu, dtype, n, k, comps, splits=(64, 150)),
                 LinearIO(GpuArray.upload(gpu, x).binding, out.binding, k, n, step_buf(gpu, t)))
    run(gpu, lambda c: lin.encode(c, t))
    check_op(out, (x.astype(np.float64) @ wref.T).astype(np.float32), *tol(k), f"{dtype} 3 bindings")


@pytest.mark.parametrize("gguf_type,k", [("Q2_K", 768), ("Q3_K", 768), ("IQ4_NL", 800), ("IQ4_XS", 768)])
def test_gemv_random_gguf_blocks_match_gguf_dequantize(gpu, kernels, gguf_type, k):
    """Random GGUF blocks (random bytes, moderate f16 d / dmin) re-laid by quant_ref.from_gguf (written from
    ggml's block layouts, not the packer's converter): formats.py decoding is bit-identical to
    gguf.quants.dequantize, and the GEMV reproduces dequantize(blocks) @ x (odd super-block / group counts: the
    last f16 word half padding)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from tests.gpu.quant_ref import GGUF_TYPES, decode, from_gguf, random_gguf

    n, t = 37, 3
    raw = random_gguf(gguf_type, n, k, seed=k)
    want = dequantize(raw, GGMLQuantizationType[gguf_type]).astype(np.float32)
    dtype = GGUF_TYPES[gguf_type]
    comps = from_gguf(gguf_type, raw, k)
    assert np.array_equal(decode(dtype, comps, k).view(np.uint32), want.view(np.uint32))
    x = np.random.default_rng(1).standard_normal((t, k)).astype(np.float32)
    out = GpuArray.empty(gpu, (t, n))
    lin = Linear(kernels, upload_weight(gpu, dtype, n, k, comps),
                 LinearIO(GpuArray.upload(gpu, x).binding, out.binding, k, n, step_buf(gpu, t)))
    run(gpu, lambda c: lin.encode(c, t))
    w = want.astype(np.float64)
    bound = (np.abs(x) @ np.abs(w).T).max()  # f32 sums of K products: error well under 1e-5 of sum |w x|
    check_op(out, (x @ w.T).astype(np.float32), 1e-5 * bound, 1e-4, f"{gguf_type} blocks")


def test_gemv_tile_choice_by_row_count(gpu, kernels):
    comps, _ = random_weight("q4", 8, 32, seed=15)
    lin = Linear(kernels, upload_weight(gpu, "q4", 8, 32, comps),
                 LinearIO(GpuArray.empty(gpu, (16, 32)).binding, GpuArray.empty(gpu, (16, 8)).binding, 32, 8,
                          step_buf(gpu, 16)))
    picked = {}
    for rows in (1, 2, 4, 5, 8, 9, 16):
        class Rec:
            def dispatch(self, pipeline, bg, x, y, z, label):
                picked[rows] = (pipeline, y)
        lin.encode(Rec(), rows)
    tiles = {b.pipeline: b.variant.key.tile for b in lin._variants}
    assert {r: (tiles[p], gy) for r, (p, gy) in picked.items()} == {
        1: (1, 1), 2: (4, 1), 4: (4, 1), 5: (8, 1), 8: (8, 1), 9: (8, 2), 16: (8, 2)}


def test_linear_variant_decisions():
    """The variant function numbers the optional bindings after the fixed six, in one order."""
    v = linear_variant(LinearKey("gemv", "q5k", 8, bias=True, norm=True))
    assert v.bindings == ("qweight", "meta", "x", "y", "params", "step", "qhigh", "norm", "bias")
    d = dict(v.defines)
    assert (d["QHIGH_SLOT"], d["NORM_SLOT"], d["BIAS_SLOT"], d["MINS"], d["KQUANT"]) == (6, 7, 8, 1, 1)
    assert linear_variant(LinearKey("gemm", "q4", 8, bias=True)).bindings[6:] == ("bias",)
    assert linear_variant(LinearKey("gemv", "q4a", 1, swiglu=True)).rows_per_invocation == 8
    with pytest.raises(ValueError, match="gemv kernel only"):
        linear_variant(LinearKey("gemm", "q4", 8, norm=True))
    with pytest.raises(ValueError, match="unsupported weight dtype"):
        linear_variant(LinearKey("gemv", "q3", 8))
    # the new formats' feature defines (quant_unpack.wgsl): q3k is the only 2-bit format with a qhigh binding
    flags = ("QHIGH", "MINS", "KQUANT", "SUB16", "D2", "BITS2", "IQ4")
    got = {dt: tuple(f for f in flags if f in dict(linear_variant(LinearKey("gemv", dt, 1)).defines))
           for dt in ("q6k", "q3k", "q2k", "iq4nl", "iq4xs", "q4k")}
    assert got == {"q6k": ("QHIGH", "KQUANT", "SUB16", "D2"), "q3k": ("QHIGH", "KQUANT", "SUB16", "D2", "BITS2"),
                   "q2k": ("KQUANT", "SUB16", "BITS2"), "iq4nl": ("IQ4",), "iq4xs": ("KQUANT", "D2", "IQ4"),
                   "q4k": ("MINS", "KQUANT")}
    assert linear_variant(LinearKey("gemv", "q3k", 1)).bindings[6:] == ("qhigh",)
    # KSPLIT: lanes per row group, so the grid holds rows / 4 * ksplit lanes (576 rows: 144 -> 1152 lanes)
    assert linear_variant(LinearKey("gemv", "q4a", 1)).grid_x(576) == 3
    v8 = linear_variant(LinearKey("gemv", "q4a", 1, ksplit=8))
    assert (dict(v8.defines)["KSPLIT"], v8.grid_x(576), v8.grid_x(577)) == (8, 18, 19)
    assert "KSPLIT" not in dict(linear_variant(LinearKey("gemv", "q4a", 1)).defines)  # the old pipelines' keys
    for bad in (LinearKey("gemm", "q4a", 8, ksplit=8), LinearKey("gemv", "q4a", 1, ksplit=3)):
        with pytest.raises(ValueError, match="ksplit"):
            linear_variant(bad)


def test_gemv_subgroup_path_is_active(gpu, kernels):
    if not gpu.caps.subgroups:
        pytest.skip("device has no subgroups")
    assert "subgroupBroadcast" in kernels.source("gemv", {"DTYPE": "q4"}, use_f16=False)
