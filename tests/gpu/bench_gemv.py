"""GEMV bandwidth on the native device, beside the copy kernel in the same run (timestamp queries).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m tests.gpu.bench_gemv [--reps 5]
(WEBINFER_DISABLE_SUBGROUPS=1 for the path without subgroupBroadcast)
Effective bytes = weight + scale (+ min) bytes; ratio = GEMV GB/s / copy GB/s (copy counts read + write bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import numpy as np

from tests.gpu.check_op import GpuArray, uniform
from webinfer.gpu.native import request_device_sync
from webinfer.kernels.library import KernelLibrary
from webinfer.kernels.linear import Linear, WeightPart
from webinfer_packager.quant import quantize

# (dtype, N, K, rows, kernel; gemv8 = 8 rows per invocation; gemv/t1, gemv/t4: decode tile of 1 or 4 activation
# rows instead of 8): SmolLM2's shapes are qkv 960x576, gate/up 3072x576, down 576x1536, head 49152x576
DECODE = [(d, n, k, t, kern) for d, n, k in [("q4a", 960, 576), ("q4a", 3072, 576), ("q4a", 576, 1536),
                                             ("q8", 49152, 576)]
          for t in (1, 4, 16) for kern in ("gemv/t1", "gemv/t4", "gemv")]
SHAPES = [("q4", 4096, 4096, 1, "gemv"), ("q4a", 4096, 4096, 1, "gemv"), ("q8", 4096, 4096, 1, "gemv"),
          ("q4a", 960, 576, 1, "gemv"), ("q4a", 3072, 576, 1, "gemv"), ("q4a", 576, 1536, 1, "gemv"),
          ("q8", 49152, 576, 1, "gemv"), ("q4a", 3072, 576, 16, "gemv"), ("q4a", 3072, 576, 16, "gemm"),
          ("q4a", 3072, 576, 64, "gemm"),
          ("q4", 4096, 4096, 1, "gemv8"), ("q4a", 4096, 4096, 1, "gemv8"), ("q8", 4096, 4096, 1, "gemv8"),
          ("q4a", 960, 576, 1, "gemv8"), ("q4a", 576, 1536, 1, "gemv8"), ("q8", 49152, 576, 1, "gemv8")]


def timed(dev, record, reps):
    ms = []
    for _ in range(reps + 1):  # the first run compiles the shader (llvmpipe JITs at first use): dropped
        cmds = dev.commands(timed=True)
        record(cmds)
        dev.submit(cmds)
        ms.append(sum(t for _, t in asyncio.run(dev.read_timings(cmds))))
    return statistics.median(ms[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode", action="store_true", help="only the decode shapes at 1/4/16 rows, tiles 1/4/8")
    args = ap.parse_args()
    dev = request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    n_vec4 = (64 << 20) // 16
    src = GpuArray.upload(dev, np.zeros((n_vec4, 4), np.uint32))
    dst = GpuArray.empty(dev, (n_vec4, 4), np.uint32)
    cp = lib.pipeline("copy")
    bg = dev.create_bind_group(cp, [src.binding, dst.binding, uniform(dev, "<4I", n_vec4, 0, 0, 0)])
    copy_ms = timed(dev, lambda c: c.dispatch(cp, bg, 4096, n_vec4 // (4096 * 1024), 1, "copy"), args.reps)
    copy_gbs = 2 * n_vec4 * 16 / copy_ms / 1e6
    print(f"{dev.info.name}; copy 64 MiB: {copy_ms:.2f} ms = {copy_gbs:.1f} GB/s (read+write)")
    rng = np.random.default_rng(0)
    for dtype, n, k, t, kernel in (DECODE if args.decode else SHAPES):
        comps = quantize(dtype, rng.standard_normal((n, k)).astype(np.float32), 32)
        nbytes = sum(v.nbytes for v in comps.values())
        up = {c: GpuArray.upload(dev, v, guard=False).buffer for c, v in comps.items()}
        x = GpuArray.upload(dev, rng.standard_normal((t, k)).astype(np.float32), guard=False).buffer
        y = GpuArray.empty(dev, (t, n)).buffer
        step = GpuArray.upload(dev, np.array([t, 0, 0, 0], np.uint32), guard=False).buffer
        lin = Linear(lib, dtype, n, k, 32, [WeightPart(0, n, up["qweight"], up["scales"], up.get("mins"))], x, y, k, n,
                     step, count_index=0, start_index=2, kernel=kernel[:4], rows8=kernel == "gemv8",
                     tile=int(kernel.split("/t")[1]) if "/t" in kernel else 8)
        ms = timed(dev, lambda c: lin.encode(c, t), args.reps)
        gbs = nbytes / ms / 1e6
        print(f"{kernel:7s} {dtype:4s} {n:6d}x{k:<5d} T={t:2d}: {ms:7.3f} ms  {gbs:6.2f} GB/s  ratio to copy {gbs / copy_gbs:.2f}")


if __name__ == "__main__":
    main()
