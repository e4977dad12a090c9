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
from webinfer.formats import FORMATS, k_padded
from webinfer.kernels.linear import QuantWeight, WeightPart, pack_meta

FORMAT_NAMES = ("q4", "q4a", "q8", "q5_0", "q5_1", "q4k", "q5k", "q6k")
KQUANTS = ("q4k", "q5k", "q6k")
f32 = np.float32


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


def random_weight(dtype: str, n: int, k: int, gs: int = 32, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(components as [n, row_words] u32 arrays, float32 values [n, k]) for random codes of `dtype`."""
    rng = np.random.default_rng(seed)
    gs = group_size_of(dtype, gs)
    kp = k_padded(k, gs)
    comps: dict[str, np.ndarray] = {}
    if dtype == "q8":
        q = rng.integers(-127, 128, (n, kp)).astype(np.int8)
        comps["qweight"] = _bytes_words(q)
        qf = q.astype(f32)
    else:
        lo = rng.integers(0, 16, (n, kp))
        comps["qweight"] = _pack_bits(lo, 4)
        q = lo
        if dtype in ("q5_0", "q5_1", "q5k"):
            hb = rng.integers(0, 2, (n, kp))
            comps["qhigh"] = _pack_bits(hb, 1)
            q = lo | (hb << 4)
        elif dtype == "q6k":
            hb = rng.integers(0, 4, (n, kp))
            comps["qhigh"] = _pack_bits(hb, 2)
            q = lo | (hb << 4)
        qf = q.astype(f32)
    if dtype in ("q4k", "q5k"):
        qmax = 15 if dtype == "q4k" else 31
        sc = rng.integers(0, 64, (n, kp // 32)).astype(np.uint8)
        mn = rng.integers(0, 64, (n, kp // 32)).astype(np.uint8)
        d = (rng.uniform(0.5, 1.0, (n, kp // 256)) / (32 * qmax)).astype(np.float16)
        dmin = (rng.uniform(0.5, 1.0, (n, kp // 256)) / 32).astype(np.float16)
        comps["scales"], comps["mins"] = _bytes_words(sc), _bytes_words(mn)
        comps["super"] = (d.view(np.uint16).astype(np.uint32) | (dmin.view(np.uint16).astype(np.uint32) << 16))
        s = np.repeat(d.astype(f32), 8, axis=1) * sc.astype(f32)  # (d * scales[s]) in f32
        m = np.repeat(dmin.astype(f32), 8, axis=1) * mn.astype(f32)
        vals = np.repeat(s, 32, axis=1) * qf - np.repeat(m, 32, axis=1)
    elif dtype == "q6k":
        sc = rng.integers(-128, 128, (n, kp // 16)).astype(np.int8)
        d = (rng.uniform(0.5, 1.0, (n, kp // 256)) / (64 * 32)).astype(np.float16)
        comps["scales"] = _bytes_words(sc)
        comps["super"] = _halves(d)
        s = np.repeat(d.astype(f32), 16, axis=1) * sc.astype(f32)
        vals = np.repeat(s, 16, axis=1) * (qf - f32(32))
    else:
        g = kp // gs
        scale = {"q4": 0.25, "q4a": 0.15, "q8": 0.01, "q5_0": 0.1, "q5_1": 0.07}[dtype]
        s = (rng.uniform(0.5, 1.5, (n, g)) * rng.choice([-1, 1], (n, g)) * scale).astype(np.float16)
        comps["scales"] = _halves(s)
        sf = np.repeat(s.astype(f32), gs, axis=1)
        if dtype in ("q4a", "q5_1"):
            m = (-rng.uniform(0.5, 1.5, (n, g)) * (1.0 if dtype == "q4a" else 1.1)).astype(np.float16)
            comps["mins"] = _halves(m)
            vals = qf * sf + np.repeat(m.astype(f32), gs, axis=1)
        else:
            off = {"q4": 8, "q5_0": 16, "q8": 0}[dtype]
            vals = (qf - f32(off)) * sf
    for c, v in comps.items():
        want = FORMATS[dtype].row_bytes(c, k, gs)
        assert v.dtype == np.uint32 and v.shape == (n, want // 4), (dtype, c, v.shape, want)
    return comps, vals[:, :k].astype(f32)


def upload_weight(dev, dtype: str, n: int, k: int, comps: dict[str, np.ndarray], gs: int = 32,
                  splits: tuple[int, ...] = ()) -> QuantWeight:
    """The components as a QuantWeight on `dev`; `splits` = row indices where a new binding starts."""
    bounds = [0, *splits, n]
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        rows = {c: np.ascontiguousarray(v[a:b]) for c, v in comps.items()}
        meta = np.frombuffer(pack_meta(dtype, {c: v.tobytes() for c, v in rows.items()}), np.uint32)
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
