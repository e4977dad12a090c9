"""Two builds of the CPU engine's module, A and B, in one process: decode speed runs alternating, and the greedy ids
(and optionally exact mode's logits against an f64 reference) compared. How a kernel change is measured before it
is kept: on a shared 2-core machine two runs minutes apart differ by more than most changes, alternating runs in
one process do not.

    python -m webinfer_packager.bench.cpu_ab A.wasm B.wasm [--package PKG] [--mode fast|exact] [--rounds 8]
                                             [--tokens 48] [--variant relaxed|base] [--threads N] [--precision]
                                             [--context 40] [--sample [--min-p P]] [--json]
    python -m webinfer_packager.bench.cpu_ab A.wasm B.wasm --formats [--variant relaxed|base] [--json]

A.wasm, B.wasm: builds of wasm/kernels.c of the same variant (e.g. `git show REV:webinfer/cpu/kernels-relaxed.wasm >
a.wasm`, and `scripts/build-wasm.sh DIR` for a working tree's); --threads N > 1: the threads builds
(kernels-relaxed-threads.wasm), on N threads.
    decode       tok per CPU-second of single-sequence greedy decode (webinfer_packager.bench.cpu.decode_speed; with
                 --sample, the chat page's default sampling: temperature 0.7, top_p 0.95, seed 1, plus --min-p;
                 with --temperature T, T alone, seed 1) after a
                 --context-token prompt (long ones: where attention weighs), A and B
                 alternating for --rounds rounds (>= 2): half on a pair of runners loaded A first, half on a
                 pair loaded B first (the second-loaded one ran 2-7 % faster with the same module), medians, B / A
                 per pair and their geometric mean (b_over_a), every run. Threads:
                 wall-clock tok/s instead (CPU time counts both threads), meaningful on a quiet machine only
    same_ids     whether A and B decode the same greedy (--sample: sampled) ids (a kernel change meant to keep the
                 bits must)
    precision    (--precision, exact mode) teacher-forced logits of a fixed chat against the numpy reference model
                 in float32 and float64 (webinfer_packager.reference): RMS and max distance, argmax agreement
    formats      (--formats, no package) one GEMV per weight format and shape on random components
                 (tests/cpu/formats_np.py), loaded as the runner loads them (wi_repack where the build packs the
                 format): ms and GB/s of the package's bytes, exact and fast, A and B in alternating rounds
CPU time of this process: what another job on the machine takes is not counted, what it does to memory bandwidth
and caches is.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys

import numpy as np

from .cpu import PAGE_SAMPLING, decode_speed

# a chat in SmolLM2's tokenizer (any ids below the vocabulary work: the logits are compared, not the text)
TEACHER_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 282, 11326, 1024, 30, 2, 198, 1, 4093, 198,
               2683, 359, 253, 1789, 282, 4234, 30, 2, 198, 1, 520, 9531, 198, 57, 5248, 338, 1303, 314, 2, 198, 1,
               9520, 9531, 198, 504, 3767, 314, 3287, 282, 253, 4234, 30, 1373, 6548, 253, 1789]
PROMPT_LEN = 40


def load(package, module: bytes, variant: str, mode: str, threads: int = 1, max_model_len: int = 512):
    from webinfer.cpu import load_cpu_runner
    from webinfer.cpu.wasm import WasmtimeHost

    host = WasmtimeHost(variant, threads=threads, module=module)
    runner = asyncio.run(load_cpu_runner(package, mode=mode, num_blocks=8 + max_model_len // 16,
                                         max_model_len=max_model_len, max_seqs=16, host=host))
    runner.calibrate_head()  # as the engine's native load does (a module before the Model's head_wide ignores it)
    return runner


def greedy_ids(runner, n: int, sampling: dict | None = None) -> list[int]:
    """n ids decoded straight through runner.execute: greedy, or drawn with `sampling` (decode_speed's keys)."""
    from webinfer.engine.batch import SeqChunk, StepBatch

    ids = [(7 * i + 11) % runner.vocab_size for i in range(8)]
    table = list(range(1, -(-(len(ids) + n + 1) // runner.block_size) + 1))
    pos, out = 0, []
    for i in range(n):
        got = asyncio.run(runner.execute(StepBatch([SeqChunk(0, ids[pos:], pos, table, True, sample_index=i,
                                                             **(sampling or {}))])))
        pos = len(ids)
        ids += got
        out += got
    return out


def teacher_logits(runner, ids: list[int]) -> np.ndarray:
    """[len(ids) - PROMPT_LEN + 1, vocab] float64: the prompt's last row, then one row per fed token."""
    from webinfer.engine.batch import SeqChunk, StepBatch

    table = list(range(1, -(-len(ids) // runner.block_size) + 2))
    runner.full_logits = True
    asyncio.run(runner.execute(StepBatch([SeqChunk(0, ids[:PROMPT_LEN], 0, table, True)])))
    rows = [np.asarray(runner.logits(1)[0], np.float64)]
    for i in range(PROMPT_LEN, len(ids)):
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [ids[i]], i, table, True)])))
        rows.append(np.asarray(runner.logits(1)[0], np.float64))
    return np.stack(rows)


def reference_logits(package, ids: list[int], dtype) -> np.ndarray:
    from webinfer_packager.reference.model import ReferenceModel

    ref = ReferenceModel.from_package(package)
    if dtype == np.float64:
        ref = ReferenceModel(ref.cfg, _to64(ref.w))
    ref.reset()
    rows = [ref.forward(ids[:PROMPT_LEN], 0)[-1]]
    for i in range(PROMPT_LEN, len(ids)):
        rows.append(ref.forward([ids[i]], i)[-1])
    return np.stack(rows).astype(np.float64)


def _to64(o):
    if isinstance(o, np.ndarray) and o.dtype == np.float32:
        return o.astype(np.float64)
    if isinstance(o, list):
        return [_to64(x) for x in o]
    if dataclasses.is_dataclass(o):
        return dataclasses.replace(o, **{f.name: _to64(getattr(o, f.name)) for f in dataclasses.fields(o)})
    return o


def distance(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a - b)
    return {"rms": float(np.sqrt((d ** 2).mean())), "max": float(d.max()),
            "argmax_agree": float(np.mean(a.argmax(1) == b.argmax(1)))}


def run(a: bytes, b: bytes, package, mode: str = "fast", rounds: int = 8, tokens: int = 48,
        variant: str = "relaxed", precision: bool = False, threads: int = 1, context: int = 40,
        sampling: dict | None = None, chat: str | None = None) -> dict:
    from webinfer.package import Package

    if rounds < 2:
        raise ValueError("cpu_ab: --rounds must be >= 2 (half the rounds on each load order)")
    pkg = package if isinstance(package, Package) else Package.open(package)
    mml = max(512, -(-(context + tokens + 16) // 16) * 16)
    metric = "decode_tok_per_cpu_s" if threads == 1 else "decode_tok_s"
    # The runner loaded second measured faster with the same module in both (A/A, SmolLM2, one thread: B / A 1.02-1.07
    # in four runs, 2026-12-05; where each instance's memory lands, not run order, which alternating did not change):
    # so half the rounds run on a pair loaded A first, half on a pair loaded B first, and b_over_a is the geometric
    # mean of the two pairs' ratios (by_load_order: each)
    runs = {"A": [], "B": []}
    by_order = {}
    runners = {}
    for first in ("A", "B"):
        for r in runners.values():
            r.close()
        order = (first, "B" if first == "A" else "A")
        runners = {k: load(pkg, {"A": a, "B": b}[k], variant, mode, threads, mml) for k in order}
        half = {"A": [], "B": []}
        for i in range((rounds + (first == "A")) // 2):
            for k in order if i % 2 == 0 else order[::-1]:
                half[k].append(decode_speed(runners[k], tokens, context, sampling, chat)[metric])
        for k in half:
            runs[k] += half[k]
        by_order[f"{first}_loaded_first"] = round(statistics.median(half["B"]) / statistics.median(half["A"]), 3)
    try:
        med = {k: statistics.median(v) for k, v in runs.items()}
        ratios = list(by_order.values())
        res = {"package": pkg.name, "mode": mode, "variant": variant, "threads": threads, "rounds": rounds,
               "tokens": tokens, "context": context, "chat": chat, "metric": metric, "sampling": sampling,
               "decode": {k: {"median": round(med[k], 2), "runs": v} for k, v in runs.items()},
               "b_over_a": round((ratios[0] * ratios[1]) ** 0.5, 3), "by_load_order": by_order}
        ids = {k: greedy_ids(r, 16, sampling) for k, r in runners.items()}
        res["same_ids"] = ids["A"] == ids["B"]
        if precision:
            teach = [t % pkg.config.vocab_size for t in TEACHER_IDS]
            got = {k: teacher_logits(r, teach) for k, r in runners.items()}
            r32, r64 = reference_logits(pkg, teach, np.float32), reference_logits(pkg, teach, np.float64)
            res["precision"] = {"rows": len(r64), "reference_f32_vs_f64": distance(r32, r64),
                                **{f"{k}_vs_f64": distance(g, r64) for k, g in got.items()},
                                **{f"{k}_vs_f32": distance(g, r32) for k, g in got.items()}}
    finally:
        for r in runners.values():
            r.close()
    return res


# (a module built before the low-bit formats, q3k .. iq4xs, does not know their codes: time those on newer builds)
FORMAT_CASES = [("q4a", 32), ("q8", 32), ("q5_0", 32), ("q5_1", 32), ("q4k", 256), ("q5k", 256), ("q6k", 256),
                ("q3k", 256), ("q2k", 256), ("iq4nl", 32), ("iq4xs", 256)]
FORMAT_SHAPES = [(2048, 2048), (1536, 576), (576, 1536)]


def formats(a: bytes, b: bytes, variant: str = "relaxed", rounds: int = 2, reps: int = 30) -> list[dict]:
    """Per format and shape: ms of one GEMV (one activation row) in each module, the median of `rounds` rounds in
    which A and B alternate, with the layout each build gives the matrix."""
    from tests.cpu.formats_np import random_components
    from webinfer.cpu.runner import Arena, repack, weight_desc
    from webinfer.cpu.wasm import WasmtimeHost

    from .cpu import gemv_seconds

    mats = {}
    for name, module in (("A", a), ("B", b)):
        host = WasmtimeHost(variant, module=module)
        arena = Arena(host)
        for dt, gs in FORMAT_CASES:
            for n, k in FORMAT_SHAPES:
                if k % gs:
                    continue
                comps = random_components(dt, n, k, gs, np.random.default_rng(n + k))
                offs = {c: arena.put(v, f"{dt} {c}") for c, v in comps.items()}
                desc = arena.put(weight_desc(dt, n, k, gs, offs), f"{dt} desc")
                packed = repack(host, arena, desc, dt)
                mats[name, dt, n, k] = (host, arena, desc, packed, sum(map(len, comps.values())))
    times = {key: {"exact": [], "fast": []} for key in mats}
    for _ in range(rounds):
        for key in sorted(mats, key=lambda x: (x[1:], x[0])):  # A then B for each matrix
            host, arena, desc, _, _ = mats[key]
            for mode, fast in (("exact", 0), ("fast", 1)):
                times[key][mode].append(gemv_seconds(host, arena, desc, key[3], fast, reps))
    out = []
    for dt, gs in FORMAT_CASES:
        for n, k in FORMAT_SHAPES:
            if ("A", dt, n, k) not in mats:
                continue
            row = {"dtype": dt, "shape": [n, k], "package_bytes": mats["A", dt, n, k][4]}
            for side in ("A", "B"):
                nb = mats[side, dt, n, k][4]
                row[side] = {"layout": "packed" if mats[side, dt, n, k][3] else "package",
                             **{m: {"ms": round(statistics.median(v) * 1e3, 4),
                                    "gb_s": round(nb / statistics.median(v) / 1e9, 2)}
                                for m, v in times[side, dt, n, k].items()}}
            row["b_over_a_time"] = {m: round(row["B"][m]["ms"] / row["A"][m]["ms"], 3) for m in ("exact", "fast")}
            out.append(row)
    return out


def main(argv=None) -> int:
    from webinfer_packager.paths import default_package_dir

    ap = argparse.ArgumentParser(prog="python -m webinfer_packager.bench.cpu_ab", description=__doc__.split("\n")[0])
    ap.add_argument("a", help="module A (.wasm)")
    ap.add_argument("b", help="module B (.wasm)")
    ap.add_argument("--package", default=None, help="package folder (default: the packed default model)")
    ap.add_argument("--mode", choices=("fast", "exact"), default="fast")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--context", type=int, default=40, help="prompt tokens before the decoded ones")
    ap.add_argument("--variant", choices=("relaxed", "base"), default="relaxed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sample", action="store_true", help="decode with the chat page's default sampling (T 0.7, "
                    "top_p 0.95, seed 1) instead of greedy")
    ap.add_argument("--min-p", type=float, default=0.0, help="with --sample: min_p as well")
    ap.add_argument("--chat", default=None, help="decode the answer to this user message (the package's chat "
                    "template) instead of after a made-up --context-token prompt")
    ap.add_argument("--temperature", type=float, default=None,
                    help="decode sampled with this temperature alone (seed 1; every id kept), not with --sample")
    ap.add_argument("--precision", action="store_true", help="exact mode's logits against the f32 and f64 reference")
    ap.add_argument("--formats", action="store_true", help="GEMV per weight format on random matrices (no package)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with open(args.a, "rb") as fa, open(args.b, "rb") as fb:
        a, b = fa.read(), fb.read()
    if args.formats:
        rows = formats(a, b, args.variant)
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        for r in rows:
            print(f"{r['dtype']:5s} {r['shape'][0]}x{r['shape'][1]}: " + "  ".join(
                f"{m} A {r['A'][m]['ms']:.3f} ms ({r['A']['layout']}) B {r['B'][m]['ms']:.3f} ms "
                f"({r['B']['layout']}, {r['B'][m]['gb_s']} GB/s) B/A {r['b_over_a_time'][m]}" for m in ("exact", "fast")))
        return 0
    res = run(a, b, args.package or default_package_dir(), args.mode, args.rounds, args.tokens, args.variant,
              args.precision, args.threads, args.context,
              {**PAGE_SAMPLING, **({"min_p": args.min_p} if args.min_p else {})} if args.sample else
              {"temperature": args.temperature, "seed": 1} if args.temperature is not None else None, args.chat)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    d = res["decode"]
    what = "tok per CPU-second" if res["threads"] == 1 else "wall-clock tok/s on 2 threads"
    print(f"{res['package']} {res['mode']} ({res['variant']}), {res['sampling'] or 'greedy'}, {res['rounds']} x "
          f"{res['tokens']} tokens after "
          f"{res['context']}, {what}: "
          f"A {d['A']['median']} B {d['B']['median']}  B/A {res['b_over_a']}  same ids: {res['same_ids']}")
    for k in ("A", "B"):
        print(f"  {k} runs: {d[k]['runs']}")
    for k, v in res.get("precision", {}).items():
        if isinstance(v, dict):
            print(f"  logits {k}: rms {v['rms']:.3e} max {v['max']:.3e} argmax agree {v['argmax_agree']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
