"""The CPU engine: the model in a WebAssembly SIMD module (wasm/kernels.c), natively through wasmtime or in the
page through JS WebAssembly, behind the same ModelRunner contract as the GPU model (webinfer/engine/batch.py).

    runner = await load_cpu_runner(package, mode="exact")     # or mode="fast": int8 activations
    ids = await runner.execute(StepBatch([...]))

See webinfer/cpu/runner.py for the memory layout and modes, webinfer/cpu/wasm.py for the hosts and the
base / relaxed-SIMD variant choice.
"""

from __future__ import annotations

from .runner import CpuRunner
from .wasm import JsHost, WasmMemoryError, WasmtimeHost

__all__ = ["CpuRunner", "JsHost", "WasmMemoryError", "WasmtimeHost", "load_cpu_runner"]


async def load_cpu_runner(package, *, mode: str = "exact", threads: int = 1, num_blocks: int = 257,
                          block_size: int = 16, max_model_len: int | None = None, max_batch_tokens: int = 256,
                          max_seqs: int = 16, variant: str = "auto", host=None, read=None) -> CpuRunner:
    """A CpuRunner for `package` (a webinfer.package.Package or a package folder).

    Natively the module runs in wasmtime (variant "auto" picks relaxed SIMD when it validates and passes its
    self-test); in the page pass host=JsHost(...). threads: 1 to 16 (past 1 the threads build on a shared memory,
    each matrix's output columns split among the threads; the same ids); the page's host brings its own."""
    if isinstance(package, (str, bytes)) or hasattr(package, "__fspath__"):
        from ..package import Package

        package = Package.open(package)
    if host is None:
        host = WasmtimeHost(variant, threads=threads)
    return await CpuRunner.load(host, package, mode=mode, num_blocks=num_blocks, block_size=block_size,
                                max_batch_tokens=max_batch_tokens, max_seqs=max_seqs, max_model_len=max_model_len,
                                read=read)
