"""GEMV bandwidth on the native device, beside the copy kernel in the same run (timestamp queries).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.gemv [--reps 5] [--decode] [--formats q4k,q6k]
     XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.gemv --model PKG [--reps 7]: decode step A/B on a package,
     decode tiles (auto) against the same model restricted to tile 1 (one activation row per invocation, the old
     layout), alternating, at 1/4/16 sequences: median GPU ms per step, per-label split, and the copy kernel.
     XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.gemv --ksplit 1,8,32 [--model PKG] [--json]: the
     decode GEMV's lanes per row group (gemv.wgsl KSPLIT) A/B, interleaved rounds: at 4096x4096 and SmolLM2's shapes
     beside the copy kernel, and with --model a decode step of that package (GPU ms) at each value.
     XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.gemv --dispatches PKG: dispatches of one decode step
     per layer and in total, at a short and a long context (issue 12: <= 5 per layer + <= 3 after the layers).
(WEBINFER_DISABLE_SUBGROUPS=1 for the path without subgroupBroadcast)
Effective bytes = every component's bytes (qweight, qhigh, scales, mins, super); ratio = GEMV GB/s / copy GB/s
(copy counts read + write bytes). Weights are random codes (tests/gpu/quant_ref.py): timing does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import numpy as np

from tests.gpu.check_op import GpuArray, uniform
from tests.gpu.quant_ref import FORMAT_NAMES, random_weight, upload_weight
from webinfer.gpu.native import request_device_sync
from webinfer.kernels.library import KernelLibrary
from webinfer.kernels.linear import Linear, LinearIO

# (dtype, N, K, rows, kernel; gemv/t1, gemv/t4: decode tile of 1 or 4 activation rows instead of the auto
# choice): SmolLM2's shapes are qkv 960x576, gate/up 3072x576 (fused: 6144 rows), down 576x1536, head 49152x576
DECODE = [(d, n, k, t, kern) for d, n, k in [("q4a", 960, 576), ("q4a", 3072, 576), ("q4a", 576, 1536),
                                             ("q8", 49152, 576)]
          for t in (1, 4, 16) for kern in ("gemv/t1", "gemv/t4", "gemv")]
SMOLLM2 = [(960, 576), (6144, 576), (576, 1536), (49152, 576)]
SHAPES = ([(d, 4096, 4096, 1, "gemv") for d in FORMAT_NAMES]
          + [(d, n, k, 1, "gemv") for d in ("q4a", "q4k", "q6k") for n, k in SMOLLM2]
          + [("q4a", 3072, 576, 16, "gemv"), ("q4a", 3072, 576, 16, "gemm"), ("q4a", 3072, 576, 64, "gemm"),
             ("q4k", 3072, 576, 64, "gemm")])


def timed(dev, record, reps):
    ms = []
    for _ in range(reps + 1):  # the first run compiles the shader (llvmpipe JITs at first use): dropped
        cmds = dev.commands(timed=True)
        record(cmds)
        dev.submit(cmds)
        ms.append(sum(t for _, t in asyncio.run(dev.read_timings(cmds))))
    return statistics.median(ms[1:])


def _gemv_linears(model):
    for ly in model.layers:
        for d in ly.qkv + [ly.o] + ly.gate_up + [ly.down]:
            yield d.gemv
    yield model.lm_head


def model_ab(path: str, reps: int) -> None:
    from collections import defaultdict

    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer.engine.gpu_model import GPUModel
    from webinfer.package import Package

    def load_runner(path, device, **kw):
        return asyncio.run(GPUModel.load(device, Package.open(path), **kw))

    dev = request_device_sync(limits="browser", timestamps=True)
    new = load_runner(path, device=dev, num_blocks=16 * 4 + 1, block_size=16, max_seqs=16)
    old = load_runner(path, device=dev, num_blocks=16 * 4 + 1, block_size=16, max_seqs=16)
    for lin in _gemv_linears(old):
        lin.restrict_tiles((1,))  # tile 1 only: one activation row per invocation
    prompt = [1, 504, 3458, 2114, 253, 1029, 30, 314]  # 8 tokens; decode at position 8

    def batch(n):
        return StepBatch([SeqChunk(i, [prompt[-1]], len(prompt), [1 + 4 * i, 2 + 4 * i], True) for i in range(n)])

    for m in (new, old):  # fill the KV of 16 sequences once (prefill), so decode attends over 8 positions
        asyncio.run(m.execute(StepBatch([SeqChunk(i, prompt, 0, [1 + 4 * i, 2 + 4 * i], True) for i in range(16)])))
    print(f"{dev.info.name}; decode step GPU ms, medians of {reps} alternating A/B runs")
    for n in (1, 4, 16):
        res = {"tiles": defaultdict(list), "tile1": defaultdict(list)}
        for r in range(reps + 1):
            for name, m in (("tiles", new), ("tile1", old)) if r % 2 else (("tile1", old), ("tiles", new)):
                cmds, rows = m.encode_step(batch(n), timed=True)
                dev.submit(cmds)
                per = defaultdict(float)
                for label, ms in asyncio.run(dev.read_timings(cmds)):
                    key = label.split(".")[-1] if label.startswith("layers.") else label
                    per[key] += ms
                asyncio.run(m.sampler.read(rows))
                if r:  # the first round compiles
                    res[name]["total"].append(sum(per.values()))
                    for key, ms in per.items():
                        res[name][key].append(ms)
        med = {a: {k: statistics.median(v) for k, v in d.items()} for a, d in res.items()}
        top = sorted(med["tile1"], key=lambda k: -med["tile1"][k])[:7]
        print(f"{n:2d} seqs: " + "  ".join(f"{k} {med['tile1'][k]:.1f}->{med['tiles'][k]:.1f}" for k in top))


def copy_bandwidth(dev, lib, reps: int) -> tuple[float, float]:
    """(ms, GB/s read + write) of the copy kernel over 64 MiB."""
    n_vec4 = (64 << 20) // 16
    src = GpuArray.upload(dev, np.zeros((n_vec4, 4), np.uint32))
    dst = GpuArray.empty(dev, (n_vec4, 4), np.uint32)
    cp = lib.pipeline("copy")
    bg = dev.create_bind_group(cp, [src.binding, dst.binding, uniform(dev, "<4I", n_vec4, 0, 0, 0)])
    ms = timed(dev, lambda c: c.dispatch(cp, bg, 4096, n_vec4 // (4096 * 1024), 1, "copy"), reps)
    return ms, 2 * n_vec4 * 16 / ms / 1e6


def _random_problem(dev, rng, dtype: str, n: int, k: int, t: int):
    """A random `dtype` weight of n x k on the device and the LinearIO of t activation rows: (weight, io, weight
    bytes). Bindings, not whole buffers: the arrays sit between guard regions (NaN words: as activations or as the
    row count they would time something else)."""
    comps, _ = random_weight(dtype, n, k, seed=n + k)
    x = GpuArray.upload(dev, rng.standard_normal((t, k)).astype(np.float32)).binding
    y = GpuArray.empty(dev, (t, n)).binding
    step = GpuArray.upload(dev, np.array([t, 0, 0, 0], np.uint32)).binding
    return (upload_weight(dev, dtype, n, k, comps), LinearIO(x, y, k, n, step, count_index=0, start_index=2),
            sum(v.nbytes for v in comps.values()))


KSPLIT_SHAPES = [("q4a", 4096, 4096, 1), ("q4k", 4096, 4096, 1), ("q4a", 960, 576, 1), ("q4a", 6144, 576, 1),
                 ("q4a", 576, 1536, 1), ("q8", 49152, 576, 1), ("q4a", 960, 576, 4)]


def ksplit_ab(ksplits: list[int], reps: int, model: str | None = None) -> dict:
    """The decode GEMV at each KSPLIT, the values interleaved round by round (fastest round of each: a shared
    machine slows single runs), beside the copy kernel; with `model`, a decode step of that package (1 sequence,
    context 8) at each value, GPU ms from timestamps. The outputs' bits differ between values (the sum order)."""
    dev = request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    copy_ms, copy_gbs = copy_bandwidth(dev, lib, reps)
    out = {"device": dev.info.name, "copy_gb_s": round(copy_gbs, 2), "shapes": []}
    print(f"{dev.info.name}; copy 64 MiB: {copy_ms:.2f} ms = {copy_gbs:.1f} GB/s (read+write); fastest of {reps}")
    rng = np.random.default_rng(0)
    for dtype, n, k, t in KSPLIT_SHAPES:
        w, io, nbytes = _random_problem(dev, rng, dtype, n, k, t)
        lins = {s: Linear(lib, w, io, ksplit=s) for s in ksplits}
        ms = {s: [] for s in ksplits}
        for r in range(reps + 1):
            for s in (ksplits if r % 2 else ksplits[::-1]):
                cmds = dev.commands(timed=True)
                lins[s].encode(cmds, t)
                dev.submit(cmds)
                if r:  # round 0 compiles
                    ms[s].append(sum(v for _, v in asyncio.run(dev.read_timings(cmds))))
        row = {"dtype": dtype, "n": n, "k": k, "rows": t,
               "ms": {s: round(min(v), 4) for s, v in ms.items()},
               "of_copy": {s: round(nbytes / min(v) / 1e6 / copy_gbs, 3) for s, v in ms.items()}}
        out["shapes"].append(row)
        print(f"gemv {dtype:4s} {n:6d}x{k:<5d} T={t}: " + "  ".join(
            f"ksplit {s}: {row['ms'][s]:.3f} ms ({row['of_copy'][s]:.2f}x copy)" for s in ksplits), flush=True)
    if model:
        out["decode_step_ms"] = _model_ksplit(dev, model, ksplits, reps)
    return out


