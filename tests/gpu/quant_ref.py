"""A small numpy encoder of the package's weight formats for the kernel tests, independent of the packer.

`random_weight(dtype, n, k)` draws random codes, high bits, scales, mins and super-block words, lays them out as
webinfer/formats.py says, and computes each element's value with the formats.py formula in float32, operation
for operation. The kernels must reproduce those values (the embedding gather exactly; GEMV/GEMM up to summation
order). `upload_weight` puts the components on a device as a `QuantWeight` (guarded GpuArrays), optionally split
by rows into several bindings.
"""

from __future__ import annotations

import numpy as np

from tests.gpu.check_op import GpuArray
from webinfer.formats import FORMATS, IQ4_KV, k_padded
from webinfer.kernels.linear import QuantWeight, WeightPart, pack_meta

FORMAT_NAMES = ("q4", "q4a", "q8", "q5_0", "q5_1", "q4k", "q5k", "q6k", "q3k", "q2k", "iq4nl", "iq4xs")
KQUANTS = ("q4k", "q5k", "q6k", "q3k", "q2k", "iq4xs")  # group (super-block) 256
f32 = np.float32
KV = np.array(IQ4_KV, f32)


def group_size_of(dtype: str, gs: int = 32) -> int:
    return FORMATS[dtype].fixed_group or gs


