"""Embedding gather on the GPU (shaders/embed.wgsl): out[t, :] = dequantized row ids[t] of a q8 / q4 / q4a table,
times `scale` (Gemma multiplies its embeddings by sqrt(hidden)).

Bind once at load; `encode(cmds, rows)` per step. Ids at or past the vocabulary read row 0 instead of memory
outside the table (the engine validates ids before they get here; this only keeps a bad id from reading garbage).
"""

from __future__ import annotations

import struct

from .linear import WG, ParamsFn, standalone_params

_PARAMS = "<7If"


class Embed:
    def __init__(self, lib, dtype: str, vocab: int, k: int, group_size: int, qweight, scales, ids, out,
                 out_stride: int, step, count_index: int = 0, params: ParamsFn | None = None, mins=None,
                 label: str = "embed", scale: float = 1.0):
        if dtype not in ("q8", "q4", "q4a"):
            raise ValueError(f"Embed: unsupported table dtype {dtype!r} (q8, q4, q4a)")
        if group_size % 8:
            raise ValueError(f"Embed: group size {group_size} must be a multiple of 8")
        if (mins is None) != (dtype != "q4a"):
            raise ValueError("Embed: q4a tables need mins, other dtypes none")
        kp = -(-k // group_size) * group_size
        w_stride = kp // 8 if dtype in ("q4", "q4a") else kp // 4
        s_stride = -(-(kp // group_size) // 2)
        self.k, self.label = k, label
        self.pipeline = lib.pipeline("embed", defines={"DTYPE": dtype, "WG": WG}, use_f16=False)
        u = (params or standalone_params(lib.device))(
            struct.pack(_PARAMS, k, group_size, w_stride, s_stride, out_stride, vocab, count_index, float(scale)))
        binds = [qweight, scales, ids, out, u, step] + ([mins] if mins is not None else [])
        self.bind_group = lib.device.create_bind_group(self.pipeline, binds)
        self.groups_x = -(-k // (8 * WG))

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, self.groups_x, rows, 1, self.label)
