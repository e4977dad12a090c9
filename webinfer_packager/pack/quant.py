"""Weight encodings of the webinfer package format: encoders and the one numpy decoder.

The layouts and the value formulas are specified once, in `webinfer/formats.py` (docstring and FORMATS table);
this module only implements them. Every format goes through one intermediate form, "fields":

    q       uint8 [N, Kp]  the element's unsigned code (q8: the int8 code's bytes; iq4nl/iq4xs: a codebook index)
    scale   q4/q4a/q8/q5_0/q5_1/iq4nl: f16 [N, G];  q4k/q5k: uint8 [N, Kp/32];  q6k/q3k: int8 [N, Kp/16];
            q2k: uint8 [N, Kp/16] (0..15);  iq4xs: int8 [N, Kp/32]
    min     q4a/q5_1: f16 [N, G];  q4k/q5k: uint8 [N, Kp/32];  q2k: uint8 [N, Kp/16] (0..15)
    d       K-quants, iq4xs: f16 [N, Kp/256] super-block scale;   dmin: q4k/q5k/q2k f16 [N, Kp/256]

`quantize` (float weights, scales chosen by minimizing a weighted squared reconstruction error) and
`repack_gguf` (GGUF blocks re-laid, no arithmetic) produce fields; `_pack` lays them out as components;
`dequantize` unpacks components to fields and evaluates the formats.py formula in float32, operation for
operation as `gguf.quants.dequantize`, so repacked GGUF tensors decode bit-identically (the packer checks this
per tensor and records `lossless`).
"""

from __future__ import annotations

import numpy as np

from webinfer.formats import FORMATS, GROUP_SIZES, IQ4_KV, QUANT_DTYPES, components, k_padded, row_bytes  # noqa: F401

DTYPES = tuple(FORMATS)
k_padded_for = k_padded  # the name callers (kernel tests, benches) use
components_of = components
QK_K = 256  # K-quant super-block
GGUF_BLOCK = 32  # Q4_0/Q4_1/Q8_0/Q5_0/Q5_1 block length along K
_LEVELS = {"q4": 16, "q4a": 16, "q5_0": 32, "q5_1": 32, "q4k": 16, "q5k": 32, "q6k": 64, "q3k": 8, "q2k": 4}
_KV = np.array(IQ4_KV, np.float32)
TWO_BIT = ("q2k", "q3k")  # qweight holds 2 bits per element
D_PAIRS = ("q6k", "q3k", "iq4xs")  # super: two f16 d per word


# ----------------------------------------------------------------------------------------------------------
# fields <-> components


def _pack_f16_pairs(x: np.ndarray) -> np.ndarray:
    """f16 [N, G] -> uint8 [N, 4*ceil(G/2)]: element 2j in the low half of little-endian word j."""
    n, g = x.shape
    if g % 2:
        x = np.concatenate([x, np.zeros((n, 1), np.float16)], axis=1)
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(n, -1)


