"""Where a q4 GEMV's time goes on this adapter: its weight loads alone, its arithmetic alone, and both, beside the
copy kernel and the project's own GEMV, all interleaved in one run (issue 12's GEMV >= 0.7x copy target).

    XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.gemv_ceiling [--rounds 15]

Three stripped kernels over a 4096 x 4096 matrix of Q4_0 codes (16 bytes per 32 weights), laid out as the package's
(rows of chunks), 8 weight rows per invocation, the activations broadcast within the subgroup, the scales loaded
once every 4 chunks, one f32 dot per chunk (the project's GEMV arithmetic, linear_common.wgsl):
    loads   the weight loads of `both`, XORed together: no arithmetic
    alu     `both` with each weight load replaced by arithmetic on the chunk index: no weight loads
    both    a lean GEMV
    gemv    webinfer's GEMV (kernels/linear.py) of the same shape and format
Each is timed with timestamp queries, the fastest of --rounds rounds (a shared machine slows single runs by 2x);
GB/s are of the codes (8 MiB), ratios against the fastest copy kernel of the run (read + write bytes).
On a GPU the `both` time is near max(loads, alu); where they add up (llvmpipe runs a load per lane and component,
in line with the arithmetic), no layout reaches copy speed: both >= loads + alu.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

N = K = 4096
C = K // 32
ROWS = 8

_HEAD = """
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> sc: array<vec4<f32>>;
const C = 128u;
fn lo4(u: u32) -> vec4<f32> { return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u)); }
fn hi4(u: u32) -> vec4<f32> { return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u)); }
fn d32(a: vec4<u32>, xs: array<vec4<f32>, 8>) -> f32 {
    return dot(lo4(a.x), xs[0]) + dot(hi4(a.x), xs[1]) + dot(lo4(a.y), xs[2]) + dot(hi4(a.y), xs[3])
         + dot(lo4(a.z), xs[4]) + dot(hi4(a.z), xs[5]) + dot(lo4(a.w), xs[6]) + dot(hi4(a.w), xs[7]);
}
fn load_x(c: u32, lane: u32) -> array<vec4<f32>, 8> {
    let xa = x[8u * c + lane % 8u];
    return array<vec4<f32>, 8>(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
        subgroupBroadcast(xa, 3u), subgroupBroadcast(xa, 4u), subgroupBroadcast(xa, 5u), subgroupBroadcast(xa, 6u),
        subgroupBroadcast(xa, 7u));
}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let n0 = g.x * ROWSu;
    var acc = array<f32, ROWS>();
    var s = array<f32, ROWS>();
    var bits = vec4<u32>(0u);
    for (var c = 0u; c < C; c++) {
        if (c % 4u == 0u) {
            for (var r = 0u; r < ROWSu; r++) { s[r] = sc[(n0 + r) * C / 4u + c / 4u].x; }
        }
BODY
    }
    // (w read once more: `alu` keeps its binding, an auto layout drops unused ones)
    for (var r = 0u; r < ROWSu; r++) { y[n0 + r] = acc[r] + f32(bits.x ^ bits.w) + f32(w[n0 + r].x) * 0.0; }
}
"""


def _kernel(kind: str) -> str:
    lines = ["        let xs = load_x(c, lane);"] if kind != "loads" else []
    for r in range(ROWS):
        if kind == "alu":
            lines.append(f"        let a{r} = vec4<u32>(c * 0x01234567u) + vec4<u32>(n0 + {r}u);")
        else:
            lines.append(f"        let a{r} = w[(n0 + {r}u) * C + c];")
        lines.append(f"        bits ^= a{r};" if kind == "loads" else f"        acc[{r}] += s[{r}] * d32(a{r}, xs);")
    if kind == "loads":  # x stays bound (an auto layout drops unused bindings)
        lines.append("        acc[0] += x[c].x * s[0];")
    return _HEAD.replace("ROWSu", f"{ROWS}u").replace("ROWS", str(ROWS)).replace("BODY", "\n".join(lines))


def stripped(dev, codes, x, y, scales) -> dict:
    """{kind: record(commands)} for the three stripped kernels over GpuArrays codes [N * C, 4] u32 (row n's chunk c
    at n * C + c), x [K / 4, 4] f32, y [N] f32 and scales [N * C / 4, 4] f32 (row n's scale of chunks 4j..4j+3 at
    x of row n * C / 4 + j); `both` computes y[n] = sum_c scale * dot(codes of chunk c, x) (tests/gpu: against
    numpy)."""
    if not dev.caps.subgroups or dev.caps.subgroup_size < 8:
        raise SystemExit("gemv_ceiling: the stripped kernels broadcast x within subgroups of >= 8 lanes; this device "
                         f"has {dev.caps.subgroup_size if dev.caps.subgroups else 'no subgroups'}")
    runs = {}
    for kind in ("loads", "alu", "both"):
        p = dev.create_pipeline(dev.wgsl_enables(False, True) + _kernel(kind), f"ceiling.{kind}")
        bg = dev.create_bind_group(p, [codes.binding, x.binding, y.binding, scales.binding])
        runs[kind] = lambda c, p=p, bg=bg: c.dispatch(p, bg, N // ROWS // 64, 1, 1, "k")
    return runs


def main() -> None:
    from tests.gpu.check_op import GpuArray, uniform
    from tests.gpu.quant_ref import random_weight, upload_weight
    from webinfer.gpu.native import request_device_sync
    from webinfer.kernels.library import KernelLibrary
    from webinfer.kernels.linear import Linear, LinearIO

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    dev = request_device_sync(limits="browser", timestamps=True)
    rng = np.random.default_rng(0)
    codes = GpuArray.upload(dev, rng.integers(0, 2**32, (N * C, 4), dtype=np.uint32))
    x = GpuArray.upload(dev, rng.standard_normal((K // 4, 4)).astype(np.float32))
    y = GpuArray.empty(dev, (N,), np.float32)
    scales = GpuArray.upload(dev, np.ones((N * C // 4, 4), np.float32))
    runs = stripped(dev, codes, x, y, scales)
    lib = KernelLibrary(dev)
    comps, _ = random_weight("q4", N, K, seed=1)
    step = GpuArray.upload(dev, np.array([1, 0, 0, 0], np.uint32)).binding
    lin = Linear(lib, upload_weight(dev, "q4", N, K, comps),
                 LinearIO(x.binding, y.binding, K, N, step, count_index=0, start_index=2), kernel="gemv")
    runs["gemv"] = lambda c: lin.encode(c, 1)
    n_vec4 = (64 << 20) // 16
    src = GpuArray.upload(dev, np.zeros((n_vec4, 4), np.uint32))
    dst = GpuArray.empty(dev, (n_vec4, 4), np.uint32)
    cp = lib.pipeline("copy")
    cbg = dev.create_bind_group(cp, [src.binding, dst.binding, uniform(dev, "<4I", n_vec4, 0, 0, 0)])
    runs["copy"] = lambda c: c.dispatch(cp, cbg, 4096, n_vec4 // (4096 * 1024), 1, "copy")

    def once(record) -> float:
        cmds = dev.commands(timed=True)
        record(cmds)
        dev.submit(cmds)
        return sum(t for _, t in asyncio.run(dev.read_timings(cmds)))

    best = {k: float("inf") for k in runs}
    for k in runs:  # the first run of each compiles (llvmpipe JITs at first use)
        once(runs[k])
    for _ in range(args.rounds):
        for k, record in runs.items():
            best[k] = min(best[k], once(record))
    copy_gbs = 2 * n_vec4 * 16 / best["copy"] / 1e6
    nbytes = N * C * 16
    print(f"{dev.info.name}: copy {copy_gbs:.2f} GB/s (read + write), fastest of {args.rounds} rounds")
    for k in ("loads", "alu", "both", "gemv"):
        gbs = nbytes / best[k] / 1e6
        print(f"  {k:6s} {best[k]:7.3f} ms  {gbs:6.2f} GB/s of codes  {gbs / copy_gbs:.2f}x copy")
    print(f"  loads + alu = {best['loads'] + best['alu']:.3f} ms against both = {best['both']:.3f} ms")


if __name__ == "__main__":
    main()
