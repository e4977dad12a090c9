"""The CPU engine in the page (Pyodide): the packaged .wasm instantiated through JS WebAssembly, the backend
choice for `load(manifest, {backend})`, and the step timer the worker reports.

    host = await js_host(threads=None)           # relaxed SIMD when valid and its self-test passes, else SIMD128;
                                                 # up to DEFAULT_PAGE_THREADS Workers when the page is cross-origin
                                                 # isolated
    choice, reason = await choose_backend("auto", get_device)

Auto picks the CPU when there is no WebGPU adapter or when the adapter is a fallback (software) one: there the
wasm engine beats a software rasterizer's compute (SwiftShader). With a real adapter and the model's shape it
times a few GEMVs of the model's largest layer matrix on each side (`time_backends`) and takes the faster one.
The reason is returned to the page.
"""

from __future__ import annotations

import struct
import time

from ..errors import GPUError, WebinferError
from .wasm import PAGE, JsHost, module_bytes

BACKENDS = ("auto", "webgpu", "cpu")


# Workers by default on a cross-origin isolated page: navigator.hardwareConcurrency of them, at most this many. Why
# a cap: a step's even split waits for its slowest thread (a phone's small cores, a core's SMT sibling, the page's
# own threads), and decode reads memory that a few threads already take; each decode block then runs on the count
# of them its timings show fastest (threads.py). Measured on 2 cores only (docs/cpu-backend.md): `threads` asks for
# more, up to MAX_PAGE_THREADS.
DEFAULT_PAGE_THREADS = 4
MAX_PAGE_THREADS = 8

# the threads builds' initial memory (scripts/build-wasm.sh --initial-memory); the shared memory made for them
# starts there and may grow to the 4 GiB wasm32 ceiling, as the module declares
THREADS_INITIAL_BYTES = 1 << 20


async def js_host(variant: str = "auto", threads: int | None = 1) -> JsHost:
    """The module in this Worker's WebAssembly. threads: 1..MAX_PAGE_THREADS, or None: what the page allows and its
    cores (page_threads); past 1 the threads build on a new shared WebAssembly.Memory (the other threads' Workers
    start with the runner)."""
    from js import Object, WebAssembly  # noqa: PLC0415 (Pyodide only)
    from pyodide.ffi import to_js  # noqa: PLC0415

    threads, why_threads = page_threads(threads)
    why = ""
    for v in (("relaxed", "base") if variant == "auto" else (variant,)):
        code = to_js(module_bytes(v, threads > 1))  # a Uint8Array copy of the packaged module
        if not WebAssembly.validate(code):
            why += f"{v} module rejected by this browser's WebAssembly; "
            continue
        memory = module = None
        if threads > 1:
            module = await WebAssembly.compile(code)
            memory = WebAssembly.Memory.new(to_js({"initial": THREADS_INITIAL_BYTES // PAGE, "maximum": 65536,
                                                   "shared": True}, dict_converter=Object.fromEntries))
            imports = to_js({"env": {"memory": memory}}, dict_converter=Object.fromEntries)
            inst = await WebAssembly.instantiate(module, imports)  # (a Module in: the Instance out)
        else:
            inst = (await WebAssembly.instantiate(code, Object.new())).instance
        if v == "relaxed" and inst.exports.wi_selftest() != 1:
            why += "relaxed SIMD self-test failed; "
            continue
        variant = "relaxed SIMD: validated and self-test passed" if v == "relaxed" else "base SIMD128"
        return JsHost(inst, v == "relaxed", f"{why}{variant}; {why_threads}", threads=threads, memory=memory,
                      module=module, cores=_cores() or None)
    raise WebinferError(f"the CPU engine needs WebAssembly SIMD128, which this browser lacks ({why.rstrip('; ')})")


def _cores() -> int:
    from js import globalThis  # noqa: PLC0415 (Pyodide only)

    return int(getattr(globalThis.navigator, "hardwareConcurrency", 0) or 0)


