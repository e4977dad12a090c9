"""The LLM behind a CLI command (`generate`, `chat`, `serve`, `bench`, `eval`): webinfer.load() on the chosen
backend. `cpu` is the WebAssembly SIMD engine through wasmtime (webinfer/cpu); `reference` runs the numpy oracle (webinfer_packager.reference) as the engine's runner — same engine,
scheduler, prompt builder and sampler rule as the GPU, only the math differs; `auto` is native when an adapter
exists, else the reference with a warning."""

from __future__ import annotations

import asyncio
import sys

from webinfer.api import LLM
from webinfer.errors import GPUError, WebinferError
from webinfer.factory import EngineOptions, kv_blocks, llm_for, load
from webinfer.package import Package

BACKENDS = ("auto", "native", "cpu", "reference")


def open_package(path) -> Package:
    return path if isinstance(path, Package) else Package.open(path)


def reference_runner(pkg: Package, opts: EngineOptions):
    from webinfer_packager.reference.model import limit_blas_threads
    from webinfer_packager.reference.runner import ReferenceRunner

    limit_blas_threads(1)  # one thread decodes ~10x faster than spinning BLAS threads on a busy small machine
    return ReferenceRunner.from_package(pkg, num_blocks=kv_blocks(opts.context_tokens, opts.block_size),
                                        block_size=opts.block_size, max_model_len=opts.model_len(pkg.config))


def open_llm(package, backend: str = "auto", *, options: EngineOptions | None = None, device=None,
             limits=None, warn=sys.stderr) -> LLM:
    """An LLM for `package` (path or Package) on `backend`; call it outside a running event loop."""
    pkg = open_package(package)
    opts = options or EngineOptions()
    if backend not in BACKENDS:
        raise WebinferError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend == "cpu":  # the WebAssembly SIMD engine in wasmtime (webinfer/cpu)
        return asyncio.run(load(pkg, backend="cpu", options=opts, limits=limits))
    if backend in ("auto", "native"):
        try:
            return asyncio.run(load(pkg, backend="native", device=device, options=opts, limits=limits))
        except GPUError as e:  # no adapter here: still answer, slowly, rather than not at all
            if backend == "native":
                raise
            print(f"webinfer: warning: no GPU ({e}); using the numpy reference model (slow)", file=warn)
    return llm_for(pkg, reference_runner(pkg, opts), opts, limits)


def engine_options(args, **kw) -> EngineOptions:
    """EngineOptions from a command's --speculative flags, plus keyword overrides."""
    if args.speculative and not 1 <= args.speculative_tokens <= 16:
        raise WebinferError(f"--speculative-tokens must be in 1..16, got {args.speculative_tokens}")
    block = getattr(args, "decode_block", 8)
    if not 1 <= block <= 64:
        raise WebinferError(f"--decode-block must be in 1..64, got {block}")
    return EngineOptions(speculative=args.speculative, speculative_tokens=args.speculative_tokens,
                         cpu_mode=getattr(args, "cpu_mode", "exact"), decode_block=block,
                         cpu_threads=cpu_threads(getattr(args, "cpu_threads", "1")), **kw)


def cpu_threads(choice: str) -> int:
    """--cpu-threads: "1", "2", or "auto" = 2 on a machine with 2 or more cores. Thread 0 is the host's own thread
    (the engine loop calls wi_step), so two wasm threads need two cores: on an idle 2-core machine they decode
    1.8x as fast as one (docs/cpu-backend.md, Measured); on cores busy with other jobs a thread waiting at a
    barrier for a descheduled partner makes them slower than one (measured 0.8x at load 4-6): pass 1 there."""
    import os

    if choice == "auto":
        return 2 if (os.cpu_count() or 1) >= 2 else 1
    return int(choice)


def context_for_budget(pkg: Package, budget_mb: float, kv_f16: bool = False) -> int:
    """KV slots that fit in budget_mb of K+V over all layers."""
    c = pkg.config
    per_token = 2 * c.num_hidden_layers * c.kv_dim * (2 if kv_f16 else 4)
    return max(16, int(budget_mb * (1 << 20)) // per_token)