def _model_ksplit(dev, path: str, ksplits: list[int], reps: int) -> dict:
    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer.engine.gpu_model import GPUModel
    from webinfer.package import Package

    pkg = Package.open(path)
    models = {s: asyncio.run(GPUModel.load(dev, pkg, num_blocks=5, block_size=16, max_seqs=1, gemv_ksplit=s))
              for s in ksplits}
    prompt = [1, 504, 3458, 2114, 253, 1029, 30, 314]
    for m in models.values():
        asyncio.run(m.execute(StepBatch([SeqChunk(0, prompt, 0, [1, 2], True)])))
    ms = {s: [] for s in ksplits}
    for r in range(reps + 1):
        for s in (ksplits if r % 2 else ksplits[::-1]):
            m = models[s]
            cmds, rows = m.encode_step(StepBatch([SeqChunk(0, [prompt[-1]], len(prompt), [1, 2], True)]), timed=True)
            dev.submit(cmds)
            gpu = sum(v for _, v in asyncio.run(dev.read_timings(cmds)))
            asyncio.run(m.sampler.read(rows))
            if r:
                ms[s].append(gpu)
    res = {s: round(min(v), 3) for s, v in ms.items()}
    print("decode step, kernels' GPU ms (fastest): " + "  ".join(f"ksplit {s}: {v}" for s, v in res.items()))
    return res