def page_threads(requested: int | None) -> tuple[int, str]:
    """(threads, why) for the engine here: more than one Worker needs a SharedArrayBuffer, i.e. a cross-origin
    isolated page; requested None (load()'s default) takes navigator.hardwareConcurrency Workers there, at most
    DEFAULT_PAGE_THREADS."""
    from js import globalThis  # noqa: PLC0415 (Pyodide only)

    if requested is not None and (not isinstance(requested, int) or isinstance(requested, bool)
                                  or not 1 <= requested <= MAX_PAGE_THREADS):
        raise WebinferError(f"threads={requested!r}: expected 1 to {MAX_PAGE_THREADS}, or null (the page decides)")
    if requested == 1:
        return 1, "one Worker: threads 1 requested"
    if not getattr(globalThis, "crossOriginIsolated", False):
        return 1, ("one Worker: the page is not cross-origin isolated (serve it with Cross-Origin-Opener-Policy: "
                   "same-origin and Cross-Origin-Embedder-Policy: require-corp, as `webinfer serve` does)")
    cores = _cores()
    if requested is None:
        n = min(cores, DEFAULT_PAGE_THREADS)
        if n < 2:
            return 1, f"one Worker: navigator.hardwareConcurrency is {cores}"
        return n, (f"{n} Workers: the page is cross-origin isolated, navigator.hardwareConcurrency {cores}"
                   + (f" (at most {DEFAULT_PAGE_THREADS} by default)" if cores > n else ""))
    return requested, (f"{requested} Workers: the page is cross-origin isolated, navigator.hardwareConcurrency "
                       f"{cores}, threads {requested} requested")


