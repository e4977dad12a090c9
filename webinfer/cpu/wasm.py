"""Hosts for the CPU engine's WebAssembly module (wasm/kernels.c): wasmtime natively, JS WebAssembly in Pyodide.

Both give the runner the same small interface, so webinfer/cpu/runner.py never knows where it runs:

    host.call("wi_step", model_ptr, step_ptr)     exported function, integer/float arguments only
    host.write(offset, data) / host.read(offset, n)   bytes in and out of linear memory
    host.ensure(nbytes)                            grow linear memory to at least nbytes (64 KiB pages)
    host.heap_base, host.relaxed, host.reason      first free byte; which variant runs and why

Variant choice ("auto"): the relaxed-SIMD module when the engine validates it and its self-test (wi_selftest,
the relaxed dot product against plain arithmetic) passes, else the base SIMD128 module. The reason is kept for
reports (`webinfer bench --backend cpu` prints it).

Threads (threads=N, 2..MAX_THREADS): the threads build of the variant (kernels-threads.wasm /
kernels-relaxed-threads.wasm) on a shared memory; the runner places the team (kernels.c Team: barrier words, each
worker's buffers and stack) and calls `host.start_worker(team, tid, stack_top)` for tid 1..N-1, each parking
another instance of the module, on the same memory, in `wi_worker` on its own thread; each `wi_step` then runs on
the team's nth of them (docs/cpu-backend.md "Threads").
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import weakref
from importlib import resources

from ..errors import WebinferError

PAGE = 65536
MAX_BYTES = 1 << 32  # the wasm32 address space
MODULES = {"base": "kernels.wasm", "relaxed": "kernels-relaxed.wasm"}
THREAD_MODULES = {"base": "kernels-threads.wasm", "relaxed": "kernels-relaxed-threads.wasm"}
TEAM_WORDS = 10  # kernels.c Team: nth, spins, go, quit, arrived, gen, m, s, max, bufs
BUFS_WORDS = 5   # kernels.c Bufs (a worker's buffers): work, xn, k, v, r
MAX_THREADS = 16  # kernels.c MAX_THREADS
_QUIT_WORD = 3
_TEAM_CALLS = ("wi_step", "wi_steps", "wi_head")  # the exports the team runs: a worker's failure raises after them
_NTH_WORD = 0
# polls of a barrier word before blocking on it (memory.atomic.wait32): enough (~0.3-1 ms) that a thread sleeps
# only through the host's time between blocks, not between a step's barriers (~30-40 us apart in the page, where
# blocking there cost two Workers most of their gain). Measured against 20000 in the page (Chromium, 2 vCPUs,
# SmolLM2, two Workers' ms per step, exact / fast): 4.8-5.9 / 3.8-3.9 against 6.2-8.9 / 5.8-6.1
# (docs/cpu-backend.md "Barrier polls"); natively the same or better
SPINS = 400000


class WasmMemoryError(WebinferError):
    """The model (or a request for scratch memory) does not fit the 4 GiB wasm32 address space."""


# Memory grows in steps of at least this much: each grow is a host call (a JS FFI round trip in the page) and a
# model's load places ~1200 buffers; what is reserved beyond use (runner.memory_bytes) stays under one step.
GROW_STEP = 8 << 20


def grow_pages(have: int, nbytes: int) -> int:
    """Pages to grow a memory of `have` bytes by so that `nbytes` fit (0 when they do): at least GROW_STEP, never
    past the wasm32 ceiling."""
    if nbytes > MAX_BYTES:
        raise WasmMemoryError(f"wasm memory: need {nbytes} bytes, more than the 4 GiB wasm32 address space")
    if nbytes <= have:
        return 0
    return -(-(min(max(nbytes, have + GROW_STEP), MAX_BYTES) - have) // PAGE)


def module_bytes(variant: str, threads: bool = False) -> bytes:
    """The packaged .wasm of a variant ("base" or "relaxed"), or its threads build."""
    return resources.files("webinfer.cpu").joinpath((THREAD_MODULES if threads else MODULES)[variant]).read_bytes()


def team_words(nth: int, bufs: int, spins: int | None = None) -> bytes:
    """A fresh kernels.c Team of `nth` threads (thread 0 and nth - 1 workers, every step on all of them until the
    host writes a smaller nth), the workers' Bufs at `bufs` (bufs_words) (spins: default SPINS)."""
    return struct.pack(f"<{TEAM_WORDS}I", nth, SPINS if spins is None else spins, 0, 0, 0, 0, 0, 0, nth, bufs)


