"""A numpy decoder written from the spec in webinfer/formats.py (docstring), independent of the packer and of
kernels.c, plus a random encoder for every format. decode() returns per element (q, a, b) with value = a * q + b
(iq4nl / iq4xs: q = the codebook value KV[index]) and the value itself computed operation for operation as the
spec states. from_gguf() re-lays GGUF blocks of the low-bit types (ggml's block structs, as gguf.quants reads
them) into the spec's components, so that gguf.quants.dequantize is a second, outside reference."""

from __future__ import annotations

import numpy as np

from webinfer.formats import IQ4_KV, k_padded, row_bytes

COMPONENTS = {"q4": ("qweight", "scales"), "q4a": ("qweight", "scales", "mins"), "q8": ("qweight", "scales"),
              "q5_0": ("qweight", "qhigh", "scales"), "q5_1": ("qweight", "qhigh", "scales", "mins"),
              "q4k": ("qweight", "scales", "mins", "super"), "q5k": ("qweight", "qhigh", "scales", "mins", "super"),
              "q6k": ("qweight", "qhigh", "scales", "super"), "q3k": ("qweight", "qhigh", "scales", "super"),
              "q2k": ("qweight", "scales", "super"), "iq4nl": ("qweight", "scales"),
              "iq4xs": ("qweight", "scales", "super"), "f32": ("data",)}


def _words(b: bytes, n: int) -> np.ndarray:
    return np.frombuffer(b, "<u4").reshape(n, -1)


def _f16(x) -> np.ndarray:
    return np.asarray(x, np.uint16).view(np.float16).astype(np.float32)