def _random_q4a(n: int, k: int) -> dict[str, bytes]:
    """q4a components of an [n, k] matrix (k a multiple of 32): codes from a fixed pattern, f16 scales 0.01 and
    mins -0.08 (the values do not matter for timing; no RNG so every start measures the same work)."""
    units = n * k // 32
    return {"qweight": bytes((i * 37 + 11) & 255 for i in range(256)) * (n * k // 512) + bytes(n * k // 2 % 256),
            "scales": b"\x1f\x21" * units, "mins": b"\x1f\xad" * units}


def _wasm_q4a(host, n: int, k: int):
    """A q4a [n, k] matrix (_random_q4a) in a throwaway arena of `host`'s memory, in the runner's packed layout, and
    16 activation rows: (desc, x offset, y offset, scratch offset, the components, one activation row's bytes). The
    runner's own arena reuses that memory."""
    from .runner import Arena, repack, weight_desc  # noqa: PLC0415

    comps = _random_q4a(n, k)
    arena = Arena(host)
    offs = {c: arena.put(b, f"start-up {c}") for c, b in comps.items()}
    desc = arena.put(weight_desc("q4a", n, k, 32, offs), "start-up desc")
    repack(host, arena, desc, "start-up weight")  # the layout the runner's GEMVs read
    x = struct.pack(f"<{k}f", *(((i * 7) % 13 - 6) / 8 for i in range(k)))
    xo, yo = arena.put(x * 16, "start-up x"), arena.alloc(4 * n * 16, "start-up y")
    scratch = arena.alloc(host.call("wi_linear_scratch_bytes", 16, k), "start-up scratch")
    return desc, xo, yo, scratch, comps, x


def warm_kernels(host, n: int = 256, k: int = 1024) -> float:
    """Runs the module's matrix code on a small q4a matrix (GEMVs and a 16-row GEMM, both modes) before the model's
    weights are placed; returns the ms it took. The browser compiles the module with its baseline compiler and
    optimizes a function only once it has run hot, in a background thread: this starts that for the largest one
    (every format's loops) while the load copies the weights, so that a first chat sent at ready finds it
    optimized (docs/cpu-backend.md). The throwaway memory is the runner's to reuse."""
    t0 = time.perf_counter()
    desc, xo, yo, scratch, _, _ = _wasm_q4a(host, n, k)
    for fast, rows, reps in ((1, 1, 8), (0, 1, 4), (1, 16, 1), (0, 16, 1)):
        host.call("wi_linear_reps", desc, xo, k, yo, n, rows, fast, scratch, reps)
    return (time.perf_counter() - t0) * 1e3


async def time_backends(dev, host, n: int, k: int, reps: int = 8) -> tuple[float, float]:
    """(GPU ms, CPU ms) per GEMV of a q4a [n, k] matrix (one activation row): the GPU's Linear kernel
    (webinfer/kernels/linear.py) with its pipeline built before timing, and the wasm module's fast-mode GEMV
    (`wi_linear_reps`) in `host`'s memory. Wall clock on both sides, each over `reps` GEMVs after a warm-up."""
    from ..gpu.device import COPY_DST, COPY_SRC, STORAGE, BufferBinding  # noqa: PLC0415
    from ..kernels.library import KernelLibrary  # noqa: PLC0415
    from ..kernels.linear import Linear, LinearIO, QuantWeight, WeightPart, default_ksplit, pack_meta  # noqa: PLC0415

    k = -(-k // 32) * 32
    # CPU: the weight in a throwaway arena of this host's memory
    desc, xo, yo, scratch, comps, x = _wasm_q4a(host, n, k)
    host.call("wi_linear_reps", desc, xo, k, yo, n, 1, 1, scratch, 1)
    t0 = time.perf_counter()
    host.call("wi_linear_reps", desc, xo, k, yo, n, 1, 1, scratch, reps)
    cpu_ms = (time.perf_counter() - t0) * 1e3 / reps
    # GPU: the same matrix through the Linear kernel, reps dispatches in one submission
    owned = []

    def upload(data: bytes):
        buf = dev.create_buffer(len(data), STORAGE | COPY_DST, "start-up")
        dev.write_buffer(buf, 0, data)
        owned.append(buf)
        return BufferBinding(buf, 0, len(data))

    step = upload(struct.pack("<4I", 1, 0, 0, 0))
    y = dev.create_buffer(4 * n, STORAGE | COPY_SRC, "start-up y")
    owned.append(y)
    meta = upload(pack_meta("q4a", comps, n))
    weight = QuantWeight("q4a", n, k, 32, (WeightPart(0, n, upload(comps["qweight"]), meta),))
    lin = Linear(KernelLibrary(dev), weight, LinearIO(upload(x), BufferBinding(y, 0, 4 * n), k, n, step), kernel="gemv",
                 ksplit=default_ksplit(dev))  # the layout the model would run
    gpu_ms = 0.0
    for count in (1, reps):  # the first submission builds the pipeline
        cmds = dev.commands()
        for _ in range(count):
            lin.encode(cmds, 1)
        t0 = time.perf_counter()
        dev.submit(cmds)
        await dev.read_buffer(y, 0, 4)
        gpu_ms = (time.perf_counter() - t0) * 1e3 / count
    for b in owned:
        dev.destroy_buffer(b)
    return gpu_ms, cpu_ms


async def choose_backend(backend: str, get_device, shape: tuple[int, int] | None = None,
                         make_host=None) -> tuple[str, str]:
    """("webgpu" | "cpu", why) for the requested backend; get_device() -> the worker's WebGPU device.
    shape: (rows, k) of the model's largest layer matrix; with it and make_host() -> a wasm host, "auto" on a
    real adapter times both engines on that matrix (time_backends) and picks the faster."""
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
    if shape is None or make_host is None:
        return "webgpu", f"WebGPU adapter {dev.info.name}"
    gpu_ms, cpu_ms = await time_backends(dev, await make_host(), *shape)
    what = f"start-up GEMV q4a {shape[0]}x{shape[1]}: WebGPU ({dev.info.name}) {gpu_ms:.2f} ms, CPU {cpu_ms:.2f} ms"
    return ("cpu", f"the CPU was faster ({what})") if cpu_ms < gpu_ms else ("webgpu", f"WebGPU was faster ({what})")
