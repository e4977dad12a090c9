"""The Python side of the chat worker (web/worker.js hosts Pyodide and calls these coroutines).

Division of labour: JavaScript downloads, verifies and caches the package files (web/loader.js) and hands their
bytes over; Python builds the Package, the GPU device and the engine, and streams chat completion chunks back
through a JS callback. Nothing here imports numpy (there is none in Pyodide): data is bytes, `array` and `struct`.

Every entry point returns plain JSON-able dicts (converted to JS objects by the worker) and raises typed
WebinferErrors, which the worker turns into {type: "error", name, message} messages.
"""

from __future__ import annotations

import array
import json
import time
from typing import Any, Callable

from .errors import DeviceLostError, FormatError, IntegrityError, WebinferError
from .gpu.device import COPY_DST, COPY_SRC, STORAGE, UNIFORM
from .package import Package

_state: dict[str, Any] = {"device": None, "engine": None, "package": None, "files": None, "timings": {}}


async def get_device():
    """The worker's one device (one device per adapter on some browsers); re-requested after a loss."""
    from .gpu.browser import request_device  # noqa: PLC0415

    dev = _state["device"]
    if dev is None or dev.lost:
        if dev is not None:
            _state["engine"] = None  # everything on the lost device is gone
        dev = await request_device()
        _state["device"] = dev
    return dev


def lose_device_for_test() -> None:
    """Destroy the JS device behind the engine's back, as a driver reset would (tests of the rebuild path)."""
    dev = _state["device"]
    if dev is not None:
        dev.device.destroy()  # not dev.destroy(): that one marks the loss as intentional


def device_summary(dev) -> dict:
    c = dev.caps
    return {"adapter": dev.info.name, "fallback": dev.info.is_fallback, "f16": c.f16, "subgroups": c.subgroups,
            "subgroup_size": c.subgroup_size, "timestamps": c.timestamps, "limits": dict(c.limits)}


# ------------------------------------------------------------------------------------------- self tests


