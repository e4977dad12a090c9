"""`webinfer bench`: measure the kernels and generation on the GPU in use, in one run; JSON output.

    webinfer bench [PACKAGE] [--json] [--output FILE] [--quick] [--skip-hf]

Everything is measured on one device with timestamp queries where the GPU does the work (copy, GEMV, the kernels
of one decode step) and with the wall clock where the host is involved (a decode step, prefill, decode):

    adapter              name, backend, adapter type and the features the device got (f16, subgroups, timestamps)
    copy_gbps            shaders/copy.wgsl over a large buffer; bytes read + bytes written per second, median
    gemv                 q4 GEMV (webinfer/kernels/linear.py) at 4096x4096 and at the model's own shapes:
                         ms, GB/s of weight bytes (qweight + scales) and ratio to copy_gbps, in the layout the
                         engine runs on this adapter (gemv_ksplit: lanes per row group, 1 on a CPU adapter, 8)
    gemv_formats         the same at 4096x4096 for every weight format (q4 ... iq4xs), with bits per weight
    attention, sampling  GPU ms of this project's attention (decode, prefill) and sampling kernels alone
    kernels              per-label GPU ms of one timed decode step of the model (summed over layers)
    prefill_kernels      the same for one prefill chunk (min(prompt, max_batch_tokens) tokens)
    step_ms              wall time of one decode step (encode, submit, read back the sampled id); median
    host_overhead_frac   1 - GPU span / wall time of the same step (span: timestamps at the start of the step's
                         first pass and the end of its last): the share of a step the GPU is idle; median
    host_ms_per_step     the host's own work in that step, apart from the GPU's: record_ms (the model's Python:
                         inputs, uploads, the step's commands) and encode_submit_ms (the backend's command buffer
                         and queue submit); tok_s_bound = 1000 / their sum, the decode rate no GPU can lift a
                         single sequence above while the host records each step (decode blocks overlap it with
                         the GPU's work, they do not remove it); medians
    decode_block         decode tok/s with K steps per read-back (the engine's decode_block) and with single
                         steps, alternating on the same model, and their ratio
    dispatches_per_token dispatches one decode step records
    ttft_s, prefill_tok_s  a PROMPT_LEN-token prompt (512; 32 with --quick) to its first sampled token
    ttft_40              a 40-token prompt to its first token (median), and over the decode step's wall time
                         (issue 12's target: <= 3 step times)
    prompt_scoring       the PROMPT_LEN-token prompt scored (echo's prompt logprobs, max_tokens 0) beside its prefill
    decode_tok_s         DECODE_LEN tokens (128; 8 with --quick), greedy, one sequence
    next_turn            a chat's second turn to its first token, the first turn's answer computed as a prompt
                         (what the scheduler does where one-token rows differ from chunk rows: exact) and reused
                         as decoded, chats alternating (bench/next_turn.py); medians and each chat
    hf_transformers      the same model through HF transformers (model.generate, greedy; on CUDA in bf16 where torch
                         has a GPU, else on this CPU in f32): decode tok/s
                         and ratio = ours / theirs; null with a reason when skipped or not possible

Numbers are medians over a few repetitions (`quick` uses fewer); lavapipe on a shared 2-core box is noisy.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import struct
import time
from pathlib import Path

import numpy as np

from webinfer.gpu.device import COPY_DST, COPY_SRC, STORAGE, UNIFORM

from .scoring import measure as measure_scoring


def _median_timed(dev, record, reps: int) -> float:
    """Median ms of the dispatches `record(cmds)` adds, over `reps` timed submissions (after one warm-up)."""
    times = []
    for i in range(reps + 1):
        cmds = dev.commands(timed=True)
        record(cmds)
        dev.submit(cmds)
        t = asyncio.run(dev.read_timings(cmds))
        if i:  # the first run compiles and warms caches
            times.append(sum(ms for _, ms in t))
    return statistics.median(times)


def adapter_info(dev) -> dict:
    c = dev.caps
    feats = [n for n, on in (("shader-f16", c.f16), ("subgroups", c.subgroups), ("timestamp-query", c.timestamps)) if on]
    return {"name": dev.info.name, "backend": dev.info.backend, "adapter_type": dev.info.adapter_type,
            "features": feats, "subgroup_size": c.subgroup_size}


def bench_copy(dev, lib, nbytes: int, reps: int) -> float:
    """GB/s of the copy kernel (read + write bytes) over an nbytes buffer."""
    n_vec4 = nbytes // 16
    src = dev.create_buffer(nbytes, STORAGE | COPY_DST | COPY_SRC, "bench.copy.src")
    dst = dev.create_buffer(nbytes, STORAGE | COPY_SRC, "bench.copy.dst")
    dev.write_buffer(src, 0, np.arange(nbytes // 4, dtype=np.uint32).tobytes())
    u = dev.create_buffer(16, UNIFORM | COPY_DST, "bench.copy.params")
    dev.write_buffer(u, 0, struct.pack("<4I", n_vec4, 0, 0, 0))
    p = lib.pipeline("copy")
    bg = dev.create_bind_group(p, [src, dst, u])
    groups = -(-n_vec4 // (256 * 4))  # copy.wgsl: WG 256, 4 vectors per invocation
    ms = _median_timed(dev, lambda c: c.dispatch(p, bg, groups, 1, 1, "copy"), reps)
    ok = dev.read_buffer_sync(dst, nbytes - 64, 64) == dev.read_buffer_sync(src, nbytes - 64, 64)
    dev.destroy_buffer(src)
    dev.destroy_buffer(dst)
    if not ok:
        raise RuntimeError("bench: the copy kernel did not copy (its last bytes differ)")
    return 2 * nbytes / (ms / 1e3) / 1e9


def random_weight_bytes(dtype: str, n: int, k: int, group_size: int, seed: int) -> dict[str, bytes]:
    """Every component of an [n, k] weight in `dtype` as bytes, for timing: random codes and scale bytes, f16
    scales / super words a fixed 1/64 (finite, no denormals: values do not change the kernel's work)."""
    from webinfer.formats import FORMATS
    from webinfer.kernels.linear import WeightLayout

    lay = WeightLayout(dtype, k, group_size)
    rng = np.random.default_rng(seed)
    f16_words = np.full(2, 1 / 64, np.float16).view(np.uint32)[0]
    out = {}
    for c in ("qweight", "qhigh", "scales", "mins", "super"):
        words = n * lay.words(c)
        if not words:
            continue
        # f16 scales in the group formats; the super-block formats hold byte scales (and f16 super words)
        f16 = c == "super" or (c in ("scales", "mins") and FORMATS[dtype].fixed_group != 256)
        data = np.full(words, f16_words, np.uint32) if f16 else rng.integers(0, 2**32, size=words, dtype=np.uint32)
        if c in ("scales", "mins") and dtype in ("q4k", "q5k"):
            data &= np.uint32(0x3F3F3F3F)  # 6-bit sub-block scales
        out[c] = data.tobytes()
    return out


def bench_gemv(dev, lib, name: str, n: int, k: int, copy_gbps: float, reps: int, group_size: int = 32,
               dtype: str = "q4") -> dict:
    """One GEMV (a decode row) of a random `dtype` weight: ms, GB/s of all its component bytes, ratio to copy. In
    the layout the engine runs on this device (default_ksplit: lanes per row group)."""
    from webinfer.formats import FORMATS
    from webinfer.kernels.linear import Linear, LinearIO, QuantWeight, WeightPart, default_ksplit, pack_meta

    group_size = FORMATS[dtype].fixed_group or group_size
    comps = random_weight_bytes(dtype, n, k, group_size, n * 7 + k)
    bufs = []

    def upload(data: bytes, label: str):
        b = dev.create_buffer(len(data), STORAGE | COPY_DST, label)
        dev.write_buffer(b, 0, data)
        bufs.append(b)
        return b

    rng = np.random.default_rng(n + k)
    x = upload(rng.standard_normal(-(-k // 4) * 4).astype(np.float32).tobytes(), "bench.x")
    y = upload(b"\0" * 4 * n, "bench.y")
    step = upload(struct.pack("<4I", 1, 1, 0, 0), "bench.step")
    part = WeightPart(0, n, upload(comps["qweight"], "bench.w"), upload(pack_meta(dtype, comps, n), "bench.meta"),
                      upload(comps["qhigh"], "bench.qhigh") if "qhigh" in comps else None)
    lin = Linear(lib, QuantWeight(dtype, n, k, group_size, (part,)), LinearIO(x, y, -(-k // 4) * 4, n, step),
                 label=f"gemv {name}", ksplit=default_ksplit(dev))
    ms = _median_timed(dev, lambda c: lin.encode(c, 1), reps)
    for b in bufs:
        dev.destroy_buffer(b)
    nbytes = sum(len(v) for v in comps.values())
    gbps = nbytes / (ms / 1e3) / 1e9
    return {"name": name, "dtype": dtype, "shape": [n, k], "bits_per_weight": _sig(8 * nbytes / (n * k)),
            "ms": _sig(ms), "gbps": _sig(gbps), "ratio": _sig(gbps / copy_gbps) if copy_gbps else None}


def _sig(x: float, digits: int = 4) -> float:
    """Round to significant digits (tiny shapes have tiny GB/s that plain rounding would turn into 0)."""
    return float(f"{x:.{digits}g}")


def bench_attention(dev, lib, cfg, ctx: int, n_seqs: int, prefill: int, reps: int) -> dict:
    """GPU ms of the paged attention kernels at the model's head shape (random q/K/V, block size 16):
    `decode`: n_seqs sequences of ctx positions, one query each (decode + reduce); `prefill`: one chunk of
    `prefill` queries at the end of a ctx + prefill long sequence."""
    from webinfer.kernels.attention import PagedAttention, SeqStep, pack_step

    H, Hkv, hd, bs = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 16
    out: dict = {"shape": {"heads": H, "kv_heads": Hkv, "head_dim": hd, "block_size": bs}}
    rng = np.random.default_rng(1)
    for name, seqs in (("decode", [(ctx, 1)] * n_seqs), ("prefill", [(ctx + prefill, prefill)])):
        blocks = [-(-c // bs) for c, _ in seqs]
        total_blocks = 1 + sum(blocks)
        T = sum(n for _, n in seqs)
        steps, row, nxt = [], 0, 1
        for (c, n), nb in zip(seqs, blocks):
            steps.append(SeqStep(c, list(range(nxt, nxt + nb)), row, n))
            nxt, row = nxt + nb, row + n
        info, tables, shape = pack_step(steps)
        attn = PagedAttention(lib, n_heads=H, n_kv_heads=Hkv, head_dim=hd, block_size=bs,
                              max_model_len=ctx + prefill, max_seqs=len(seqs), label=f"attn.{name}")

        def up(data: bytes):
            b = dev.create_buffer(len(data), STORAGE | COPY_DST | COPY_SRC)
            dev.write_buffer(b, 0, data)
            return b

        kv = 4 * total_blocks * bs * Hkv * hd
        bufs = [up(rng.standard_normal(T * H * hd).astype(np.float32).tobytes()),
                up(rng.standard_normal(kv // 4).astype(np.float32).tobytes()),
                up(rng.standard_normal(kv // 4).astype(np.float32).tobytes()), up(tables), up(info),
                up(b"\0" * 4 * T * H * hd)]
        bg = attn.bind(*bufs)
        ms = _median_timed(dev, lambda c: attn.encode(c, bg, shape), reps)
        out[name] = {"seqs": len(seqs), "ctx": seqs[0][0], "queries": T, "ms": round(ms, 4),
                     "kv_gbps": _sig(2 * sum(c for c, _ in seqs) * Hkv * hd * 4 / (ms / 1e3) / 1e9)}
        for b in bufs:
            dev.destroy_buffer(b)
    return out


def bench_sampling(dev, lib, vocab: int, rows: int, reps: int) -> dict:
    """GPU ms of the sampling kernel over `rows` rows of `vocab` logits: greedy, and temperature + top-k + top-p."""
    from webinfer.kernels.sampling import ROW_BYTES, GpuSampler, SampleRow, pack_rows

    s = GpuSampler(lib, vocab)
    logits = dev.create_buffer(4 * vocab * rows, STORAGE | COPY_DST)
    dev.write_buffer(logits, 0, (np.random.default_rng(2).standard_normal(vocab * rows) * 3).astype(np.float32).tobytes())
    ids = dev.create_buffer(4 * rows, STORAGE | COPY_SRC)
    res = {"vocab": vocab, "rows": rows}
    for name, row in (("greedy_ms", SampleRow(0)), ("top_k_top_p_ms", SampleRow(0, 0.8, 40, 0.9, seed=1))):
        params = dev.create_buffer(ROW_BYTES * rows, STORAGE | COPY_DST)
        dev.write_buffer(params, 0, pack_rows([SampleRow(i, row.temperature, row.top_k, row.top_p, i) for i in range(rows)]))
        bg = s.bind(logits, params, ids)
        res[name] = round(_median_timed(dev, lambda c: s.encode(c, bg, rows), reps), 4)
    return res


def model_shapes(cfg) -> list[tuple[str, int, int]]:
    """The model's GEMV shapes [N, K] as the GPU model runs them (q/k/v fused, gate/up fused)."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    return [("qkv", qkv, d), ("o", d, cfg.num_attention_heads * hd), ("gate_up", 2 * f, d), ("down", d, f),
            ("lm_head", cfg.vocab_size, d)]


def bench_model(dev, package, prompt_len: int, decode_len: int, reps: int) -> dict:
    """Timed decode step, step wall time, dispatch count, prefill and decode speed of the GPU model."""
    from webinfer.engine.batch import SeqChunk, StepBatch
    from webinfer.factory import EngineOptions, load

    cfg = package.config
    total = prompt_len + decode_len + 16
    # no prefix cache: the prompt is run several times and each run must prefill it (TTFT, prefill tok/s)
    llm = asyncio.run(load(package, device=dev, options=EngineOptions(
        context_tokens=total, max_seqs=1, max_batch_tokens=min(256, prompt_len), enable_prefix_caching=False)))
    runner = llm.engine.runner
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, size=prompt_len)]
    # generation through the API, as a user runs it: prefill (in chunks of max_batch_tokens) + greedy decode, no EOS;
    # decode blocks (K steps per read-back) and single steps alternate, on the same model
    block = llm.engine.decode_block
    llm.engine.decode_block_ms = 0  # blocks of exactly `block` steps, however long a step is here
    rates: dict[int, list[float]] = {block: [], 1: []}
    for k in rates:  # untimed: the pipelines compiled at first use (lazy ones, the block's id copy) and warm caches
        llm.engine.decode_block = k
        asyncio.run(llm.completions.create(prompt=prompt[:16], max_tokens=min(decode_len, block + 2), temperature=0,
                                           ignore_eos=True))
    for _ in range(max(1, reps // 2)):
        for k in rates:
            llm.engine.decode_block = k
            r = asyncio.run(llm.completions.create(prompt=prompt, max_tokens=decode_len, temperature=0, ignore_eos=True))
            tpot = r["usage"]["time_per_output_token_s"]
            rates[k].append(1.0 / tpot if tpot else 0.0)
            if k == block:
                out, u = r["choices"][0]["token_ids"], r["usage"]
    llm.engine.decode_block = block
    ttft, tpot = u["ttft_s"], u["time_per_output_token_s"]
    short = prompt[:min(40, prompt_len)]  # a chat turn's prompt: its first token against decode steps
    ttft_short = statistics.median(
        asyncio.run(llm.completions.create(prompt=short, max_tokens=1, temperature=0))["usage"]["ttft_s"]
        for _ in range(max(2, reps)))
    # prompt logprobs (echo with max_tokens 0, docs/api.md): the prompt scored at every position against its prefill
    # to a first token, alternating, median wall seconds of each
    scoring = measure_scoring(llm, prompt, max(1, reps // 2))
    # one decode step at the end of that context, repeated (same position: it rewrites the same KV slot); the
    # GPU span (timestamps at the start of its first pass and the end of its last) and the wall time of the same
    # step: host overhead = 1 - span / wall, which cannot go below 0
    table = list(range(1, -(-total // 16) + 1))
    batch = StepBatch([SeqChunk(0, [out[-1]], prompt_len + len(out) - 1, table, True)])
    walls, fracs = [], []
    for i in range(reps + 1):
        t = time.perf_counter()
        cmds, rows = runner.encode_step(batch, timed="span")
        dev.submit(cmds)
        asyncio.run(runner.sampler.read(rows))
        wall = (time.perf_counter() - t) * 1e3
        span = asyncio.run(dev.read_span_ms(cmds))
        if i:  # the first run warms up
            walls.append(wall)
            if span is not None:
                fracs.append(1 - span / wall)
    step_ms = statistics.median(walls)
    rec, enc = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        cmds, rows = runner.encode_step(batch)
        t1 = time.perf_counter()
        dev.submit(cmds)
        t2 = time.perf_counter()
        asyncio.run(runner.sampler.read(rows))
        if i:
            rec.append((t1 - t0) * 1e3)
            enc.append((t2 - t1) * 1e3)
    host_ms = statistics.median(rec) + statistics.median(enc)
    kernels, kernel_ms = _timed_step(dev, runner, batch, reps)
    # one prefill chunk (the prompt's first max_batch_tokens tokens again: it rewrites the same KV values)
    n_pre = min(prompt_len, runner.max_tokens)
    pre_batch = StepBatch([SeqChunk(0, prompt[:n_pre], 0, table, True)])
    prefill_kernels, prefill_kernel_ms = _timed_step(dev, runner, pre_batch, 1)
    return {
        "kernels": kernels,
        "kernel_ms": round(kernel_ms, 4),
        "prefill_kernels": {"tokens": n_pre, "total_ms": round(prefill_kernel_ms, 4), **prefill_kernels},
        "step_ms": round(step_ms, 4),
        "host_overhead_frac": round(statistics.median(fracs), 4) if fracs else None,
        "host_ms_per_step": {"record_ms": round(statistics.median(rec), 4),
                             "encode_submit_ms": round(statistics.median(enc), 4),
                             "tok_s_bound": round(1e3 / host_ms, 1)},
        "dispatches_per_token": runner.dispatch_count(batch),
        "ttft_s": round(ttft, 4),
        "prefill_tok_s": round(prompt_len / ttft, 2),
        "ttft_40": {"prompt_tokens": len(short), "ttft_s": round(ttft_short, 4),
                    "decode_steps": round(ttft_short * 1e3 / step_ms, 2)},
        "prompt_scoring": scoring,
        "decode_tok_s": round(1.0 / tpot, 2) if tpot else None,
        "decode_block": {"steps": block, "tok_s": round(statistics.median(rates[block]), 2),
                         "single_step_tok_s": round(statistics.median(rates[1]), 2),
                         "ratio": round(statistics.median(rates[block]) / statistics.median(rates[1]), 3)},
        "prompt_tokens": prompt_len,
        "decode_tokens": len(out),
    }


def _timed_step(dev, runner, batch, reps: int) -> tuple[dict[str, float], float]:
    """({kernel kind: median GPU ms per step, largest first}, median total GPU ms) of a model step."""
    per_label: dict[str, list[float]] = {}
    sums = []
    for _ in range(max(reps, 1)):
        cmds, _ = runner.encode_step(batch, timed=True)
        dev.submit(cmds)
        timings = asyncio.run(dev.read_timings(cmds))  # waits for the step to finish
        sums.append(sum(ms for _, ms in timings))
        step_labels: dict[str, float] = {}
        for label, ms in timings:
            step_labels[_kind(label)] = step_labels.get(_kind(label), 0.0) + ms
        for kname, ms in step_labels.items():
            per_label.setdefault(kname, []).append(ms)
    med = {k: round(statistics.median(v), 4) for k, v in per_label.items()}
    return dict(sorted(med.items(), key=lambda kv: -kv[1])), statistics.median(sums)


def _kind(label: str) -> str:
    """'layers.3.qkv' -> 'qkv', 'attn.decode' -> 'attn.decode': group a step's timings by kernel across layers."""
    parts = [p for p in label.split(".") if not p.isdigit() and p != "layers"]
    return ".".join(parts) or label or "?"


def bench_hf(package, decode_len: int, hf_folder=None) -> dict:
    """Greedy decode tok/s of HF transformers' model.generate for the package's source: the default GGUF, or
    `hf_folder` (the HF folder the package was packed from). On CUDA when torch has a GPU (bf16: the peer on a real
    GPU's machine), else on this CPU (f32)."""
    from webinfer_packager.paths import default_gguf_path

    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    if hf_folder is not None:
        where, kw = str(hf_folder), {}
    else:
        src = package.manifest.get("source", {}) if hasattr(package, "manifest") else {}
        gguf = default_gguf_path()
        if src.get("kind") != "gguf" or src.get("name") != gguf.name:
            return {"decode_tok_s": None, "reason": f"only the default GGUF source can be loaded by transformers "
                                                    f"here (package source: {src})"}
        where, kw = str(gguf.parent), {"gguf_file": gguf.name}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(where, local_files_only=True, dtype=dtype, **kw)
    model.eval()
    if cuda:
        model = model.to("cuda")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device=model.device)

    def run(n):
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run(2)  # warm-up
    t1, tn = run(1), run(decode_len)
    return {"decode_tok_s": round((decode_len - 1) / max(tn - t1, 1e-9), 2), "path": "model.generate (greedy)",
            "device": torch.cuda.get_device_name(0) if cuda else "cpu", "dtype": str(dtype).replace("torch.", ""),
            "torch_threads": torch.get_num_threads()}


def run_bench(package_path, *, quick: bool = False, skip_hf: bool = False, skip_serving: bool = False,
              device=None, hf_folder=None) -> dict:
    from webinfer.gpu.native import request_device_sync
    from webinfer.formats import QUANT_DTYPES
    from webinfer.kernels.library import KernelLibrary
    from webinfer.kernels.linear import default_ksplit
    from webinfer.package import Package

    dev = device or request_device_sync(limits="browser", timestamps=True)
    lib = KernelLibrary(dev)
    reps = 3 if quick else 7
    res: dict = {"adapter": adapter_info(dev), "quick": quick}
    if not dev.caps.timestamps:
        res["note"] = "no timestamp-query on this adapter: GPU times are missing"
    copy_bytes = (16 if quick else 128) << 20
    res["copy_gbps"] = round(bench_copy(dev, lib, copy_bytes, reps), 3)
    res["copy_bytes"] = copy_bytes
    pkg = package_path if isinstance(package_path, Package) else Package.open(Path(package_path))
    shapes = [("4096x4096", 4096, 4096)] + model_shapes(pkg.config)
    res["gemv_ksplit"] = default_ksplit(dev)  # the GEMVs' layout below and the engine's on this device
    res["gemv"] = [bench_gemv(dev, lib, n_, n, k, res["copy_gbps"], reps) for n_, n, k in shapes]
    fmts = ("q4", "q4k", "q6k") if quick else QUANT_DTYPES
    res["gemv_formats"] = [bench_gemv(dev, lib, "4096x4096", 4096, 4096, res["copy_gbps"], reps, dtype=d) for d in fmts]
    cfg = pkg.config
    res["attention"] = bench_attention(dev, lib, cfg, 128 if quick else 512, 4 if quick else 16, 32 if quick else 256, reps)
    res["sampling"] = bench_sampling(dev, lib, cfg.vocab_size, 1 if quick else 4, reps)
    prompt_len, decode_len = (32, 8) if quick else (512, 128)
    res.update(bench_model(dev, pkg, prompt_len, decode_len, reps))
    if skip_hf:
        res["hf_transformers"] = {"decode_tok_s": None, "reason": "skipped (--skip-hf)"}
    else:
        try:
            res["hf_transformers"] = bench_hf(pkg, 16 if quick else 64, hf_folder)
        except Exception as e:  # the comparison must never sink the benchmark
            res["hf_transformers"] = {"decode_tok_s": None, "reason": f"{type(e).__name__}: {e}"}
    hf = res["hf_transformers"].get("decode_tok_s")
    res["hf_transformers"]["ratio"] = round(res["decode_tok_s"] / hf, 3) if hf and res.get("decode_tok_s") else None
    if skip_serving:
        res["serving"] = {"reason": "skipped (--skip-serving)"}
    else:  # issue 4's numbers: concurrency scaling, prefix-cache TTFT, a mixed workload (same device, same run)
        from webinfer_packager.bench.serving import run_serving_bench

        res["serving"] = run_serving_bench(pkg, quick=quick, device=dev)
    # speculative decoding (prompt lookup) vs plain, batch 1, alternating in this run
    from webinfer_packager.bench.speculative import bench_speculative

    res["speculative"] = bench_speculative(pkg, dev, max_tokens=32 if quick else 96, reps=1 if quick else 2)
    # a chat's next turn: the previous answer computed as a prompt (exact) against reused as decoded (the peer)
    from webinfer_packager.bench.next_turn import bench_next_turn

    res["next_turn"] = bench_next_turn(pkg, dev, chats=2 if quick else 6, answer=16 if quick else 64)
    return res


def format_table(r: dict) -> str:
    a = r["adapter"]
    lines = [f"adapter      {a['name']} ({a['backend']}, {a['adapter_type']}) features: {', '.join(a['features'])}",
             f"copy         {r['copy_gbps']:.2f} GB/s (read + write, {r['copy_bytes'] >> 20} MiB)",
             f"gemv layout  {r.get('gemv_ksplit', 1)} lanes per row group (gemv.wgsl KSPLIT)"]
    for g in r["gemv"]:
        lines.append(f"gemv q4      {g['name']:<10} {g['shape'][0]:>6}x{g['shape'][1]:<6} {g['ms']:8.3f} ms "
                     f"{g['gbps']:7.2f} GB/s  {g['ratio']:.2f}x copy")
    for g in r.get("gemv_formats", []):
        lines.append(f"gemv {g['dtype']:<7} {g['name']:<10} {g['bits_per_weight']:5.2f} bits/weight {g['ms']:8.3f} ms "
                     f"{g['gbps']:7.2f} GB/s  {g['ratio']:.2f}x copy")
    host = r["host_overhead_frac"]
    lines.append(f"decode step  {r['step_ms']:.2f} ms wall, {r['kernel_ms']:.2f} ms in kernels, host overhead "
                 f"{'n/a' if host is None else f'{100 * host:.0f} %'}, {r['dispatches_per_token']} dispatches")
    hm = r["host_ms_per_step"]
    lines.append(f"host / step  {hm['record_ms']:.3f} ms recording + {hm['encode_submit_ms']:.3f} ms encode and submit: "
                 f"at most {hm['tok_s_bound']:.0f} tok/s for one sequence on any GPU")
    at = r["attention"]
    for k in ("decode", "prefill"):
        a = at[k]
        lines.append(f"attention    {k:<8} {a['seqs']} seq x ctx {a['ctx']}, {a['queries']} queries: {a['ms']:.3f} ms "
                     f"({a['kv_gbps']:.2f} GB/s of K+V)")
    sm = r["sampling"]
    lines.append(f"sampling     vocab {sm['vocab']} x {sm['rows']}: greedy {sm['greedy_ms']:.3f} ms, "
                 f"top-k+top-p {sm['top_k_top_p_ms']:.3f} ms")
    for k, ms in list(r["kernels"].items())[:8]:
        lines.append(f"  {k:<24} {ms:8.3f} ms")
    lines.append(f"prefill      {r['prompt_tokens']} tokens: ttft {r['ttft_s']:.3f} s, {r['prefill_tok_s']:.1f} tok/s")
    ps = r["prompt_scoring"]
    lines.append(f"scoring      {ps['prompt_tokens']} tokens (echo, max_tokens 0): {ps['scored_s']:.3f} s, "
                 f"x{ps['vs_prefill']:.2f} its prefill")
    t40 = r["ttft_40"]
    lines.append(f"first token  {t40['prompt_tokens']}-token prompt: {t40['ttft_s']:.3f} s = {t40['decode_steps']:.2f} "
                 f"decode steps")
    lines.append(f"decode       {r['decode_tok_s']} tok/s ({r['decode_tokens']} tokens)")
    b = r["decode_block"]
    lines.append(f"decode block {b['steps']} steps per read-back {b['tok_s']} tok/s vs single steps "
                 f"{b['single_step_tok_s']} tok/s: {b['ratio']:.2f}x")
    nt = r.get("next_turn")
    if nt:
        lines.append(f"next turn    first token {nt['compute_median_ms']} ms with the answer computed as a prompt "
                     f"(exact), {nt['reuse_median_ms']} ms reusing its decoded KV; medians")
    cw = r.get("serving", {}).get("compile")
    if cw:
        lines.append(f"compiling    one stream {cw['alone']['tok_s']} tok/s alone, {cw['lowered']['tok_s']} while a "
                     f"schema compiles ({cw['ratio_lowered']}x; at Python's default switch interval "
                     f"{cw['default']['tok_s']}, {cw['ratio_default']}x)")
    hf = r["hf_transformers"]
    lines.append(f"transformers {hf.get('decode_tok_s')} tok/s" + (f" (ours {hf['ratio']}x)" if hf.get("ratio") else
                                                                  f" ({hf.get('reason', '')})"))
    return "\n".join(lines)


def cli_main(args) -> int:
    from webinfer_packager.paths import resolve_package

    if getattr(args, "grammar", False):
        from webinfer_packager.bench.grammar import cli_main as grammar_main

        return grammar_main(args)

    res = run_bench(resolve_package(args.package), quick=args.quick, skip_hf=args.skip_hf,
                    skip_serving=args.skip_serving)
    text = json.dumps(res, indent=2, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    else:
        print(format_table(res))
        print(text)
    return 0


__all__ = ["run_bench", "cli_main", "format_table"]