def bufs_words(work: int, xn: int, k: int, v: int, r: int) -> bytes:
    """One worker's kernels.c Bufs: its scratch (and attention scores), normed rows, k and v rows, residual."""
    return struct.pack(f"<{BUFS_WORDS}I", work, xn, k, v, r)


def check_threads(threads) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads={threads!r}: expected 1 to {MAX_THREADS}")
    return threads


def spins_for(threads: int, cores: int | None) -> int:
    """Barrier polls for a step on `threads` threads on `cores` cores (None: unknown): SPINS, or 0 (block at once)
    when the threads outnumber the cores: a thread polling for a partner that waits for its core only delays it.
    Per step's count, not per team: four Workers on two cores run their two-thread steps polling (measured in the
    page, fast mode: 7.8 ms a step polling, 11.7-19.6 blocking)."""
    return SPINS if cores is None or threads <= max(cores, 1) else 0


class WasmtimeHost:
    """The module in wasmtime (native CPython); threads > 1: the threads build, each worker thread (1..threads-1) a
    Python thread with its own Store and Instance on the same wasmtime.SharedMemory (wasm calls release the GIL:
    ctypes)."""

    def __init__(self, variant: str = "auto", threads: int = 1, module: bytes | None = None):
        """module: a build's bytes instead of the packaged one (A/B benches: webinfer_packager.bench.cpu_ab); its
        variant ("base" or "relaxed") and threads must be the build's."""
        import wasmtime

        if variant not in ("auto", "base", "relaxed"):
            raise ValueError(f"wasm variant {variant!r}: expected 'auto', 'base' or 'relaxed'")
        check_threads(threads)
        if module is not None and variant == "auto":
            raise ValueError("wasm: a module's bytes need its variant, 'base' or 'relaxed'")
        self.threads, self.reason, self.team, self._workers = threads, "", 0, []
        self.cores = os.cpu_count() or 1
        self._module_bytes = module
        self._closer = None
        if variant in ("auto", "relaxed"):
            try:
                self._instantiate(wasmtime, "relaxed")
                if self.call("wi_selftest") == 1:
                    self.reason = "relaxed SIMD: validated and self-test passed"
                    self._say_threads()
                    return
                self.reason = "relaxed SIMD self-test failed; "
            except wasmtime.WasmtimeError as e:
                self.reason = f"relaxed SIMD unavailable ({str(e).splitlines()[0]}); "
            if variant == "relaxed":
                raise WebinferError(f"wasm: {self.reason.rstrip('; ')}")
        self._instantiate(wasmtime, "base")
        self.reason += "base SIMD128"
        self._say_threads()

    def _say_threads(self) -> None:
        if self.threads > 1:
            self.reason += f"; {self.threads} threads (the threads build on a shared memory)"

    def _instantiate(self, wasmtime, variant: str) -> None:
        cfg = wasmtime.Config()
        cfg.wasm_simd = True
        cfg.wasm_bulk_memory = True
        cfg.wasm_relaxed_simd = variant == "relaxed"
        cfg.cranelift_opt_level = "speed"
        shared = self.threads > 1
        if shared:
            cfg.wasm_threads = True
            cfg.shared_memory = True
        self.engine = wasmtime.Engine(cfg)
        self.store = wasmtime.Store(self.engine)
        self.module = module = wasmtime.Module(self.engine, self._module_bytes or module_bytes(variant, shared))
        if shared:  # the module's own limits (its initial size; 4 GiB max), shared
            lim = module.imports[0].type.limits
            self.memory = _shared_memory(wasmtime)(
                self.engine, wasmtime.MemoryType(wasmtime.Limits(lim.min, lim.max), shared=True))
            self.instance = wasmtime.Instance(self.store, module, [self.memory])
        else:
            self.instance = wasmtime.Instance(self.store, module, [])
        ex = self.instance.exports(self.store)
        if not shared:
            self.memory = ex["memory"]
        self._funcs = {}
        self._ex = ex
        self.heap_base = ex["__heap_base"].value(self.store)
        self.variant = variant
        self.relaxed = variant == "relaxed"

    def call(self, name: str, *args):
        f = self._funcs.get(name)
        if f is None:
            f = self._funcs[name] = self._ex[name]
        out = f(self.store, *_i32(args))
        if self.team and name in _TEAM_CALLS and self.read(self.team + 4 * _QUIT_WORD, 4) != bytes(4):
            failed = [w for w in self._workers if w.error]
            why = f"thread {failed[0].tid} failed: {failed[0].error}" if failed else "a thread has quit"
            raise WebinferError(f"wasm: the step was abandoned: {why}")
        return out

    def start_worker(self, team: int, tid: int, stack_top: int) -> None:
        """Start worker `tid` on the Team at `team` (written by the runner; team_words), its stack below
        stack_top."""
        import wasmtime

        store = wasmtime.Store(self.engine)
        inst = wasmtime.Instance(store, self.module, [self.memory])  # (the data segments are not written again)
        ex = inst.exports(store)
        ex["__stack_pointer"].set_value(store, wasmtime.Val.i32(_i32([stack_top])[0]))
        self.team = team
        worker = _Worker(store, ex["wi_worker"], ex["wi_team_quit"], team, tid)
        self._workers.append(worker)
        worker.thread.start()
        # on close, at garbage collection or at exit: thread 0's instance tells the team to quit, the workers are
        # joined (one finalizer for all: it reads the list as it is then)
        if self._closer is None:
            self._closer = weakref.finalize(self, _stop_team, self.store, self._ex["wi_team_quit"], team,
                                            self._workers)

    def close(self) -> None:
        """Stop the worker threads (no-op with one thread); the host takes no more steps."""
        if self._closer is not None:
            self._closer()

    def write(self, offset: int, data) -> None:
        if self.threads > 1:
            self._check(offset, len(data))
            ctypes.memmove(ctypes.addressof(self.memory.data_ptr().contents) + offset, bytes(data), len(data))
        else:
            self.memory.write(self.store, data, offset)

    def read(self, offset: int, n: int) -> bytes:
        if self.threads > 1:
            self._check(offset, n)
            return ctypes.string_at(ctypes.addressof(self.memory.data_ptr().contents) + offset, n)
        return bytes(self.memory.read(self.store, offset, offset + n))

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or offset + n > self.size:
            raise IndexError(f"wasm memory: bytes [{offset}, {offset + n}) past its {self.size} bytes")

    @property
    def size(self) -> int:
        return self.memory.data_len() if self.threads > 1 else self.memory.data_len(self.store)

    def ensure(self, nbytes: int) -> None:
        pages = grow_pages(self.size, nbytes)
        if pages and self.threads > 1:
            _grow(lambda: self.memory.grow(pages), nbytes)
        elif pages:
            _grow(lambda: self.memory.grow(self.store, pages), nbytes)