async def selftest_copy(n_words: int = 1 << 16) -> dict:
    """Run shaders/copy.wgsl through the KernelLibrary on the browser device and compare every word."""
    from .kernels.library import KernelLibrary  # noqa: PLC0415

    dev = await get_device()
    lib = KernelLibrary(dev)
    src_words = array.array("I", ((i * 2654435761) & 0xFFFFFFFF for i in range(n_words)))
    nbytes = 4 * n_words
    src = dev.create_buffer(nbytes, STORAGE | COPY_DST, "src")
    dst = dev.create_buffer(nbytes + 256, STORAGE | COPY_SRC | COPY_DST, "dst")  # guard region after the copy
    params = dev.create_buffer(16, UNIFORM | COPY_DST, "params")
    dev.write_buffer(src, 0, src_words)
    dev.write_buffer(params, 0, array.array("I", [n_words // 4, 0, 0, 0]))
    dev.write_buffer(dst, 0, b"\xab" * (nbytes + 256))
    pipe = lib.pipeline("copy")
    bg = dev.create_bind_group(pipe, [dev_binding(src), dev_binding(dst, 0, nbytes), params])
    cmds = dev.commands()
    threads = 256 * 4
    cmds.dispatch(pipe, bg, max(1, -(-(n_words // 4) // threads)))
    t0 = time.perf_counter()
    dev.submit(cmds)
    out = await dev.read_buffer(dst)
    ms = (time.perf_counter() - t0) * 1e3
    ok = out[:nbytes] == src_words.tobytes() and out[nbytes:] == b"\xab" * 256
    for b in (src, dst, params):
        dev.destroy_buffer(b)
    return {"ok": ok, "words": n_words, "ms": ms, "device": device_summary(dev)}


GUARD_BYTES = 256
GUARD = b"\xab" * GUARD_BYTES  # NaN-free pattern (0xabababab is a finite float) that no kernel writes


async def selftest_gemv(spec_json: str) -> dict:
    """Run the quantized Linear (webinfer/kernels/linear.py) on the browser device for each case of
    spec["cases"]: weights and activations given by the caller (base64), a guard region after y; returns y + guard
    (base64) per case, to be compared against numpy outside the browser. A case: dtype, n, k, t, group_size,
    kernel ("gemv"|"gemm"), x_stride, qweight, scales, [mins], x (f32 rows of x_stride floats)."""
    from .kernels.library import KernelLibrary  # noqa: PLC0415

    dev = await get_device()
    lib = KernelLibrary(dev)
    results = [await _gemv_case(dev, lib, case) for case in json.loads(spec_json)["cases"]]
    return {"results": results, "device": device_summary(dev)}


async def _gemv_case(dev, lib, spec: dict) -> dict:
    import base64  # noqa: PLC0415

    from .kernels.linear import Linear, WeightPart  # noqa: PLC0415

    n, k, t = int(spec["n"]), int(spec["k"]), int(spec["t"])
    owned = []

    def upload(b64: str, label: str):
        data = base64.b64decode(b64)
        buf = dev.create_buffer(len(data) + (-len(data) % 4), STORAGE | COPY_DST, label)
        dev.write_buffer(buf, 0, data + b"\0" * (-len(data) % 4))
        owned.append(buf)
        return dev_binding(buf, 0, len(data) + (-len(data) % 4))

    part = WeightPart(0, n, upload(spec["qweight"], "qweight"), upload(spec["scales"], "scales"),
                      upload(spec["mins"], "mins") if spec.get("mins") else None)
    x = upload(spec["x"], "x")
    y_bytes = 4 * t * n
    y = dev.create_buffer(y_bytes + GUARD_BYTES, STORAGE | COPY_SRC | COPY_DST, "y")
    owned.append(y)
    dev.write_buffer(y, 0, b"\xcd" * y_bytes + GUARD)
    step = dev.create_buffer(16, STORAGE | COPY_DST, "step")
    owned.append(step)
    dev.write_buffer(step, 0, array.array("I", [t, 0, 0, 0]))  # step[0] = row count, step[1] = first row (gemm)
    kernel = spec.get("kernel", "gemv")
    lin = Linear(lib, spec["dtype"], n, k, int(spec["group_size"]), [part], x, dev_binding(y, 0, y_bytes),
                 int(spec["x_stride"]), n, dev_binding(step), count_index=0, start_index=1, kernel=kernel)
    cmds = dev.commands()
    lin.encode(cmds, t)
    t0 = time.perf_counter()
    dev.submit(cmds)
    out = await dev.read_buffer(y)
    ms = (time.perf_counter() - t0) * 1e3
    for b in owned:
        dev.destroy_buffer(b)
    return {"y": base64.b64encode(out).decode("ascii"), "y_bytes": y_bytes, "guard_ok": out[y_bytes:] == GUARD,
            "ms": ms, "kernel": kernel}


async def selftest(name: str = "copy", spec_json: str = "{}") -> dict:
    """Dispatch a named GPU self test (copy | gemv)."""
    if name == "copy":
        return await selftest_copy()
    if name == "gemv":
        return await selftest_gemv(spec_json)
    raise WebinferError(f"unknown self test {name!r} (copy, gemv)")


def dev_binding(buf, offset: int = 0, size: int | None = None):
    from .gpu.device import BufferBinding  # noqa: PLC0415

    return BufferBinding(buf, offset, size)


# ------------------------------------------------------------------------------------------- the model


def make_reader(files: dict[str, Any]) -> Callable[[str, int, int], bytes]:
    """A Package reader over file bytes handed over by JS (name -> bytes-like)."""

    def reader(name: str, offset: int, size: int) -> bytes:
        data = files.get(name)
        if data is None:
            raise IntegrityError(name, "a file downloaded by the loader", "nothing (not handed over)")
        if offset + size > len(data):
            raise IntegrityError(name, f"at least {offset + size} bytes", f"{len(data)} bytes")
        return bytes(memoryview(data)[offset: offset + size])

    return reader


def open_package(manifest_text: str, files: dict[str, Any], where: str = "manifest.json") -> Package:
    try:
        manifest = json.loads(manifest_text)
    except json.JSONDecodeError as e:
        raise FormatError(where, "(json)", f"is not valid JSON: {e}") from None
    return Package.from_manifest(manifest, make_reader(files), where)


async def load(manifest_text: str, js_files, where: str = "manifest.json", backend: str = "webgpu") -> dict:
    """Take the files over from JS (a Map name -> Uint8Array), open the package and build the engine.
    backend: "webgpu", "cpu" (the wasm engine, webinfer/cpu) or "auto" (webinfer.cpu.browser.choose_backend)."""
    from .cpu.browser import choose_backend  # noqa: PLC0415

    t0 = time.perf_counter()
    files = {}
    for name in list(js_files.keys()):
        files[str(name)] = js_files.get(name).to_bytes()  # one copy into the Python heap
    t_copy = time.perf_counter()
    pkg = open_package(manifest_text, files, where)
    _state["package"], _state["files"] = pkg, files
    _state["backend"], why = await choose_backend(backend, get_device)
    dev = await get_device() if _state["backend"] == "webgpu" else None
    timings = {"handover_ms": (t_copy - t0) * 1e3}
    info = {"name": pkg.name, "device": device_summary(dev) if dev else None, "engine": False, "timings": timings,
            "backend": _state["backend"], "backend_reason": why}
    try:
        await build_engine(timings)
        info["engine"] = True
    except ImportError as e:  # the engine modules have not landed in this build
        info["engine_missing"] = str(e)
    _state["timings"] = timings
    return info


class _Timed:
    """Adds up the wall time of some device methods during engine build (GPU upload vs pipeline creation)."""

    def __init__(self, dev, names):
        self.dev, self.names, self.ms = dev, names, {n: 0.0 for n in names}

    def __enter__(self):
        for n in self.names:
            orig = getattr(self.dev, n)

            def wrapped(*a, _orig=orig, _n=n, **kw):
                t0 = time.perf_counter()
                try:
                    return _orig(*a, **kw)
                finally:
                    self.ms[_n] += (time.perf_counter() - t0) * 1e3
            setattr(self.dev, n, wrapped)
        return self

    def __exit__(self, *exc):
        for n in self.names:
            delattr(self.dev, n)  # back to the class's method


def blocks_for(cfg, tokens: int, block_size: int) -> int:
    """KV blocks for `tokens` of context, plus the null block 0."""
    return 1 + -(-tokens // block_size)


# The page may run several chats at once (two create() calls, two UI panes): they share one paged KV pool of
# KV_TOKENS slots and are stepped together by the engine's scheduler (continuous batching, at most MAX_SEQS).
KV_TOKENS = 2048
MAX_SEQS = 4
MAX_BATCH_TOKENS = 64


class _HostTime:
    """Running totals of the host (Python) time spent encoding and submitting steps: reported per token."""

    def __init__(self, runner, device):
        self.ms, self.steps = 0.0, 0
        enc, sub = runner.encode_step, device.submit

        def encode_step(batch):
            t0 = time.perf_counter()
            try:
                return enc(batch)
            finally:
                self.ms += (time.perf_counter() - t0) * 1e3
                self.steps += 1

        def submit(cmds):
            t0 = time.perf_counter()
            try:
                return sub(cmds)
            finally:
                self.ms += (time.perf_counter() - t0) * 1e3

        runner.encode_step, device.submit = encode_step, submit  # instance attributes shadow the methods


async def build_engine(timings: dict | None = None, context_tokens: int = KV_TOKENS) -> Any:
    """(Re)build the runner and the AsyncEngine for the loaded package on a live device (after a loss too)."""
    from .api import LLM  # noqa: PLC0415
    from .chat_template import render  # noqa: PLC0415, F401  (fail early if the runtime lacks it)
    from .engine.engine import AsyncEngine  # noqa: PLC0415
    from .engine.gpu_model import GPUModel  # noqa: PLC0415
    from .tokenizer import Tokenizer  # noqa: PLC0415

    pkg = _state["package"]
    if pkg is None:
        raise WebinferError("no model is loaded")
    old = _state.get("engine")
    _state["engine"] = _state["llm"] = None
    if old is not None:
        await old.close()  # its step loop ends; streams still open get EngineStepError
    if _state.get("backend") == "cpu":
        return await _build_cpu_engine(pkg, context_tokens, timings)
    dev = await get_device()
    t0 = time.perf_counter()
    ctx = min(context_tokens, pkg.config.max_position_embeddings)
    with _Timed(dev, ("write_buffer", "create_pipeline", "create_buffer")) as tm:
        runner = await GPUModel.load(dev, pkg, num_blocks=blocks_for(pkg.config, ctx, 16), block_size=16,
                                     max_batch_tokens=MAX_BATCH_TOKENS, max_seqs=MAX_SEQS, max_model_len=ctx)
    t_enc = time.perf_counter()
    # Uploads done and pipelines compiled. In Chrome createComputePipeline returns at once and compiles in the GPU
    # process, and later calls needing that process wait behind it: on SwiftShader this drain (or a big
    # createBuffer) is ~8-10 s of shader compilation, not uploads (75 KB of tiny weights drain as long as 98 MB).
    # Compiling the recorded sources first with createComputePipelineAsync took as long and did not make the
    # later synchronous creations cache hits ("auto" layouts), so it doubled the time: not done.
    await dev.wait_idle()
    t1 = time.perf_counter()
    if _state.get("tokenizer") is None:
        _state["tokenizer"] = Tokenizer.from_json(pkg.tokenizer_json())
    _state["host"] = _HostTime(runner, dev)
    engine = AsyncEngine(runner, _state["tokenizer"], eos_ids=pkg.config.eos_token_ids,
                         chat_template=pkg.chat_template, special_tokens=pkg.special_tokens,
                         model_name=pkg.name or "webinfer", max_num_batched_tokens=runner.max_tokens,
                         max_num_seqs=MAX_SEQS, enable_prefix_caching=True)
    _state["runner"], _state["engine"], _state["llm"] = runner, engine, LLM(engine)
    if timings is None:
        timings = {}
    _state["build_timings"] = timings
    timings.update({"engine_build_ms": (t1 - t0) * 1e3, "gpu_upload_ms": tm.ms["write_buffer"],
                    "pipeline_create_ms": tm.ms["create_pipeline"], "buffer_create_ms": tm.ms["create_buffer"], "load_calls_ms": (t_enc - t0) * 1e3,
                    "gpu_drain_ms": (t1 - t_enc) * 1e3,
                    "tokenizer_ms": (time.perf_counter() - t1) * 1e3})
    return engine


async def _build_cpu_engine(pkg, context_tokens: int, timings: dict | None) -> Any:
    """The same engine over the CPU runner (the wasm module through JS WebAssembly)."""
    from .api import LLM  # noqa: PLC0415
    from .cpu import CpuRunner  # noqa: PLC0415
    from .cpu.browser import StepTimer, js_host  # noqa: PLC0415
    from .engine.engine import AsyncEngine  # noqa: PLC0415
    from .tokenizer import Tokenizer  # noqa: PLC0415

    t0 = time.perf_counter()
    host = await js_host()
    ctx = min(context_tokens, pkg.config.max_position_embeddings)
    runner = await CpuRunner.load(host, pkg, num_blocks=blocks_for(pkg.config, ctx, 16), block_size=16,
                                  max_batch_tokens=MAX_BATCH_TOKENS, max_seqs=MAX_SEQS, max_model_len=ctx)
    t1 = time.perf_counter()
    if _state.get("tokenizer") is None:
        _state["tokenizer"] = Tokenizer.from_json(pkg.tokenizer_json())
    _state["host"] = StepTimer(runner)
    engine = AsyncEngine(runner, _state["tokenizer"], eos_ids=pkg.config.eos_token_ids,
                         chat_template=pkg.chat_template, special_tokens=pkg.special_tokens,
                         model_name=pkg.name or "webinfer", max_num_batched_tokens=runner.max_tokens,
                         max_num_seqs=MAX_SEQS, enable_prefix_caching=True)
    _state["runner"], _state["engine"], _state["llm"] = runner, engine, LLM(engine)
    timings = {} if timings is None else timings
    _state["build_timings"] = timings
    timings.update({"engine_build_ms": (t1 - t0) * 1e3, "wasm_variant": host.variant, "wasm_reason": host.reason,
                    "wasm_memory_bytes": runner.memory_bytes, "tokenizer_ms": (time.perf_counter() - t1) * 1e3})
    return engine


async def ensure_engine():
    """(LLM, build timings if this call rebuilt it): after a device loss the first caller rebuilds the engine and
    concurrent callers wait for that."""
    import asyncio  # noqa: PLC0415

    lock = _state.get("build_lock")
    if lock is None:
        lock = _state["build_lock"] = asyncio.Lock()
    async with lock:
        dev = _state["device"]
        gpu_gone = _state.get("backend") != "cpu" and (dev is None or dev.lost)
        if _state.get("llm") is None or gpu_gone:
            await build_engine()
            return _state["llm"], _state["build_timings"]
    return _state["llm"], None


def _request_args(req: dict) -> dict:
    """OpenAI sampling fields of a request dict, as keyword arguments for LLM's create()."""
    keys = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")
    args = {k: req[k] for k in keys if req.get(k) is not None}
    if "max_tokens" not in args and req.get("max_completion_tokens") is not None:
        args["max_tokens"] = req["max_completion_tokens"]
    return args


def _as_chat_chunk(c: dict, first: bool) -> dict:
    """A text_completion chunk (prompt given as ids) reshaped as a chat.completion.chunk."""
    ch = dict(c["choices"][0])
    text = ch.pop("text", "")
    ch["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    return {**c, "id": "chat" + c["id"], "object": "chat.completion.chunk", "choices": [ch]}


async def chat(request_json: str, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> dict:
    """Stream one OpenAI-shaped chat completion through the shared engine: emit(chunk_json) per chunk.

    Any number of chat() calls may run at once; each is one engine request, stepped together with the others.
    `prompt_ids` (an extension) replaces the chat template. should_stop() is polled after every chunk: when it
    turns true the request is aborted (its KV blocks freed) and a last chunk with finish_reason "abort" is sent.
    Returns this request's stats; host_ms_per_step is the engine-wide Python time per step while it ran."""
    req = json.loads(request_json)
    llm, rebuilt = await ensure_engine()
    engine, host = _state["engine"], _state["host"]
    host_ms0, steps0 = host.ms, host.steps
    args = _request_args(req)
    if req.get("prompt_ids"):
        stream = await llm.completions.create(prompt=[int(i) for i in req["prompt_ids"]], stream=True, **args)
        reshape = True
    else:
        stream = await llm.chat.completions.create(messages=req.get("messages"), stream=True, **args)
        reshape = False
    ids: list[int] = []
    last, first, stopped = None, True, False
    try:
        async for c in stream:
            if reshape:
                c = _as_chat_chunk(c, first)
            first = False
            ids += c["choices"][0].get("token_ids") or []
            last = c
            emit(json.dumps(c))
            if c["choices"][0]["finish_reason"] is None and should_stop():
                stopped = True
                break
    except Exception as e:
        if _state["device"] is not None and _state["device"].lost:
            raise DeviceLostError(f"the GPU device was lost during generation ({e}); send the request again") from e
        raise
    finally:
        await stream.aclose()  # aborts the engine request if it is still running
    if stopped:
        emit(json.dumps({**last, "choices": [{**last["choices"][0], "delta": {}, "token_ids": [],
                                              "finish_reason": "abort"}]}))
    usage = (last or {}).get("usage") or {}
    tpot = usage.get("time_per_output_token_s")
    steps = host.steps - steps0
    return {"id": (last or {}).get("id"), "token_ids": ids, "completion_tokens": len(ids),
            "prompt_tokens": usage.get("prompt_tokens"), "stopped": stopped,
            "ttft_ms": usage["ttft_s"] * 1e3 if usage.get("ttft_s") is not None else None,
            "decode_tok_s": 1.0 / tpot if tpot else 0.0,
            "host_ms_per_step": (host.ms - host_ms0) / steps if steps else 0.0,
            "engine_steps": steps, "engine": engine.stats(), "rebuild_timings": rebuilt}
