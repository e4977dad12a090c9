"""RMSNorm on the GPU (shaders/rmsnorm.wgsl), optionally fused with the residual add or with a row gather.

    RMSNorm(..., residual=r)   h = x + r; r = h; y = rmsnorm(h) * w   (one pass instead of add + norm)
    RMSNorm(..., row_map=m)    y[t] = rmsnorm(x[m[t]]) * w            (final norm of the sampled rows only)
    RMSNorm(..., accumulate=True)  y[t] += rmsnorm(x[t]) * w          (Gemma's post norms into the residual)
    HeadNorm                   every q and k head of the qkv rows normalised in place (Qwen3 / Gemma 3)
One workgroup per row with a fixed reduction tree: a row's result does not depend on the other rows.
"""

from __future__ import annotations

import struct

from .common import WG, ParamsFn, standalone_params



class RMSNorm:
    def __init__(self, lib, k: int, eps: float, x, weight, y, x_stride: int, y_stride: int, step,
                 count_index: int = 0, params: ParamsFn | None = None, residual=None, row_map=None,
                 accumulate: bool = False, label: str = "rmsnorm"):
        if residual is not None and row_map is not None:
            raise ValueError("RMSNorm: residual add and row gather are separate variants")
        defines: dict[str, object] = {"WG": WG}
        if accumulate:
            defines["ACC"] = 1
        extra = []
        if residual is not None:
            defines["ADD"] = 1
            extra = [residual]
        if row_map is not None:
            defines["ROW_MAP"] = 1
            extra = [row_map]
        self.label = label
        self.pipeline = lib.pipeline("rmsnorm", defines=defines, use_f16=False)
        u = (params or standalone_params(lib.device))(
            struct.pack("<4If3I", k, x_stride, y_stride, count_index, float(eps), 0, 0, 0))
        self.bind_group = lib.device.create_bind_group(self.pipeline, [x, weight, y, u, step] + extra)

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, 1, rows, 1, self.label)


class HeadNorm:
    """RMSNorm over each head_dim-long q and k head of the qkv rows, in place, before RoPE. weight: q_norm then
    k_norm ([2 * head_dim] f32). One workgroup per (head, token)."""

    def __init__(self, lib, n_heads: int, n_kv_heads: int, head_dim: int, eps: float, qkv, weight, qkv_stride: int,
                 step, count_index: int = 0, params: ParamsFn | None = None, label: str = "qk_norm"):
        self.heads, self.label = n_heads + n_kv_heads, label
        self.pipeline = lib.pipeline("rmsnorm", defines={"WG": WG, "HEADS": 1}, use_f16=False)
        u = (params or standalone_params(lib.device))(
            struct.pack("<4If3I", head_dim, qkv_stride, n_heads, count_index, float(eps), 0, 0, 0))
        self.bind_group = lib.device.create_bind_group(self.pipeline, [qkv, weight, u, step])

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, self.heads, rows, 1, self.label)
