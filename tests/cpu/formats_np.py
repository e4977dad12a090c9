"""A numpy decoder written from the spec in webinfer/formats.py (docstring), independent of the packer and of
kernels.c, plus a random encoder for every format. decode() returns per element (q, a, b) with value = a * q + b
(iq4nl / iq4xs: q = the codebook value KV[index]) and the value itself computed operation for operation as the
spec states."""

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

