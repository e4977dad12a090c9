"""The browser's WebGPU (navigator.gpu) through Pyodide's JS FFI. Runs only inside Pyodide, in a Web Worker.

Costs that shape this file (measured in Chromium 156): every JS call from Python costs ~0.5-0.8 us and a full
encoder-pass-dispatch-submit issued from Python 32-175 us, so `submit` encodes a whole recorded `Commands` list into
one encoder, one compute pass (while dispatches follow each other) and one queue submit. Uploads pass a view of the
Python buffer to `queue.writeBuffer` without copying it in Python.

WebGPU reports validation errors asynchronously (uncapturederror events), not as exceptions from the call that
caused them; they are collected here and raised as GPUError at the next `read_buffer`, the only point where the
engine waits for the GPU anyway.

Pipelines made ahead (the page's fast second visit): pipeline creation is most of an engine build on a software
adapter (SwiftShader compiles each shader for seconds in Chrome's GPU process). The device records every pipeline
it creates (`created`: WGSL, entry point, label) and how it was requested (`request`); web/worker.js stores that
record and on the next visit requests the same device and creates those pipelines from JS while Pyodide starts.
`adopt_device` wraps that device, and `create_pipeline` then takes a made-ahead pipeline whose WGSL and entry point
are exactly the ones asked for (the key is the full source, so a changed runtime or adapter can only miss, never
get a wrong pipeline).
"""

from __future__ import annotations

import time
from array import array

from ..errors import DeviceLostError, GPUError, NoAdapterError
from .device import (
    BROWSER_DEFAULT_LIMITS,
    COPY_DST,
    COPY_SRC,
    MAP_READ,
    AdapterInfo,
    BufferBinding,
    Capabilities,
    Commands,
    Device,
    align,
    record_passes,
)

_QUERY_RESOLVE = 0x0200
_MAP_MODE_READ = 0x0001


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _js():
    import js  # noqa: PLC0415  (only exists inside Pyodide)
    from pyodide.ffi import create_once_callable, create_proxy, to_js  # noqa: PLC0415

    return js, create_proxy, create_once_callable, to_js


def _obj(value):
    js, _, _, to_js = _js()
    return to_js(value, dict_converter=js.Object.fromEntries)


async def request_device(*, timestamps: bool = False, force_f32: bool = False,
                         disable_subgroups: bool = False) -> "BrowserDevice":
    """Request an adapter and a device with the adapter's limits for the keys we use, and the features we can use.

    No shader-f16 is not an error: the kernels have an f32 path (SwiftShader, many phones)."""
    js, _, _, _ = _js()
    gpu = getattr(js.navigator, "gpu", None)
    if gpu is None:
        raise NoAdapterError("this browser has no WebGPU (navigator.gpu is missing); use a recent Chrome or Edge, "
                             "or Safari/Firefox with WebGPU enabled")
    adapter = await gpu.requestAdapter(powerPreference="high-performance")
    if adapter is None or type(adapter).__name__ == "JsNull":  # JS null is pyodide.ffi.jsnull, not None
        raise NoAdapterError("navigator.gpu.requestAdapter() returned no adapter (WebGPU disabled or blocklisted)")
    feats = set(adapter.features.keys())  # a JS Set: keys() iterates its values
    want = []
    f16 = "shader-f16" in feats and not force_f32
    sub = "subgroups" in feats and not disable_subgroups
    ts = timestamps and "timestamp-query" in feats
    for on, name in ((f16, "shader-f16"), (sub, "subgroups"), (ts, "timestamp-query")):
        if on:
            want.append(name)
    # Ask for the adapter's value of every limit we know (never less than the default a browser guarantees).
    req = {}
    for k, v in BROWSER_DEFAULT_LIMITS.items():
        a = getattr(adapter.limits, _camel(k), None)
        if a is not None:
            req[_camel(k)] = int(a)
    try:
        device = await adapter.requestDevice(_obj({"requiredFeatures": want, "requiredLimits": req,
                                                   "label": "webinfer"}))
    except Exception as e:
        raise GPUError(f"requestDevice failed: {e}") from e
    return adopt_device(adapter, device)


