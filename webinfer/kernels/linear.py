"""Quantized linear layers on the GPU (shaders/gemv.wgsl): y[t, :] = W x[t, :] for q4 / q4a / q8 weights.

Built once at model load (pipeline, uniform parameters, bind groups); `encode(cmds, rows)` per step only records
a dispatch whose grid depends on the row count. The kernel reads the row count itself from the per-step buffer
(`step[count_index]`), so the same bind group serves every step.

Two kernels: gemv.wgsl (decode: each invocation loads and unpacks 4 weight rows' words once per k chunk and
applies them to a tile of up to 8 activation rows; slots past the row count are skipped, so one row
costs what it did alone) and gemm.wgsl (prefill: each invocation loads 4 weight rows' words once per k chunk and
applies them to TT activation rows that the whole workgroup shares, their chunks loaded once per subgroup and
broadcast).
Batch invariance rule: in both, every output y[t, n] is a sequential sum over 32-element k chunks in a fixed
order, whatever T is and whichever other rows share the dispatch. The two kernels may differ in the last bits,
so the model picks per sequence, from the sequence's own chunk: one-token chunks (decode) -> gemv over rows
[0, step[count_index]); multi-token chunks (prefill) -> gemm over rows [step[start_index], + step[count_index]).

Pure Python (it runs in Pyodide): parameters are packed with `struct`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable

from ..gpu.device import COPY_DST, UNIFORM, BufferBinding

ROWS_PER_INVOCATION = 4
WG = 64
AUTO_TILES = (1, 4, 8)  # gemv.wgsl TILE variants: activation rows per invocation
# tile="auto": one gemv variant per tile, the dispatch picks the smallest that holds the rows (lavapipe: a tile
# of 8 costs ~2x a tile of 1 for a single row, the skipped slots still cost registers; 16 rows: 2-3x faster)
GEMM_TOKENS = 8  # gemm.wgsl default: activation rows per invocation (TT; all lanes of a workgroup share them)
_PARAMS = "<10IfI"  # Params in gemv.wgsl / gemm.wgsl (48 bytes; field 10 = gemv's RMSNorm eps)

ParamsFn = Callable[[bytes], BufferBinding]


def standalone_params(device) -> ParamsFn:
    """A ParamsFn that gives each dispatch its own small uniform buffer (tests; the model uses an arena)."""

    def make(data: bytes) -> BufferBinding:
        data = data + b"\0" * (-len(data) % 16)
        buf = device.create_buffer(len(data), UNIFORM | COPY_DST, label="params")
        device.write_buffer(buf, 0, data)
        return BufferBinding(buf, 0, len(data))

    return make


@dataclass
class WeightPart:
    """One storage binding of a quantized weight: rows [row0, row0 + rows) of the logical matrix."""

    row0: int
    rows: int
    qweight: Any  # BufferBinding or buffer
    scales: Any
    mins: Any = None  # q4a only


def weight_strides(dtype: str, k: int, group_size: int) -> tuple[int, int]:
    """(vec4<u32> per qweight row, u32 words per scale row) for the package layout."""
    kp = -(-k // group_size) * group_size
    w_words = kp // 8 if dtype in ("q4", "q4a") else kp // 4
    groups = kp // group_size
    return w_words // 4, -(-groups // 2)


class Linear:
    """y[:, n_offset : n_offset + N] (=, +=, or + bias) W x, for every row t < step[count_index].

    x and y are bindings of row-major f32 matrices with row strides x_stride / y_stride (floats; x_stride must be a
    multiple of 4). swiglu=True: W holds gate and up rows interleaved in blocks of 4 (see `interleave_gate_up`),
    and y receives silu(gate) * up (N/2 columns).
    norm=(weight binding, eps) (gemv only): x is the un-normalised residual and the RMSNorm with that weight is
    folded into the kernel (y = W rmsnorm(x) * w): no separate norm dispatch. The weight binding must hold K
    floats rounded up to a multiple of 4.
    tile (gemv only): activation rows sharing each loaded weight chunk: 1, 4, 8, or "auto" (the three variants,
    picked per dispatch by the row count). A row's result does not depend on the tile or on the other rows in it.
    """

    def __init__(self, lib, dtype: str, n: int, k: int, group_size: int, parts: list[WeightPart], x, y,
                 x_stride: int, y_stride: int, step, count_index: int = 0, params: ParamsFn | None = None,
                 bias=None, accumulate: bool = False, swiglu: bool = False, n_offset: int = 0, label: str = "linear",
                 kernel: str = "gemv", start_index: int = 0, rows8: bool = False, gemm_tokens: int = GEMM_TOKENS,
                 norm: tuple[Any, float] | None = None, tile: int | str = "auto"):
        if kernel not in ("gemv", "gemm"):
            raise ValueError(f"Linear: kernel must be 'gemv' or 'gemm', not {kernel!r}")
        if dtype not in ("q4", "q4a", "q8"):
            raise ValueError(f"Linear: unsupported weight dtype {dtype!r} (q4, q4a, q8)")
        if x_stride % 4:
            raise ValueError(f"Linear: x row stride {x_stride} must be a multiple of 4 floats (vec4 loads)")
        if group_size % 32:
            raise ValueError(f"Linear: group size {group_size} must be a multiple of 32")
        if swiglu and (n % 8 or len(parts) != 1 or bias is not None or accumulate):
            raise ValueError("Linear: swiglu needs one binding with 2*F rows, F a multiple of 4, no bias/accumulate")
        if bias is not None and len(parts) != 1:
            raise ValueError("Linear: a bias is supported on single-binding weights only")
        self.n, self.k, self.label, self.swiglu, self.kernel = n, k, label, swiglu, kernel
        if norm is not None and kernel != "gemv":
            raise ValueError("Linear: a folded RMSNorm (norm=...) is implemented in the gemv kernel only")
        defines: dict[str, object] = {"DTYPE": dtype, "WG": WG}
        slot = 7 if dtype == "q4a" else 6  # first binding after the fixed ones (and mins)
        if norm is not None:
            defines["NORM"] = 1
            defines["NORM_SLOT"] = slot
            slot += 1
        if bias is not None:
            defines["BIAS"] = 1
            defines["BIAS_SLOT"] = slot
        if accumulate:
            defines["ACCUMULATE"] = 1
        if swiglu:
            defines["SWIGLU"] = 1
        if kernel == "gemv":
            if tile not in (1, 4, 8, "auto"):
                raise ValueError(f"Linear: the decode tile must be 1, 4, 8 or 'auto', not {tile!r}")
        eight = kernel == "gemv" and (swiglu or rows8)
        if eight:
            defines["ROWS8"] = 1
        if kernel == "gemm":
            if gemm_tokens not in (4, 8):
                raise ValueError(f"Linear: gemm_tokens must be 4 or 8, not {gemm_tokens}")
            defines["TT"] = gemm_tokens
        self.dtype = dtype
        params = params or standalone_params(lib.device)
        w4, s_stride = weight_strides(dtype, k, group_size)
        # one (pipeline, tokens per workgroup row, [(bind group, grid x)]) per variant, all built here at load
        self._variants: list[tuple[Any, int, list[tuple[Any, int]]]] = []
        tiles = [gemm_tokens] if kernel == "gemm" else (list(AUTO_TILES) if tile == "auto" else [tile])
        u_of_part: list[Any] = []
        for p in parts:
            if (p.mins is None) != (dtype != "q4a"):
                raise ValueError(f"Linear {label}: q4a weights need mins, other dtypes none")
            eps = float(norm[1]) if norm is not None else 0.0
            u_of_part.append(params(struct.pack(_PARAMS, p.rows, k, group_size, w4, s_stride, x_stride // 4, y_stride,
                                                n_offset + p.row0, count_index, start_index, eps, 0)))
        for tt in tiles:
            if kernel == "gemv":
                defines["TILE"] = tt
            pipeline = lib.pipeline(kernel, defines=dict(defines), use_f16=False)
            groups = []
            for p, u in zip(parts, u_of_part):
                binds = [p.qweight, p.scales, x, y, u, step]
                if dtype == "q4a":
                    binds.append(p.mins)
                if norm is not None:
                    binds.append(norm[0])
                if bias is not None:
                    binds.append(bias)
                bg = lib.device.create_bind_group(pipeline, binds)
                gx = -(-p.rows // ((2 if (swiglu or eight) else 1) * ROWS_PER_INVOCATION * WG))
                groups.append((bg, gx))
            self._variants.append((pipeline, tt, groups))
        self.pipeline = self._variants[-1][0]

    def encode(self, cmds, rows: int) -> None:
        """Record the dispatches for `rows` activation rows (at least step[count_index]; extra rows exit early).
        With several decode tiles, the smallest tile that holds `rows` in one workgroup row is used (the largest
        beyond that): a row's result is the same bits in every variant (per-row code and order are identical)."""
        if rows <= 0:
            return
        pipeline, tt, groups = self._variants[-1]
        for v in self._variants:
            if rows <= v[1]:
                pipeline, tt, groups = v
                break
        gy = -(-rows // tt)
        for bg, gx in groups:
            cmds.dispatch(pipeline, bg, gx, gy, 1, self.label)


def interleave_gate_up(gate_rows: list[bytes], up_rows: list[bytes]) -> bytes:
    """Rows of gate and up (same length F, F % 4 == 0) -> the fused order the SWIGLU kernel expects:
    4 gate rows, then the same 4 up rows, repeated. Works on any per-row component (qweight, scales, mins)."""
    if len(gate_rows) != len(up_rows) or len(gate_rows) % 4:
        raise ValueError("interleave_gate_up: gate and up need the same row count, a multiple of 4")
    out = []
    for j in range(0, len(gate_rows), 4):
        out += gate_rows[j : j + 4] + up_rows[j : j + 4]
    return b"".join(out)


def split_rows(data: bytes, rows: int) -> list[bytes]:
    if rows <= 0 or len(data) % rows:
        raise ValueError(f"split_rows: {len(data)} bytes do not divide into {rows} rows")
    rb = len(data) // rows
    return [data[i * rb : (i + 1) * rb] for i in range(rows)]