def _pack_bits(vals: np.ndarray, bits: int) -> np.ndarray:
    """[n, Kp] small unsigned values -> [n, Kp*bits/32] u32, element k at bits (k % (32/bits)) * bits of word."""
    per = 32 // bits
    n, kp = vals.shape
    v = vals.astype(np.uint64).reshape(n, kp // per, per)
    shifts = (np.arange(per, dtype=np.uint64) * bits)
    return (v << shifts).sum(axis=2).astype(np.uint32)


def _halves(h: np.ndarray) -> np.ndarray:
    """[n, G] f16 -> [n, ceil(G/2)] u32 words (element 2j in the low half)."""
    n, g = h.shape
    if g % 2:
        h = np.concatenate([h, np.zeros((n, 1), np.float16)], axis=1)
    return h.astype(np.float16).view(np.uint32)


def _bytes_words(b: np.ndarray) -> np.ndarray:
    """[n, B] u8/i8 (B % 4 == 0) -> [n, B/4] u32."""
    return np.ascontiguousarray(b).view(np.uint32)


def _f16_words_to(words: np.ndarray, count: int) -> np.ndarray:
    """[n, W] u32 of two f16 each -> [n, count] float32 (element 2j = low half of word j)."""
    return np.ascontiguousarray(words).view(np.float16)[:, :count].astype(f32)


def codes_of(dtype: str, comps: dict[str, np.ndarray], kp: int) -> np.ndarray:
    """The element codes [n, kp] as formats.py lays them out: unsigned with the high bits (q8: signed; iq4nl/iq4xs:
    the codebook index)."""
    w = comps["qweight"]
    n = w.shape[0]
    if dtype == "q8":
        return np.ascontiguousarray(w).view(np.int8).reshape(n, kp).astype(np.int64)
    if dtype in ("q2k", "q3k"):
        q = ((w[:, :, None] >> (2 * np.arange(16, dtype=np.uint32))) & 3).reshape(n, kp).astype(np.int64)
        if dtype == "q3k":
            h = comps["qhigh"]
            q |= (((h[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(n, kp).astype(np.int64)) << 2
        return q
    q = ((w[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(n, kp).astype(np.int64)
    if dtype in ("q5_0", "q5_1", "q5k"):
        h = comps["qhigh"]
        q |= (((h[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(n, kp).astype(np.int64)) << 4
    elif dtype == "q6k":
        h = comps["qhigh"]
        q |= (((h[:, :, None] >> (2 * np.arange(16, dtype=np.uint32))) & 3).reshape(n, kp).astype(np.int64)) << 4
    return q


def decode(dtype: str, comps: dict[str, np.ndarray], k: int, gs: int = 32) -> np.ndarray:
    """The float32 values [n, k] of a weight, by the formats.py formulas, operation for operation in float32."""
    gs = group_size_of(dtype, gs)
    kp = k_padded(k, gs)
    qf = codes_of(dtype, comps, kp).astype(f32)
    n = qf.shape[0]
    if dtype in ("q4k", "q5k"):
        sc = np.ascontiguousarray(comps["scales"]).view(np.uint8).astype(f32)
        mn = np.ascontiguousarray(comps["mins"]).view(np.uint8).astype(f32)
        sup = comps["super"]
        d = (sup & 0xFFFF).astype(np.uint16).view(np.float16).astype(f32)
        dmin = (sup >> 16).astype(np.uint16).view(np.float16).astype(f32)
        s = np.repeat(d, 8, axis=1) * sc  # d * scales[s] in f32
        m = np.repeat(dmin, 8, axis=1) * mn
        vals = np.repeat(s, 32, axis=1) * qf - np.repeat(m, 32, axis=1)
    elif dtype in ("q6k", "q3k"):
        sc = np.ascontiguousarray(comps["scales"]).view(np.int8).astype(f32)
        d = _f16_words_to(comps["super"], kp // 256)
        vals = np.repeat(np.repeat(d, 16, axis=1) * sc, 16, axis=1) * (qf - f32(32 if dtype == "q6k" else 4))
    elif dtype == "q2k":
        sc = np.ascontiguousarray(comps["scales"]).view(np.uint8)
        sup = comps["super"]
        d = (sup & 0xFFFF).astype(np.uint16).view(np.float16).astype(f32)
        dmin = (sup >> 16).astype(np.uint16).view(np.float16).astype(f32)
        s = np.repeat(d, 16, axis=1) * (sc & 15).astype(f32)  # d * (scales[s] & 15)
        m = np.repeat(dmin, 16, axis=1) * (sc >> 4).astype(f32)
        vals = np.repeat(s, 16, axis=1) * qf - np.repeat(m, 16, axis=1)
    elif dtype == "iq4xs":
        sc = np.ascontiguousarray(comps["scales"]).view(np.int8).astype(f32)
        d = _f16_words_to(comps["super"], kp // 256)
        vals = np.repeat(np.repeat(d, 8, axis=1) * sc, 32, axis=1) * KV[codes_of(dtype, comps, kp)]
    elif dtype == "iq4nl":
        vals = np.repeat(_f16_words_to(comps["scales"], kp // 32), 32, axis=1) * KV[codes_of(dtype, comps, kp)]
    else:
        s = np.repeat(_f16_words_to(comps["scales"], kp // gs), gs, axis=1)
        if dtype in ("q4a", "q5_1"):
            vals = qf * s + np.repeat(_f16_words_to(comps["mins"], kp // gs), gs, axis=1)
        else:
            vals = (qf - f32({"q4": 8, "q5_0": 16, "q8": 0}[dtype])) * s
    assert vals.shape == (n, kp) and vals.dtype == f32
    return vals[:, :k]


def random_weight(dtype: str, n: int, k: int, gs: int = 32, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(components as [n, row_words] u32 arrays, their float32 values [n, k]) for random codes of `dtype`, with
    scales chosen so that values are of unit size."""
    rng = np.random.default_rng(seed)
    gs = group_size_of(dtype, gs)
    kp = k_padded(k, gs)
    comps: dict[str, np.ndarray] = {}
    if dtype == "q8":
        comps["qweight"] = _bytes_words(rng.integers(-127, 128, (n, kp)).astype(np.int8))
    elif dtype in ("q2k", "q3k"):
        comps["qweight"] = _pack_bits(rng.integers(0, 4, (n, kp)), 2)
        if dtype == "q3k":
            comps["qhigh"] = _pack_bits(rng.integers(0, 2, (n, kp)), 1)
    else:
        comps["qweight"] = _pack_bits(rng.integers(0, 16, (n, kp)), 4)
        if dtype in ("q5_0", "q5_1", "q5k"):
            comps["qhigh"] = _pack_bits(rng.integers(0, 2, (n, kp)), 1)
        elif dtype == "q6k":
            comps["qhigh"] = _pack_bits(rng.integers(0, 4, (n, kp)), 2)
    if dtype in ("q4k", "q5k"):
        qmax = 15 if dtype == "q4k" else 31
        comps["scales"] = _bytes_words(rng.integers(0, 64, (n, kp // 32)).astype(np.uint8))
        comps["mins"] = _bytes_words(rng.integers(0, 64, (n, kp // 32)).astype(np.uint8))
        d = (rng.uniform(0.5, 1.0, (n, kp // 256)) / (32 * qmax)).astype(np.float16)
        dmin = (rng.uniform(0.5, 1.0, (n, kp // 256)) / 32).astype(np.float16)
        comps["super"] = d.view(np.uint16).astype(np.uint32) | (dmin.view(np.uint16).astype(np.uint32) << 16)
    elif dtype == "q6k":
        comps["scales"] = _bytes_words(rng.integers(-128, 128, (n, kp // 16)).astype(np.int8))
        comps["super"] = _halves((rng.uniform(0.5, 1.0, (n, kp // 256)) / (64 * 32)).astype(np.float16))
    elif dtype in ("q3k", "iq4xs"):  # 6-bit signed scales as GGUF's; |q - 4| <= 4, |KV[q]| <= 127
        sub = 16 if dtype == "q3k" else 32
        comps["scales"] = _bytes_words(rng.integers(-32, 32, (n, kp // sub)).astype(np.int8))
        comps["super"] = _halves((rng.uniform(0.5, 1.0, (n, kp // 256)) / (32 * (4 if dtype == "q3k" else 127))
                                  ).astype(np.float16))
    elif dtype == "q2k":  # a byte per 16: scale | min << 4
        comps["scales"] = _bytes_words(rng.integers(0, 256, (n, kp // 16)).astype(np.uint8))
        d = (rng.uniform(0.5, 1.0, (n, kp // 256)) / (15 * 3)).astype(np.float16)
        dmin = (rng.uniform(0.5, 1.0, (n, kp // 256)) / 15).astype(np.float16)
        comps["super"] = d.view(np.uint16).astype(np.uint32) | (dmin.view(np.uint16).astype(np.uint32) << 16)
    else:
        g = kp // gs
        scale = {"q4": 0.25, "q4a": 0.15, "q8": 0.01, "q5_0": 0.1, "q5_1": 0.07, "iq4nl": 0.01}[dtype]
        comps["scales"] = _halves((rng.uniform(0.5, 1.5, (n, g)) * rng.choice([-1, 1], (n, g)) * scale
                                   ).astype(np.float16))
        if dtype in ("q4a", "q5_1"):
            comps["mins"] = _halves((-rng.uniform(0.5, 1.5, (n, g))).astype(np.float16))
    for c, v in comps.items():
        want = FORMATS[dtype].row_bytes(c, k, gs)
        assert v.dtype == np.uint32 and v.shape == (n, want // 4), (dtype, c, v.shape, want)
    return comps, decode(dtype, comps, k, gs)


GGUF_TYPES = {"Q8_0": "q8", "Q5_0": "q5_0", "Q4_K": "q4k", "Q6_K": "q6k", "Q3_K": "q3k", "Q2_K": "q2k",
              "IQ4_NL": "iq4nl", "IQ4_XS": "iq4xs"}
GGUF_BLOCK_BYTES = {"Q8_0": 34, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210, "Q3_K": 110, "Q2_K": 84, "IQ4_NL": 18,
                    "IQ4_XS": 136}


def from_gguf(gguf_type: str, raw: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Re-lay a GGUF tensor's blocks ([rows, row_bytes] uint8, ggml's block layouts) into formats.py components:
    an independent check of the layout contract on real tensors (the packer has its own converter)."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    dtype = GGUF_TYPES[gguf_type]
    blocks = np.ascontiguousarray(raw).reshape(-1, GGUF_BLOCK_BYTES[gguf_type])
    nb = blocks.shape[0]
    comps: dict[str, np.ndarray] = {}
    if gguf_type in ("Q2_K", "Q3_K"):
        # ggml's 2-bit planes: per 128 elements, element 32j + l of them = bits 2j of qs[l] (32 bytes)
        if gguf_type == "Q2_K":  # block_q2_K: scales[16], qs[64], d, dmin
            sc, qs, d, dmin = np.hsplit(blocks, [16, 80, 82])
            comps["scales"] = _bytes_words(sc.reshape(rows, k // 16))  # already scale | min << 4
            comps["super"] = (d.copy().view(np.uint16).astype(np.uint32)
                              | (dmin.copy().view(np.uint16).astype(np.uint32) << 16)).reshape(rows, k // 256)
        else:  # block_q3_K: hmask[32], qs[64], scales[12] (16 x 6 bits), d
            hmask, qs, sc, d = np.hsplit(blocks, [32, 96, 108])
            # high bit of element e = bit e / 32 of hmask[e % 32]; ggml subtracts 4 where it is 0: q - 4
            hb = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
            comps["qhigh"] = _pack_bits(hb.reshape(rows, k), 1)
            i = np.arange(16)
            low = (sc[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 15  # scale i: a nibble of bytes 0-7
            high = (sc[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3  # and 2 bits of bytes 8-11
            comps["scales"] = _bytes_words(((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)
                                          .reshape(rows, k // 16))
            comps["super"] = _halves(d.copy().view(np.float16).reshape(rows, k // 256))
        lo = (qs.reshape(nb, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
        comps["qweight"] = _pack_bits(lo.reshape(rows, k), 2)
        return {c: comps[c] for c in FORMATS[dtype].components}
    if gguf_type in ("IQ4_NL", "IQ4_XS"):
        # per 32 elements 16 bytes: element l = low nibble of byte l, element 16 + l = its high nibble
        if gguf_type == "IQ4_NL":  # block_iq4_nl: d, qs[16]
            d, qs = np.hsplit(blocks, [2])
            comps["scales"] = _halves(d.copy().view(np.float16).reshape(rows, k // 32))
        else:  # block_iq4_xs: d, scales_h (u16: 2 bits per sub-block), scales_l[4] (a nibble per sub-block), qs[128]
            d, sh, sl, qs = np.hsplit(blocks, [2, 4, 8])
            ib = np.arange(8)
            low = (sl[:, ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & 15
            high = (sh.copy().view(np.uint16) >> (2 * ib).astype(np.uint16)) & 3
            comps["scales"] = _bytes_words(((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)
                                          .reshape(rows, k // 32))
            comps["super"] = _halves(d.copy().view(np.float16).reshape(rows, k // 256))
        q = (qs.reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)) & 15
        comps["qweight"] = _pack_bits(q.reshape(rows, k), 4)
        return {c: comps[c] for c in FORMATS[dtype].components}
    if gguf_type == "Q8_0":
        d, qs = np.hsplit(blocks, [2])
        comps["qweight"] = _bytes_words(qs.reshape(rows, k))
        comps["scales"] = _halves(d.copy().view(np.float16).reshape(rows, k // 32))
        return comps
    if gguf_type == "Q5_0":
        d, qh, qs = np.hsplit(blocks, [2, 6])
        hb = (qh.copy().view(np.uint32).reshape(nb, 1) >> np.arange(32, dtype=np.uint32)) & 1
        lo = ((qs.reshape(nb, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)) & 15).reshape(nb, 32)
        comps["scales"] = _halves(d.copy().view(np.float16).reshape(rows, k // 32))
    elif gguf_type == "Q4_K":
        d, dmin, scales, qs = np.hsplit(blocks, [2, 4, 16])
        sc, m = Q4_K.get_scale_min(scales)
        lo = ((qs.reshape(nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15).reshape(nb, 256)
        hb = None
        comps["scales"] = _bytes_words(sc.astype(np.uint8).reshape(rows, k // 32))
        comps["mins"] = _bytes_words(m.astype(np.uint8).reshape(rows, k // 32))
        comps["super"] = (d.copy().view(np.uint16).astype(np.uint32)
                          | (dmin.copy().view(np.uint16).astype(np.uint32) << 16)).reshape(rows, k // 256)
    else:  # Q6_K
        ql, qh, scales, d = np.hsplit(blocks, [128, 192, 208])
        lo = ((ql.reshape(nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15).reshape(nb, 256)
        hb = ((qh.reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(nb, 256)
        comps["scales"] = _bytes_words(scales.reshape(rows, k // 16))
        comps["super"] = _halves(d.copy().view(np.float16).reshape(rows, k // 256))
    comps["qweight"] = _pack_bits(lo.reshape(rows, k), 4)
    if hb is not None:
        comps["qhigh"] = _pack_bits(hb.reshape(rows, k), 2 if gguf_type == "Q6_K" else 1)
    return {c: comps[c] for c in FORMATS[dtype].components}


# where the f16 fields of a block are (byte offsets) and the factor that keeps values of unit size with them
_GGUF_F16 = {"Q2_K": ((80, 82), 1 / 45), "Q3_K": ((108,), 1 / 128), "IQ4_NL": ((0,), 1 / 127),
             "IQ4_XS": ((0,), 1 / (32 * 127))}


def random_gguf(gguf_type: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """[rows, row_bytes] uint8 GGUF blocks of `gguf_type` (Q2_K, Q3_K, IQ4_NL, IQ4_XS): random bytes, with the f16
    fields (d, dmin) finite, of either sign, such that values are of unit size."""
    rng = np.random.default_rng(seed)
    bb = GGUF_BLOCK_BYTES[gguf_type]
    nb = rows * k // (32 if gguf_type == "IQ4_NL" else 256)
    blocks = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    offsets, scale = _GGUF_F16[gguf_type]
    for off in offsets:
        d = (rng.uniform(0.3, 1.0, nb) * rng.choice([-1, 1], nb) * scale).astype(np.float16)
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def upload_weight(dev, dtype: str, n: int, k: int, comps: dict[str, np.ndarray], gs: int = 32,
                  splits: tuple[int, ...] = ()) -> QuantWeight:
    """The components as a QuantWeight on `dev`; `splits` = row indices where a new binding starts."""
    bounds = [0, *splits, n]
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        rows = {c: np.ascontiguousarray(v[a:b]) for c, v in comps.items()}
        meta = np.frombuffer(pack_meta(dtype, {c: v.tobytes() for c, v in rows.items()}, b - a), np.uint32)
        parts.append(WeightPart(a, b - a, GpuArray.upload(dev, rows["qweight"]).binding,
                                GpuArray.upload(dev, meta).binding,
                                GpuArray.upload(dev, rows["qhigh"]).binding if "qhigh" in rows else None))
    return QuantWeight(dtype, n, k, group_size_of(dtype, gs), tuple(parts))


def interleave(comps: dict[str, np.ndarray], f: int) -> dict[str, np.ndarray]:
    """gate rows [0, f) and up rows [f, 2f) of every component -> the SWIGLU kernel's blocks of 4 + 4."""
    out = {}
    for c, v in comps.items():
        g, u = v[:f].reshape(f // 4, 4, -1), v[f:].reshape(f // 4, 4, -1)
        out[c] = np.ascontiguousarray(np.concatenate([g, u], axis=1).reshape(2 * f, -1))
    return out