def _grow(grow, nbytes: int) -> None:
    """Grow the memory; a refusal (wasmtime's limit, the browser's RangeError for a tab out of memory) is a
    WasmMemoryError, which CpuRunner.load answers by laying the model out smaller."""
    try:
        grow()
    except Exception as e:
        raise WasmMemoryError(f"wasm memory: could not grow to {nbytes} bytes ({e})") from e


def _shared_memory(wasmtime):
    """wasmtime.SharedMemory as an import: wasmtime-py (50) passes a pointer to its pointer (`ctypes.pointer(
    self.ptr())`), which its ctypes union rejects; the union takes the pointer itself."""

    class SharedMemory(wasmtime.SharedMemory):
        def _as_extern(self):
            from wasmtime import _ffi as ffi

            return ffi.wasmtime_extern_t(ffi.WASMTIME_EXTERN_SHAREDMEMORY,
                                         ffi.wasmtime_extern_union(sharedmemory=self.ptr()))
    return SharedMemory


def _i32(args):
    # i32 parameters: offsets past 2 GiB go in as their two's-complement (wasmtime checks the signed range)
    return [a - (1 << 32) if isinstance(a, int) and a >= 1 << 31 else a for a in args]


class _Worker:
    """Worker thread `tid`: its own Store and Instance, parked in wi_worker until the team quits. If it traps, it
    makes the team quit (thread 0's step returns at its next barrier and the host raises with this error)."""

    def __init__(self, store, run, quit_, team: int, tid: int):
        self.store, self.run, self.quit, self.team, self.tid, self.error = store, run, quit_, team, tid, None
        self.thread = threading.Thread(target=self._main, name=f"webinfer-wasm-thread-{tid}", daemon=True)

    def _main(self) -> None:
        try:
            self.run(self.store, *_i32([self.team, self.tid]))
        except Exception as e:  # noqa: BLE001 (reported by thread 0's host call)
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.quit(self.store, *_i32([self.team]))


def _stop_team(store, quit_, team: int, workers: list[_Worker]) -> None:
    quit_(store, *_i32([team]))
    for w in workers:
        w.thread.join(timeout=10)


