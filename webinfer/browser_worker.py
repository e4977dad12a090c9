"""The Python side of the page's worker (web/worker.js hosts Pyodide and calls the module functions at the end).

Division of labour: JavaScript downloads, verifies and caches the package files (web/loader.js) and hands their
bytes over; Python opens the Package and builds the LLM through webinfer.load() (the same factory as the CLI and
the server), and streams chat completion chunks back through a JS callback. Nothing here imports numpy (there is
none in Pyodide): data is bytes, `array` and `struct`.

Every entry point returns {"ok": true, "value": ...} or {"ok": false, "error": {"name", "message"}} (plain
JSON-able dicts), so the worker forwards typed errors without parsing Python tracebacks.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import selftest as selftests
from .api import LLM
from .errors import DeviceLostError, FormatError, IntegrityError, WebinferError
from .factory import EngineOptions, load_cpu_runner, load_gpu_runner, llm_for
from .package import Package

# The page may run several chats at once (two create() calls, two UI panes): they share one paged KV pool and are
# stepped together by the engine's scheduler (continuous batching).
PAGE_ENGINE = EngineOptions(context_tokens=2048, max_seqs=4, max_batch_tokens=64)
# The CPU engine's warm-up after ready (CpuRunner.warm_up): V8 optimizes a function only once it has run hot, and
# until it has, a two-Worker step ran 12-25 ms against 4.6-5 (SmolLM2; likely its background compiles taking a core
# from two threads that wait for each other). 2 s of steps raised two Workers' chat decode 1.1-1.9x over one step of
# warm-up (docs/cpu-backend.md, "One-step probes and a 2 s warm-up"); slices, so that a chat sent meanwhile waits
# for one slice at most.
WARM_UP_S = 2.0
WARM_UP_SLICE = 8


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


async def write_pycache(engine, idle) -> dict:
    """Compile the wheels' modules (webinfer, jinja2, markupsafe) into the bytecode cache that web/worker.js keeps
    in IndexedDB (sys.pycache_prefix, set there), unless the cache is complete. One file at a time, each while the
    engine has no work (a chat sent meanwhile waits for one file's compile at most); "unchecked-hash" .pyc: the
    key of the prefix names the wheels' content, so the sources cannot change under it. `complete` is written
    last: a visit that ends mid-way leaves a cache that the next one compiles again."""
    import importlib.util  # noqa: PLC0415
    import os  # noqa: PLC0415
    import py_compile  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import jinja2  # noqa: PLC0415
    import markupsafe  # noqa: PLC0415

    import webinfer  # noqa: PLC0415

    prefix = getattr(sys, "pycache_prefix", None)
    if not prefix:
        return {"state": "off"}
    if os.path.exists(os.path.join(prefix, "complete")):
        return {"state": "hit"}
    t0, n = time.perf_counter(), 0
    for pkg in (webinfer, jinja2, markupsafe):
        for root, _, names in os.walk(os.path.dirname(pkg.__file__)):
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                if engine.scheduler.has_work():
                    await idle()
                else:
                    await asyncio.sleep(0)
                src = os.path.join(root, name)
                py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                n += 1
    with open(os.path.join(prefix, "complete"), "w") as f:
        f.write(f"{n}\n")
    from js import webinferPersistPycache  # noqa: PLC0415 (web/worker.js)

    await webinferPersistPycache()
    return {"state": "written", "files": n, "ms": round((time.perf_counter() - t0) * 1e3, 1)}


async def make_runtime_snapshot(idle) -> dict:
    """Once the engine idles, the memory snapshot of a started runtime with the modules of snapshot_imports (web/
    worker.js webinferMakeRuntimeSnapshot: its own Worker; skipped when this runtime was restored from one)."""
    try:
        from js import webinferMakeRuntimeSnapshot  # noqa: PLC0415 (web/worker.js)
    except ImportError:
        return {"state": "off"}
    await idle()
    try:
        return json.loads(await webinferMakeRuntimeSnapshot())
    except Exception as e:  # noqa: BLE001 (the next visit starts Pyodide as this one did)
        return {"state": "error", "error": f"{type(e).__name__}: {e}"}


def snapshot_imports() -> int:
    """Imports what a load and a first chat import lazily, in the runtime web/snapshot-worker.js snapshots, so that a
    visit restored from it imports nothing. Returns how many modules are loaded."""
    import sys  # noqa: PLC0415

    import jinja2  # noqa: F401, PLC0415 (webinfer/prompt.py: at the first render)

    import webinfer.grammar  # noqa: F401, PLC0415 (api.py: per request with a response format)

    import webinfer.chat_template  # noqa: F401, PLC0415
    import webinfer.cpu.browser  # noqa: F401, PLC0415
    import webinfer.cpu.runner  # noqa: F401, PLC0415
    import webinfer.engine.gpu_model  # noqa: F401, PLC0415
    import webinfer.engine.speculative  # noqa: F401, PLC0415
    import webinfer.gpu.browser  # noqa: F401, PLC0415
    import webinfer.kernels.sampling  # noqa: F401, PLC0415

    return len(sys.modules)


def gemv_ksplit(value) -> int | None:
    """webinfer.js load()'s gemvKsplit: null (the device's default) or one of kernels/linear.py KSPLITS."""
    from .kernels.linear import KSPLITS  # noqa: PLC0415

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in KSPLITS:
        raise WebinferError(f"load option gemvKsplit: expected null or one of {', '.join(map(str, KSPLITS))}, "
                            f"got {value!r}")
    return value


def open_package(manifest_text: str, files: dict[str, Any], where: str = "manifest.json") -> Package:
    try:
        manifest = json.loads(manifest_text)
    except json.JSONDecodeError as e:
        raise FormatError(where, "(json)", f"is not valid JSON: {e}") from None
    return Package.from_manifest(manifest, make_reader(files), where)


@dataclass
class PageWorker:
    """The worker's state: one device (one per adapter on some browsers), the loaded package and its LLM."""
    device: Any = None                 # webinfer.gpu.browser.BrowserDevice, re-requested after a loss
    package: Package | None = None
    llm: LLM | None = None
    options: EngineOptions = field(default_factory=lambda: PAGE_ENGINE)
    backend: str = "webgpu"            # "webgpu" or "cpu" (the WebAssembly engine), chosen at load
    backend_reason: str = ""
    build_timings: dict = field(default_factory=dict)
    build_lock: asyncio.Lock | None = None
    ahead: Any = None                  # JS {adapter, device, pipelines: Map} made by worker.js before Python ran
    cpu_threads: int | None = None     # load()'s threads for the CPU engine (None: the page decides, cpu/browser.py)
    cpu_host: Any = None               # the CPU engine's JsHost (closed on rebuild: its second Worker ends)
    deferred: asyncio.Task | None = None   # compiling the lazy pipelines in the background (start_deferred)
    deferred_stats: dict = field(default_factory=dict)

    async def get_device(self):
        from .gpu.browser import adopt_device, request_device  # noqa: PLC0415  (JS FFI: only inside Pyodide)

        if self.device is None or self.device.lost:
            if self.device is not None:
                self.llm = None  # everything on the lost device is gone
            ahead, self.ahead = self.ahead, None  # used once: after a loss its device and pipelines are gone
            if ahead is not None and ahead.device is not None:
                self.device = adopt_device(ahead.adapter, ahead.device, ahead.pipelines, ahead.ready)
            else:
                self.device = await request_device()
        return self.device

    async def load(self, manifest_text: str, js_files, where: str, engine_json: str = "{}", ahead=None) -> dict:
        """Take the files over from JS (a Map name -> Uint8Array), open the package and build the LLM.
        engine_json: {"backend", "cpu_mode", "threads": null | 1..8 (the CPU engine's Workers; null: up to 4 when
        the page is cross-origin isolated, cpu/browser.py page_threads), "speculative": null | "prompt-lookup", "speculative_tokens": int,
        "decode_block": int, "decode_block_ms": number, "gemv_ksplit": null | 1..32} from webinfer.js load().
        ahead: the device and pipelines worker.js made from the last visit's record (see gpu/browser.py), or None.
        The value's "pipeline_record" is this build's record when it differs from what was made ahead."""
        t0 = time.perf_counter()
        if ahead is not None and self.device is None:
            self.ahead = ahead
        eng = json.loads(engine_json)
        self.options = replace(PAGE_ENGINE, speculative=eng.get("speculative") or None,
                               speculative_tokens=int(eng.get("speculative_tokens") or 4),
                               decode_block=max(1, min(int(eng.get("decode_block") or PAGE_ENGINE.decode_block), 64)),
                               decode_block_ms=max(0.0, float(eng.get("decode_block_ms", PAGE_ENGINE.decode_block_ms))),
                               cpu_mode=eng.get("cpu_mode") or "exact", gemv_ksplit=gemv_ksplit(eng.get("gemv_ksplit")))
        self.cpu_threads = eng.get("threads")
        from .cpu.browser import choose_backend, js_host  # noqa: PLC0415

        files = {str(name): js_files.get(name).to_bytes() for name in list(js_files.keys())}  # one copy each
        t_copy = time.perf_counter()
        self.package = open_package(manifest_text, files, where)
        cfg = self.package.config  # "auto" on a real adapter times both engines on the model's gate matrix
        t_choice = time.perf_counter()
        self.backend, self.backend_reason = await choose_backend(
            eng.get("backend") or "webgpu", self.get_device, shape=(cfg.intermediate_size, cfg.hidden_size),
            make_host=js_host)
        t_choice = time.perf_counter() - t_choice
        dev = await self.get_device() if self.backend == "webgpu" else None
        await self.build()
        timings = {"handover_ms": (t_copy - t0) * 1e3, "backend_choice_ms": t_choice * 1e3, **self.build_timings}
        record = None
        if dev is not None:
            # the build's pipelines first (made ahead next visit, before Load), then the lazy ones flagged
            # "deferred" (compiled after ready, in the background); written again when it differs from what was
            # made ahead: a miss, or made ahead but not used (a record from before a pipeline turned lazy)
            made = dev.made_ahead
            unique = {(p["entry"], p["code"]): p for p in dev.created}  # two libraries may ask for the same one
            if dev.made_ahead_hits < len(dev.created) or made is None or int(made.size) != len(unique):
                for p in self.llm.engine.runner.lib.deferred():
                    unique.setdefault((p["entry"], p["code"]), {**p, "deferred": True})
                record = {**dev.request, "pipelines": list(unique.values())}
        self.start_deferred()
        return {"name": self.package.name, "device": selftests.device_summary(dev) if dev else None,
                "timings": timings, "backend": self.backend, "backend_reason": self.backend_reason,
                "cpu_mode": self.options.cpu_mode if self.backend == "cpu" else None,
                "gemv_ksplit": getattr(self.llm.engine.runner, "ksplit", None),  # (the WebGPU engine's)
                "pipeline_record": record}

    def start_deferred(self, idle_s: float = 1.0) -> None:
        """After ready, in the background, each step once the engine has been idle for idle_s: Python's first-chat
        costs (imports, the chat template's compile), the bytecode cache for the next visit (write_pycache), then
        the pipelines the build left lazy (gemv tiles for several chats at once, the speculative and long-context
        attention kernels), one at a time: a chat sent right after ready does not share the CPU with them (on a
        software GPU a compile takes seconds). A chat that needs a lazy pipeline first compiles it itself
        (KernelLibrary.LazyPipeline). The CPU engine has no pipelines."""
        llm = self.llm
        engine, lib = llm.engine, getattr(llm.engine.runner, "lib", None)
        t0 = time.perf_counter()
        compile0 = lib.device.time_ms["create_pipeline_async"] if lib is not None else 0.0

        async def idle():
            quiet = 0.0
            while quiet < idle_s:
                await asyncio.sleep(0.1)
                quiet = 0.0 if engine.scheduler.has_work() else quiet + 0.1

        async def run():
            n = len(lib.deferred()) if lib is not None else 0
            self.deferred_stats = {"pending": n}
            # what the first chat would pay once in Python (Pyodide compiles a module's source at its first import):
            # the grammar package (api.py imports its matcher per request), jinja2 and the chat template's compile.
            # Only once the engine has been idle: this blocks the worker's thread for ~1 s, which must not delay
            # load()'s answer (ready) nor a chat sent at once (that chat pays them itself).
            await idle()
            warm_up = getattr(engine.runner, "warm_up", None)
            if warm_up is not None:  # the CPU engine: the first chat then finds the kernels optimized
                w0, steps, slices = time.perf_counter(), 0, []
                try:
                    # slices of steps until WARM_UP_S have passed or a request comes (it waits one slice at most)
                    while True:
                        s0 = time.perf_counter()
                        warm_up(steps=WARM_UP_SLICE)
                        slices.append(round((time.perf_counter() - s0) * 1e3 / WARM_UP_SLICE, 2))
                        steps += WARM_UP_SLICE
                        if time.perf_counter() - w0 >= WARM_UP_S:
                            break
                        await asyncio.sleep(0)
                        if engine.scheduler.has_work():
                            break
                    self.deferred_stats["kernel_warm_up_ms"] = (time.perf_counter() - w0) * 1e3
                    self.deferred_stats["kernel_warm_up_steps"] = steps
                    # ms per step of each slice (its prefill included): the module's optimization as it went
                    self.deferred_stats["kernel_warm_up_ms_per_step"] = slices
                except Exception as e:  # noqa: BLE001 (the first chat then runs unoptimized code: slower, not wrong)
                    self.deferred_stats["kernel_warm_up"] = f"error: {type(e).__name__}: {e}"
                await idle()
                # the LM head's two passes against one, on optimized code (CpuRunner.calibrate_head: speed only)
                calibrate = getattr(engine.runner, "calibrate_head", None)
                if calibrate is not None:
                    try:
                        self.deferred_stats["head_calibration"] = calibrate()
                    except Exception as e:  # noqa: BLE001 (the default limit stays: slower at worst, never wrong)
                        self.deferred_stats["head_calibration"] = f"error: {type(e).__name__}: {e}"
                    await idle()
            import webinfer.grammar  # noqa: F401, PLC0415

            if llm.prompter.chat_template:
                try:
                    llm.prompter.chat_ids([{"role": "user", "content": "Hi"}])
                except WebinferError:
                    pass  # a template that needs more than one user message: compiled by the first chat
            try:
                self.deferred_stats["pycache"] = await write_pycache(engine, idle)
            except Exception as e:  # noqa: BLE001 (storage full or gone: the next visit compiles from source)
                self.deferred_stats["pycache"] = {"state": "error", "error": f"{type(e).__name__}: {e}"}
            self.deferred_stats["runtime_snapshot"] = await make_runtime_snapshot(idle)
            if lib is None:
                self.deferred_stats.update(pending=0, done_after_ready_ms=(time.perf_counter() - t0) * 1e3)
                return
            try:
                made = await lib.create_deferred(idle)
            except Exception as e:  # a lost device: the rebuild starts again; anything else: compiled at first use
                self.deferred_stats["error"] = f"{type(e).__name__}: {e}"
                return
            self.deferred_stats.update({"pending": 0, "compiled": made, "at_first_use": lib.created_on_use,
                                        "compile_ms": lib.device.time_ms["create_pipeline_async"] - compile0,
                                        "done_after_ready_ms": (time.perf_counter() - t0) * 1e3})

        self.deferred = asyncio.ensure_future(run())

    def background_stats(self) -> dict:
        """What the work after ready has done so far (start_deferred): the lazy pipelines and the bytecode cache."""
        return dict(self.deferred_stats)

    async def build(self) -> None:
        """(Re)build the runner and the LLM for the loaded package on a live device (after a loss too)."""
        if self.package is None:
            raise WebinferError("no model is loaded")
        if self.deferred is not None:
            self.deferred.cancel()
            self.deferred = None
        old, self.llm = self.llm, None
        if old is not None:
            await old.close()  # its step loop ends; streams still open get EngineStepError
        if self.cpu_host is not None:
            self.cpu_host.close()  # the old CPU engine's second Worker, if any
            self.cpu_host = None
        if self.backend == "cpu":
            from .cpu.browser import js_host, warm_kernels  # noqa: PLC0415

            t0 = time.perf_counter()
            host = self.cpu_host = await js_host(threads=self.cpu_threads)
            warm_ms = warm_kernels(host)  # (the rest of the step's code: CpuRunner.warm_up after ready)
            runner = await load_cpu_runner(self.package, self.options, host=host)
            runner.choose_threads()  # several Workers: each decode block on the count its timings show fastest
            self.llm = llm_for(self.package, runner, self.options)
            self.build_timings = {"engine_build_ms": (time.perf_counter() - t0) * 1e3, "wasm_variant": host.variant,
                                  "wasm_threads": host.threads, "wasm_reason": host.reason, "wasm_warm_ms": warm_ms,
                                  "wasm_memory_bytes": runner.memory_bytes, "wasm_weights": runner.pack_reason}
            return
        dev = await self.get_device()
        ahead_wait = 0.0
        if dev.made_ahead is not None and not dev.created:
            # wait for the pipelines worker.js made ahead (async ones: until all are in the map; sync ones: the GPU
            # process compiles them before anything sent after them), so that the upload time below is their own
            t = time.perf_counter()
            if dev.made_ahead_ready is not None:
                await dev.made_ahead_ready
            await dev.wait_idle()
            ahead_wait = (time.perf_counter() - t) * 1e3
        counters0 = dict(dev.time_ms)
        made0, hits0 = len(dev.created), dev.made_ahead_hits
        t0 = time.perf_counter()
        runner = await load_gpu_runner(self.package, dev, self.options)
        t_enc = time.perf_counter()
        # Uploads done and pipelines created. In Chrome createComputePipeline returns at once and compiles in the GPU
        # process, and later calls needing that process wait behind it: on SwiftShader this drain is most of the
        # build (shader compilation, not uploads).
        await dev.wait_idle()
        t1 = time.perf_counter()
        self.llm = llm_for(self.package, runner, self.options)
        spent = {k: dev.time_ms[k] - counters0.get(k, 0.0) for k in dev.time_ms}
        t2 = time.perf_counter()
        await dev.read_buffer(runner.bufs.logits, 0, 4)  # nothing queued: what any read-back costs at least
        readback_ms = (time.perf_counter() - t2) * 1e3
        self.build_timings = {"engine_build_ms": (t1 - t0) * 1e3, "load_calls_ms": (t_enc - t0) * 1e3,
                              "gpu_drain_ms": (t1 - t_enc) * 1e3, "gpu_upload_ms": spent.get("write_buffer", 0.0),
                              "pipeline_create_ms": spent.get("create_pipeline", 0.0),
                              "buffer_create_ms": spent.get("create_buffer", 0.0),
                              "pipelines": len(dev.created) - made0,
                              "pipelines_made_ahead": dev.made_ahead_hits - hits0,
                              "ahead_compile_wait_ms": ahead_wait, "tokenizer_ms": (t2 - t1) * 1e3,
                              "readback_latency_ms": readback_ms, "pipelines_deferred": len(runner.lib.deferred())}

    async def ensure_llm(self) -> tuple[LLM, dict | None]:
        """(LLM, build timings if this call rebuilt it): after a device loss the first caller rebuilds and
        concurrent callers wait for that."""
        if self.build_lock is None:
            self.build_lock = asyncio.Lock()
        async with self.build_lock:
            gpu_gone = self.backend == "webgpu" and (self.device is None or self.device.lost)
            if self.llm is None or gpu_gone:
                await self.build()
                self.start_deferred()
                return self.llm, self.build_timings
        return self.llm, None

    async def chat(self, request_json: str, emit: Callable[[str], None], should_stop: Callable[[], bool],
                   kind: str = "chat") -> dict:
        """One OpenAI-shaped request of `kind` ("chat" or "completion"), streamed (emit(chunk_json) per chunk) when
        request["stream"], else answered whole: {"response": the same dict as Python's LLM returns, "stats": ...}.

        Any number of chat() calls may run at once; each is one engine request, stepped together with the others.
        `prompt_ids` (an extension) sends token ids through the completions path instead of the chat template.
        should_stop() is polled after every chunk (every 50 ms without a stream): when it turns true the request is
        aborted (its KV blocks freed); a stream then gets a last chunk with finish_reason "abort", a whole request
        fails with an AbortError. Returns this request's stats; host_ms_per_step is the engine-wide Python time per
        step while it ran."""
        req = json.loads(request_json)
        emit, should_stop, ffi = _timed_calls(emit, should_stop)
        llm, rebuilt = await self.ensure_llm()
        runner = llm.engine.runner
        host_ms0, steps0, step_ms0 = getattr(runner, "host_ms", 0.0), llm.engine.steps, getattr(runner, "step_ms", 0.0)
        between0 = llm.engine.between_s
        module_ms0 = getattr(runner, "module_ms", 0.0)
        dev = self.device if self.backend == "webgpu" else None
        dev0 = dict(dev.time_ms) if dev is not None else {}
        t_req, lazy0 = time.perf_counter(), runner.lib.created_on_use if dev is not None else 0
        first_token = None  # the request's time to its first token, split like per_token (streams only)
        prompt_ids = req.pop("prompt_ids", None)
        as_chat = bool(prompt_ids) and kind == "chat"  # chunks of the completions path reshaped as chat chunks
        if prompt_ids:
            req.pop("messages", None)
            req["prompt"] = [int(i) for i in prompt_ids]
            kind = "completion"
        if not req.get("stream"):
            task = asyncio.ensure_future(llm.create(kind, req))
            while not task.done():
                await asyncio.wait([task], timeout=0.05)
                if not task.done() and should_stop():
                    task.cancel()  # its engine requests are aborted as the task unwinds
                    await asyncio.gather(task, return_exceptions=True)
                    raise AbortError("the request was stopped")
            r = task.result()
            out_ids = [t for c in r["choices"] for t in c["token_ids"]]
            return {"response": r,
                    "stats": self._stats(llm, r["id"], out_ids, r["usage"], False, steps0, host_ms0, rebuilt,
                                         dev, dev0, step_ms0, module_ms0, ffi[0], between0)}
        stream = await llm.create(kind, req)
        ids: list[int] = []
        last, first, stopped = None, True, False
        try:
            async for c in stream:
                if not c["choices"]:  # stream_options.include_usage: the usage-only chunk
                    emit(c)
                    continue
                if as_chat:
                    c = _as_chat_chunk(c, first)
                first = False
                if first_token is None and dev is not None and c["choices"][0].get("token_ids"):
                    first_token = _time_split(dev, dev0, runner.host_ms - host_ms0, 1,
                                              (time.perf_counter() - t_req) * 1e3, ffi[0],
                                              (llm.engine.between_s - between0) * 1e3)
                    first_token.update(steps=llm.engine.steps - steps0,
                                       pipelines_compiled=runner.lib.created_on_use - lazy0)
                ids += c["choices"][0].get("token_ids") or []
                last = c
                emit(c)
                if c["choices"][0]["finish_reason"] is None and should_stop():
                    stopped = True
                    break
        except Exception as e:
            if self.device is not None and self.device.lost:
                raise DeviceLostError(f"the GPU device was lost during generation ({e}); send the request again") from e
            raise
        finally:
            await stream.aclose()  # aborts the engine request if it is still running
        if stopped:
            emit({**last, "choices": [{**last["choices"][0], "delta": {}, "token_ids": [], "finish_reason": "abort"}]})
        stats = self._stats(llm, (last or {}).get("id"), ids, (last or {}).get("usage") or {}, stopped, steps0,
                            host_ms0, rebuilt, dev, dev0, step_ms0, module_ms0, ffi[0], between0)
        stats["first_token"] = first_token
        stats["deferred_pipelines"] = dict(self.deferred_stats)
        return stats

    def _stats(self, llm: LLM, rid, ids: list[int], usage: dict, stopped: bool, steps0: int, host_ms0: float,
               rebuilt, dev=None, dev0=None, step_ms0: float = 0.0, module_ms0: float = 0.0,
               stream_ms: float = 0.0, between0: float = 0.0) -> dict:
        """A request's stats; dev, dev0: the browser device and its time counters when the request began; step_ms0:
        the CPU runner's summed step time then (cpu_ms_per_step: the wasm step, the CPU backend's per-step cost);
        module_ms0: the part of it inside the module's calls; stream_ms: the request's time in emit and should_stop;
        between0: the engine's between_s when the request began."""
        runner = llm.engine.runner
        tpot = usage.get("time_per_output_token_s")
        steps = llm.engine.steps - steps0
        split = None
        if dev is not None and len(ids) > 1 and tpot:
            # per decoded token (prefill included: the split is over the whole request)
            split = _time_split(dev, dev0 or {}, getattr(runner, "host_ms", 0.0) - host_ms0, len(ids),
                                (usage["ttft_s"] + tpot * (len(ids) - 1)) * 1e3, stream_ms,
                                (llm.engine.between_s - between0) * 1e3)
        return {"id": rid, "token_ids": ids, "completion_tokens": len(ids),
                "prompt_tokens": usage.get("prompt_tokens"), "stopped": stopped,
                "ttft_ms": usage["ttft_s"] * 1e3 if usage.get("ttft_s") is not None else None,
                "decode_tok_s": 1.0 / tpot if tpot else 0.0,
                "host_ms_per_step": (getattr(runner, "host_ms", 0.0) - host_ms0) / steps if steps else 0.0,
                "cpu_ms_per_step": ((runner.step_ms - step_ms0) / steps if steps else 0.0)
                if hasattr(runner, "step_ms") else None,
                # of which inside the module's step calls (the rest is the runner's Python between them)
                "cpu_module_ms_per_step": ((runner.module_ms - module_ms0) / steps if steps else 0.0)
                if hasattr(runner, "module_ms") else None,
                # the CPU engine with several Workers: decode blocks on 1, 2, ... by their timings (cpu/threads.py)
                "cpu_threads": getattr(runner, "threads_used", None),
                "cpu_thread_choice": runner.chooser.stats() if getattr(runner, "chooser", None) else None,
                "engine_steps": steps, "engine": llm.engine.stats(), "rebuild_timings": rebuilt,
                "per_token": split}

    async def selftest(self, name: str, spec_json: str) -> dict:
        return await selftests.run(await self.get_device(), name, spec_json)

    def handle_limit_for_test(self, limit: int) -> int:
        """Lower the device's command-handle table limit (BrowserDevice.max_handles) so that the table's rebuild
        runs between lists; returns the rebuilds so far."""
        if self.device is None:
            raise WebinferError("no GPU device: the handle table is the WebGPU engine's (load with backend webgpu)")
        self.device.max_handles = limit
        return self.device.handle_rebuilds

    def lose_device_for_test(self) -> None:
        """Destroy the JS device behind the engine's back, as a driver reset would (tests of the rebuild path)."""
        if self.device is not None:
            self.device.device.destroy()  # not device.destroy(): that one marks the loss as intentional


