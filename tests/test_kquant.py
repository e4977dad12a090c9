"""GGUF Q5_0/Q5_1/Q2_K..Q6_K/IQ4_NL/IQ4_XS (and Q4_0/Q4_1/Q8_0) repacked into the formats of webinfer/formats.py,
and the encoders of those formats. References: gguf.quants.dequantize (bit for bit), real tensors of the Gemma 3
270M Q4_K_M GGUF, and `spec_decode`, a second decoder written from the formats.py docstring with u32 word arithmetic (it shares
no code with quant.py's unpacking).

Run: python -m pytest tests/test_kquant.py -q
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from webinfer.formats import FORMATS, row_bytes
from webinfer_packager.pack import quant

BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q5_0": (32, 22), "Q5_1": (32, 24),
         "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q2_K": (256, 84), "Q3_K": (256, 110),
         "IQ4_NL": (32, 18), "IQ4_XS": (256, 136)}
# byte offsets of the f16 fields in each block (d, and dmin / m where the type has one)
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,)}
KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)  # llama.cpp's


def group_of(dtype: str) -> int:
    return FORMATS[dtype].fixed_group or 32


def words(comps: dict, name: str, n: int) -> np.ndarray:
    return np.frombuffer(bytes(np.ascontiguousarray(comps[name]).tobytes()), "<u4").reshape(n, -1)


def f16_half(word: np.ndarray, high) -> np.ndarray:
    return ((word >> np.where(high, 16, 0).astype(np.uint32)) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


def spec_decode(dtype: str, comps: dict, n: int, k: int) -> np.ndarray:
    """The formats.py docstring, element index by element index, on u32 words."""
    kk = np.arange(k)
    qw = words(comps, "qweight", n)
    if dtype == "q8":
        q = ((qw[:, kk // 4] >> (8 * (kk % 4)).astype(np.uint32)) & 0xFF).astype(np.uint8).view(np.int8).astype(np.int32)
    elif dtype in ("q2k", "q3k"):
        q = ((qw[:, kk // 16] >> (2 * (kk % 16)).astype(np.uint32)) & 3).astype(np.int32)
    else:
        q = ((qw[:, kk // 8] >> (4 * (kk % 8)).astype(np.uint32)) & 0xF).astype(np.int32)
    if dtype in ("q5_0", "q5_1", "q5k"):
        qh = words(comps, "qhigh", n)
        q |= (((qh[:, kk // 32] >> (kk % 32).astype(np.uint32)) & 1) << 4).astype(np.int32)
    if dtype == "q3k":
        qh = words(comps, "qhigh", n)
        q |= (((qh[:, kk // 32] >> (kk % 32).astype(np.uint32)) & 1) << 2).astype(np.int32)
    if dtype == "q6k":
        qh = words(comps, "qhigh", n)
        q |= (((qh[:, kk // 16] >> (2 * (kk % 16)).astype(np.uint32)) & 3) << 4).astype(np.int32)
    sw = words(comps, "scales", n)
    f32 = np.float32
    if dtype in ("q4", "q4a", "q8", "q5_0", "q5_1", "iq4nl"):
        g = kk // 32
        scale = f16_half(sw[:, g // 2], g % 2 == 1)
        if dtype == "iq4nl":
            return scale * KV[q]
        if dtype in ("q4a", "q5_1"):
            mn = f16_half(words(comps, "mins", n)[:, g // 2], g % 2 == 1)
            return scale * q.astype(f32) + mn
        off = {"q4": 8, "q5_0": 16, "q8": 0}[dtype]
        return (q - off).astype(f32) * scale
    b = kk // 256
    sup = words(comps, "super", n)
    if dtype in ("q6k", "q3k", "iq4xs"):
        s = kk // (32 if dtype == "iq4xs" else 16)
        sc = ((sw[:, s // 4] >> (8 * (s % 4)).astype(np.uint32)) & 0xFF).astype(np.uint8).view(np.int8).astype(f32)
        d = f16_half(sup[:, b // 2], b % 2 == 1)
        return (d * sc) * (KV[q] if dtype == "iq4xs" else (q - (32 if dtype == "q6k" else 4)).astype(f32))
    if dtype == "q2k":
        s = kk // 16
        byte = (sw[:, s // 4] >> (8 * (s % 4)).astype(np.uint32)) & 0xFF
        d, dmin = f16_half(sup[:, b], False), f16_half(sup[:, b], True)
        return (d * (byte & 15).astype(f32)) * q.astype(f32) - (dmin * (byte >> 4).astype(f32))
    s = kk // 32
    sc = ((sw[:, s // 4] >> (8 * (s % 4)).astype(np.uint32)) & 0xFF).astype(f32)
    mn = ((words(comps, "mins", n)[:, s // 4] >> (8 * (s % 4)).astype(np.uint32)) & 0xFF).astype(f32)
    d, dmin = f16_half(sup[:, b], False), f16_half(sup[:, b], True)
    return (d * sc) * q.astype(f32) - (dmin * mn)


def check_repack(type_name: str, raw: np.ndarray, n: int, k: int, spec: bool = True) -> None:
    ref = gguf_dequantize(raw, T[type_name]).reshape(n, k)
    dtype = quant.GGUF_REPACK[type_name]
    comps = quant.repack_gguf(type_name, raw, n, k)
    for c, a in comps.items():
        assert a.dtype == np.uint8 and a.shape == (n, row_bytes(dtype, c, k, group_of(dtype))), (c, a.shape)
    got = quant.dequantize(dtype, {c: a.tobytes() for c, a in comps.items()}, [n, k], group_of(dtype), k)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), type_name  # bits, so -0 and NaN-free subnormals too
    if spec:
        assert np.array_equal(spec_decode(dtype, comps, n, k).view(np.uint32), ref.view(np.uint32)), type_name


# ----------------------------------------------------------------------------------------------------------
# synthetic blocks: every bit pattern is a valid block once its f16 fields are finite


EDGE_F16 = np.array([0x0001, 0x8001, 0x03FF, 0x8000, 0x0000, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00], np.uint16)  # subnormals,
# -0, +0, +-max, +-1


def random_blocks(type_name: str, n: int, k: int, seed: int, edge: bool) -> np.ndarray:
    per, bb = BLOCK[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, bb), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        if edge:
            v = EDGE_F16[rng.integers(0, len(EDGE_F16), (n, k // per))]
        else:
            v = rng.standard_normal((n, k // per)).astype(np.float16).view(np.uint16)
        raw[..., off:off + 2] = v[..., None].view(np.uint8).reshape(n, k // per, 2)
    if edge and type_name in ("Q4_K", "Q5_K"):
        raw[0, :, 4:16] = 0xFF  # every 6-bit scale and min at 63
    if edge and type_name == "Q6_K":
        raw[0, :, 192:208] = 0x80  # every sub-block scale at -128
        raw[1, :, 0:192] = 0xFF  # every code at 63
    if edge and type_name == "Q3_K":
        raw[0, :, 96:108] = 0x00  # every sub-block scale at -32
        raw[1, :, 96:108] = 0xFF  # ... at 31
        raw[2, :, 0:32] = 0x00  # every high bit clear: codes -4..-1
    if edge and type_name == "Q2_K":
        raw[0, :, 0:16] = 0xFF  # scale and min at 15
    if edge and type_name == "IQ4_XS":
        raw[0, :, 2:8] = 0x00  # every sub-block scale at -32
        raw[1, :, 2:8] = 0xFF  # ... at 31
    return raw.reshape(n, -1)


@pytest.mark.parametrize("type_name", list(BLOCK))
@pytest.mark.parametrize("edge", [False, True])
def test_random_blocks_repack_bit_identically(type_name, edge):
    n, k = 6, 512
    check_repack(type_name, random_blocks(type_name, n, k, seed=len(type_name) + edge, edge=edge), n, k)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"])
def test_gguf_quantized_floats_repack_bit_identically(type_name):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 160)).astype(np.float32) * rng.uniform(1e-3, 5, (9, 1)).astype(np.float32)
    w[2] = 0.0  # all-zero blocks
    check_repack(type_name, gguf_quantize(w, T[type_name]), 9, 160)


# ----------------------------------------------------------------------------------------------------------
# real tensors: Gemma 3 270M Q4_K_M


@pytest.fixture(scope="module")
def gemma_tensors() -> dict:
    """name -> (header info, raw block rows memory-mapped); only the tensors a test reads are paged in."""
    from webinfer.errors import WebinferError
    from webinfer_packager.pack.gguf_source import gguf_tensor_blocks
    from webinfer_packager.paths import gemma3_gguf_path

    try:
        path = gemma3_gguf_path()
    except WebinferError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))
    return gguf_tensor_blocks(path)


def smallest(tensors: dict, type_name: str, count: int = 2) -> list[tuple[str, int, int, np.ndarray]]:
    """(name, N, K, raw rows) of the `count` smallest matrices of a type."""
    ts = [(info.nbytes, name, raw) for name, (info, raw) in tensors.items()
          if T(info.type_id).name == type_name and len(info.dims) == 2]
    return [(name, raw.shape[0], tensors[name][0].dims[0], raw) for _, name, raw in sorted(ts)[:count]]


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_real_gemma_tensors_repack_bit_identically(gemma_tensors, type_name):
    picked = smallest(gemma_tensors, type_name)
    assert picked, f"the Gemma file has no {type_name} tensor"
    for _, n, k, raw in picked:
        check_repack(type_name, np.asarray(raw), n, k)


def test_real_gemma_q4k_through_the_packer(gemma_tensors):
    """The packer's per-tensor path (row chunks, the lossless check it records) on a real Q4_K tensor."""
    from webinfer_packager.pack import build
    from webinfer_packager.pack.gguf_source import SourceTensor

    name, n, k, raw = smallest(gemma_tensors, "Q4_K", 1)[0]
    dtype, gs, repack = build._target_dtype("layers.0.o", [n, k], "Q4_K", quant_name="q4", group_size=32,
                                            embedding=None, n_layers=18)
    assert (dtype, gs, repack) == ("q4k", 256, True)
    st = SourceTensor(name, "Q4_K", [n, k], raw, None, T.Q4_K)
    old = build.CHUNK_ELEMENTS
    build.CHUNK_ELEMENTS = 100 * k  # several chunks, the last one short
    try:
        comps, err, exact = build._encode(st, "layers.0.o", [n, k], dtype, gs, repack)
    finally:
        build.CHUNK_ELEMENTS = old
    assert exact and err == {"max_rel": 0.0, "rms_rel": 0.0}
    ref = gguf_dequantize(np.asarray(raw), T.Q4_K).reshape(n, k)
    assert np.array_equal(quant.dequantize("q4k", comps, [n, k], 256, k), ref)


