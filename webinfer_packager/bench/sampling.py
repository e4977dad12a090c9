"""The GPU sampler's own time per row (timestamp queries), by sampling configuration, on a big vocabulary.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m webinfer_packager.bench.sampling [--model PKG] [--reps 5] [--json]
     ... --wgsl OLD.wgsl: A/B against another sample.wgsl (e.g. `git show REV:shaders/sample.wgsl > OLD.wgsl`),
     the two alternating round by round; the fastest round of each is reported, and whether their ids agree.
     ... --no-scan: A/B against this sampler without its argmax scan (kernels/sampling.py SCAN_MIN_VOCAB: one
     dispatch, the argmax in the sampler's own workgroup), for a vocabulary that has one.
Logits: with --model, the package's logits after a short prompt (one decode step on the native device); else a
synthetic 262,144-token row shaped like real ones (a few strong tokens over a long tail). Every sampled id is also
checked against the reference sampler's inverse CDF (`ok` / `WRONG`; draws within 1e-5 of a CDF step: `unsure`).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np

from tests.gpu.check_op import GpuArray
from webinfer.gpu.native import request_device_sync
from webinfer.kernels.library import KernelLibrary, load_source
from webinfer.kernels.preprocess import preprocess
from webinfer.kernels.sampling import GpuSampler, SampleRow, pack_rows, uniform
from webinfer_packager.reference.model import Sampler
from webinfer_packager.reference.runner import inverse_cdf

CONFIGS = [("greedy", {}), ("T 1", dict(temperature=1.0)), ("T 0.7 top-k 40", dict(temperature=0.7, top_k=40)),
           ("T 0.7 top-p 0.95", dict(temperature=0.7, top_p=0.95)), ("T 1 top-p 0.9", dict(temperature=1.0, top_p=0.9)),
           ("T 2 top-p 0.99", dict(temperature=2.0, top_p=0.99))]


def model_logits(dev, path: str) -> np.ndarray:
    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer.engine.gpu_model import GPUModel
    from webinfer.package import Package

    m = asyncio.run(GPUModel.load(dev, Package.open(path), num_blocks=3, block_size=16, max_seqs=1))
    v = m.cfg.vocab_size
    prompt = [t % v for t in (2, 504, 3458, 2114, 253, 1029, 30, 314)]
    asyncio.run(m.execute(StepBatch([SeqChunk(0, prompt, 0, [1], True)])))
    return np.frombuffer(dev.read_buffer_sync(m.logits_buf, 0, 4 * v), np.float32).copy()


def synthetic_logits(vocab: int = 262144) -> np.ndarray:
    rng = np.random.default_rng(262)
    lg = (rng.standard_normal(vocab) * 2.5 - 40.0).astype(np.float32)
    lg[rng.integers(0, vocab, 60)] += rng.uniform(4.0, 9.0, 60).astype(np.float32)
    return lg


def _expected(lg: np.ndarray, row: SampleRow) -> tuple[int, bool]:
    """(the reference's id, whether f32 cannot land on another one: 1e-5 or more from a CDF step)."""
    if row.temperature == 0:
        return int(np.argmax(lg)), True
    i, gap = inverse_cdf(Sampler(row.temperature, row.top_k, row.top_p).probs(lg.astype(np.float64)),
                         uniform(row.seed, row.index))
    return i, gap >= 1e-5


def _sampler(lib, vocab: int, wgsl: str | None = None, scan: bool = True) -> GpuSampler:
    """This tree's sampler (scan=False: without its argmax scan), or (wgsl) the same built from another sample.wgsl,
    with its scan where that file has one (sample.wgsl SCAN)."""
    if not wgsl:
        return GpuSampler(lib, vocab, scan=scan)
    src = open(wgsl).read()
    s = GpuSampler(lib, vocab, scan="#ifdef SCAN" in src)

    def compile_(defines: dict, label: str):
        defs = lib.standard_defines(False)
        defs.update(defines)
        code = lib.device.wgsl_enables(False, "SUBGROUPS" in defs) + preprocess(src, defs, load_source, "sample")
        return lib.device.create_pipeline(code, label=label)

    s.pipeline = compile_(s.defines, "sample.other")
    if s.scan is not None:
        s.scan = compile_(s.scan_defines, "sample.other.scan")
    return s


def run(model: str | None, reps: int, wgsl: str | None, no_scan: bool = False) -> dict:
    dev = request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    lg = model_logits(dev, model) if model else synthetic_logits()
    vocab = lg.size
    sides = {"this": _sampler(lib, vocab, None)}
    if wgsl or no_scan:
        sides["other"] = _sampler(lib, vocab, wgsl, scan=False)
    wgsl = wgsl or ("(no scan)" if no_scan else None)
    logits = GpuArray.upload(dev, lg.reshape(1, vocab))
    out = {"device": dev.info.name, "vocab": vocab, "logits": model or "synthetic", "configs": []}
    print(f"{dev.info.name}; vocab {vocab} ({out['logits']}); fastest of {reps} rounds, ms per row")
    for name, kw in CONFIGS:
        ms = {k: [] for k in sides}
        ids = {k: [] for k in sides}
        verdict = {k: "ok" for k in sides}
        for r in range(reps + 1):
            row = SampleRow(0, seed=r, **kw)
            for k in (list(sides) if r % 2 else list(sides)[::-1]):
                s = sides[k]
                params = GpuArray.upload(dev, np.frombuffer(pack_rows([row]), np.uint8))
                got = GpuArray.empty(dev, (1,), np.uint32)
                b = s.bind(logits.binding, params.binding, got.binding)
                cmds = dev.commands(timed=True)
                s.encode(cmds, b, 1)
                dev.submit(cmds)
                t = sum(v for _, v in asyncio.run(dev.read_timings(cmds)))
                i = int(got.read()[0])
                want, sure = _expected(lg, row)
                if i != want:
                    verdict[k] = "WRONG" if sure else ("unsure" if verdict[k] == "ok" else verdict[k])
                ids[k].append(i)
                if r:  # round 0 compiles
                    ms[k].append(t)
        res = {"config": name, "ms": {k: round(min(v), 3) for k, v in ms.items()}, "ids": verdict}
        if wgsl:
            res["same_ids"] = ids["this"] == ids["other"]
        out["configs"].append(res)
        print(f"{name:18s} " + "  ".join(f"{k}: {res['ms'][k]:7.2f} ms ({verdict[k]})" for k in sides)
              + ("" if not wgsl else f"  same ids: {res['same_ids']}"), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a package: sample its logits after a short prompt (default: synthetic 262k)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--wgsl", help="another sample.wgsl to time beside this one")
    ap.add_argument("--no-scan", action="store_true", help="time this sampler without its argmax scan beside it")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.model, a.reps, a.wgsl, a.no_scan)
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
