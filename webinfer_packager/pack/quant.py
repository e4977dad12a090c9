"""Weight encodings of the webinfer package format (docs/package-format.md, "Component encodings").

Encoders turn a float matrix [N, K] (or GGUF blocks) into the components a tensor stores; `dequantize` is the
one decoder every other part of the project (numpy reference model, kernel tests) uses to read them back.

    q4   qweight u32 [N, k_padded/8] nibbles, value = (q - 8) * scale           (GGUF Q4_0 compatible)
    q4a  as q4, value = q * scale + min                                         (GGUF Q4_1 compatible)
    q8   qweight u32 [N, k_padded/4] int8 bytes, value = q * scale              (GGUF Q8_0 compatible)
    f32  data f32 [N] or [N, K]
Scales and mins are f16 [N, G] stored as u32 [N, ceil(G/2)] (G = k_padded / group_size, odd G padded with 0).

Every decode is done in float32 with the same operations as `gguf.quants.dequantize`, so GGUF blocks repacked
here decode to bit-identical values (the packer checks this per tensor and records `lossless`).
"""

from __future__ import annotations

import numpy as np

QUANT_DTYPES = ("q4", "q4a", "q8")
DTYPES = QUANT_DTYPES + ("f32",)
GGUF_BLOCK = 32  # Q4_0 / Q4_1 / Q8_0 block length along K


def k_padded_for(k: int, group_size: int) -> int:
    return -(-k // group_size) * group_size


def components_of(dtype: str) -> tuple[str, ...]:
    return {"q4": ("qweight", "scales"), "q4a": ("qweight", "scales", "mins"),
            "q8": ("qweight", "scales"), "f32": ("data",)}[dtype]


def row_bytes(dtype: str, component: str, k: int, group_size: int | None) -> int:
    """Bytes one row of `component` takes (every row is a whole number of u32 words)."""
    if dtype == "f32":
        return 4 * k
    kp = k_padded_for(k, group_size)
    if component == "qweight":
        return kp // 2 if dtype in ("q4", "q4a") else kp
    groups = kp // group_size
    return 4 * (-(-groups // 2))


# ----------------------------------------------------------------------------------------------------------
# packing helpers


def _pack_f16_pairs(x: np.ndarray) -> np.ndarray:
    """f16 [N, G] -> uint8 [N, 4*ceil(G/2)]: element 2j in the low half of little-endian word j."""
    n, g = x.shape
    if g % 2:
        x = np.concatenate([x, np.zeros((n, 1), np.float16)], axis=1)
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(n, -1)


def _unpack_f16_pairs(raw: np.ndarray, n: int, groups: int) -> np.ndarray:
    return np.ascontiguousarray(raw).view("<f2").reshape(n, -1)[:, :groups].astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 q [N, Kp] in 0..15 -> bytes [N, Kp/2]; element k is nibble k%2 of byte k/2 = nibble k%8 of u32 k/8."""
    return (q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).astype(np.uint8)


def _unpack_nibbles(raw: np.ndarray, n: int) -> np.ndarray:
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
    q = np.empty((n, b.shape[1] * 2), np.uint8)
    q[:, 0::2] = b & np.uint8(0x0F)
    q[:, 1::2] = b >> np.uint8(4)
    return q


def _as_u8(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    return np.frombuffer(x, dtype=np.uint8)


def _pad_k(w: np.ndarray, group_size: int) -> np.ndarray:
    n, k = w.shape
    kp = k_padded_for(k, group_size)
    if kp == k:
        return w
    return np.concatenate([w, np.zeros((n, kp - k), np.float32)], axis=1)


# ----------------------------------------------------------------------------------------------------------
# encoders from float weights


def quantize(dtype: str, w: np.ndarray, group_size: int) -> dict[str, np.ndarray]:
    """Float [N, K] -> components (uint8 arrays [N, row_bytes]) of `dtype`."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize expects a matrix, got shape {w.shape}")
    if dtype == "f32":
        return {"data": np.ascontiguousarray(w).view(np.uint8)}
    n, k = w.shape
    g = _pad_k(w, group_size).reshape(n, -1, group_size)  # [N, G, gs]
    if dtype == "q4":
        # Q4_0's rule: the signed extreme maps to q = 0 (value -8*d), using all 16 levels; measured better in
        # rms than max|w|/7 (see tests/test_quant.py::test_q4_rule_beats_max_over_7).
        idx = np.abs(g).argmax(axis=-1)[..., None]
        d = (np.take_along_axis(g, idx, axis=-1) / -8.0).astype(np.float16)
        d32 = d.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d32 == 0, 0.0, 1.0 / d32)
        q = np.clip(np.rint(g * inv) + 8, 0, 15).astype(np.uint8).reshape(n, -1)
        if k % group_size:
            q[:, k:] = 8
        return {"qweight": _pack_nibbles(q), "scales": _pack_f16_pairs(d[..., 0])}
    if dtype == "q4a":
        lo = g.min(axis=-1, keepdims=True)
        hi = g.max(axis=-1, keepdims=True)
        m = lo.astype(np.float16)
        d = ((hi - m.astype(np.float32)) / 15.0).astype(np.float16)
        d32, m32 = d.astype(np.float32), m.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d32 == 0, 0.0, 1.0 / d32)
        q = np.clip(np.rint((g - m32) * inv), 0, 15).astype(np.uint8).reshape(n, -1)
        if k % group_size:
            q[:, k:] = 0
        return {"qweight": _pack_nibbles(q), "scales": _pack_f16_pairs(d[..., 0]), "mins": _pack_f16_pairs(m[..., 0])}
    if dtype == "q8":
        d = (np.abs(g).max(axis=-1, keepdims=True) / 127.0).astype(np.float16)
        d32 = d.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d32 == 0, 0.0, 1.0 / d32)
        q = np.clip(np.rint(g * inv), -127, 127).astype(np.int8).reshape(n, -1)
        if k % group_size:
            q[:, k:] = 0
        return {"qweight": q.view(np.uint8), "scales": _pack_f16_pairs(d[..., 0])}
    raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")