def adapter_fingerprint(adapter) -> str:
    """What identifies an adapter across visits (web/worker.js computes the same string before Python runs)."""
    info = adapter.info
    return "|".join(str(getattr(info, f, "") or "") for f in ("vendor", "architecture", "device", "description"))


def adopt_device(adapter, device, made_ahead=None, made_ahead_ready=None) -> "BrowserDevice":
    """A BrowserDevice over a JS GPUDevice requested elsewhere (request_device, or web/worker.js ahead of Python).
    Capabilities come from what the device was created with. made_ahead: a JS Map "entry\\0WGSL" -> pipeline,
    complete once the JS Promise made_ahead_ready resolves."""
    feats = set(device.features.keys())  # a JS Set: keys() iterates its values
    f16, sub, ts = "shader-f16" in feats, "subgroups" in feats, "timestamp-query" in feats
    info = adapter.info
    sg = 0
    if sub:
        sg = int(getattr(info, "subgroupMinSize", 0) or 0) or 4
    caps = Capabilities(f16=f16, subgroups=sub, subgroup_size=sg, timestamps=ts,
                        limits={k: int(getattr(device.limits, _camel(k))) for k in BROWSER_DEFAULT_LIMITS
                                if getattr(device.limits, _camel(k), None) is not None})
    name = " ".join(str(getattr(info, f, "") or "") for f in ("vendor", "architecture", "device", "description"))
    ainfo = AdapterInfo(name=" ".join(name.split()) or "unknown", backend="WebGPU (browser)",
                        adapter_type="", is_fallback=bool(getattr(info, "isFallbackAdapter", False)))
    dev = BrowserDevice(device, ainfo, caps, made_ahead)
    dev.made_ahead_ready = made_ahead_ready
    # how to request this device again (web/worker.js, next visit): the same features, every limit at the adapter's
    dev.request = {"adapter": adapter_fingerprint(adapter), "features": sorted(feats & {"shader-f16", "subgroups"}),
                   "limits": [_camel(k) for k in BROWSER_DEFAULT_LIMITS
                              if getattr(adapter.limits, _camel(k), None) is not None]}
    return dev


# A command list encoded by one JS call (BrowserDevice._submit): 6 words a command, handles by index into a table
# of the pipelines, bind groups and buffers the commands name. From Python the same encoding took one FFI call per
# setPipeline / setBindGroup / dispatchWorkgroups / copy (~500 a decode step) and Pyodide's loop around them: in the
# page, 1.3-1.4 ms of a SmolLM2 step's 2.9 ms of host time, before this (docs/performance.md).
_ENCODE_JS = """(enc, h, ops) => {
    let p = null;
    for (let i = 0; i < ops.length; i += 6) {
        const k = ops[i];
        if (k === 0) {
            if (p === null) p = enc.beginComputePass();
            p.setPipeline(h[ops[i + 1]]);
            p.setBindGroup(0, h[ops[i + 2]]);
            p.dispatchWorkgroups(ops[i + 3], ops[i + 4], ops[i + 5]);
            continue;
        }
        if (p !== null) { p.end(); p = null; }
        if (k === 1) enc.copyBufferToBuffer(h[ops[i + 1]], ops[i + 2], h[ops[i + 3]], ops[i + 4], ops[i + 5]);
        else if (ops[i + 3] < 0) enc.clearBuffer(h[ops[i + 1]], ops[i + 2]);
        else enc.clearBuffer(h[ops[i + 1]], ops[i + 2], ops[i + 3]);
    }
    if (p !== null) p.end();
}"""
_MAX_HANDLES = 4096  # the table is rebuilt past this (it grows only by objects new to it: a model's are a few hundred)


