"""RMSNorm on the GPU (shaders/rmsnorm.wgsl), optionally fused with the residual add or with a row gather.

    RMSNorm(..., residual=r)   h = x + r; r = h; y = rmsnorm(h) * w   (one pass instead of add + norm)
    RMSNorm(..., row_map=m)    y[t] = rmsnorm(x[m[t]]) * w            (final norm of the sampled rows only)
One workgroup per row with a fixed reduction tree: a row's result does not depend on the other rows.
"""

from __future__ import annotations

import struct

from .common import WG, ParamsFn, standalone_params



class RMSNorm:
    def __init__(self, lib, k: int, eps: float, x, weight, y, x_stride: int, y_stride: int, step,
                 count_index: int = 0, params: ParamsFn | None = None, residual=None, row_map=None,
                 label: str = "rmsnorm"):
        if residual is not None and row_map is not None:
            raise ValueError("RMSNorm: residual add and row gather are separate variants")
        defines: dict[str, object] = {"WG": WG}
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