def random_components(dtype: str, n: int, k: int, gs: int, rng) -> dict[str, bytes]:
    """Random but valid component bytes: any codes, finite f16 scales of moderate size."""
    out = {}
    for c in COMPONENTS[dtype]:
        nb = row_bytes(dtype, c, k, gs) * n
        if c == "data":
            out[c] = rng.standard_normal(n * k).astype(np.float32).tobytes()
        elif c in ("qweight", "qhigh"):
            out[c] = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
        elif dtype in ("q4k", "q5k") and c in ("scales", "mins"):
            out[c] = rng.integers(0, 64, nb, dtype=np.uint8).tobytes()  # 6-bit
        elif dtype == "q6k" and c == "scales":
            out[c] = rng.integers(-128, 128, nb, dtype=np.int8).tobytes()
        elif dtype in ("q3k", "iq4xs") and c == "scales":
            out[c] = rng.integers(-32, 32, nb, dtype=np.int8).tobytes()  # 6-bit signed
        elif dtype == "q2k" and c == "scales":
            out[c] = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()  # (scale, min) nibbles
        else:  # f16 values
            vals = (rng.choice([-1.0, 1.0], nb // 2) * rng.uniform(0.001, 0.05, nb // 2)).astype(np.float16)
            if c == "mins" and dtype in ("q4a", "q5_1"):
                vals = (-8 * np.abs(vals.astype(np.float32))).astype(np.float16)
            out[c] = vals.tobytes()
    return out


def decode(dtype: str, comps: dict[str, bytes], n: int, k: int, gs: int | None):
    """-> (values [n, k] f32, q [n, k], a [n, k], b [n, k]) from the spec."""
    if dtype == "f32":
        v = np.frombuffer(comps["data"], "<f4").reshape(n, k)
        return v, v, np.ones_like(v), np.zeros_like(v)
    kp = k_padded(k, gs)
    e = np.arange(kp)
    qw = _words(comps["qweight"], n)
    if dtype == "q8":
        q = ((qw[:, e // 4] >> (8 * (e % 4))) & 0xFF).astype(np.uint8).view(np.int8).astype(np.float32)
    elif dtype in ("q2k", "q3k"):
        q = ((qw[:, e // 16] >> (2 * (e % 16))) & 3).astype(np.int64)
        if dtype == "q3k":
            q |= ((_words(comps["qhigh"], n)[:, e // 32] >> (e % 32)) & 1).astype(np.int64) << 2
        q = q.astype(np.float32)
    elif dtype in ("iq4nl", "iq4xs"):
        q = np.asarray(IQ4_KV, np.float32)[(qw[:, e // 8] >> (4 * (e % 8))) & 0xF]
    else:
        q = ((qw[:, e // 8] >> (4 * (e % 8))) & 0xF).astype(np.int64)
        if dtype in ("q5_0", "q5_1", "q5k"):
            q |= ((_words(comps["qhigh"], n)[:, e // 32] >> (e % 32)) & 1).astype(np.int64) << 4
        elif dtype == "q6k":
            q |= ((_words(comps["qhigh"], n)[:, e // 16] >> (2 * (e % 16))) & 3).astype(np.int64) << 4
        q = q.astype(np.float32)

    def half(comp, idx):  # f16 number idx of each row, two per word, low half first
        w = _words(comps[comp], n)
        return _f16((w[:, idx // 2] >> (16 * (idx % 2))) & 0xFFFF)

    def byte(comp, idx):
        return ((_words(comps[comp], n)[:, idx // 4] >> (8 * (idx % 4))) & 0xFF).astype(np.uint8)

    f32 = np.float32
    if dtype in ("q4k", "q5k"):
        s, b = e // 32, e // 256
        sup = _words(comps["super"], n)[:, b]
        d, dmin = _f16(sup & 0xFFFF), _f16(sup >> 16)
        sc, mn = byte("scales", s).astype(f32), byte("mins", s).astype(f32)
        a, off = d * sc, -(dmin * mn)
        v = a * q - (dmin * mn)
    elif dtype in ("q6k", "q3k"):
        s, b = e // 16, e // 256
        z = f32(32 if dtype == "q6k" else 4)
        d = half("super", b)
        sc = byte("scales", s).view(np.int8).astype(f32)
        a = d * sc
        off = -z * a
        v = a * (q - z)
    elif dtype == "q2k":
        s, b = e // 16, e // 256
        sup = _words(comps["super"], n)[:, b]
        d, dmin = _f16(sup & 0xFFFF), _f16(sup >> 16)
        sm = byte("scales", s)
        a, m = d * (sm & 15).astype(f32), dmin * (sm >> 4).astype(f32)
        off = -m
        v = a * q - m
    elif dtype == "iq4xs":
        d = half("super", e // 256)
        a = d * byte("scales", e // 32).view(np.int8).astype(f32)
        off = np.zeros_like(a)
        v = a * q
    elif dtype == "iq4nl":
        a = half("scales", e // 32)
        off = np.zeros_like(a)
        v = a * q
    else:
        g = e // gs
        sc = half("scales", g)
        a = sc
        if dtype in ("q4a", "q5_1"):
            off = half("mins", g)
            v = q * sc + off
        else:
            z = {"q4": 8, "q5_0": 16, "q8": 0}[dtype]
            off = f32(-z) * sc
            v = (q - f32(z)) * sc
    cut = (slice(None), slice(0, k))
    return (v[cut].astype(f32), q[cut], a[cut].astype(f32), off[cut].astype(f32))


# ------------------------------------------------------------------------------------------------ GGUF blocks

GGUF_TYPES = {"q3k": "Q3_K", "q2k": "Q2_K", "iq4nl": "IQ4_NL", "iq4xs": "IQ4_XS"}
BLOCK = {"q3k": (256, 110), "q2k": (256, 84), "iq4nl": (32, 18), "iq4xs": (256, 136)}  # elements, bytes


def random_gguf(dtype: str, n: int, k: int, rng) -> np.ndarray:
    """uint8 [n, row bytes] of GGUF blocks as a quantizer leaves them: any codes and sub-block scales (every byte
    pattern is a valid block), f16 d of the size a unit-variance row gives (|d| ~ 1e-3 .. 3e-2: llama.cpp's d =
    max / 4 / 32 for Q3_K, max / 15 / 15 for Q2_K, max / 127 for IQ4), dmin > 0 (Q2_K: min = -dmin * m)."""
    per, nbytes = BLOCK[dtype]
    nb = n * (k // per)
    raw = rng.integers(0, 256, (nb, nbytes), dtype=np.uint8)

    def f16s(lo, hi, signed=True):
        v = rng.uniform(lo, hi, nb) * (rng.choice([-1.0, 1.0], nb) if signed else 1.0)
        return v.astype("<f2").view(np.uint8).reshape(nb, 2)

    if dtype == "q3k":
        raw[:, 108:110] = f16s(2e-3, 2e-2)
    elif dtype == "q2k":
        raw[:, 80:82], raw[:, 82:84] = f16s(5e-3, 3e-2, False), f16s(5e-3, 3e-2, False)
    else:  # iq4nl, iq4xs: d first
        raw[:, 0:2] = f16s(1e-3, 2e-2)
    return raw.reshape(n, -1)


def from_gguf(dtype: str, blocks: np.ndarray, n: int, k: int) -> dict[str, bytes]:
    """GGUF blocks (random_gguf's [n, row bytes]) -> the spec's components, element for element (ggml's block
    structs: Q3_K hmask[32] qs[64] scales[12] d; Q2_K scales[16] qs[64] d dmin; IQ4_NL d qs[16]; IQ4_XS d
    scales_h scales_l[4] qs[128])."""
    per, nbytes = BLOCK[dtype]
    nb = k // per
    B = blocks.reshape(n, nb, nbytes)
    e = np.arange(per)
    out = {}

    def f16_bytes(x):  # [n, m] uint8 pairs (little-endian f16) as uint16
        return x.view("<u2").reshape(n, -1)

    def words_of(codes, bits):  # [n, Kp] codes -> [n, Kp * bits / 32] words, element k at bits*(k % (32/bits))
        per_word = 32 // bits
        c = codes.reshape(n, -1, per_word).astype(np.uint64)
        return (c << (bits * np.arange(per_word, dtype=np.uint64))).sum(-1).astype("<u4")

    def pairs(h):  # [n, m] uint16 -> two per word, padded to an even count
        h = np.concatenate([h, np.zeros((n, h.shape[1] % 2), np.uint16)], 1)
        return h.astype("<u2").tobytes()

    if dtype in ("q3k", "q2k"):
        qs = B[..., 32:96] if dtype == "q3k" else B[..., 16:80]
        low = (qs[..., 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3  # [n, nb, 256]
        out["qweight"] = words_of(low.reshape(n, -1), 2).tobytes()
        if dtype == "q3k":
            high = (B[..., e % 32] >> (e // 32)) & 1
            out["qhigh"] = words_of(high.reshape(n, -1), 1).tobytes()
            s = np.arange(16)
            sc = B[..., 96:108]
            s6 = ((sc[..., s % 8] >> (4 * (s // 8))) & 15) | (((sc[..., 8 + s % 4] >> (2 * (s // 4))) & 3) << 4)
            out["scales"] = (s6.astype(np.int16) - 32).astype(np.int8).tobytes()
            out["super"] = pairs(f16_bytes(np.ascontiguousarray(B[..., 108:110])))
        else:
            out["scales"] = np.ascontiguousarray(B[..., :16]).tobytes()
            d, dmin = f16_bytes(np.ascontiguousarray(B[..., 80:82])), f16_bytes(np.ascontiguousarray(B[..., 82:84]))
            out["super"] = (d.astype(np.uint32) | (dmin.astype(np.uint32) << 16)).astype("<u4").tobytes()
        return out
    if dtype == "iq4nl":
        idx = (B[..., 2 + e % 16] >> (4 * (e // 16))) & 15
        out["qweight"] = words_of(idx.reshape(n, -1), 4).tobytes()
        out["scales"] = pairs(f16_bytes(np.ascontiguousarray(B[..., 0:2])))
        return out
    # iq4xs
    j = e % 32
    idx = (B[..., 8 + 16 * (e // 32) + j % 16] >> (4 * (j // 16))) & 15
    out["qweight"] = words_of(idx.reshape(n, -1), 4).tobytes()
    s = np.arange(8)
    sh = f16_bytes(np.ascontiguousarray(B[..., 2:4])).reshape(n, nb, 1)
    lo = (B[..., 4 + s // 2] >> (4 * (s % 2))) & 15
    hi = (sh >> (2 * s).astype(np.uint16)) & 3
    out["scales"] = ((lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - 32).astype(np.int8).tobytes()
    out["super"] = pairs(f16_bytes(np.ascontiguousarray(B[..., 0:2])))
    return out


def gguf_values(dtype: str, blocks: np.ndarray) -> np.ndarray:
    """gguf.quants' dequantization of the blocks (float32 [n, k])."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(blocks, GGMLQuantizationType[GGUF_TYPES[dtype]]).astype(np.float32)
