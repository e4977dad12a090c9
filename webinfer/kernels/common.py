"""Helpers every kernel wrapper shares: the workgroup size, how a dispatch gets its uniform parameters, and the
storage-binding limit of the device.

Pure Python (it runs in Pyodide).
"""

from __future__ import annotations

from typing import Callable

from ..gpu.device import COPY_DST, UNIFORM, BufferBinding

WG = 64  # invocations per workgroup of the element-wise kernels and the GEMV/GEMM (8 SIMD batches on llvmpipe)

ParamsFn = Callable[[bytes], BufferBinding]  # a dispatch's constant parameters -> where they live


def standalone_params(device) -> ParamsFn:
    """A ParamsFn that gives each dispatch its own small uniform buffer (tests; the model uses an arena)."""

    def make(data: bytes) -> BufferBinding:
        data = data + b"\0" * (-len(data) % 16)
        buf = device.create_buffer(len(data), UNIFORM | COPY_DST, label="params")
        device.write_buffer(buf, 0, data)
        return BufferBinding(buf, 0, len(data))

    return make


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