def dispatches(path: str) -> None:
    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer.engine.gpu_model import GPUModel
    from webinfer.package import Package

    dev = request_device_sync(limits="browser")
    m = asyncio.run(GPUModel.load(dev, Package.open(path), num_blocks=64, block_size=16, max_seqs=4))
    layers = len(m.layers)
    for ctx in (m.attention.one_split, m.attention.one_split + 1):
        labels = [op[-1] for op in m.encode_step(StepBatch([SeqChunk(0, [7], ctx - 1, list(range(1, 64)), True)]))[0].ops
                  if op[0] == "dispatch"]
        per_layer = [x for x in labels if x.startswith("layers.") or x.startswith("attn")]
        print(f"decode step at context {ctx}: {len(labels)} dispatches = {len(per_layer) / layers:g} per layer x "
              f"{layers} + {len(labels) - len(per_layer)} others ({', '.join(x for x in labels if x not in per_layer)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode", action="store_true", help="only the decode shapes at 1/4/16 rows, tiles 1/4/8")
    ap.add_argument("--model", help="a package folder: decode step A/B (tiles vs tile 1) instead of the shapes")
    ap.add_argument("--formats", help="comma-separated formats to keep (default: all)")
    ap.add_argument("--dispatches", metavar="PKG", help="a package folder: dispatches per decode step")
    ap.add_argument("--ksplit", help="comma-separated gemv.wgsl KSPLIT values to A/B (e.g. 1,8,32)")
    ap.add_argument("--json", action="store_true", help="--ksplit: print the results as JSON at the end")
    args = ap.parse_args()
    if args.ksplit:
        res = ksplit_ab([int(v) for v in args.ksplit.split(",")], args.reps, args.model)
        if args.json:
            print(json.dumps(res))
        return None
    if args.dispatches:
        return dispatches(args.dispatches)
    if args.model:
        return model_ab(args.model, args.reps)
    dev = request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    copy_ms, copy_gbs = copy_bandwidth(dev, lib, args.reps)
    print(f"{dev.info.name}; copy 64 MiB: {copy_ms:.2f} ms = {copy_gbs:.1f} GB/s (read+write)")
    rng = np.random.default_rng(0)
    keep = set(args.formats.split(",")) if args.formats else None
    for dtype, n, k, t, kernel in (DECODE if args.decode else SHAPES):
        if keep and dtype not in keep:
            continue
        w, io, nbytes = _random_problem(dev, rng, dtype, n, k, t)
        lin = Linear(lib, w, io, kernel=kernel[:4], tiles=(int(kernel.split("/t")[1]),) if "/t" in kernel else None)
        ms = timed(dev, lambda c: lin.encode(c, t), args.reps)
        gbs = nbytes / ms / 1e6
        print(f"{kernel:7s} {dtype:4s} {n:6d}x{k:<5d} T={t:2d}: {ms:7.3f} ms  {gbs:6.2f} GB/s  "
              f"{8 * nbytes / (n * k):5.2f} bits/weight  ratio to copy {gbs / copy_gbs:.2f}")


if __name__ == "__main__":
    main()
