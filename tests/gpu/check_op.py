"""check_op: run one kernel on the GPU and compare it with numpy, with guard regions around every output.

WebGPU clamps or drops out-of-bounds accesses silently, so an off-by-one write would otherwise go unseen: every
output is bound as a sub-range of a larger buffer whose guard bytes (a NaN pattern) must come back unchanged.

    out = GpuArray.empty(dev, (n,), np.float32)
    x = GpuArray.upload(dev, x_np)
    run(lambda cmds: cmds.dispatch(pipeline, dev.create_bind_group(pipeline, [w.binding, x.binding, out.binding, u]), g))
    check_op(out, ref, atol=1e-5, rtol=1e-4)   # also checks the guards of `out`
"""

from __future__ import annotations

import asyncio
import struct

import numpy as np

from webinfer.gpu.device import COPY_DST, COPY_SRC, STORAGE, UNIFORM, BufferBinding

GUARD = 256  # bytes on each side (one offset-alignment unit)
GUARD_WORD = 0x7FC0DEAD  # a quiet NaN that no kernel computes by accident


class GpuArray:
    def __init__(self, dev, shape, dtype, buffer, nbytes):
        self.dev, self.shape, self.dtype, self.buffer, self.nbytes = dev, tuple(shape), np.dtype(dtype), buffer, nbytes

    @classmethod
    def upload(cls, dev, arr: np.ndarray, guard: bool = True) -> "GpuArray":
        arr = np.ascontiguousarray(arr)
        nbytes = arr.nbytes
        padded = (nbytes + 3) // 4 * 4
        total = padded + 2 * GUARD
        buf = dev.create_buffer(total, STORAGE | COPY_DST | COPY_SRC)
        raw = np.full(total // 4, GUARD_WORD, dtype=np.uint32).view(np.uint8)
        raw[GUARD : GUARD + nbytes] = arr.view(np.uint8).reshape(-1)
        dev.write_buffer(buf, 0, raw.tobytes())
        return cls(dev, arr.shape, arr.dtype, buf, nbytes)

    @classmethod
    def empty(cls, dev, shape, dtype=np.float32) -> "GpuArray":
        """Output array filled with the guard pattern (so unwritten elements show up as NaN)."""
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return cls.upload(dev, np.full((n + 3) // 4, GUARD_WORD, np.uint32).view(np.uint8)[:n].view(dtype).reshape(shape))

    @property
    def binding(self) -> BufferBinding:
        return BufferBinding(self.buffer, GUARD, (self.nbytes + 3) // 4 * 4)

    def read(self) -> np.ndarray:
        raw = np.frombuffer(asyncio.run(self.dev.read_buffer(self.buffer)), dtype=np.uint8)
        head, tail = raw[:GUARD], raw[GUARD + (self.nbytes + 3) // 4 * 4 :]
        guard = np.full(max(len(head), len(tail)) // 4, GUARD_WORD, np.uint32).view(np.uint8)
        assert np.array_equal(head, guard[: len(head)]), "kernel wrote before the start of its output"
        assert np.array_equal(tail, guard[: len(tail)]), "kernel wrote past the end of its output"
        return raw[GUARD : GUARD + self.nbytes].view(self.dtype).reshape(self.shape).copy()


def uniform(dev, fmt: str, *values) -> object:
    """A uniform buffer from struct format (e.g. '<4I'), padded to 16 bytes."""
    data = struct.pack(fmt, *values)
    data += b"\0" * (-len(data) % 16)
    buf = dev.create_buffer(len(data), UNIFORM | COPY_DST)
    dev.write_buffer(buf, 0, data)
    return buf


def run(dev, record) -> None:
    """record(cmds) adds dispatches; submitted as one command buffer."""
    cmds = dev.commands()
    record(cmds)
    dev.submit(cmds)


def check_op(out: GpuArray, ref: np.ndarray, atol: float, rtol: float, name: str = "") -> np.ndarray:
    """Read `out` (checking its guards), then compare to `ref`: shape, dtype kind, NaN/Inf positions, values."""
    got = out.read()
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    if np.issubdtype(ref.dtype, np.integer):
        mism = np.flatnonzero(got.reshape(-1) != ref.reshape(-1))
        assert mism.size == 0, f"{name}: {mism.size} mismatches, first at {mism[:5]}: {got.reshape(-1)[mism[:5]]} != {ref.reshape(-1)[mism[:5]]}"
        return got
    g, r = got.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(r)), f"{name}: NaN positions differ (unwritten outputs read as NaN)"
    assert np.array_equal(np.isinf(g), np.isinf(r)), f"{name}: Inf positions differ"
    fin = np.isfinite(r)
    err = np.abs(g[fin] - r[fin])
    tol = atol + rtol * np.abs(r[fin])
    bad = err > tol
    if bad.any():
        i = int(np.argmax(err - tol))
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.size} elements out of tolerance; worst |got-ref|={err[i]:.3g} "
            f"(ref {r[fin][i]:.6g}, got {g[fin][i]:.6g}, atol={atol}, rtol={rtol})"
        )
    return got
