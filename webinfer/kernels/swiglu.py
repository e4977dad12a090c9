"""SwiGLU on the GPU (shaders/swiglu.wgsl): out[t, i] = silu(gu[t, i]) * gu[t, F + i]; GeGLU with gelu=True.
SoftCap: logits soft-capping in place, x = cap * tanh(x / cap).

The model prefers the fused form (the SWIGLU epilogue of the gate/up GEMV in linear.py, one dispatch less per
layer); this standalone kernel is the fallback when that fusion does not apply.
"""

from __future__ import annotations

import struct

from .common import WG, ParamsFn, standalone_params


class SwiGLU:
    def __init__(self, lib, f: int, gu, out, in_stride: int, out_stride: int, step, count_index: int = 0,
                 params: ParamsFn | None = None, label: str = "swiglu", gelu: bool = False):
        self.f, self.label = f, label
        defines: dict[str, object] = {"WG": WG}
        if gelu:
            defines["GELU_TANH"] = 1
        self.pipeline = lib.pipeline("swiglu", defines=defines, use_f16=False)
        u = (params or standalone_params(lib.device))(struct.pack("<4I", f, in_stride, out_stride, count_index))
        self.bind_group = lib.device.create_bind_group(self.pipeline, [gu, out, u, step])

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, -(-self.f // WG), rows, 1, self.label)


class SoftCap:
    """x[t, i] = cap * tanh(x[t, i] / cap) in place for rows t < step[count_index], i < n (row stride `stride`)."""

    def __init__(self, lib, n: int, cap: float, x, stride: int, step, count_index: int = 0,
                 params: ParamsFn | None = None, label: str = "softcap"):
        self.n, self.label = n, label
        self.pipeline = lib.pipeline("swiglu", defines={"WG": WG, "SOFTCAP": 1}, use_f16=False)
        cap_bits = struct.unpack("<I", struct.pack("<f", float(cap)))[0]
        u = (params or standalone_params(lib.device))(struct.pack("<4I", n, cap_bits, stride, count_index))
        self.bind_group = lib.device.create_bind_group(self.pipeline, [x, u, step])

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, -(-self.n // WG), rows, 1, self.label)
