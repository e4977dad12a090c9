"""The LM head for short rows (shaders/lm_head.wgsl): logits[t, :] = W x[t, :] for q4 / q4a / q8 weights, K <= 1024.

x-stationary: each lane copies its activation row(s) into registers once (constant indices only), then streams RPL
consecutive weight rows, a whole row at a time, with vec4<u32> loads (the shader's header says why).
Measured on lavapipe (SmolLM2 head, q8 49152x576, A/B medians in one process): at parity with gemv.wgsl for one row
(5.9 vs 6.4 ms; 11.2 vs 12.4 ms in a decode step), slower for 4 and 16 rows (the tile registers spill). So it is
NOT the model's default head: GPUModel.make_lm_head("x-stationary") selects it for A/B measurements.
Same interface and conventions as `linear.Linear`: built once at load (pipelines, uniforms, bind groups, one per
weight binding: heads over 128 MiB come in several parts), `encode(cmds, rows)` per step only records dispatches;
the kernel reads the row count from `step[count_index]`.

Tiles: TILE activation rows share each loaded weight chunk (1, 2 or 4; "auto" builds all three and picks the
smallest that holds the rows, the largest beyond). A row's logits are the same bits in every tile and slot.

Pure Python (it runs in Pyodide): parameters are packed with `struct`.
"""

from __future__ import annotations

import struct
from typing import Any

from .linear import ParamsFn, WeightPart, standalone_params, weight_strides

WG = 64
RPL = 128  # weight rows per lane (lavapipe, q8 49152x576, 1 row, one run: 4 -> 14.1 ms, 16 -> 8.2, 64 -> 6.2, gemv 6.1)
TILES = (1, 2, 4)
MAX_CHUNKS = 32  # the shader's unrolled chunk loop: K <= 1024
_PARAMS = "<12I"  # Params in lm_head.wgsl (48 bytes)


def supports(dtype: str, k: int) -> bool:
    """Whether this kernel handles a head of this dtype and width (else use linear.Linear)."""
    return dtype in ("q4", "q4a", "q8") and 0 < k <= 32 * MAX_CHUNKS


class LMHead:
    """y[t, n_offset + n] = sum_{k < K} W[n, k] x[t, k] for every row t < step[count_index]."""

    def __init__(self, lib, dtype: str, n: int, k: int, group_size: int, parts: list[WeightPart], x, y,
                 x_stride: int, y_stride: int, step, count_index: int = 0, params: ParamsFn | None = None,
                 n_offset: int = 0, label: str = "lm_head", tile: int | str = "auto", rpl: int = RPL):
        if not supports(dtype, k):
            raise ValueError(f"LMHead: {dtype} weights with K={k} unsupported (q4/q4a/q8, 0 < K <= 1024); use linear.Linear")
        if x_stride % 4:
            raise ValueError(f"LMHead: x row stride {x_stride} must be a multiple of 4 floats (vec4 loads)")
        if group_size % 32:
            raise ValueError(f"LMHead: group size {group_size} must be a multiple of 32")
        if tile not in TILES and tile != "auto":
            raise ValueError(f"LMHead: tile must be one of {TILES} or 'auto', not {tile!r}")
        if rpl < 1:
            raise ValueError(f"LMHead: rpl (rows per lane) must be >= 1, not {rpl}")
        self.n, self.k, self.label, self.dtype = n, k, label, dtype
        params = params or standalone_params(lib.device)
        w4, s_stride = weight_strides(dtype, k, group_size)
        uniforms = []
        for p in parts:
            if (p.mins is None) != (dtype != "q4a"):
                raise ValueError(f"LMHead {label}: q4a weights need mins, other dtypes none")
            uniforms.append(params(struct.pack(_PARAMS, p.rows, k, group_size, w4, s_stride, x_stride // 4, y_stride,
                                               n_offset + p.row0, count_index, 0, 0, 0)))
        defines = {"DTYPE": dtype, "KC": -(-k // 32), "RPL": rpl}
        # (pipeline, tile, [(bind group, grid x)]) per tile variant, all built here at load
        self._variants: list[tuple[Any, int, list[tuple[Any, int]]]] = []
        for tt in (TILES if tile == "auto" else (tile,)):
            pipeline = lib.pipeline("lm_head", defines=dict(defines, TILE=tt), use_f16=False)
            groups = []
            for p, u in zip(parts, uniforms):
                binds = [p.qweight, p.scales, x, y, u, step] + ([p.mins] if dtype == "q4a" else [])
                groups.append((lib.device.create_bind_group(pipeline, binds), -(-p.rows // (WG * rpl))))
            self._variants.append((pipeline, tt, groups))

    def encode(self, cmds, rows: int) -> None:
        """Record the dispatches for `rows` activation rows (at least step[count_index]; extra rows exit early)."""
        if rows <= 0:
            return
        pipeline, tt, groups = self._variants[-1]
        for v in self._variants:
            if rows <= v[1]:
                pipeline, tt, groups = v
                break
        for bg, gx in groups:
            cmds.dispatch(pipeline, bg, gx, -(-rows // tt), 1, self.label)
