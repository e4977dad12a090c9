"""The CPU engine in the page (Pyodide): the packaged .wasm instantiated through JS WebAssembly, the backend
choice for `load(manifest, {backend})`, and the step timer the worker reports.

    host = await js_host()                       # relaxed SIMD when valid and its self-test passes, else SIMD128
    choice, reason = await choose_backend("auto", get_device)

Auto picks the CPU when there is no WebGPU adapter or when the adapter is a fallback (software) one: there the
wasm engine beats a software rasterizer's compute (SwiftShader). The reason is returned to the page.
"""

from __future__ import annotations

import time

from ..errors import GPUError, WebinferError
from .wasm import JsHost, module_bytes

BACKENDS = ("auto", "webgpu", "cpu")


async def js_host(variant: str = "auto") -> JsHost:
    from js import Object, WebAssembly  # noqa: PLC0415 (Pyodide only)
    from pyodide.ffi import to_js  # noqa: PLC0415

    why = ""
    for v in (("relaxed", "base") if variant == "auto" else (variant,)):
        code = to_js(module_bytes(v))  # a Uint8Array copy of the packaged module
        if not WebAssembly.validate(code):
            why += f"{v} module rejected by this browser's WebAssembly; "
            continue
        inst = (await WebAssembly.instantiate(code, Object.new())).instance
        if v == "relaxed" and inst.exports.wi_selftest() != 1:
            why += "relaxed SIMD self-test failed; "
            continue
        variant = "relaxed SIMD: validated and self-test passed" if v == "relaxed" else "base SIMD128"
        return JsHost(inst, v == "relaxed", f"{why}{variant}; {one_worker_reason()}")
    raise WebinferError(f"the CPU engine needs WebAssembly SIMD128, which this browser lacks ({why.rstrip('; ')})")


def one_worker_reason() -> str:
    """Why the engine runs in one Worker here: two need SharedArrayBuffer, i.e. a cross-origin isolated page."""
    from js import globalThis  # noqa: PLC0415 (Pyodide only)

    if not getattr(globalThis, "crossOriginIsolated", False):
        return ("one Worker: the page is not cross-origin isolated (serve it with Cross-Origin-Opener-Policy: "
                "same-origin and Cross-Origin-Embedder-Policy: require-corp, as `webinfer serve` does)")
    return "one Worker: the page is cross-origin isolated, but the two-Worker engine is not built yet"


async def choose_backend(backend: str, get_device) -> tuple[str, str]:
    """("webgpu" | "cpu", why) for the requested backend; get_device() -> the worker's WebGPU device."""
    if backend not in BACKENDS:
        raise WebinferError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend, "requested"
    try:
        dev = await get_device()
    except GPUError as e:
        return "cpu", f"no WebGPU adapter ({e})"
    except Exception as e:  # noqa: BLE001 (navigator.gpu missing surfaces as a JS error)
        return "cpu", f"WebGPU unavailable ({e})"
    if dev.info.is_fallback:
        return "cpu", f"the WebGPU adapter is a fallback (software) one: {dev.info.name}"
    return "webgpu", f"WebGPU adapter {dev.info.name}"


class StepTimer:
    """Running totals of the time spent in the runner's steps (the worker's host_ms_per_step for the CPU)."""

    def __init__(self, runner):
        self.ms, self.steps = 0.0, 0
        run = runner.execute

        async def execute(batch):
            t0 = time.perf_counter()
            try:
                return await run(batch)
            finally:
                self.ms += (time.perf_counter() - t0) * 1e3
                self.steps += 1

        runner.execute = execute