# ----------------------------------------------------------------------------------------------------------
# lossless repacking of GGUF blocks (rows of raw block bytes, [N, K/32 * block_bytes])

GGUF_REPACK = {"Q4_0": "q4", "Q4_1": "q4a", "Q8_0": "q8"}
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def repack_gguf(type_name: str, raw: np.ndarray, n: int, k: int) -> dict[str, np.ndarray]:
    """GGUF Q4_0/Q4_1/Q8_0 rows -> q4/q4a/q8 components with group 32, decoding to the identical float32 values."""
    bb = _BLOCK_BYTES[type_name]
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // GGUF_BLOCK, bb)
    d = blocks[..., 0:2].copy().view("<f2")[..., 0]  # [N, G]
    if type_name == "Q8_0":
        q = blocks[..., 2:].reshape(n, k)
        return {"qweight": np.ascontiguousarray(q), "scales": _pack_f16_pairs(d)}
    off = 2 if type_name == "Q4_0" else 4
    qs = blocks[..., off:]  # [N, G, 16]: element j = low nibble of byte j, element j+16 = high nibble
    q = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1).reshape(n, k)
    out = {"qweight": _pack_nibbles(q), "scales": _pack_f16_pairs(d)}
    if type_name == "Q4_1":
        out["mins"] = _pack_f16_pairs(blocks[..., 2:4].copy().view("<f2")[..., 0])
    return out


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
    groups = kp // group_size
    scales = _unpack_f16_pairs(_as_u8(components["scales"]), n, groups)[:, :, None]
    if dtype == "q8":
        q = _as_u8(components["qweight"]).view(np.int8).reshape(n, groups, group_size).astype(np.float32)
        w = scales * q
    else:
        q = _unpack_nibbles(_as_u8(components["qweight"]), n).reshape(n, groups, group_size)
        if dtype == "q4":
            w = scales * (q.astype(np.int8) - np.int8(8)).astype(np.float32)
        else:
            mins = _unpack_f16_pairs(_as_u8(components["mins"]), n, groups)[:, :, None]
            w = (scales * q.astype(np.float32)) + mins
    return np.ascontiguousarray(w.reshape(n, kp)[:, :k]).reshape(shape)


def error_stats(w: np.ndarray, w_hat: np.ndarray) -> dict[str, float]:
    """max_rel = max|w-ŵ|/max|w|, rms_rel = rms(w-ŵ)/rms(w) (0 for an all-zero w)."""
    w = np.asarray(w, np.float64)
    diff = np.asarray(w_hat, np.float64) - w
    amax = float(np.abs(w).max()) if w.size else 0.0
    rms = float(np.sqrt(np.mean(w * w))) if w.size else 0.0
    return {"max_rel": float(np.abs(diff).max()) / amax if amax else 0.0,
            "rms_rel": float(np.sqrt(np.mean(diff * diff))) / rms if rms else 0.0}
