"""Token sampling on the GPU (shaders/sample.wgsl): logits rows in, one u32 token id per row out.

What it computes (exactly `webinfer_packager.reference.model.Sampler`'s distribution, in f32):
  greedy when temperature <= 0 or top_k == 1: argmax, lowest id on ties;
  else temperature -> top-k (ties at the k-th value: lowest ids first) -> top-p (shortest prefix, in logit-descending /
  id-ascending order, whose mass reaches top_p) -> inverse CDF in id order at u * mass, u = `uniform(seed, index)`.
The draw is a pure function of (logits, parameters, seed, index): a request that resamples index i gets the same
token, and a row's result never depends on the other rows in the dispatch.

Built once at load (`GpuSampler(lib, vocab)`, `bind(...)`); per step the host writes `pack_rows(...)` into the
params buffer and records `encode(cmds, binding, n_rows)`. With top-k / top-p the kernel copies each row's
candidate tokens to a scratch buffer (8 bytes x vocab per row) that `bind` allocates for as many rows as out_ids
holds. Pure Python (it runs in Pyodide).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..gpu.device import COPY_DST, COPY_SRC, STORAGE, BufferBinding

ROW_BYTES = 32  # RowParams in sample.wgsl
_ROW = "<4I2f2I"
_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class SampleRow:
    logit_row: int  # which row of the logits buffer
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    index: int = 0  # how many tokens the request sampled before this one


def pack_rows(rows: list[SampleRow]) -> bytes:
    """The params buffer contents for `rows` (validated like the reference Sampler)."""
    out = bytearray()
    for r in rows:
        if r.temperature < 0 or r.top_k < 0 or not (0.0 < r.top_p <= 1.0):
            raise ValueError(f"sampling: need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {r}")
        out += struct.pack(_ROW, r.logit_row, r.top_k, r.seed & _MASK, r.index & _MASK, r.temperature, r.top_p, 0, 0)
    return bytes(out)


def _pcg(v: int) -> int:
    s = (v * 747796405 + 2891336453) & _MASK
    w = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & _MASK
    return ((w >> 22) ^ w) & _MASK


def uniform(seed: int, index: int) -> float:
    """The shader's uniform draw in [0, 1) for (seed, index): (pcg(pcg(seed) + index) >> 8) / 2^24."""
    return (_pcg((_pcg(seed & _MASK) + index) & _MASK) >> 8) / 16777216.0


@dataclass(frozen=True)
class SamplerBinding:
    """What `bind` returns: the bind group and how many rows it can sample (out_ids slots, candidate space)."""

    group: Any
    rows: int
    candidates: Any  # the scratch buffer


def _bound_bytes(b) -> int:
    if isinstance(b, BufferBinding):
        return b.size if b.size is not None else int(b.buffer.size) - b.offset
    return int(b.size)


class GpuSampler:
    def __init__(self, lib, vocab: int, label: str = "sample"):
        self.lib, self.vocab, self.label = lib, vocab, label
        # MASS_SHIFT: fraction bits of the fixed-point bucket masses (vocab tokens of mass <= 1 fit in a u32)
        self.pipeline = lib.pipeline("sample", defines={"VOCAB": f"{vocab}u", "ID_BITS": f"{vocab.bit_length()}i",
                                                        "MASS_SHIFT": f"{32 - vocab.bit_length()}u"}, use_f16=False)

    def bind(self, logits, params, out_ids) -> SamplerBinding:
        """logits: f32 [rows, vocab]; params: ROW_BYTES per row; out_ids: u32 per row (buffers or BufferBindings).
        Allocates the candidate scratch (vocab x 8 bytes per out_ids slot)."""
        rows = max(_bound_bytes(out_ids) // 4, 1)
        dev = self.lib.device
        limit = dev.caps.max_binding_bytes
        if rows * self.vocab * 8 > limit:
            raise ValueError(f"sampling: candidate space for {rows} rows x vocab {self.vocab} is "
                             f"{rows * self.vocab * 8} bytes (> {limit} per binding on this device); sample fewer "
                             f"rows per dispatch (out_ids holds {rows})")
        cand = dev.create_buffer(rows * self.vocab * 8, STORAGE, label=f"{self.label}.candidates")
        return SamplerBinding(dev.create_bind_group(self.pipeline, [logits, params, out_ids, cand]), rows, cand)

    def encode(self, cmds, binding: SamplerBinding, n_rows: int) -> None:
        if n_rows > binding.rows:
            raise ValueError(f"sampling: {n_rows} rows, but out_ids holds {binding.rows}")
        if n_rows > 0:
            cmds.dispatch(self.pipeline, binding.group, n_rows, 1, 1, self.label)


def buffers(device, max_rows: int) -> tuple[Any, Any]:
    """(params, out_ids) buffers for up to max_rows rows; out_ids can be copied to a staging buffer and read."""
    params = device.create_buffer(ROW_BYTES * max_rows, STORAGE | COPY_DST, label="sample.params")
    ids = device.create_buffer(4 * max_rows, STORAGE | COPY_SRC, label="sample.ids")
    return params, ids
