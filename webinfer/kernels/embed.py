"""Embedding gather on the GPU (shaders/embed.wgsl): out[t, :] = the dequantized row ids[t] of a table in any
weight format, exactly as webinfer/formats.py computes it, times `scale` (Gemma multiplies its embeddings by
sqrt(hidden); 1 otherwise).

A table larger than one storage binding (a 262,144-token vocabulary at INT8 is 160 MiB) comes as several
`WeightPart`s split by rows, as the package records them; one dispatch per part writes the tokens whose id falls
in its rows. Bind once at load; `encode(cmds, rows)` per step. Ids at or past the vocabulary read row 0 instead
of memory outside the table (the engine validates ids before they get here; this only keeps a bad id harmless).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .common import WG, ParamsFn, ceil_div, standalone_params
from .linear import QuantWeight, format_defines

_PARAMS = "<15If"


@dataclass(frozen=True)
class EmbedKey:
    dtype: str


def embed_variant(key: EmbedKey) -> tuple[tuple[str, object], ...]:
    """The defines of the gather for one table format (bindings: qweight, meta, ids, out, params, step, qhigh)."""
    return tuple(sorted({**format_defines(key.dtype), "WG": WG}.items()))


class Embed:
    def __init__(self, lib, table: QuantWeight, ids, out, out_stride: int, step, count_index: int = 0,
                 params: ParamsFn | None = None, label: str = "embed", scale: float = 1.0):
        self.k, self.label = table.k, label
        self.pipeline = lib.variant_pipeline("embed", embed_variant(EmbedKey(table.dtype)))
        make = params or standalone_params(lib.device)
        lay = table.layout
        self.bind_groups = []
        for p in table.parts:
            m_off, sup_off = lay.meta_offsets(p.rows)
            u = make(struct.pack(_PARAMS, table.k, table.group_size, lay.w_stride4, lay.meta_words("scales"), out_stride,
                                 table.n, count_index, p.row0, p.rows, lay.words("qhigh"), m_off, sup_off,
                                 lay.meta_words("super"), 0, 0, float(scale)))
            binds = [p.qweight, p.meta, ids, out, u, step] + ([p.qhigh] if p.qhigh is not None else [])
            self.bind_groups.append(lib.device.create_bind_group(self.pipeline, binds))
        self.groups_x = ceil_div(table.k, 8 * WG)

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            for bg in self.bind_groups:
                cmds.dispatch(self.pipeline, bg, self.groups_x, rows, 1, self.label)
