"""Encoders and the decoder of packager/quant.py against independent references: gguf.quants (llama.cpp's
block formats) and a per-element decoder written straight from docs/package-format.md.

Run: python -m pytest tests/test_quant.py -q
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from webinfer_packager.pack import quant


def spec_decode(dtype, comps, n, k, gs):
    """Element by element, the way the spec words it (u32 words, nibble k%8 of word k/8, f16 pairs)."""
    kp = -(-k // gs) * gs
    qw = struct.unpack(f"<{len(bytes(comps['qweight'])) // 4}I", bytes(comps["qweight"]))
    sc = np.frombuffer(bytes(comps["scales"]), "<f2")
    mn = np.frombuffer(bytes(comps["mins"]), "<f2") if "mins" in comps else None
    per_row_q = kp // 8 if dtype != "q8" else kp // 4
    per_row_s = len(sc) // n
    out = np.zeros((n, k), np.float32)
    for r in range(n):
        for c in range(k):
            s = np.float32(sc[r * per_row_s + c // gs])
            if dtype == "q8":
                word = qw[r * per_row_q + c // 4]
                q = (word >> (8 * (c % 4))) & 0xFF
                q = q - 256 if q > 127 else q
                out[r, c] = np.float32(q) * s
            else:
                q = (qw[r * per_row_q + c // 8] >> (4 * (c % 8))) & 0xF
                out[r, c] = (np.float32(q - 8) * s if dtype == "q4"
                             else np.float32(q) * s + np.float32(mn[r * per_row_s + c // gs]))
    return out


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_repack_is_bit_identical(type_name):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((7, 96)).astype(np.float32) * rng.uniform(0.01, 3, (7, 1)).astype(np.float32)
    raw = gguf_quantize(w, T[type_name])
    ref = gguf_dequantize(raw, T[type_name])
    dtype = quant.GGUF_REPACK[type_name]
    comps = quant.repack_gguf(type_name, raw, 7, 96)
    got = quant.dequantize(dtype, {c: a.tobytes() for c, a in comps.items()}, [7, 96], 32, 96)
    assert got.dtype == np.float32 and got.shape == (7, 96)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))  # bit-identical, not just close
    assert np.array_equal(spec_decode(dtype, comps, 7, 96, 32), ref)


@pytest.mark.parametrize("dtype", ["q4", "q4a", "q8"])
@pytest.mark.parametrize("k,gs", [(64, 32), (100, 32), (200, 64), (130, 128)])
def test_quantize_layout_matches_spec_and_pads(dtype, k, gs):
    rng = np.random.default_rng(k + gs)
    w = rng.standard_normal((5, k)).astype(np.float32)
    comps = quant.quantize(dtype, w, gs)
    kp = quant.k_padded_for(k, gs)
    for c, a in comps.items():
        assert a.shape == (5, quant.row_bytes(dtype, c, k, gs)) and a.shape[1] % 4 == 0
    got = quant.dequantize(dtype, comps, [5, k], gs, kp)
    assert np.array_equal(got, spec_decode(dtype, comps, 5, k, gs))
    full = quant.dequantize(dtype, comps, [5, kp], gs, kp)  # padding columns decode to 0 for q4/q8
    if dtype != "q4a":
        assert np.all(full[:, k:] == 0)
    err = quant.error_stats(w, got)
    assert err["rms_rel"] < {"q4": 0.12, "q4a": 0.11, "q8": 0.01}[dtype]
    assert err["max_rel"] < {"q4": 0.15, "q4a": 0.15, "q8": 0.01}[dtype]


def test_q4_rule_beats_max_over_7():
    """The Q4_0 rule (d = signed extreme / -8, all 16 levels) against scale = max|w|/7 on gaussian weights."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    ours = quant.error_stats(w, quant.dequantize("q4", quant.quantize("q4", w, 32), [256, 1024], 32, 1024))
    g = w.reshape(256, -1, 32)
    s = (np.abs(g).max(-1, keepdims=True) / 7).astype(np.float16).astype(np.float32)
    alt = quant.error_stats(w, (np.clip(np.rint(g / s), -7, 7) * s).reshape(w.shape))
    assert ours["rms_rel"] < alt["rms_rel"]


def test_zero_and_constant_groups():
    w = np.zeros((2, 64), np.float32)
    w[1, 32:] = 0.5
    for dtype in ("q4", "q4a", "q8"):
        got = quant.dequantize(dtype, quant.quantize(dtype, w, 32), [2, 64], 32, 64)
        assert np.all(np.isfinite(got)) and np.allclose(got, w, atol=1e-3), dtype


def test_f32_roundtrip_vector_and_matrix():
    w = np.arange(12, dtype=np.float32)
    assert np.array_equal(quant.dequantize("f32", {"data": w.tobytes()}, [12], None, None), w)
    assert np.array_equal(quant.dequantize("f32", {"data": w}, [3, 4], None, None), w.reshape(3, 4))