def _time_split(dev, dev0: dict, host_ms: float, n: int, wall_ms: float, stream_ms: float = 0.0,
                between_ms: float = 0.0) -> dict:
    """Where wall_ms (n tokens' worth) went, per token: Python recording the steps (python_ms), the JS FFI calls
    that upload step data (js_upload_ms) and encode + submit (js_submit_ms), waiting for read-backs (read_wait_ms:
    map latency + the GPU's time + shaders compiled on first use, which SwiftShader cannot tell apart without
    timestamp queries; load timings' readback_latency_ms is an empty read's), the read-back's own JS calls
    (js_read_ms: staging buffer, copy, submit, map, copy out, apart from the wait), the engine's host time between a
    step's result and the next step (between_steps_ms: the scheduler, the sampled tokens through the API's
    streams, the event loop's turns; engine.py between_s), and the rest (other_ms: the request's start and end,
    the chat template, the tokenizer, the runner's time around its measured calls). stream_ms, the chunks'
    JSON, emit's postMessage and the should_stop polls, is shown beside them, not in the sum: it runs between
    steps or while a read-back is awaited. dev0: dev.time_ms at the start; host_ms: the runner's."""
    d = {k: dev.time_ms[k] - dev0.get(k, 0.0) for k in ("submit", "read_wait", "read_calls", "write_buffer")}
    split = {"wall_ms": wall_ms / n, "python_ms": (host_ms - d["submit"] - d["write_buffer"]) / n,
             "js_upload_ms": d["write_buffer"] / n, "js_submit_ms": d["submit"] / n, "read_wait_ms": d["read_wait"] / n,
             "js_read_ms": d["read_calls"] / n, "between_steps_ms": between_ms / n}
    split["other_ms"] = max(0.0, split["wall_ms"] - sum(v for k, v in split.items() if k != "wall_ms"))
    split["stream_ms"] = stream_ms / n
    return split


