"""The CPU backend for the CLI: the WebAssembly engine (webinfer/cpu) in wasmtime, like native.py for the GPU.

    runner = load_runner("path/to/package", mode="fast")
    ids, timings = generate_cpu("path/to/package", prompt_ids, 32, eos_ids=[2])
    webinfer generate --backend cpu [--cpu-mode exact|fast] --prompt ...
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from webinfer.cpu import CpuRunner, load_cpu_runner
from webinfer.package import Package
from webinfer_packager.native import blocks_for_budget, generate_async


def load_runner(package_path, *, mode: str = "exact", kv_budget_mb: float = 64.0, block_size: int = 16,
                num_blocks: int | None = None, max_batch_tokens: int = 256, max_seqs: int = 16,
                max_model_len: int | None = None, variant: str = "auto") -> CpuRunner:
    pkg = package_path if isinstance(package_path, Package) else Package.open(Path(package_path))
    nb = num_blocks or blocks_for_budget(pkg, kv_budget_mb, block_size)
    return asyncio.run(load_cpu_runner(pkg, mode=mode, num_blocks=nb, block_size=block_size,
                                       max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
                                       max_model_len=max_model_len, variant=variant))


def generate_cpu(package_path, prompt_ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=0, eos_ids=(),
                 on_token=None, runner: CpuRunner | None = None, **load_kw):
    """(output ids, timings) for one prompt on the CPU engine (timings as native.generate_native's)."""
    t0 = time.perf_counter()
    runner = runner or load_runner(package_path, max_model_len=len(prompt_ids) + max_tokens + 16, **load_kw)
    t_load = time.perf_counter() - t0
    stamps: list[float] = []
    t0 = time.perf_counter()
    out = asyncio.run(generate_async(runner, list(prompt_ids), max_tokens, temperature, top_p, top_k, seed,
                                     tuple(eos_ids), on_token, stamps=stamps))
    prefill_s = (stamps[0] - t0) if stamps else time.perf_counter() - t0
    decode_s = (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return out, {"load_s": round(t_load, 4), "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
                 "prefill_tok_s": round(len(prompt_ids) / prefill_s, 2) if prefill_s else None,
                 "decode_tok_s": round((len(stamps) - 1) / decode_s, 2) if decode_s else None,
                 "device": f"cpu (wasm, {runner.host.reason}, {runner.mode} mode)"}