class BrowserDevice(Device):
    def __init__(self, device, info: AdapterInfo, caps: Capabilities, made_ahead=None):
        js, create_proxy, create_once_callable, _ = _js()
        self._js = js
        from pyodide.code import run_js  # noqa: PLC0415

        self._encode_js, self._to_js = run_js(_ENCODE_JS), _js()[3]
        self._handles = js.Array.new()
        self._handle_ids: dict[int, tuple[int, object]] = {}  # id(object) -> (index in _handles, the object)
        self.max_handles = _MAX_HANDLES  # (tests lower it: the rebuild then runs between every few lists)
        self.handle_rebuilds = 0
        self._create_proxy = create_proxy
        self.device = device
        self.queue = device.queue
        self.info = info
        self.caps = caps
        self._errors: list[str] = []
        self._lost_reason: str | None = None
        self._destroyed = False
        self._timing: dict[int, tuple] = {}
        # host time spent in the calls that dominate an engine build (reported by the page's load timings)
        # and in the calls of a step: encoding through the JS FFI + queue.submit, and waiting for a read-back (map
        # latency + the GPU's time), split out per token by the page's stats (browser_worker.chat)
        self.time_ms = {"create_buffer": 0.0, "write_buffer": 0.0, "create_pipeline": 0.0, "submit": 0.0,
                        "read_wait": 0.0, "read_calls": 0.0, "create_pipeline_async": 0.0}
        self.made_ahead = made_ahead   # JS Map "entry\0WGSL" -> pipeline created before Python ran (or None)
        self.created: list[dict] = []  # every pipeline asked for: {"code", "entry", "label"} (the page's record)
        self.made_ahead_hits = 0
        self.made_ahead_ready = None   # JS Promise: resolves when made_ahead is complete (awaited before a build)
        self.request: dict = {}

        def on_error(event):
            self._errors.append(str(event.error.message))

        def on_lost(lost_info):
            if not self._destroyed:
                self._lost_reason = f"{lost_info.reason}: {lost_info.message}"

        self._on_error = create_proxy(on_error)  # kept alive as long as the device
        device.addEventListener("uncapturederror", self._on_error)
        device.lost.then(create_once_callable(on_lost))

    # ----------------------------------------------------------------- state
    @property
    def lost(self) -> bool:
        return self._lost_reason is not None

    def _check(self) -> None:
        if self._lost_reason is not None:
            raise DeviceLostError(f"the GPU device was lost ({self._lost_reason}); the engine will be rebuilt")
        if self._errors:
            errs, self._errors = self._errors, []
            raise GPUError("WebGPU reported: " + " | ".join(errs[:5]) + (f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""))

    # ----------------------------------------------------------------- resources
    def create_buffer(self, size: int, usage: int, label: str = ""):
        t0 = time.perf_counter()
        buf = self.device.createBuffer(size=align(max(size, 4), 4), usage=usage, label=label)
        self.time_ms["create_buffer"] += (time.perf_counter() - t0) * 1e3
        return buf

    def write_buffer(self, buffer, offset: int, data) -> None:
        t0 = time.perf_counter()
        self._write_buffer(buffer, offset, data)
        self.time_ms["write_buffer"] += (time.perf_counter() - t0) * 1e3

    def _write_buffer(self, buffer, offset: int, data) -> None:
        mv = memoryview(data).cast("B")
        if len(mv) % 4:  # writeBuffer sizes must be multiples of 4
            mv = memoryview(bytes(mv) + b"\0" * (4 - len(mv) % 4))
        if not mv.contiguous:
            mv = memoryview(bytes(mv))
        px = self._create_proxy(mv)
        view = px.getBuffer("u8")
        try:
            self.queue.writeBuffer(buffer, offset, view.data)  # zero-copy view of the Python buffer
        finally:
            view.release()
            px.destroy()

    def create_pipeline(self, code: str, label: str = "", entry_point: str = "main"):
        t0 = time.perf_counter()
        self.created.append({"code": code, "entry": entry_point, "label": label})
        pipe = self.made_ahead.get(entry_point + "\0" + code) if self.made_ahead is not None else None
        if pipe is not None:
            self.made_ahead_hits += 1
        else:
            module = self.device.createShaderModule(code=code, label=label)
            pipe = self.device.createComputePipeline(
                _obj({"layout": "auto", "label": label, "compute": {"module": module, "entryPoint": entry_point}}))
        self.time_ms["create_pipeline"] += (time.perf_counter() - t0) * 1e3
        return pipe

    async def create_pipeline_async(self, code: str, label: str = "", entry_point: str = "main"):
        """createComputePipelineAsync: Chrome compiles it off its GPU process's main thread, so a chat's GPU work
        does not queue behind it (KernelLibrary.create_deferred, in the background after a build)."""
        t0 = time.perf_counter()
        self.created.append({"code": code, "entry": entry_point, "label": label})
        pipe = self.made_ahead.get(entry_point + "\0" + code) if self.made_ahead is not None else None
        if pipe is not None:
            self.made_ahead_hits += 1
            return pipe
        module = self.device.createShaderModule(code=code, label=label)
        try:
            pipe = await self.device.createComputePipelineAsync(
                _obj({"layout": "auto", "label": label, "compute": {"module": module, "entryPoint": entry_point}}))
        except Exception as e:
            raise GPUError(f"shader {label or '?'} failed to compile: {e}") from e
        self.time_ms["create_pipeline_async"] += (time.perf_counter() - t0) * 1e3
        return pipe

    def create_bind_group(self, pipeline, bindings, group: int = 0):
        entries = []
        for i, b in enumerate(bindings):
            if not isinstance(b, BufferBinding):
                b = BufferBinding(b)
            size = b.size if b.size is not None else int(b.buffer.size) - b.offset
            entries.append({"binding": i, "resource": {"buffer": b.buffer, "offset": b.offset, "size": size}})
        return self.device.createBindGroup(_obj({"layout": pipeline.getBindGroupLayout(group), "entries": entries}))

    def destroy_buffer(self, buffer) -> None:
        buffer.destroy()

    # ----------------------------------------------------------------- execution
    def submit(self, commands: Commands) -> None:
        t0 = time.perf_counter()
        try:
            self._submit(commands)
        finally:
            self.time_ms["submit"] += (time.perf_counter() - t0) * 1e3

    def _handle(self, obj) -> int:
        e = self._handle_ids.get(id(obj))
        if e is None or e[1] is not obj:
            e = (self._handles.push(obj) - 1, obj)
            self._handle_ids[id(obj)] = e
        return e[0]

    def _encode_words(self, commands: Commands):
        if len(self._handle_ids) + 3 * len(commands.ops) > self.max_handles:  # (never inside a list: its indices)
            self._handles, self._handle_ids = self._js.Array.new(), {}
            self.handle_rebuilds += 1
        h, words = self._handle, array("i")
        for op in commands.ops:
            kind = op[0]
            if kind == "dispatch":
                words.extend((0, h(op[1]), h(op[2]), op[3], op[4], op[5]))
            elif kind == "copy":
                words.extend((1, h(op[1]), op[2], h(op[3]), op[4], op[5]))
            elif kind == "clear":
                words.extend((2, h(op[1]), op[2], -1 if op[3] is None else op[3], 0, 0))
        return words

    def _submit(self, commands: Commands) -> None:
        if self._lost_reason is not None:
            raise DeviceLostError(f"the GPU device was lost ({self._lost_reason}); the engine will be rebuilt")
        enc = self.device.createCommandEncoder()
        if not commands.timed:  # (timed: a pass per dispatch with timestamps, benchmarks: record_passes below)
            words = self._to_js(self._encode_words(commands))  # first: it may start a new table
            self._encode_js(enc, self._handles, words)
            self.queue.submit(self._js.Array.of(enc.finish()))
            return
        qs = None
        if commands.timed and self.caps.timestamps:
            n = sum(1 for op in commands.ops if op[0] == "dispatch")
            qs = self.device.createQuerySet(type="timestamp", count=max(2 * n, 2))

        def begin_pass(qi):
            if qi is None:
                return enc.beginComputePass()
            return enc.beginComputePass(_obj({"timestampWrites": {
                "querySet": qs, "beginningOfPassWriteIndex": qi, "endOfPassWriteIndex": qi + 1}}))

        def dispatch(cpass, pipe, bg, x, y, z):
            cpass.setPipeline(pipe)
            cpass.setBindGroup(0, bg)
            cpass.dispatchWorkgroups(x, y, z)

        def clear(buf, off, size):
            if size is None:
                enc.clearBuffer(buf, off)
            else:
                enc.clearBuffer(buf, off, size)

        labels = record_passes(commands, qs is not None, begin_pass, dispatch,
                               lambda *a: enc.copyBufferToBuffer(*a), clear)
        qi = 2 * len(labels)
        if qs is not None:
            rb = self.device.createBuffer(size=align(8 * qi, 256), usage=_QUERY_RESOLVE | COPY_SRC)
            enc.resolveQuerySet(qs, 0, qi, rb, 0)
            self._timing[id(commands)] = (rb, labels, qi)
        self.queue.submit(self._js.Array.of(enc.finish()))

    async def read_buffer(self, buffer, offset: int = 0, size: int | None = None) -> bytes:
        size = int(buffer.size) - offset if size is None else size
        if size == 0:
            self._check()
            return b""
        t_all, waited = time.perf_counter(), 0.0
        o0 = offset - offset % 4  # copy ranges must be 4-byte aligned: widen, then slice
        n = align(offset + size - o0, 4)
        staging = self.device.createBuffer(size=n, usage=MAP_READ | COPY_DST, label="readback")
        try:
            enc = self.device.createCommandEncoder()
            enc.copyBufferToBuffer(buffer, o0, staging, 0, n)
            self.queue.submit(self._js.Array.of(enc.finish()))
            t0 = time.perf_counter()
            try:
                await staging.mapAsync(_MAP_MODE_READ)
            except Exception as e:
                self._check()
                raise GPUError(f"reading back {n} bytes failed: {e}") from e
            finally:
                waited = (time.perf_counter() - t0) * 1e3
                self.time_ms["read_wait"] += waited
            self._check()
            out = bytearray(n)
            self._js.Uint8Array.new(staging.getMappedRange()).assign_to(out)
            staging.unmap()
        finally:
            staging.destroy()
            # the read's own JS calls (staging buffer, copy, submit, map, copy out), apart from the wait for the map
            self.time_ms["read_calls"] += (time.perf_counter() - t_all) * 1e3 - waited
        return bytes(out[offset - o0: offset - o0 + size])

    async def read_timings(self, commands: Commands) -> list[tuple[str, float]]:
        entry = self._timing.pop(id(commands), None)
        if entry is None:
            return []
        rb, labels, n = entry
        import struct  # noqa: PLC0415

        raw = await self.read_buffer(rb, 0, 8 * n)
        ticks = struct.unpack(f"<{n}Q", raw)
        return [(lab, (ticks[2 * i + 1] - ticks[2 * i]) / 1e6) for i, lab in enumerate(labels)]

    async def wait_idle(self) -> None:
        await self.queue.onSubmittedWorkDone()
        self._check()

    def destroy(self) -> None:
        self._destroyed = True
        try:
            self.device.destroy()
        except Exception:
            pass


__all__ = ["BrowserDevice", "adopt_device", "adapter_fingerprint", "request_device"]