def _timed_calls(emit: Callable[[str], None], should_stop: Callable[[], bool]):
    """emit (a JS function in the page, taking a chunk's JSON) as emit(chunk dict), and should_stop, each adding its
    milliseconds (the JSON included) to ms[0]."""
    ms = [0.0]

    def timed_emit(chunk: dict) -> None:
        t0 = time.perf_counter()
        emit(json.dumps(chunk))
        ms[0] += (time.perf_counter() - t0) * 1e3

    def timed_stop() -> bool:
        t0 = time.perf_counter()
        try:
            return should_stop()
        finally:
            ms[0] += (time.perf_counter() - t0) * 1e3

    return timed_emit, timed_stop, ms


class AbortError(WebinferError):
    """A whole (not streamed) request stopped by the page before it finished."""


def _as_chat_chunk(c: dict, first: bool) -> dict:
    """A text_completion chunk (prompt given as ids) reshaped as a chat.completion.chunk."""
    ch = dict(c["choices"][0])
    text = ch.pop("text", "")
    ch["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    return {**c, "id": "chat" + c["id"], "object": "chat.completion.chunk", "choices": [ch]}


# ------------------------------------------------------------------------------------- entry points for worker.js

WORKER = PageWorker()


async def _result(coro) -> dict:
    try:
        return {"ok": True, "value": await coro}
    except Exception as e:  # every error crosses to JS as {name, message}; WebinferErrors carry their own names
        return {"ok": False, "error": {"name": type(e).__name__, "message": str(e)}}


async def load(manifest_text: str, js_files, where: str = "manifest.json", engine_json: str = "{}",
               ahead=None) -> dict:
    return await _result(WORKER.load(manifest_text, js_files, where, engine_json, ahead))


async def chat(request_json: str, emit: Callable[[str], None], should_stop: Callable[[], bool],
               kind: str = "chat") -> dict:
    return await _result(WORKER.chat(request_json, emit, should_stop, kind))


async def selftest(name: str = "copy", spec_json: str = "{}") -> dict:
    return await _result(WORKER.selftest(name, spec_json))


def lose_device_for_test() -> None:
    WORKER.lose_device_for_test()


def handle_limit_for_test(limit: int) -> int:
    return WORKER.handle_limit_for_test(limit)


def background_stats() -> str:
    """JSON of what the work after ready has done (PageWorker.background_stats)."""
    return json.dumps(WORKER.background_stats())
