"""GPU self tests the page runs through its worker (and the browser tests call): the copy kernel and the quantized
Linear on the browser's device, with guard regions after every output. Results go back as bytes (base64) to be
compared against numpy outside the browser. Pure Python (runs in Pyodide).
"""

from __future__ import annotations

import array
import base64
import json
import time

from .errors import WebinferError
from .gpu.device import COPY_DST, COPY_SRC, STORAGE, UNIFORM, BufferBinding
from .kernels.library import KernelLibrary
from .kernels.linear import Linear, LinearIO, QuantWeight, WeightPart


def device_summary(dev) -> dict:
    c = dev.caps
    return {"adapter": dev.info.name, "fallback": dev.info.is_fallback, "f16": c.f16, "subgroups": c.subgroups,
            "subgroup_size": c.subgroup_size, "timestamps": c.timestamps, "limits": dict(c.limits)}


async def selftest_copy(dev, n_words: int = 1 << 16) -> dict:
    """Run shaders/copy.wgsl through the KernelLibrary on `dev` and compare every word."""
    lib = KernelLibrary(dev)
    src_words = array.array("I", ((i * 2654435761) & 0xFFFFFFFF for i in range(n_words)))
    nbytes = 4 * n_words
    src = dev.create_buffer(nbytes, STORAGE | COPY_DST, "src")
    dst = dev.create_buffer(nbytes + 256, STORAGE | COPY_SRC | COPY_DST, "dst")  # guard region after the copy
    params = dev.create_buffer(16, UNIFORM | COPY_DST, "params")
    dev.write_buffer(src, 0, src_words)
    dev.write_buffer(params, 0, array.array("I", [n_words // 4, 0, 0, 0]))
    dev.write_buffer(dst, 0, b"\xab" * (nbytes + 256))
    pipe = lib.pipeline("copy")
    bg = dev.create_bind_group(pipe, [dev_binding(src), dev_binding(dst, 0, nbytes), params])
    cmds = dev.commands()
    threads = 256 * 4
    cmds.dispatch(pipe, bg, max(1, -(-(n_words // 4) // threads)))
    t0 = time.perf_counter()
    dev.submit(cmds)
    out = await dev.read_buffer(dst)
    ms = (time.perf_counter() - t0) * 1e3
    ok = out[:nbytes] == src_words.tobytes() and out[nbytes:] == b"\xab" * 256
    for b in (src, dst, params):
        dev.destroy_buffer(b)
    return {"ok": ok, "words": n_words, "ms": ms, "device": device_summary(dev)}


GUARD_BYTES = 256
GUARD = b"\xab" * GUARD_BYTES  # NaN-free pattern (0xabababab is a finite float) that no kernel writes


async def selftest_gemv(dev, spec_json: str) -> dict:
    """Run the quantized Linear (webinfer/kernels/linear.py) on the browser device for each case of
    spec["cases"]: weights and activations given by the caller (base64), a guard region after y; returns y + guard
    (base64) per case, to be compared against numpy outside the browser. A case: dtype, n, k, t, group_size,
    kernel ("gemv"|"gemm"), x_stride, qweight, meta (kernels/linear.py pack_meta), [qhigh], x (f32 rows of
    x_stride floats)."""
    lib = KernelLibrary(dev)
    results = [await _gemv_case(dev, lib, case) for case in json.loads(spec_json)["cases"]]
    return {"results": results, "device": device_summary(dev)}


async def _gemv_case(dev, lib, spec: dict) -> dict:
    n, k, t = int(spec["n"]), int(spec["k"]), int(spec["t"])
    owned = []

    def upload(b64: str, label: str):
        data = base64.b64decode(b64)
        buf = dev.create_buffer(len(data) + (-len(data) % 4), STORAGE | COPY_DST, label)
        dev.write_buffer(buf, 0, data + b"\0" * (-len(data) % 4))
        owned.append(buf)
        return dev_binding(buf, 0, len(data) + (-len(data) % 4))

    part = WeightPart(0, n, upload(spec["qweight"], "qweight"), upload(spec["meta"], "meta"),
                      upload(spec["qhigh"], "qhigh") if spec.get("qhigh") else None)
    x = upload(spec["x"], "x")
    y_bytes = 4 * t * n
    y = dev.create_buffer(y_bytes + GUARD_BYTES, STORAGE | COPY_SRC | COPY_DST, "y")
    owned.append(y)
    dev.write_buffer(y, 0, b"\xcd" * y_bytes + GUARD)
    step = dev.create_buffer(16, STORAGE | COPY_DST, "step")
    owned.append(step)
    dev.write_buffer(step, 0, array.array("I", [t, 0, 0, 0]))  # step[0] = row count, step[1] = first row (gemm)
    kernel = spec.get("kernel", "gemv")
    weight = QuantWeight(spec["dtype"], n, k, int(spec["group_size"]), (part,))
    io = LinearIO(x, dev_binding(y, 0, y_bytes), int(spec["x_stride"]), n, dev_binding(step), count_index=0,
                  start_index=1)
    lin = Linear(lib, weight, io, kernel=kernel)
    cmds = dev.commands()
    lin.encode(cmds, t)
    t0 = time.perf_counter()
    dev.submit(cmds)
    out = await dev.read_buffer(y)
    ms = (time.perf_counter() - t0) * 1e3
    for b in owned:
        dev.destroy_buffer(b)
    return {"y": base64.b64encode(out).decode("ascii"), "y_bytes": y_bytes, "guard_ok": out[y_bytes:] == GUARD,
            "ms": ms, "kernel": kernel}


async def run(dev, name: str = "copy", spec_json: str = "{}") -> dict:
    """Run a named GPU self test (copy | gemv) on `dev`."""
    if name == "copy":
        return await selftest_copy(dev)
    if name == "gemv":
        return await selftest_gemv(dev, spec_json)
    raise WebinferError(f"unknown self test {name!r} (copy, gemv)")


def dev_binding(buf, offset: int = 0, size: int | None = None):
    return BufferBinding(buf, offset, size)
