"""The native GPU backend for the CLI: load a package onto a wgpu-py device and generate.

    runner = load_runner("path/to/package")                       # GPUModel on a browser-limits device
    ids, timings = generate_native("path/to/package", prompt_ids, 32, 0.0, 1.0, 0, 0, eos_ids=[2])

`generate_native` drives the runner directly with one sequence (prefill in chunks of max_batch_tokens, then one
token per step); the multi-request server goes through the scheduler instead.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from webinfer.engine.batch import SeqChunk, StepBatch
from webinfer.engine.gpu_model import GPUModel
from webinfer.package import Package


def blocks_for_budget(package: Package, budget_mb: float, block_size: int, kv_f16: bool = False) -> int:
    """How many KV blocks (incl. the null block) fit in budget_mb of K+V over all layers."""
    c = package.config
    per_block = 2 * c.num_hidden_layers * block_size * c.kv_dim * (2 if kv_f16 else 4)
    return max(2, int(budget_mb * (1 << 20)) // per_block)


def load_runner(package_path, *, device=None, kv_budget_mb: float = 64.0, block_size: int = 16,
                num_blocks: int | None = None, max_batch_tokens: int = 256, max_seqs: int = 16,
                max_model_len: int | None = None, fuse: bool = True, kv_f16: bool = False) -> GPUModel:
    from webinfer.gpu.native import request_device_sync

    pkg = package_path if isinstance(package_path, Package) else Package.open(Path(package_path))
    dev = device or request_device_sync(limits="browser")
    nb = num_blocks or blocks_for_budget(pkg, kv_budget_mb, block_size, kv_f16)
    return asyncio.run(GPUModel.load(dev, pkg, num_blocks=nb, block_size=block_size,
                                     max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
                                     max_model_len=max_model_len, fuse=fuse, kv_f16=kv_f16))


async def generate_async(runner: GPUModel, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0,
                         top_p: float = 1.0, top_k: int = 0, seed: int = 0, eos_ids=(), on_token=None,
                         seq_id: int = 0, stamps: list | None = None) -> list[int]:
    """Greedy/sampled generation of one sequence on `runner` (blocks 1.. are used; nothing else may run)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one token (e.g. BOS)")
    total = len(prompt_ids) + max_tokens
    bs = runner.block_size
    need = -(-total // bs)
    if need > runner.num_blocks - 1 or total > runner.max_model_len:
        from webinfer.errors import ContextOverflowError

        raise ContextOverflowError(total, min((runner.num_blocks - 1) * bs, runner.max_model_len), "KV cache capacity")
    table = list(range(1, need + 1))
    out: list[int] = []

    def chunk(tokens, start, sample):
        return SeqChunk(seq_id, list(tokens), start, table, sample, temperature, top_p, top_k, seed, len(out))

    step = runner.max_tokens
    pos = 0
    while pos < len(prompt_ids):
        part = prompt_ids[pos : pos + step]
        last = pos + len(part) == len(prompt_ids)
        res = await runner.execute(StepBatch([chunk(part, pos, last)]))
        pos += len(part)
    tok = res[0]
    while True:
        out.append(tok)
        if stamps is not None:
            stamps.append(time.perf_counter())
        if on_token:
            on_token(tok)
        if tok in eos_ids or len(out) >= max_tokens:
            return out
        tok = (await runner.execute(StepBatch([chunk([tok], len(prompt_ids) + len(out) - 1, True)])))[0]


def generate_native(package_path, prompt_ids, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=0, eos_ids=(),
                    on_token=None, runner: GPUModel | None = None, **load_kw):
    """(output ids, timings) for one prompt on the native GPU."""
    t0 = time.perf_counter()
    runner = runner or load_runner(package_path, max_model_len=len(prompt_ids) + max_tokens + 16, **load_kw)
    t_load = time.perf_counter() - t0
    stamps: list[float] = []
    t0 = time.perf_counter()
    out = asyncio.run(generate_async(runner, list(prompt_ids), max_tokens, temperature, top_p, top_k, seed,
                                     tuple(eos_ids), on_token, stamps=stamps))
    t_end = time.perf_counter()
    prefill_s = (stamps[0] - t0) if stamps else t_end - t0
    decode_s = (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return out, {"load_s": round(t_load, 4), "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
                 "prefill_tok_s": round(len(prompt_ids) / prefill_s, 2) if prefill_s else None,
                 "decode_tok_s": round((len(stamps) - 1) / decode_s, 2) if decode_s else None,
                 "device": runner.device.info.name}


def open_llm(package_path=None, *, backend: str = "native", kv_budget_mb: float = 128.0, **engine_kw):
    """The OpenAI-shaped Python API (webinfer.api.LLM) over the native GPU engine for a package.
    Call it outside a running event loop (loading is synchronous on the native side), then use it inside one:

        llm = open_llm()                      # the packed default model
        r = asyncio.run(llm.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=32))
    """
    from webinfer.api import LLM
    from webinfer_packager.paths import resolve_package
    from webinfer_packager.cli.serve import load_engine

    path = package_path if isinstance(package_path, Package) else resolve_package(package_path)
    return LLM(load_engine(path, backend=backend, kv_budget_mb=kv_budget_mb, **engine_kw))
