"""`webinfer bench --backend cpu`: the WebAssembly CPU engine (webinfer/cpu) in wasmtime, one JSON report.

    webinfer bench --backend cpu [PACKAGE] [--quick] [--ppl-text examples/data/eval.txt] [--json]
                   [--wasm-variant auto|base|relaxed]

In one process run, so the ratios hold on a busy machine:
    variant      which module runs (relaxed SIMD or base SIMD128) and why
    read_bw      a wasm read-bandwidth kernel (wi_read_bw: v128 loads summed) over 64 MiB
    gemv         every matrix of layer 0 and the LM head, and a large q4a matrix that does not fit
                 in cache: ms per GEMV and GB/s of the package's weight bytes (the packed layout the module reads
                 holds a little more: see wasm_memory_mb), exact and fast, beside read_bw (timed inside the
                 module, wi_linear_reps: the host's ~40-80 us per call from wasmtime-py is not in them)
    profile      where a decode step's time goes: every matrix of the model timed alone (layer 0's shapes x the
                 layer count, plus the LM head), against the measured step; the rest is attention, norms, RoPE,
                 sampling and the host (one wi_step call per step, its step-area write and the ids read)
    decode       tok/s of single-sequence greedy decode, exact and fast; first-token time of a 40-token prompt
                 already in the prefix cache; beside them decode_read_bound, the most one thread could do: read_bw
                 over the weight bytes a step reads (every matrix as the module holds it, packed or not), and each
                 mode's per-CPU-second figure as a fraction of it
    prefill      CPU seconds to the first token of a 40- and a 511-token prompt, and prompt tok per CPU-second;
                 prompt_scoring: the longest prompt scored (echo's prompt logprobs) beside it
    threads      the same decode on one thread and on two (the threads build), one after the other in each mode,
                 wall clock (what two threads change) with the load average around it, each beside the read
                 bandwidth of that many threads reading at once (two cores share one memory bus), the two-thread step
                 with blocking barriers only (spins 0) against the default polling; each thread's CPU ms per
                 fast step with blocking barriers (its share of the work, what survives a loaded machine);
                 more_threads: on a machine of 4+ cores the same decode on 4, 8, 16 threads (up to the cores)
    ppl          (--ppl-text) perplexity of exact and fast mode on the same windows, and the relative change
Native wasmtime figures; the page runs the same module in the browser's engine.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np


def _time(fn, reps: int, clock=time.process_time) -> float:
    """Median seconds of fn() over reps runs (after one warm-up). The default clock is this process's CPU time:
    on a shared machine wall-clock time mostly measures the other jobs (the module runs on one thread)."""
    fn()
    out = []
    for _ in range(reps):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return statistics.median(out)


def read_bandwidth(host, arena, nbytes: int = 64 << 20, reps: int = 5) -> float:
    off = arena.alloc(nbytes, "bench read buffer")
    host.write(off, bytes(range(256)) * (nbytes // 256))
    return nbytes / _time(lambda: host.call("wi_read_bw", off, nbytes, 1), reps) / 1e9


def read_bandwidth_together(variant: str, n: int = 2, nbytes: int = 64 << 20, reps: int = 3) -> float:
    """GB/s that `n` threads reading at once get together: wi_read_bw over nbytes each, in n module instances on n
    OS threads (wasm calls release the GIL), timed from the first start to the last end, median of `reps` (the
    bound on decode with n threads, which share the memory bus)."""
    import threading  # noqa: PLC0415

    from webinfer.cpu.runner import Arena  # noqa: PLC0415
    from webinfer.cpu.wasm import WasmtimeHost  # noqa: PLC0415

    bufs = []
    for _ in range(n):
        host = WasmtimeHost(variant)
        off = Arena(host).alloc(nbytes, "bench read buffer")
        host.write(off, bytes(range(256)) * (nbytes // 256))
        host.call("wi_read_bw", off, nbytes, 1)  # (warm: pages touched, code compiled)
        bufs.append((host, off))

    def once() -> float:
        ts = [threading.Thread(target=h.call, args=("wi_read_bw", off, nbytes, 2)) for h, off in bufs]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return n * 2 * nbytes / (time.perf_counter() - t0) / 1e9

    return statistics.median(once() for _ in range(reps))


def gemv_seconds(host, arena, desc: int, k: int, fast: int, reps: int) -> float:
    """Seconds of one GEMV (one activation row) of the weight at `desc`, timed over `reps` runs inside the module
    (one host call), median of 3 such calls after a warm-up."""
    n = struct.unpack("<2I", host.read(desc, 8))[1]
    x = arena.put(np.random.default_rng(0).standard_normal(k).astype(np.float32).tobytes(), "bench x")
    y = arena.alloc(4 * n, "bench y")
    scratch = arena.alloc(host.call("wi_linear_scratch_bytes", 1, k + 256), "bench scratch")
    return _time(lambda: host.call("wi_linear_reps", desc, x, k, y, n, 1, fast, scratch, reps), 3) / reps


def gemv(host, arena, desc: int, k: int, weight_bytes: int, reps: int) -> dict:
    """ms and GB/s of one GEMV of the weight at `desc`, exact and fast."""
    out = {}
    for mode, fast in (("exact", 0), ("fast", 1)):
        s = gemv_seconds(host, arena, desc, k, fast, reps)
        out[mode] = {"ms": round(s * 1e3, 4), "gb_s": round(weight_bytes / s / 1e9, 2)}
    return out


def greedy_head(host, arena, desc: int, x_off: int, k: int, n: int, reps: int) -> dict:
    """ms of the LM head in two passes (kernels.c, wi_head_two_pass: what an exact-mode step runs) for a greedy row
    and for a sampled row the two passes take (HEAD_SAMPLING: the page's defaults with min_p, whose cut, head_cut,
    lets more rows into the second pass; top-p alone takes the one-pass head) against the one-pass exact head
    (wi_linear) on the same activation row, alternating, medians of 5, and how many logits each second pass
    recomputed (the candidates' groups)."""
    from webinfer.kernels.sampling import SampleRow, pack

    y = arena.alloc(4 * n, "bench head y")
    kp = struct.unpack("<4I", host.read(desc, 16))[3]
    scratch = arena.alloc(host.call("wi_linear_scratch_bytes", 1, kp), "bench head scratch")
    params = arena.put(pack([SampleRow(0, **HEAD_SAMPLING)], n).params, "bench head params")
    times = {"exact_one_pass": [], "exact_greedy": [], "exact_sampled": []}
    for _ in range(5):
        times["exact_one_pass"].append(_time(lambda: host.call("wi_linear_reps", desc, x_off, k, y, n, 1, 0, scratch,
                                                              reps), 1) / reps)
        for key, p in (("exact_greedy", 0), ("exact_sampled", params)):
            times[key].append(_time(lambda: [host.call("wi_head_two_pass", desc, x_off, y, scratch, p)
                                             for _ in range(reps)], 1) / reps)
    host.call("wi_linear_reps", desc, x_off, k, y, n, 1, 0, scratch, 1)
    full = np.frombuffer(host.read(y, 4 * n), np.float32).copy()
    out = {key: round(statistics.median(v) * 1e3, 3) for key, v in times.items()}
    out["speedup"] = round(out["exact_one_pass"] / out["exact_greedy"], 3)
    out["sampled_speedup"] = round(out["exact_one_pass"] / out["exact_sampled"], 3)
    out["sampling"] = HEAD_SAMPLING
    for key, p in (("recomputed_logits", 0), ("sampled_recomputed_logits", params)):
        host.call("wi_head_two_pass", desc, x_off, y, scratch, p)
        out[key] = int((np.frombuffer(host.read(y, 4 * n), np.float32) == full).sum())
    return out


def step_profile(runner, layer0: tuple, head_desc: int, reps: int, rounds: int = 3) -> dict:
    """Per mode, in CPU milliseconds of thread 0 (one thread): a decode step (runner.execute, median of 8 steps:
    thread_step_ms), its remainder (attention, norms, RoPE, SwiGLU, sampling, the activations' preparation, the
    host's call), timed directly as the same step with every matrix skipped (wi_bench_skip_linear), the matrices'
    share of the step (step - remainder), and each matrix timed alone (layer 0's seven x the layer count, and the
    LM head: warm caches, so they say how the share divides, not its size). Each figure is the median over
    `rounds` rounds, all figures of a round timed together."""
    from webinfer.cpu.runner import FAST_GATE_UP16, mode_bits

    cfg, host, arena = runner.cfg, runner.host, runner.arena
    d, f = cfg.hidden_size, cfg.intermediate_size
    shapes = {"q": (layer0[4], d), "k": (layer0[5], d), "v": (layer0[6], d), "o": (layer0[7], cfg.q_dim),
              "gate": (layer0[8], d), "up": (layer0[9], d), "down": (layer0[10], f)}
    out = {}
    for mode in ("exact", "fast"):
        runner.set_mode(mode)
        bits = mode_bits(mode, cfg)
        gate = 2 if bits & FAST_GATE_UP16 else (bits >> 2) & 1
        fast = {"q": bits & 1, "k": bits & 1, "v": bits & 1, "o": (bits >> 1) & 1, "gate": gate, "up": gate,
                "down": 2 if bits & 32 else (bits >> 3) & 1}
        steps, rests, mats = [], [], {name: [] for name in [*shapes, "lm_head"]}
        for _ in range(rounds):
            steps.append(thread_step_ms(runner, 8)["0"])
            host.call("wi_bench_skip_linear", 1)
            try:
                rests.append(thread_step_ms(runner, 8)["0"])
            finally:
                host.call("wi_bench_skip_linear", 0)
            for name, (desc, k) in shapes.items():
                mats[name].append(1e3 * cfg.num_hidden_layers * gemv_seconds(host, arena, desc, k, fast[name], reps))
            mats["lm_head"].append(1e3 * gemv_seconds(host, arena, head_desc, d, (bits >> 4) & 1, max(1, reps // 20)))
        step, rest = statistics.median(steps), statistics.median(rests)
        ms = {name: round(statistics.median(v), 3) for name, v in mats.items()}
        out[mode] = {"step_ms": round(step, 2), "rest_ms": round(rest, 2), "matrices_in_step_ms": round(step - rest, 2),
                     "matrices_alone_ms": ms, "matrices_alone_total_ms": round(sum(ms.values()), 2)}
    host_us = _time(lambda: [host.call("wi_relaxed") for _ in range(100)], 3) / 100 * 1e6
    out["host_call_us"] = round(host_us, 1)
    return out


def _weight_bytes(t) -> int:
    return sum(t.rows * t.row_bytes(c) for c in t.components)


# the chat page's default sampling (web/store.js DEFAULT_SETTINGS), seeded: what `--sample` decodes with
PAGE_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "seed": 1}
# the API's defaults (OpenAI's: temperature 1, top_p 1), seeded: every id kept, the widest head (one pass, mostly)
API_SAMPLING = {"temperature": 1.0, "seed": 1}
# what many clients send: a temperature alone (every id kept: the one-pass LM head, kernels.c head_cut)
TEMPERATURE_SAMPLING = {"temperature": 0.7, "seed": 1}
# a sampled row the LM head's two passes take (min_p's cut; top-p alone and a temperature alone need every logit)
HEAD_SAMPLING = {**PAGE_SAMPLING, "min_p": 0.05}


def decode_speed(runner, n_tokens: int, prompt_len: int = 40, sampling: dict | None = None,
                 chat: str | None = None) -> dict:
    """Greedy requests (or `sampling`'s: temperature, top_p, min_p, seed) through the engine and API over `runner`
    (as a user runs it): wall-clock figures from the API's usage, and per CPU-second of this process (a 1-token
    request's CPU time subtracted from an n-token one's: the decode steps alone), the figure that holds on a busy
    machine. first_token_s is the n-token request's, whose prompt the warm-up requests left in the prefix cache:
    prefill_speed measures fresh prompts. The prompt: prompt_len made-up ids, or with `chat` that user message
    through the package's chat template (a made-up prompt gives flat next-token distributions; a chat gives the
    ones a user's decode sees, which the sampled LM head's cuts depend on)."""
    from webinfer.factory import EngineOptions, llm_for

    prompt = [(7 * i + 11) % runner.vocab_size for i in range(prompt_len)]
    llm = llm_for(runner.package, runner, EngineOptions(max_seqs=1, max_batch_tokens=runner.max_tokens))

    def req(n):
        c0 = time.process_time()
        kw = dict(max_tokens=n, ignore_eos=True, **(sampling or {"temperature": 0}))
        if chat is None:
            r = asyncio.run(llm.completions.create(prompt=prompt, **kw))
        else:
            r = asyncio.run(llm.chat.completions.create(messages=[{"role": "user", "content": chat}], **kw))
        return r["usage"], time.process_time() - c0

    req(1)  # warm-up (the first request builds the engine's state)
    # the garbage collector off while timing: a full collection inside one request and not the other (more likely in
    # a process holding many objects, e.g. under pytest) made the difference negative on a fast tiny model
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        cpu1 = min(req(1)[1] for _ in range(2))
        u, cpu_n = req(n_tokens)
    finally:
        if was:
            gc.enable()
    tpot = u["time_per_output_token_s"]
    return {"first_token_s": round(u["ttft_s"], 4), "decode_tok_s": round(1.0 / tpot, 2) if tpot else None,
            "decode_tok_per_cpu_s": round((n_tokens - 1) / (cpu_n - cpu1), 2) if cpu_n > cpu1 else None}


def _task_cpu_s(native_id: int) -> float | None:
    """CPU seconds of one thread of this process (Linux: schedstat's first field, ns); None elsewhere."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return None


def thread_step_ms(runner, n_steps: int) -> dict:
    """CPU ms per greedy decode step, straight through runner.execute, of thread 0 (the calling thread: the host's
    wi_step call) and, with two threads, of thread 1 (the host's worker thread): with blocking barriers (spins 0)
    each one's share of the work, whatever else the machine runs. The larger of the two bounds a step's time on
    two idle cores; its ratio to one thread's, what the second thread can give."""
    from webinfer.engine.batch import SeqChunk, StepBatch

    workers = getattr(runner.host, "_workers", None)
    tid1 = workers[0].thread.native_id if workers else None
    toks = [(7 * i + 11) % runner.vocab_size for i in range(8)]
    table = list(range(1, -(-(len(toks) + n_steps + 1) // runner.block_size) + 1))
    pos = 0
    out0, out1 = [], []
    for i in range(n_steps + 1):
        t0, c1 = time.thread_time(), _task_cpu_s(tid1) if tid1 else None
        ids = asyncio.run(runner.execute(StepBatch([SeqChunk(0, toks[pos:], pos, table, True)])))
        if i:  # (the first step is the prompt's prefill)
            out0.append(time.thread_time() - t0)
            if c1 is not None:
                out1.append(_task_cpu_s(tid1) - c1)
        pos = len(toks)
        toks += ids
    ms = lambda xs: round(statistics.median(xs) * 1e3, 2) if xs else None  # noqa: E731
    return {"0": ms(out0), "1": ms(out1)}


def threads_compare(runner, n_tokens: int, variant: str) -> dict:
    """Decode on one thread (`runner`) and on two (a second runner over the threads build, the same sizes), in
    each mode one after the other, wall clock: the ratio is what the second thread buys, meaningful only on a
    quiet machine (the load average before and after says how quiet it was). Also the two-thread fast decode with
    blocking barriers only (spins = 0: memory.atomic.wait32 at once) against the default polling."""
    from webinfer.cpu import load_cpu_runner
    from webinfer.cpu.wasm import SPINS

    two = asyncio.run(load_cpu_runner(runner.package, mode="exact", threads=2, num_blocks=runner.num_blocks,
                                      max_model_len=runner.max_model_len, max_seqs=runner.max_seqs,
                                      variant=variant))
    out = {"loadavg_before": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
           "note": "wall clock; per_cpu_s counts both threads' CPU time; weights_gb_s: decode tok/s x the weight "
                   "bytes a step reads, of_read_bw: its fraction of read_bw_gb_s for that many threads reading "
                   "at once",
           "read_bw_gb_s": {str(n): round(read_bandwidth_together(variant, n), 2) for n in (1, 2)}}
    try:
        for mode in ("exact", "fast"):
            runner.set_mode(mode)
            two.set_mode(mode)
            one_d, two_d = decode_speed(runner, n_tokens), decode_speed(two, n_tokens)
            ratio = (two_d["decode_tok_s"] / one_d["decode_tok_s"]
                     if one_d["decode_tok_s"] and two_d["decode_tok_s"] else None)
            out[mode] = {"1": one_d, "2": two_d, "wall_ratio_2_vs_1": round(ratio, 3) if ratio else None}
            for n, dd in (("1", one_d), ("2", two_d)):  # the weights' read rate, against what n threads can read
                if dd["decode_tok_s"] and out["read_bw_gb_s"][n]:
                    gb = dd["decode_tok_s"] * runner.step_weight_bytes / 1e9
                    dd["weights_gb_s"], dd["of_read_bw"] = round(gb, 2), round(gb / out["read_bw_gb_s"][n], 3)
        spins = {}
        for n in (0, SPINS):  # two.set_mode("fast") still holds
            two.host.write(two.host.team + 4, struct.pack("<I", n))
            spins[str(n)] = decode_speed(two, n_tokens)["decode_tok_s"]
        out["fast_2_threads_tok_s_by_barrier_spins"] = spins
        two.host.write(two.host.team + 4, struct.pack("<I", 0))
        one, both = thread_step_ms(runner, n_tokens), thread_step_ms(two, n_tokens)
        one_ms, two_ms = one["0"], both["0"]
        out["fast_thread0_cpu_ms_per_step"] = {"1": one_ms, "2 (blocking barriers)": two_ms,
                                               "ratio": round(one_ms / two_ms, 3) if two_ms else None}
        slow = max(both["0"], both["1"]) if both["1"] is not None else None
        out["fast_thread1_cpu_ms_per_step"] = {"2 (blocking barriers)": both["1"],
                                               "ratio_1_thread_vs_slower_of_2": round(one_ms / slow, 3) if slow
                                               else None}
    finally:
        two.close()
    out["more_threads"] = more_threads(runner, n_tokens, variant)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def more_threads(runner, n_tokens: int, variant: str, cores: int | None = None) -> dict:
    """Decode (both modes) and the first token of a 40-token prompt on each power of two from 4 up to the cores (at
    most 16), every step on all of them (no choice), beside the read bandwidth of that many threads reading at
    once; {"skipped": why} on a machine with fewer than 4 cores (more threads than cores measure the scheduler)."""
    from webinfer.cpu import load_cpu_runner

    cores = cores or os.cpu_count() or 1
    counts = [n for n in (4, 8, 16) if n <= cores]
    if not counts:
        return {"skipped": f"{cores} cores: more than two threads are measured on 4 or more"}
    out = {}
    for n in counts:
        many = asyncio.run(load_cpu_runner(runner.package, mode="exact", threads=n, num_blocks=runner.num_blocks,
                                           max_model_len=runner.max_model_len, max_seqs=runner.max_seqs,
                                           variant=variant))
        try:
            row = {"read_bw_gb_s": round(read_bandwidth_together(variant, n), 2)}
            for mode in ("exact", "fast"):
                many.set_mode(mode)
                row[mode] = decode_speed(many, n_tokens)
            out[str(n)] = row
        finally:
            many.close()
    return out


def prefill_speed(runner, lengths=(40, 511), reps: int = 3) -> dict:
    """CPU seconds (this process, median of `reps` after a warm-up) of a greedy 1-token request through the engine
    and API per prompt length: the first token's cost (prefill in max_batch_tokens chunks, the LM head of the last
    row, one sampling), and prompt tokens per CPU-second. 511: the longest prompt the bench's max_model_len of 512
    leaves room for one output token. prompt_scoring: the longest prompt scored instead (echo's prompt logprobs,
    max_tokens 0: every position through kernels.c wi_head), beside its prefill."""
    from webinfer.factory import EngineOptions, llm_for

    llm = llm_for(runner.package, runner, EngineOptions(max_seqs=1, max_batch_tokens=runner.max_tokens))
    out, seed = {}, iter(range(1, 1 << 20))

    def req(n, score=False):  # a new first token each time: no prefix-cache hit
        s = next(seed)
        prompt = [(7 * i + 11 * s) % runner.vocab_size for i in range(n)]
        how = {"max_tokens": 0, "echo": True, "logprobs": 1} if score else {"max_tokens": 1}
        asyncio.run(llm.completions.create(prompt=prompt, temperature=0, **how))

    for n in lengths:
        s = _time(lambda: req(n), reps)
        out[str(n)] = {"first_token_cpu_s": round(s, 4), "prefill_tok_per_cpu_s": round(n / s, 1)}
    scored = _time(lambda: req(lengths[-1], True), reps)
    out["prompt_scoring"] = {"prompt_tokens": lengths[-1], "scored_cpu_s": round(scored, 4),
                             "vs_prefill": round(scored / s, 3)}
    return out


def perplexity(runner, pkg, ids: list[int], window: int, stride: int) -> dict:
    """webinfer eval's windows and sums through the engine over this runner: each window a request whose prompt
    logprobs score it (the path `echo` and `webinfer eval --backend cpu` take)."""
    from webinfer.factory import EngineOptions, llm_for
    from webinfer_packager.cli.eval import evaluate_engine

    r = evaluate_engine(llm_for(pkg, runner, EngineOptions(max_seqs=1)), ids, window, stride)
    return {"nll": r["nll"], "ppl": r["ppl"], "tokens_scored": r["tokens_scored"]}


def run(package_path, quick: bool = False, ppl_text: str | None = None, variant: str = "auto") -> dict:
    from webinfer.package import Package
    from webinfer.cpu import load_cpu_runner

    pkg = Package.open(package_path)
    reps = 3 if quick else 10
    t0 = time.perf_counter()
    long_ctx = 480 if quick else 1000  # decode_long_context's prompt
    mml = min(pkg.config.max_position_embeddings, -(-(long_ctx + 96) // 16) * 16)
    runner = asyncio.run(load_cpu_runner(pkg, mode="exact", num_blocks=8 + mml // 16, max_model_len=mml,
                                         max_seqs=16, variant=variant))
    load_s = time.perf_counter() - t0
    host, arena = runner.host, runner.arena
    head_calibration = runner.calibrate_head()  # as the engine's native load does (webinfer.factory)
    res = {"backend": "cpu (wasm in wasmtime)", "variant": host.variant, "variant_reason": host.reason,
           "threads": 1, "load_s": round(load_s, 3), "wasm_memory_mb": round(runner.memory_bytes / 2**20, 1),
           "note": "kernel, bandwidth, profile and per-CPU-second figures: this process's CPU time; wall-clock "
                   "ones (decode_tok_s, first_token_s, load_s) include whatever else the machine runs"}
    # the exact LM head in one pass and in two, and the band limit for sampled rows it gives (CpuRunner.calibrate_head)
    res["head_calibration"] = head_calibration
    res["read_bw_gb_s"] = round(read_bandwidth(host, arena, (16 if quick else 64) << 20), 2)
    from webinfer.cpu.runner import LAYER_WORDS, MODEL_WORDS

    m = struct.unpack(f"<{MODEL_WORDS}I", host.read(runner.model_off, 4 * MODEL_WORDS))
    layer0 = struct.unpack(f"<{LAYER_WORDS}I", host.read(m[17], 4 * LAYER_WORDS))
    g = {}
    # every matrix of layer 0 (a Layer's words 4-10) and the LM head
    mats = [(f"layers.0.{n}", layer0[4 + i]) for i, n in enumerate(("q", "k", "v", "o", "gate", "up", "down"))]
    for name, desc in mats + [("lm_head" if "lm_head" in pkg.tensors else "embed", m[13])]:
        t = pkg.tensors[name]
        g[f"{name} {t.dtype} {t.rows}x{t.k}"] = gemv(host, arena, desc, t.k_padded or t.k, _weight_bytes(t), reps)
    # a q4a matrix far larger than the caches: streaming bandwidth
    from webinfer.cpu.runner import repack, weight_desc

    n, k = (2048, 4096) if quick else (8192, 4096)
    rng = np.random.default_rng(1)
    comps = {"qweight": rng.integers(0, 256, n * k // 2, dtype=np.uint8).tobytes(),
             "scales": np.full(n * k // 32, 0.01, np.float16).tobytes(),
             "mins": np.full(n * k // 32, -0.08, np.float16).tobytes()}
    offs = {c: arena.put(b, f"bench {c}") for c, b in comps.items()}
    desc = arena.put(weight_desc("q4a", n, k, 32, offs), "bench desc")
    repack(host, arena, desc, "bench q4a")  # as the runner loads it
    g[f"synthetic q4a {n}x{k}"] = gemv(host, arena, desc, k, sum(map(len, comps.values())), reps)
    for v in g.values():
        for mode in ("exact", "fast"):
            v[mode]["of_read_bw"] = round(v[mode]["gb_s"] / res["read_bw_gb_s"], 3)
    res["gemv"] = g
    # the greedy LM head on the final norm of a real step's last row (a short greedy chat's)
    if struct.unpack("<12I", host.read(m[13], 48))[11] == 1:  # (a packed head: the Weight's last word)
        from webinfer.engine.batch import SeqChunk, StepBatch

        runner.set_mode("exact")
        asyncio.run(runner.execute(StepBatch([SeqChunk(0, [(7 * i + 11) % runner.vocab_size for i in range(16)], 0,
                                                       [1, 2], True)])))
        res["greedy_head"] = greedy_head(host, arena, m[13], m[27], pkg.config.hidden_size, runner.vocab_size, reps)
    n_tok = 16 if quick else 64
    res["decode"] = {}
    # the limit beside decode: a step reads every matrix once (the bytes as the module holds them), so one thread
    # decodes at most read_bw / those bytes tokens a second, with nothing else costing time
    bound = res["read_bw_gb_s"] * 1e9 / runner.step_weight_bytes
    res["decode_read_bound"] = {"step_weight_mb": round(runner.step_weight_bytes / 1e6, 1),
                                "tok_s": round(bound, 1)}
    for mode in ("exact", "fast"):
        runner.set_mode(mode)
        res["decode"][mode] = decode_speed(runner, n_tok)
        per_cpu_s = res["decode"][mode]["decode_tok_per_cpu_s"]
        res["decode"][mode]["of_read_bound"] = round(per_cpu_s / bound, 3) if per_cpu_s else None
        # the chat page's default sampling beside greedy (exact mode: the two-pass LM head takes greedy rows), a
        # temperature alone, and the API's defaults (every id kept at T 1: the slowest sampled path)
        for key, sampling in (("sampled", PAGE_SAMPLING), ("sampled_temperature", TEMPERATURE_SAMPLING),
                              ("sampled_api_defaults", API_SAMPLING)):
            d = decode_speed(runner, n_tok, sampling=sampling)
            d["of_greedy"] = round(d["decode_tok_per_cpu_s"] / per_cpu_s, 3) if d["decode_tok_per_cpu_s"] and \
                per_cpu_s else None
            res["decode"][mode][key] = {"sampling": sampling, **d}
    # decode after a long prompt (its prefill in the prefix cache: the decode steps alone), beside the short prompt's
    # decode above: what attention over the context costs a step
    res["decode_long_context"] = {"context": long_ctx}
    if long_ctx + n_tok + 16 <= mml:
        for mode in ("exact", "fast"):
            runner.set_mode(mode)
            d = decode_speed(runner, n_tok, long_ctx)
            short = res["decode"][mode]["decode_tok_per_cpu_s"]
            d["of_short_context"] = round(d["decode_tok_per_cpu_s"] / short, 3) if d["decode_tok_per_cpu_s"] and short \
                else None
            res["decode_long_context"][mode] = d
    res["prefill"] = {}
    for mode in ("exact", "fast"):
        runner.set_mode(mode)
        res["prefill"][mode] = prefill_speed(runner, (40,) if quick else (40, 511), 1 if quick else 3)
    res["profile"] = step_profile(runner, layer0, m[13], reps=20 if quick else 100)
    res["threads"] = threads_compare(runner, n_tok, host.variant)
    # speculative decoding (prompt lookup) per mode, one thread, against plain decoding in the same minutes
    from .speculative import bench_speculative

    res["speculative"] = {mode: bench_speculative(package_path, max_tokens=32 if quick else 96, reps=1 if quick else 2,
                                                  backend="cpu", cpu_mode=mode, cpu_threads=1)
                          for mode in ("exact", "fast")}
    if ppl_text:
        from pathlib import Path

        from webinfer.prompt import Prompter
        from webinfer.tokenizer import Tokenizer

        text = Path(ppl_text).read_text(encoding="utf-8")
        ids = Prompter.for_package(pkg, Tokenizer.from_json(pkg.tokenizer_json())).text_ids(text)
        ids = ids[: 512 if quick else 1024]
        ppl = {}
        for mode in ("exact", "fast"):
            runner.set_mode(mode)
            t0 = time.perf_counter()
            ppl[mode] = {**perplexity(runner, pkg, ids, 256, 128), "seconds": round(time.perf_counter() - t0, 1)}
        ppl["fast_vs_exact_change"] = round(ppl["fast"]["ppl"] / ppl["exact"]["ppl"] - 1, 5)
        ppl["text"], ppl["window"], ppl["stride"] = str(ppl_text), 256, 128
        res["ppl"] = ppl
    return res


def cli_main(args) -> int:
    from webinfer_packager.paths import resolve_package

    res = run(resolve_package(args.package), quick=args.quick, ppl_text=args.ppl_text,
              variant=getattr(args, "wasm_variant", "auto"))
    text = json.dumps(res, indent=1)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    if args.json:
        print(text)
        return 0
    print(f"cpu engine: {res['variant_reason']}; load {res['load_s']} s, wasm memory {res['wasm_memory_mb']} MiB")
    print(f"read bandwidth (wasm v128 loads): {res['read_bw_gb_s']} GB/s")
    for name, v in res["gemv"].items():
        print(f"gemv {name:34s} exact {v['exact']['ms']:8.3f} ms {v['exact']['gb_s']:6.2f} GB/s"
              f"   fast {v['fast']['ms']:8.3f} ms {v['fast']['gb_s']:6.2f} GB/s")
    b = res["decode_read_bound"]
    print(f"decode's read bound: {b['step_weight_mb']} MB of weights a step at {res['read_bw_gb_s']} GB/s = "
          f"{b['tok_s']} tok/s on one thread")
    for mode, v in res["decode"].items():
        print(f"decode {mode:5s}: {v['decode_tok_s']} tok/s wall, {v['decode_tok_per_cpu_s']} per CPU-second "
              f"({v['of_read_bound']} of the read bound); first token of a 40-token prompt {v['first_token_s']} s")
        p = res["profile"][mode]
        print(f"  step {p['step_ms']} ms: matrices {p['matrices_in_step_ms']} ms, rest {p['rest_ms']} ms (timed with "
              f"the matrices skipped); matrices alone {p['matrices_alone_total_ms']} ms "
              f"({', '.join(f'{k} {v}' for k, v in p['matrices_alone_ms'].items())})")
    lc = res["decode_long_context"]
    for mode in ("exact", "fast"):
        if mode in lc:
            print(f"decode {mode:5s} after a {lc['context']}-token prompt: {lc[mode]['decode_tok_per_cpu_s']} per "
                  f"CPU-second ({lc[mode]['of_short_context']} of the 40-token prompt's)")
    t = res["threads"]
    for mode in ("exact", "fast"):
        one, two = t[mode]["1"], t[mode]["2"]
        print(f"threads {mode:5s}: 1 thread {one['decode_tok_s']} tok/s ({one.get('of_read_bw')} of 1 thread's read "
              f"bandwidth), 2 threads {two['decode_tok_s']} tok/s ({two.get('of_read_bw')} of 2 threads') wall "
              f"(x{t[mode]['wall_ratio_2_vs_1']}); load average {t['loadavg_before'][0]} -> {t['loadavg_after'][0]} "
              f"on {t['cores']} cores")
    print(f"read bandwidth, threads reading at once: {t['read_bw_gb_s']} GB/s")
    print(f"two threads, fast, by barrier polls before blocking: {t['fast_2_threads_tok_s_by_barrier_spins']} tok/s")
    print(f"thread 0's CPU ms per fast decode step: {t['fast_thread0_cpu_ms_per_step']}")
    print(f"thread 1's CPU ms per fast decode step: {t['fast_thread1_cpu_ms_per_step']}")
    for n, row in t["more_threads"].items():
        print(f"{n} threads: " + (row if n == "skipped" else
              f"exact {row['exact']['decode_tok_s']} tok/s, fast {row['fast']['decode_tok_s']} tok/s, first token "
              f"(exact) {row['exact']['first_token_s']} s; {n} threads read {row['read_bw_gb_s']} GB/s at once"))
    for mode, v in res["prefill"].items():
        print(f"prefill {mode:5s}: " + ", ".join(f"{n} tokens {p['first_token_cpu_s']} CPU-s to the first token "
                                                 f"({p['prefill_tok_per_cpu_s']} tok per CPU-second)"
                                                 for n, p in v.items()))
    for mode, sp in res["speculative"].items():
        print(f"prompt lookup {mode:5s}: " + ", ".join(
            f"{name} x{v['speedup']} ({v['plain_decode_tok_s']} -> {v['spec_decode_tok_s']} tok/s, accepted "
            f"{v['accepted']}/{v['proposed']}{'' if v['identical'] else ', OUTPUT DIFFERS'})"
            for name, v in sp["prompts"].items() if "speedup" in v))
    if "ppl" in res:
        p = res["ppl"]
        print(f"perplexity exact {p['exact']['ppl']:.4f}  fast {p['fast']['ppl']:.4f}  "
              f"change {100 * p['fast_vs_exact_change']:+.3f} %  ({p['exact']['tokens_scored']} tokens)")
    print(res["note"], file=sys.stderr)
    return 0
