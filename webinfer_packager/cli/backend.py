"""The LLM behind a CLI command (`generate`, `chat`, `serve`, `bench`, `eval`): webinfer.load() on the chosen
backend. `cpu` is the WebAssembly SIMD engine through wasmtime (webinfer/cpu); `reference` runs the numpy oracle
(webinfer_packager.reference) as the engine's runner — same engine, scheduler, prompt builder and sampler rule as
the GPU, only the math differs; `auto` is native on a hardware adapter and the CPU engine on a software one
(lavapipe, SwiftShader) or none, as the page's Auto."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

from webinfer.api import LLM
from webinfer.errors import WebinferError
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
             limits=None, warn=None) -> LLM:
    """An LLM for `package` (path or Package) on `backend`; call it outside a running event loop."""
    pkg = open_package(package)
    opts = options or EngineOptions()
    if backend not in BACKENDS:
        raise WebinferError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend, device, why = auto_backend(pkg, device, draft=opts.speculative not in (None, "prompt-lookup"))
        print(f"webinfer: --backend auto: {'the CPU engine' if backend == 'cpu' else 'the GPU'} ({why})",
              file=warn or sys.stderr)  # (looked up now: a caller may have redirected sys.stderr since import)
    if backend == "cpu":  # the WebAssembly SIMD engine in wasmtime (webinfer/cpu)
        return asyncio.run(load(pkg, backend="cpu", options=opts, limits=limits))
    if backend == "native":
        return asyncio.run(load(pkg, backend="native", device=device, options=opts, limits=limits))
    return llm_for(pkg, reference_runner(pkg, opts), opts, limits)


def backend_of(llm: LLM) -> str:
    """The backend an LLM from open_llm runs on ("native", "cpu" or "reference"): what --backend auto chose."""
    kind = llm.engine.runner.kind
    return "native" if kind == "gpu" else kind


def auto_backend(pkg: Package, device=None, draft: bool = False) -> tuple[str, object, str]:
    """(backend, device, why) for --backend auto, by the page's rule (webinfer.cpu.browser.choose_backend): the CPU
    engine when there is no adapter or a software one (lavapipe, SwiftShader: there the WebAssembly engine decodes
    faster, docs/cpu-backend.md), else a start-up GEMV of the model's gate matrix on each side picks the faster.
    A draft model (speculative decoding) runs only on the GPU."""
    from webinfer.cpu.browser import choose_backend
    from webinfer.cpu.wasm import WasmtimeHost
    from webinfer.gpu.native import request_device

    if draft:
        return "native", device, "a draft model runs on the GPU"
    if importlib.util.find_spec("wasmtime") is None:
        return "native", device, "the CPU engine is not installed: pip install 'webinfer[cpu]'"
    got = [device]

    async def get_device():
        if got[0] is None:
            got[0] = await request_device(limits="browser")
        return got[0]

    async def make_host():
        return WasmtimeHost()

    cfg = pkg.config
    choice, why = asyncio.run(choose_backend("auto", get_device, shape=(cfg.intermediate_size, cfg.hidden_size),
                                             make_host=make_host))
    return ("cpu", None, why) if choice == "cpu" else ("native", got[0], why)


def engine_options(args, **kw) -> EngineOptions:
    """EngineOptions from a command's --speculative flags, plus keyword overrides."""
    if args.speculative and not 1 <= args.speculative_tokens <= 16:
        raise WebinferError(f"--speculative-tokens must be in 1..16, got {args.speculative_tokens}")
    block = getattr(args, "decode_block", 8)
    if not 1 <= block <= 64:
        raise WebinferError(f"--decode-block must be in 1..64, got {block}")
    ksplit = getattr(args, "gemv_ksplit", "auto")
    return EngineOptions(speculative=args.speculative, speculative_tokens=args.speculative_tokens,
                         cpu_mode=getattr(args, "cpu_mode", "exact"), decode_block=block,
                         cpu_threads=cpu_threads(getattr(args, "cpu_threads", "1")),
                         gemv_ksplit=None if ksplit == "auto" else int(ksplit), **kw)


def cpu_threads(choice: str) -> int:
    """--cpu-threads: "1".."16", or "auto" = the machine's cores, at most 4. Thread 0 is the host's own thread (the
    engine loop calls wi_step), so N wasm threads need N cores: on an idle 2-core machine two decode 1.6-1.8x as
    fast as one (docs/cpu-backend.md, Measured); on cores busy with other jobs a thread waiting at a barrier for a
    descheduled partner makes them slower than one (measured 0.8x at load 4-6): pass 1 there. Past two threads
    each decode block runs on the count its timings show fastest (the runner's ThreadChooser); four is auto's cap
    because decode reads memory that a few threads already take, and more than two is unmeasured here."""
    import os

    if choice == "auto":
        return max(1, min(os.cpu_count() or 1, 4))
    return int(choice)


def context_for_budget(pkg: Package, budget_mb: float, kv_f16: bool = False) -> int:
    """KV slots that fit in budget_mb of K+V over all layers."""
    c = pkg.config
    per_token = 2 * c.num_hidden_layers * c.kv_dim * (2 if kv_f16 else 4)
    return max(16, int(budget_mb * (1 << 20)) // per_token)
