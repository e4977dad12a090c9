"""check_op for the wasm module: numpy arrays placed in the module's linear memory between guard regions.

The same .wasm the page loads runs here in wasmtime. Every array sits between two guard regions filled with a NaN
pattern that must come back unchanged, so a kernel writing past its output is caught (wasm itself only traps
outside the whole memory).

    mem = WasmMem("base")                     # or "relaxed"
    x = mem.put(x_np); y = mem.empty((n,))
    mem.call("wi_rmsnorm", x.off, ...)
    check(y, ref, atol=1e-6, rtol=1e-5)       # reads y, checks its guards
"""

from __future__ import annotations

import numpy as np

from webinfer.cpu.runner import Arena, weight_desc
from webinfer.cpu.wasm import WasmtimeHost

GUARD = 64
GUARD_WORD = 0x7FC0DEAD


class WasmArray:
    def __init__(self, mem, off, shape, dtype):
        self.mem, self.off, self.shape, self.dtype = mem, off, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    def read(self) -> np.ndarray:
        raw = np.frombuffer(self.mem.host.read(self.off - GUARD, self.nbytes + 2 * GUARD), np.uint8)
        guard = np.full(GUARD // 4, GUARD_WORD, np.uint32).view(np.uint8)
        assert np.array_equal(raw[:GUARD], guard), "kernel wrote before the start of its output"
        assert np.array_equal(raw[GUARD + self.nbytes:], guard), "kernel wrote past the end of its output"
        return raw[GUARD: GUARD + self.nbytes].view(self.dtype).reshape(self.shape).copy()


class WasmMem:
    def __init__(self, variant: str = "base"):
        self.host = WasmtimeHost(variant)
        self.arena = Arena(self.host)

    def call(self, name, *args):
        return self.host.call(name, *args)

    def put(self, arr) -> WasmArray:
        arr = np.ascontiguousarray(arr)
        n = (arr.nbytes + 3) // 4 * 4
        base = self.arena.alloc(n + 2 * GUARD, "test array")
        raw = np.full((n + 2 * GUARD) // 4, GUARD_WORD, np.uint32).view(np.uint8)
        raw[GUARD: GUARD + arr.nbytes] = arr.view(np.uint8).reshape(-1)
        self.host.write(base, raw.tobytes())
        return WasmArray(self, base + GUARD, arr.shape, arr.dtype)

    def empty(self, shape, dtype=np.float32) -> WasmArray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        a = self.put(np.full((n + 3) // 4, GUARD_WORD, np.uint32))
        return WasmArray(self, a.off, shape, dtype)

    def weight(self, dtype: str, n: int, k: int, group_size: int | None, comps: dict, bias=None,
               packed: bool = False) -> int:
        """A Weight descriptor over components (bytes) placed in memory; returns its offset. packed: rewritten
        into the packed GEMV layout by wi_repack, as the runner loads every format it can pack (kernels.c PACKABLE;
        the packed bytes between guards)."""
        offs = {c: self.put(np.frombuffer(b, np.uint8)).off for c, b in comps.items()}
        b = self.put(np.asarray(bias, np.float32)).off if bias is not None else 0
        desc = self.arena.put(weight_desc(dtype, n, k, group_size, offs, b), "weight desc")
        if packed:
            nbytes = self.call("wi_repack_bytes", desc)
            assert nbytes, f"{dtype} at group {group_size} has no packed layout"
            self.call("wi_repack", desc, self.scratch(nbytes).off)
        return desc

    def scratch(self, nbytes: int) -> WasmArray:
        return self.empty((nbytes,), np.uint8)


def check(out: WasmArray, ref, atol: float, rtol: float, name: str = "") -> np.ndarray:
    got = out.read()
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{name}: NaN positions differ"
    np.testing.assert_allclose(got, ref, atol=atol, rtol=rtol, err_msg=name)
    return got


def topk_alone(top_k: int, top_p: float, min_p: float) -> bool:
    """kernels.c topk_alone (a vocabulary larger than top_k): a sampled row whose only filter is top-k."""
    return top_k > 1 and top_p >= 1 and not min_p


def read_by_draw(exact: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Which of a sampled row's logits the two-pass LM head must leave exact (kernels.c head_cut): min_p's kept
    ones, with top-k alone the top k, else every one (top-p's goal and temperature alone's mass take every term)."""
    if topk_alone(top_k, top_p, min_p) and top_k < len(exact):
        return exact >= np.sort(exact)[-top_k]
    if min_p:
        return exact >= exact.max() + temperature * np.log(min_p)
    return np.ones(exact.shape, bool)