def _unpack_f16_pairs(raw: np.ndarray, n: int, groups: int) -> np.ndarray:
    return np.ascontiguousarray(raw).view("<f2").reshape(n, -1)[:, :groups]


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 q [N, Kp] -> bytes [N, Kp/2]: low 4 bits of element k = nibble k%2 of byte k/2 (= nibble k%8 of u32 k/8)."""
    q = q & np.uint8(0x0F)
    return (q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).astype(np.uint8)


def _unpack_nibbles(raw: np.ndarray, n: int) -> np.ndarray:
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
    q = np.empty((n, b.shape[1] * 2), np.uint8)
    q[:, 0::2] = b & np.uint8(0x0F)
    q[:, 1::2] = b >> np.uint8(4)
    return q


def _pack_crumbs(q: np.ndarray) -> np.ndarray:
    """uint8 q [N, Kp] -> bytes [N, Kp/4]: low 2 bits of element k = bits 2*(k%4) of byte k/4 (of u32 k/16)."""
    c = (q & np.uint8(3)).reshape(q.shape[0], -1, 4)
    return (c[..., 0] | (c[..., 1] << np.uint8(2)) | (c[..., 2] << np.uint8(4)) | (c[..., 3] << np.uint8(6)))


def _unpack_crumbs(raw: np.ndarray, n: int) -> np.ndarray:
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1, 1)
    return ((b >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)).reshape(n, -1)


def _as_u8(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    return np.frombuffer(x, dtype=np.uint8)


def _pack(dtype: str, f: dict) -> dict[str, np.ndarray]:
    """Fields -> components, each uint8 [N, row_bytes]."""
    q = f["q"]
    n, kp = q.shape
    out = {"qweight": np.ascontiguousarray(q) if dtype == "q8" else _pack_crumbs(q) if dtype in TWO_BIT
           else _pack_nibbles(q)}
    if dtype in ("q5_0", "q5_1", "q5k", "q3k"):  # bit 4 (q3k: 2) of element k = bit k%32 of word k/32
        out["qhigh"] = np.packbits((q >> np.uint8(2 if dtype == "q3k" else 4)) & np.uint8(1), axis=-1,
                                   bitorder="little")
    elif dtype == "q6k":  # bits 4-5 of element k = bits 2*(k%16).. of word k/16, i.e. bits 2*(k%4) of byte k/4
        h = ((q >> np.uint8(4)) & np.uint8(3)).reshape(n, kp // 4, 4)
        out["qhigh"] = h[..., 0] | (h[..., 1] << np.uint8(2)) | (h[..., 2] << np.uint8(4)) | (h[..., 3] << np.uint8(6))
    if dtype == "q2k":  # scale and min of a sub-block in one byte (as GGUF)
        out["scales"] = (f["scale"] & np.uint8(15)) | (f["min"] << np.uint8(4))
        out["super"] = np.stack([f["d"], f["dmin"]], axis=-1).astype("<f2").view(np.uint8).reshape(n, -1)
    elif dtype in ("q4k", "q5k") + D_PAIRS:
        out["scales"] = np.ascontiguousarray(f["scale"]).view(np.uint8)
        if dtype in D_PAIRS:
            out["super"] = _pack_f16_pairs(f["d"])
        else:
            out["mins"] = np.ascontiguousarray(f["min"]).view(np.uint8)
            out["super"] = np.stack([f["d"], f["dmin"]], axis=-1).astype("<f2").view(np.uint8).reshape(n, -1)
    else:
        out["scales"] = _pack_f16_pairs(f["scale"])
        if "mins" in FORMATS[dtype].components:
            out["mins"] = _pack_f16_pairs(f["min"])
    return {c: np.ascontiguousarray(a).reshape(n, -1) for c, a in out.items()}


def _unpack(dtype: str, comps: dict, n: int, kp: int, group_size: int) -> dict:
    if dtype == "q8":
        q = _as_u8(comps["qweight"]).reshape(n, kp)
    elif dtype in TWO_BIT:
        q = _unpack_crumbs(_as_u8(comps["qweight"]), n)
    else:
        q = _unpack_nibbles(_as_u8(comps["qweight"]), n)
    if dtype in ("q5_0", "q5_1", "q5k", "q3k"):
        hi = np.unpackbits(_as_u8(comps["qhigh"]).reshape(n, -1), axis=-1, bitorder="little")
        q = q | (hi << np.uint8(2 if dtype == "q3k" else 4))
    elif dtype == "q6k":
        b = _as_u8(comps["qhigh"]).reshape(n, -1, 1) >> np.array([0, 2, 4, 6], np.uint8)
        q = q | ((b & np.uint8(3)).reshape(n, kp) << np.uint8(4))
    f = {"q": q}
    nb = kp // QK_K
    if dtype in ("q4k", "q5k"):
        f["scale"] = _as_u8(comps["scales"]).reshape(n, kp // 32)
        f["min"] = _as_u8(comps["mins"]).reshape(n, kp // 32)
        sup = _as_u8(comps["super"]).view("<f2").reshape(n, nb, 2)
        f["d"], f["dmin"] = sup[..., 0], sup[..., 1]
    elif dtype in D_PAIRS:
        f["scale"] = _as_u8(comps["scales"]).view(np.int8).reshape(n, kp // FORMATS[dtype].sub_block)
        f["d"] = _unpack_f16_pairs(_as_u8(comps["super"]), n, nb)
    elif dtype == "q2k":
        b = _as_u8(comps["scales"]).reshape(n, kp // 16)
        f["scale"], f["min"] = b & np.uint8(15), b >> np.uint8(4)
        sup = _as_u8(comps["super"]).view("<f2").reshape(n, nb, 2)
        f["d"], f["dmin"] = sup[..., 0], sup[..., 1]
    else:
        g = kp // group_size
        f["scale"] = _unpack_f16_pairs(_as_u8(comps["scales"]), n, g)
        if "mins" in comps:
            f["min"] = _unpack_f16_pairs(_as_u8(comps["mins"]), n, g)
    return f


def _values(dtype: str, f: dict, group_size: int) -> np.ndarray:
    """Fields -> float32 [N, Kp], with gguf.quants.dequantize's float32 operations in its order."""
    q = f["q"]
    n, kp = q.shape
    if FORMATS[dtype].fixed_group == QK_K:
        sub = FORMATS[dtype].sub_block
        d = f["d"].astype(np.float32)[:, :, None]  # [N, nb, 1]
        ds = (d * f["scale"].astype(np.float32).reshape(n, -1, QK_K // sub)).reshape(n, -1, 1)  # per sub-block
        if dtype in ("q6k", "q3k"):
            qf = (q.astype(np.int8) - np.int8(_LEVELS[dtype] // 2)).astype(np.float32).reshape(n, -1, sub)
            return (ds * qf).reshape(n, kp)
        if dtype == "iq4xs":
            return (ds * _KV[q].reshape(n, -1, sub)).reshape(n, kp)
        dmin = f["dmin"].astype(np.float32)[:, :, None]
        dm = (dmin * f["min"].astype(np.float32).reshape(n, -1, QK_K // sub)).reshape(n, -1, 1)
        return (ds * q.astype(np.float32).reshape(n, -1, sub) - dm).reshape(n, kp)
    scale = f["scale"].astype(np.float32)[:, :, None]
    qg = q.reshape(n, -1, group_size)
    if dtype == "iq4nl":
        w = scale * _KV[qg]
    elif dtype == "q8":
        w = scale * qg.view(np.int8).astype(np.float32)
    elif dtype in ("q4", "q5_0"):
        w = scale * (qg.astype(np.int8) - np.int8(_LEVELS[dtype] // 2)).astype(np.float32)
    else:  # q4a, q5_1
        w = (scale * qg.astype(np.float32)) + f["min"].astype(np.float32)[:, :, None]
    return w.reshape(n, kp)


# ----------------------------------------------------------------------------------------------------------
# the decoder


def dequantize(dtype: str, components: dict, shape: list[int], group_size: int | None,
               k_padded: int | None) -> np.ndarray:
    """Components (bytes or arrays) -> float32 array of the logical `shape` (padding columns dropped)."""
    shape = [int(s) for s in shape]
    if dtype == "f32":
        return _as_u8(components["data"]).view("<f4").astype(np.float32).reshape(shape)
    if dtype not in QUANT_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    n, k = shape if len(shape) == 2 else (1, shape[0])
    kp = k_padded if k_padded is not None else k_padded_for(k, group_size)
    w = _values(dtype, _unpack(dtype, components, n, kp, group_size), group_size)
    return np.ascontiguousarray(w[:, :k]).reshape(shape)


# ----------------------------------------------------------------------------------------------------------
# lossless repacking of GGUF blocks (rows of raw block bytes, [N, K/block * block_bytes])

GGUF_REPACK = {f.gguf: f.name for f in FORMATS.values() if f.gguf and f.name != "f32"}
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210,
                "Q2_K": 84, "Q3_K": 110, "IQ4_NL": 18, "IQ4_XS": 136}


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2")[..., 0]


def _gguf_nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """[..., C*chunk/2] bytes -> [..., C*chunk] codes: in each chunk, element j is the low nibble of byte j and
    element j + chunk/2 the high nibble (GGUF's interleave: 32-element chunks for Q4_0..Q5_1, 64 for K-quants)."""
    lead = qs.shape[:-1]
    c = qs.reshape(*lead, -1, chunk // 2)
    return np.concatenate([c & np.uint8(0x0F), c >> np.uint8(4)], axis=-1).reshape(*lead, -1)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte packed 6-bit scales and mins -> two uint8 [..., 8] (llama.cpp get_scale_min_k4)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def repack_gguf(type_name: str, raw: np.ndarray, n: int, k: int) -> dict[str, np.ndarray]:
    """GGUF rows of `type_name` blocks -> components of the same-named format, decoding to identical float32."""
    dtype = GGUF_REPACK[type_name]
    bb = _BLOCK_BYTES[type_name]
    per = QK_K if type_name.endswith("_K") or type_name == "IQ4_XS" else GGUF_BLOCK
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // per, bb)
    f = {}
    if type_name == "Q8_0":
        f["scale"], f["q"] = _f16(b[..., 0:2]), b[..., 2:].reshape(n, k)
    elif type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        f["scale"] = _f16(b[..., 0:2])
        off = 2
        if type_name in ("Q4_1", "Q5_1"):
            f["min"], off = _f16(b[..., 2:4]), 4
        q = _gguf_nibbles(b[..., off + (4 if type_name[1] == "5" else 0):], 32)  # [N, G, 32]
        if type_name[1] == "5":  # high bit of element i = bit i of the little-endian u32 qh
            q = q | (np.unpackbits(b[..., off:off + 4], axis=-1, bitorder="little") << np.uint8(4))
        f["q"] = q.reshape(n, k)
    elif type_name in ("Q4_K", "Q5_K"):
        f["d"], f["dmin"] = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scale_min(b[..., 4:16])
        f["scale"], f["min"] = sc.reshape(n, -1), mn.reshape(n, -1)
        if type_name == "Q4_K":
            q = _gguf_nibbles(b[..., 16:], 64)
        else:  # qh[32] then qs[128]; bit i of qh[j] is bit 4 of element 32*i + j
            q = _gguf_nibbles(b[..., 48:], 64)
            hi = (b[..., 16:48, None] >> np.arange(8, dtype=np.uint8)) & np.uint8(1)  # [N, nb, 32 (j), 8 (i)]
            q = q | (hi.swapaxes(-1, -2).reshape(n, -1, QK_K) << np.uint8(4))
        f["q"] = q.reshape(n, k)
    elif type_name == "Q6_K":  # ql[128] qh[64] scales[16] d
        ql = _gguf_nibbles(b[..., 0:128], 128)  # element 128*h + 64*t + j: nibble t of ql[64*h + j]
        qh = b[..., 128:192].reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
        qh = (qh & np.uint8(3)).reshape(n, -1, QK_K)  # element 128*h + 32*i + j: bits 2i of qh[32*h + j]
        f["q"] = (ql | (qh << np.uint8(4))).reshape(n, k)
        f["scale"] = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(n, -1)
        f["d"] = _f16(b[..., 208:210])
    elif type_name in ("Q2_K", "Q3_K"):
        qs = b[..., 16:80] if type_name == "Q2_K" else b[..., 32:96]
        # element 128*h + 32*j + i: bits 2j of qs[32*h + i]
        q = (qs.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & np.uint8(3)
        q = q.reshape(n, -1, QK_K)
        if type_name == "Q2_K":  # scales[16] qs[64] d dmin; a scales byte is (min << 4) | scale, as ours
            f["scale"], f["min"] = b[..., 0:16] & np.uint8(15), b[..., 0:16] >> np.uint8(4)
            f["d"], f["dmin"] = _f16(b[..., 80:82]), _f16(b[..., 82:84])
        else:  # hmask[32] qs[64] scales[12] d; element 32*j + i has its bit 2 at bit j of hmask[i]
            hi = (b[..., 0:32, None] >> np.arange(8, dtype=np.uint8)) & np.uint8(1)  # [N, nb, 32 (i), 8 (j)]
            q = q | (hi.swapaxes(-1, -2).reshape(n, -1, QK_K) << np.uint8(2))
            s = b[..., 96:108]  # 16 6-bit scales: low 4 bits from bytes 0-7 (two nibbles), high 2 from 8-11
            lo = np.concatenate([s[..., 0:8] & np.uint8(15), s[..., 0:8] >> np.uint8(4)], axis=-1)
            hs = np.concatenate([(s[..., 8:12] >> np.uint8(2 * t)) & np.uint8(3) for t in range(4)], axis=-1)
            f["scale"] = ((lo | (hs << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n, -1)
            f["d"] = _f16(b[..., 108:110])
        f["q"] = q.reshape(n, k)
        f.update({c: f[c].reshape(n, -1) for c in ("scale", "min") if c in f})
    elif type_name == "IQ4_NL":  # d qs[16]
        f["scale"] = _f16(b[..., 0:2])
        f["q"] = _gguf_nibbles(b[..., 2:], 32).reshape(n, k)
    elif type_name == "IQ4_XS":  # d, scales_h (u16), scales_l[4], qs[128] in 8 sub-blocks of 32
        f["d"] = _f16(b[..., 0:2])
        sh = np.ascontiguousarray(b[..., 2:4]).view("<u2")  # [N, nb, 1]: bits 2j..2j+1 = high bits of scale j
        lo = ((b[..., 4:8, None] >> np.array([0, 4], np.uint8)) & np.uint8(15)).reshape(n, -1, 8)
        hs = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
        f["scale"] = ((lo | (hs << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n, -1)
        f["q"] = _gguf_nibbles(b[..., 8:], 32).reshape(n, k)
    else:
        raise ValueError(f"no lossless repack for GGUF {type_name} (have {', '.join(GGUF_REPACK)})")
    return _pack(dtype, f)


# ----------------------------------------------------------------------------------------------------------
# encoders from float weights: scales (and mins) chosen by minimizing the weighted squared error


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row sum of a * b in one pass (no temporary array)."""
    return np.einsum("ij,ij->i", a, b)


def _fit_symmetric(x: np.ndarray, w: np.ndarray, nmax: int) -> np.ndarray:
    """Scale per row of x [M, n] for codes L in [-nmax, nmax-1], value = scale * L (llama.cpp make_qx_quants'
    search): candidate scales put the signed extreme at -(nmax + t/10), t in -9..9; for each candidate's rounding L
    the weighted least-squares scale sum(w x L) / sum(w L^2) is taken, and the one with the least error wins."""
    ext = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    safe = np.where(ext == 0, 1, ext)
    wx = w * x
    best = np.zeros(x.shape[0], np.float32)
    best_score = np.full(x.shape[0], -1.0, np.float32)
    lv = np.empty_like(x)
    for t in range(-9, 10):
        iscale = (-(nmax + 0.1 * t) / safe).astype(np.float32)
        np.clip(np.rint(np.multiply(x, iscale[:, None], out=lv), out=lv), -nmax, nmax - 1, out=lv)
        sumlx = _rowdot(wx, lv)
        suml2 = _rowdot(w * lv, lv)
        ok = suml2 > 0
        score = np.where(ok, sumlx * sumlx / np.where(ok, suml2, 1), 0)  # error = sum(w x^2) - score
        better = ok & (score > best_score)
        best = np.where(better, sumlx / np.where(ok, suml2, 1), best)
        best_score = np.where(better, score, best_score)
    return np.where(ext == 0, 0, best).astype(np.float32)


def _fit_affine(x: np.ndarray, w: np.ndarray, nmax: int, *, min_le_zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) per row of x [M, n] for codes L in [0, nmax], value = scale * L + offset (llama.cpp
    make_qkx2_quants' search): starting from the min/max fit, candidate scales (nmax - 1 + t/10) / (max - min),
    t in 0..20, round x; each rounding gets the weighted least-squares (scale, offset); the least error wins.
    `min_le_zero`: the offset must be <= 0 (K-quants store it as an unsigned min that is subtracted)."""
    lo, hi = x.min(-1), x.max(-1)
    if min_le_zero:
        lo = np.minimum(lo, 0)
    span = hi - lo
    flat = span <= 0
    safe = np.where(flat, 1, span).astype(np.float32)
    xs = x - lo[:, None]
    wx = w * x
    # the error of (s, m) from per-row sums, in float64: sum w (s L + m - x)^2
    sw, sx, sxx = (v.astype(np.float64) for v in (w.sum(-1), wx.sum(-1), _rowdot(wx, x)))
    lv = np.empty_like(x)

    def fit(iscale):
        np.clip(np.rint(np.multiply(xs, iscale[:, None], out=lv), out=lv), 0, nmax, out=lv)
        wl = w * lv
        return (v.astype(np.float64) for v in (wl.sum(-1), _rowdot(wl, lv), _rowdot(wx, lv)))

    def err(s, m, sl, sl2, sxl):
        return sxx - 2 * s * sxl - 2 * m * sx + s * s * sl2 + 2 * s * m * sl + m * m * sw

    best_s, best_m = (span / nmax).astype(np.float64), lo.astype(np.float64)
    best_e = err(best_s, best_m, *fit((nmax / safe).astype(np.float32)))
    for t in range(21):
        sl, sl2, sxl = fit(((nmax - 1 + 0.1 * t) / safe).astype(np.float32))
        det = sw * sl2 - sl * sl
        ok = det > 0
        sdet = np.where(ok, det, 1)
        s = (sw * sxl - sx * sl) / sdet
        m = (sl2 * sx - sl * sxl) / sdet
        if min_le_zero:
            pos = m > 0
            m = np.where(pos, 0, m)
            s = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1), s)
        e = err(s, m, sl, sl2, sxl)
        better = ok & (e < best_e)
        best_s, best_m, best_e = np.where(better, s, best_s), np.where(better, m, best_m), np.where(better, e, best_e)
    return np.where(flat, 0, best_s).astype(np.float32), np.where(flat, lo, best_m).astype(np.float32)


def _codes(x: np.ndarray, step: np.ndarray, offset: np.ndarray | float, lo: int, hi: int) -> np.ndarray:
    """Nearest code L in [lo, hi] for value = step * L + offset (step broadcast; step 0 gives the code nearest 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.where(step == 0, 0, np.rint((x - offset) / np.where(step == 0, 1, step)))
    return np.clip(lv, lo, hi)


_KV_MID = (_KV[1:] + _KV[:-1]) / 2


def _kv_codes(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Index of the codebook entry nearest x / step (step broadcast; 0 gives the entry nearest 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(step == 0, 0, x / np.where(step == 0, 1, step))
    return np.searchsorted(_KV_MID, v).astype(np.uint8)


def _fit_codebook(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Scale per row of x [M, n] for value = scale * KV[L] (llama.cpp's IQ4_NL search): candidates map the signed
    extreme to KV[0] +- t (t in -7..7); each candidate's nearest-entry codes get the weighted least-squares scale,
    and the one with the least error wins."""
    ext = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    safe = np.where(ext == 0, 1, ext)
    wx = w * x
    best = np.zeros(x.shape[0], np.float32)
    best_score = np.full(x.shape[0], -1.0, np.float32)
    for t in range(-7, 8):
        kv = _KV[_kv_codes(x, (safe / (_KV[0] + t)).astype(np.float32)[:, None])]
        sumlx, suml2 = _rowdot(wx, kv), _rowdot(w * kv, kv)
        ok = suml2 > 0
        score = np.where(ok, sumlx * sumlx / np.where(ok, suml2, 1), 0)
        better = ok & (score > best_score)
        best = np.where(better, sumlx / np.where(ok, suml2, 1), best)
        best_score = np.where(better, score, best_score)
    return np.where(ext == 0, 0, best).astype(np.float32)


def _importance(g: np.ndarray) -> np.ndarray:
    """llama.cpp's error weights without an importance matrix: sqrt(mean x^2) + |x| (mean over the last axis).
    Measured on gaussian rows with outliers, against weights 1 and x^2: within 1 % of the least plain rms error
    and close to the least x^2-weighted error, i.e. large weights are kept precise without losing the rest."""
    return np.sqrt(np.mean(g * g, axis=-1, keepdims=True)) + np.abs(g)


def _quantize_fields(dtype: str, w: np.ndarray, group_size: int) -> dict:
    n, kp = w.shape
    levels = _LEVELS.get(dtype)
    if dtype == "q8":  # 255 levels: max-abs is already within a few % of the optimum, and far below q4's error
        g = w.reshape(n, -1, group_size)
        d = (np.abs(g).max(axis=-1) / 127.0).astype(np.float16)
        q = _codes(g, d.astype(np.float32)[..., None], 0.0, -127, 127).astype(np.int8)
        return {"q": q.reshape(n, kp).view(np.uint8), "scale": d}
    if dtype in ("q4", "q5_0"):
        g = w.reshape(-1, group_size)
        d = _fit_symmetric(g, _importance(g), levels // 2).astype(np.float16)
        q = _codes(g, d.astype(np.float32)[:, None], 0.0, -(levels // 2), levels // 2 - 1) + levels // 2
        return {"q": q.astype(np.uint8).reshape(n, kp), "scale": d.reshape(n, -1)}
    if dtype in ("q4a", "q5_1"):
        g = w.reshape(-1, group_size)
        s, m = _fit_affine(g, _importance(g), levels - 1, min_le_zero=False)
        d, m16 = s.astype(np.float16), m.astype(np.float16)
        q = _codes(g, d.astype(np.float32)[:, None], m16.astype(np.float32)[:, None], 0, levels - 1)
        return {"q": q.astype(np.uint8).reshape(n, kp), "scale": d.reshape(n, -1), "min": m16.reshape(n, -1)}
    if dtype == "iq4nl":
        g = w.reshape(-1, group_size)
        d = _fit_codebook(g, _importance(g)).astype(np.float16)
        q = _kv_codes(g, d.astype(np.float32)[:, None])
        return {"q": q.reshape(n, kp), "scale": d.reshape(n, -1)}
    nb = kp // QK_K
    if dtype in ("q4k", "q5k", "q2k"):  # sub-blocks of 32 (q2k: 16); a 6-bit (q2k: 4-bit) scale and min each
        sub = FORMATS[dtype].sub_block
        top = 15 if dtype == "q2k" else 63
        g = w.reshape(n, nb, QK_K // sub, sub)
        imp = np.sqrt(np.mean(w.reshape(n, nb, 1, QK_K) ** 2, axis=-1, keepdims=True)) + np.abs(g)
        s, m = _fit_affine(g.reshape(-1, sub), imp.reshape(-1, sub), levels - 1, min_le_zero=True)
        s, m = np.maximum(s, 0).reshape(n, nb, -1), (-m).reshape(n, nb, -1)
        d = (s.max(-1) / top).astype(np.float16)
        dmin = (m.max(-1) / top).astype(np.float16)
        sc = _codes(s, d.astype(np.float32)[..., None], 0.0, 0, top).astype(np.uint8)
        mn = _codes(m, dmin.astype(np.float32)[..., None], 0.0, 0, top).astype(np.uint8)
        step = (d.astype(np.float32)[..., None] * sc.astype(np.float32))[..., None]
        off = -(dmin.astype(np.float32)[..., None] * mn.astype(np.float32))[..., None]
        q = _codes(g, step, off, 0, levels - 1)
        return {"q": q.astype(np.uint8).reshape(n, kp), "scale": sc.reshape(n, -1), "min": mn.reshape(n, -1),
                "d": d, "dmin": dmin}
    if dtype in ("q6k", "q3k"):  # 16 sub-blocks of 16; int8 scale per sub-block (llama.cpp quantize_row_q6_K)
        half, smax = levels // 2, 128 if dtype == "q6k" else 32
        g = w.reshape(n, nb, 16, 16)
        s = _fit_symmetric(g.reshape(-1, 16), _importance(g.reshape(-1, 16)), half).reshape(n, nb, 16)
        ext = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], axis=-1)[..., 0]
        d = (ext / -smax).astype(np.float16)  # the largest sub-block scale becomes -128 (q3k: -32)
        sc = _codes(s, d.astype(np.float32)[..., None], 0.0, -smax, smax - 1).astype(np.int8)
        step = (d.astype(np.float32)[..., None] * sc.astype(np.float32))[..., None]
        q = _codes(g, step, 0.0, -half, half - 1) + half
        return {"q": q.astype(np.uint8).reshape(n, kp), "scale": sc.reshape(n, -1), "d": d}
    if dtype == "iq4xs":  # 8 sub-blocks of 32 with a codebook scale each, as an int8 multiple of d
        g = w.reshape(n, nb, 8, 32)
        s = _fit_codebook(g.reshape(-1, 32), _importance(g.reshape(-1, 32))).reshape(n, nb, 8)
        ext = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], axis=-1)[..., 0]
        d = (ext / -32).astype(np.float16)
        sc = _codes(s, d.astype(np.float32)[..., None], 0.0, -32, 31).astype(np.int8)
        step = (d.astype(np.float32)[..., None] * sc.astype(np.float32))[..., None]
        return {"q": _kv_codes(g, step).reshape(n, kp), "scale": sc.reshape(n, -1), "d": d}
    raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")


def quantize(dtype: str, w: np.ndarray, group_size: int | None = None) -> dict[str, np.ndarray]:
    """Float [N, K] -> components (uint8 arrays [N, row_bytes]) of `dtype`. `group_size` is the scale group for
    q4/q4a/q8 (32/64/128); the other formats have a fixed group (formats.FORMATS[dtype].fixed_group)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize expects a matrix, got shape {w.shape}")
    if dtype == "f32":
        return {"data": np.ascontiguousarray(w).view(np.uint8)}
    if dtype not in QUANT_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    fixed = FORMATS[dtype].fixed_group
    gs = fixed or group_size or 32
    if fixed and group_size not in (None, fixed):
        raise ValueError(f"{dtype} has a fixed group of {fixed}, got group_size={group_size}")
    if not fixed and gs not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES} for {dtype}, got {gs}")
    n, k = w.shape
    kp = k_padded_for(k, gs)
    if kp != k:  # padding columns are zeros; kernels ignore k >= K anyway
        w = np.concatenate([w, np.zeros((n, kp - k), np.float32)], axis=1)
    return _pack(dtype, _quantize_fields(dtype, w, gs))


def error_stats(w: np.ndarray, w_hat: np.ndarray) -> dict[str, float]:
    """max_rel = max|w-ŵ|/max|w|, rms_rel = rms(w-ŵ)/rms(w) (0 for an all-zero w)."""
    w = np.asarray(w, np.float64)
    diff = np.asarray(w_hat, np.float64) - w
    amax = float(np.abs(w).max()) if w.size else 0.0
    rms = float(np.sqrt(np.mean(w * w))) if w.size else 0.0
    return {"max_rel": float(np.abs(diff).max()) / amax if amax else 0.0,
            "rms_rel": float(np.sqrt(np.mean(diff * diff))) / rms if rms else 0.0}