class JsHost:
    """The module in the page: Pyodide calls the exports of a JS WebAssembly.Instance through its FFI.

    `instance` is the JS instance the worker created from the same .wasm (webinfer/cpu/browser.py js_host picks
    the variant with the same self-test); `relaxed` says which one it is. threads > 1: the instance is the threads
    build on the shared `memory`, `module` its compiled WebAssembly.Module, which start_worker hands to another
    Worker (web/wasm-thread.js) for each worker thread; cores: navigator.hardwareConcurrency (None: unknown), for
    the barriers' polls (spins_for).
    """

    def __init__(self, instance, relaxed: bool, reason: str = "", *, threads: int = 1, memory=None, module=None,
                 cores: int | None = None):
        self.instance, self.relaxed, self.reason = instance, relaxed, reason
        self.variant = "relaxed" if relaxed else "base"
        self.exports = instance.exports
        self.threads, self.module, self.team = check_threads(threads), module, 0
        self.cores = cores
        self.workers: list = []                 # the workers' JS Worker objects, thread 1 first
        self.worker_error: str | None = None    # "thread N: what failed" (the first failure)
        self.memory = memory if memory is not None else self.exports.memory
        self.heap_base = int(getattr(self.exports, "__heap_base").value)  # (not .__heap_base: name mangling)
        self._listeners: list = []
        self._have: int | None = None  # the memory's size as last read or grown (only this host grows it)

    def call(self, name: str, *args):
        out = getattr(self.exports, name)(*args)
        if self.team and name in _TEAM_CALLS and self.read(self.team + 4 * _QUIT_WORD, 4) != bytes(4):
            raise WebinferError(f"wasm: the step was abandoned: "
                                f"{self.worker_error if self.worker_error else 'a thread has quit'}")
        return out

    async def start_worker(self, team: int, tid: int, stack_top: int) -> None:
        """Start worker `tid`: a Worker (web/wasm-thread.js, beside worker.js) instantiates the module on the shared
        memory and parks in wi_worker; returns once it runs (raises if it could not start)."""
        import asyncio  # noqa: PLC0415

        from js import URL, Object, Worker, globalThis  # noqa: PLC0415 (Pyodide only)
        from pyodide.ffi import create_proxy, to_js  # noqa: PLC0415

        started = asyncio.get_event_loop().create_future()

        def on_event(ev):
            kind = getattr(ev, "type", "")
            data = getattr(ev, "data", None)
            what = getattr(data, "type", None) if kind == "message" else "error"
            if what == "started" and not started.done():
                started.set_result(None)
            elif what == "error":
                error = str(getattr(data, "message", None) or getattr(ev, "message", "") or
                            "the thread's script failed to load")
                self.worker_error = self.worker_error or f"thread {tid} failed: {error}"
                if not started.done():
                    started.set_exception(WebinferError(f"wasm thread {tid} did not start: {error}"))

        listener = create_proxy(on_event)
        self._listeners.append(listener)
        url = URL.new("./wasm-thread.js", globalThis.location.href).href
        worker = Worker.new(url, to_js({"type": "module", "name": f"webinfer-wasm-thread-{tid}"},
                                       dict_converter=Object.fromEntries))
        self.workers.append(worker)
        worker.addEventListener("message", listener)
        worker.addEventListener("error", listener)
        worker.postMessage(to_js({"module": self.module, "memory": self.memory, "team": team, "tid": tid,
                                  "stackTop": stack_top}, dict_converter=Object.fromEntries))
        await started
        self.team = team

    def close(self) -> None:
        """Stop the worker threads (no-op with one thread): the team quits, their Workers end."""
        if self.workers:
            if self.team:
                self.exports.wi_team_quit(self.team)
            for w in self.workers:
                w.terminate()
            self.workers = []

    def _view(self, offset: int, n: int):
        from js import Uint8Array  # noqa: PLC0415 (Pyodide only)

        return Uint8Array.new(self.memory.buffer, offset, n)

    def write(self, offset: int, data) -> None:
        self._view(offset, len(data)).assign(data)

    def read(self, offset: int, n: int) -> bytes:
        out = bytearray(n)
        self._view(offset, n).assign_to(out)
        return bytes(out)

    @property
    def size(self) -> int:
        return int(self.memory.buffer.byteLength)

    def ensure(self, nbytes: int) -> None:
        if self._have is None or nbytes > self._have:  # the size is asked of JS only when it may have to grow
            self._have = self.size
            pages = grow_pages(self._have, nbytes)
            if pages:
                _grow(lambda: self.memory.grow(pages), nbytes)
                self._have += pages * PAGE