@pytest.mark.slow
def test_every_gemma_tensor_repacks_bit_identically(gemma_tensors):
    """All 236 tensors, the 262,144 x 640 Q8_0 embedding included, in row chunks."""
    counts: dict[str, int] = {}
    for info, raw in gemma_tensors.values():
        name = T(info.type_id).name
        if name in quant.GGUF_REPACK:
            for r0 in range(0, raw.shape[0], 16384):
                rows = np.asarray(raw[r0:r0 + 16384])
                check_repack(name, rows, len(rows), info.dims[0], spec=False)
        counts[name] = counts.get(name, 0) + 1
    print("\nGemma 3 270M Q4_K_M tensors (all quantized ones bit-identical):", counts)
    assert counts == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}


# ----------------------------------------------------------------------------------------------------------
# encoders


ERR = {"q4": 0.125, "q4a": 0.095, "q5_0": 0.062, "q5_1": 0.046, "q4k": 0.095, "q5k": 0.047, "q6k": 0.026, "q8": 0.009,
       "iq4nl": 0.10, "iq4xs": 0.10, "q3k": 0.205, "q2k": 0.33}


def gaussian_with_outliers(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.2, 3, (n, 1)).astype(np.float32)
    w[:, rng.integers(0, k, k // 40)] *= 5
    return w


@pytest.mark.parametrize("dtype", list(ERR))
@pytest.mark.parametrize("k", [512, 300])
def test_quantize_layout_error_and_padding(dtype, k):
    n = 7
    w = gaussian_with_outliers(n, k, seed=k)
    w[3] = 0.0
    gs = group_of(dtype)
    comps = quant.quantize(dtype, w, None)
    for c, a in comps.items():
        assert a.shape == (n, row_bytes(dtype, c, k, gs)) and a.shape[1] % 4 == 0, c
    kp = quant.k_padded_for(k, gs)
    got = quant.dequantize(dtype, comps, [n, k], gs, kp)
    assert np.array_equal(got, spec_decode(dtype, comps, n, kp)[:, :k])
    assert np.all(got[3] == 0)
    assert quant.error_stats(w, got)["rms_rel"] < ERR[dtype]


@pytest.mark.parametrize("ours,ref", [("q4", "Q4_0"), ("q4a", "Q4_1"), ("q5_0", "Q5_0"), ("q5_1", "Q5_1"),
                                      ("q4k", "Q4_1"), ("q5k", "Q5_1"), ("iq4nl", "Q4_0"), ("iq4xs", "Q4_0")])
def test_search_beats_max_abs_rule(ours, ref):
    """The error-minimizing scale search against gguf's own (max-abs / min-max) quantizers of the same bit width:
    lower error weighted like the search (|x| + rms), and no worse in plain rms."""
    w = gaussian_with_outliers(64, 1024, seed=5)
    mine = quant.dequantize(ours, quant.quantize(ours, w, None), [64, 1024], group_of(ours), 1024)
    base = gguf_dequantize(gguf_quantize(w, T[ref]), T[ref])
    imp = np.sqrt(np.mean(w.reshape(64, -1, 32) ** 2, -1, keepdims=True)) + np.abs(w.reshape(64, -1, 32))

    def werr(x):
        return float(np.sum(imp.reshape(64, -1) * (x - w) ** 2))

    assert werr(mine) < 0.97 * werr(base)
    assert quant.error_stats(w, mine)["rms_rel"] <= 1.01 * quant.error_stats(w, base)["rms_rel"]


def test_fixed_group_is_enforced():
    w = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError, match="fixed group of 256"):
        quant.quantize("q4k", w, 32)
    with pytest.raises(ValueError, match="group_size"):
        quant.quantize("q4", w, 48)
