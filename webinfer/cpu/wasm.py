"""Hosts for the CPU engine's WebAssembly module (wasm/kernels.c): wasmtime natively, JS WebAssembly in Pyodide.

Both give the runner the same small interface, so webinfer/cpu/runner.py never knows where it runs:

    host.call("wi_step", model_ptr, step_ptr)     exported function, integer/float arguments only
    host.write(offset, data) / host.read(offset, n)   bytes in and out of linear memory
    host.ensure(nbytes)                            grow linear memory to at least nbytes (64 KiB pages)
    host.heap_base, host.relaxed, host.reason      first free byte; which variant runs and why

Variant choice ("auto"): the relaxed-SIMD module when the engine validates it and its self-test (wi_selftest,
the relaxed dot product against plain arithmetic) passes, else the base SIMD128 module. The reason is kept for
reports (`webinfer bench --backend cpu` prints it).
"""

from __future__ import annotations

from importlib import resources

from ..errors import WebinferError

PAGE = 65536
MAX_BYTES = 1 << 32  # the wasm32 address space
MODULES = {"base": "kernels.wasm", "relaxed": "kernels-relaxed.wasm"}


class WasmMemoryError(WebinferError):
    """The model (or a request for scratch memory) does not fit the 4 GiB wasm32 address space."""


def module_bytes(variant: str) -> bytes:
    """The packaged .wasm of a variant ("base" or "relaxed")."""
    return resources.files("webinfer.cpu").joinpath(MODULES[variant]).read_bytes()


class WasmtimeHost:
    """The module in wasmtime (native CPython)."""

    def __init__(self, variant: str = "auto"):
        import wasmtime

        if variant not in ("auto", "base", "relaxed"):
            raise ValueError(f"wasm variant {variant!r}: expected 'auto', 'base' or 'relaxed'")
        self.reason = ""
        if variant in ("auto", "relaxed"):
            try:
                self._instantiate(wasmtime, "relaxed")
                if self.call("wi_selftest") == 1:
                    self.reason = "relaxed SIMD: validated and self-test passed"
                    return
                self.reason = "relaxed SIMD self-test failed; "
            except wasmtime.WasmtimeError as e:
                self.reason = f"relaxed SIMD unavailable ({str(e).splitlines()[0]}); "
            if variant == "relaxed":
                raise WebinferError(f"wasm: {self.reason.rstrip('; ')}")
        self._instantiate(wasmtime, "base")
        self.reason += "base SIMD128"

    def _instantiate(self, wasmtime, variant: str) -> None:
        cfg = wasmtime.Config()
        cfg.wasm_simd = True
        cfg.wasm_bulk_memory = True
        cfg.wasm_relaxed_simd = variant == "relaxed"
        cfg.cranelift_opt_level = "speed"
        self.engine = wasmtime.Engine(cfg)
        self.store = wasmtime.Store(self.engine)
        module = wasmtime.Module(self.engine, module_bytes(variant))
        self.instance = wasmtime.Instance(self.store, module, [])
        ex = self.instance.exports(self.store)
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
        # i32 parameters: offsets past 2 GiB go in as their two's-complement (wasmtime checks the signed range)
        return f(self.store, *(a - (1 << 32) if isinstance(a, int) and a >= 1 << 31 else a for a in args))

    def write(self, offset: int, data) -> None:
        self.memory.write(self.store, data, offset)

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.memory.read(self.store, offset, offset + n))

    @property
    def size(self) -> int:
        return self.memory.data_len(self.store)

    def ensure(self, nbytes: int) -> None:
        if nbytes > MAX_BYTES:
            raise WasmMemoryError(f"wasm memory: need {nbytes} bytes, more than the 4 GiB wasm32 address space")
        have = self.size
        if nbytes > have:
            self.memory.grow(self.store, -(-(nbytes - have) // PAGE))


class JsHost:
    """The module in the page: Pyodide calls the exports of a JS WebAssembly.Instance through its FFI.

    `instance` is the JS instance the worker created from the same .wasm (webinfer.js picks the variant with the
    same self-test); `relaxed` says which one it is.
    """

    def __init__(self, instance, relaxed: bool, reason: str = ""):
        self.instance, self.relaxed, self.reason = instance, relaxed, reason
        self.variant = "relaxed" if relaxed else "base"
        self.exports = instance.exports
        self.memory = self.exports.memory
        self.heap_base = int(getattr(self.exports, "__heap_base").value)  # (not .__heap_base: name mangling)

    def call(self, name: str, *args):
        return getattr(self.exports, name)(*args)

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
        if nbytes > MAX_BYTES:
            raise WasmMemoryError(f"wasm memory: need {nbytes} bytes, more than the 4 GiB wasm32 address space")
        have = self.size
        if nbytes > have:
            self.memory.grow(-(-(nbytes - have) // PAGE))
