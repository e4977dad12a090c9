"""Native WebGPU through wgpu-py (Vulkan/Metal/D3D12; Mesa lavapipe in CI). CPython only.

The native side may block, so the coroutines here just call wgpu-py's synchronous functions; `request_device_sync`
exists for the CLI and tests.
"""

from __future__ import annotations

import asyncio
import os
import struct

from ..errors import GPUError, NoAdapterError
from .device import (
    BROWSER_DEFAULT_LIMITS,
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


def _wgpu():
    try:
        import wgpu  # noqa: PLC0415  (only the native backend needs it)
    except ImportError as e:  # pragma: no cover
        raise NoAdapterError("wgpu-py is not installed: pip install wgpu==0.32.0") from e
    return wgpu


def _raw_calls():
    """(dispatch, copy) straight through wgpu-native's C functions, or None: dispatch(pass, pipeline, bind_group, x,
    y, z) and copy(encoder, src, src_offset, dst, dst_offset, size).

    Why: a decode step records ~150-190 dispatches, 3 calls each, and its inputs' copies, and wgpu-py wraps every
    call in an error-capture proxy (~2-3 us a call here: ~1 ms a SmolLM2 step, which a real GPU's step of a
    millisecond cannot hide). An encoder's validation errors are deferred to its finish() in WebGPU, which still goes
    through wgpu-py and raises there, so skipping the proxy for these calls loses no error. It reaches into
    wgpu-py's private `_api` (cffi `lib`, `ffi`, objects' `_internal`) of the pinned 0.32.0; without them, None: the
    public calls are used (tests/gpu/test_recorded_steps.py checks that the pinned version has them)."""
    try:
        from wgpu.backends.wgpu_native import _api  # noqa: PLC0415
        lib, null = _api.lib, _api.ffi.NULL
        set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        dispatch_workgroups = lib.wgpuComputePassEncoderDispatchWorkgroups
        copy_buffer = lib.wgpuCommandEncoderCopyBufferToBuffer
    except (ImportError, AttributeError):  # pragma: no cover  (another wgpu-py)
        return None

    def dispatch(cpass, pipe, bg, x, y, z):
        c = cpass._internal
        set_pipeline(c, pipe._internal)
        set_bind_group(c, 0, bg._internal, 0, null)
        dispatch_workgroups(c, x, y, z)

    def copy(enc, src, src_offset, dst, dst_offset, size):
        copy_buffer(enc._internal, src._internal, src_offset, dst._internal, dst_offset, size)

    return dispatch, copy


def _force_f32() -> bool:
    return os.environ.get("WEBINFER_FORCE_F32", "") not in ("", "0")


def _no_subgroups() -> bool:
    return os.environ.get("WEBINFER_DISABLE_SUBGROUPS", "") not in ("", "0")


def request_adapter_sync():
    wgpu = _wgpu()
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # lavapipe prints a harmless warning without it
        d = "/tmp/webinfer-xdg"
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = d
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu raises a plain RuntimeError
        raise NoAdapterError(f"no WebGPU adapter found ({e}); on Debian: apt-get install mesa-vulkan-drivers libvulkan1") from e
    if adapter is None:
        raise NoAdapterError("no WebGPU adapter found; on Debian: apt-get install mesa-vulkan-drivers libvulkan1")
    return adapter


def request_device_sync(*, limits: str = "browser", timestamps: bool = False) -> "NativeDevice":
    """limits="browser": the WebGPU defaults a browser gives (tests, and the honest default);
    "adapter": the adapter's maxima (only where the runtime has a reason to use them)."""
    wgpu = _wgpu()
    adapter = request_adapter_sync()
    feats = set(adapter.features)
    want = []
    f16 = "shader-f16" in feats and not _force_f32()
    if f16:
        want.append("shader-f16")
    sub = "subgroup" in feats and not _no_subgroups()
    if sub:
        want.append("subgroup")  # wgpu-native's name; "subgroups" silently enables nothing in wgpu 0.32
    ts = timestamps and "timestamp-query" in feats
    if ts:
        want.append("timestamp-query")
        if "timestamp-query-inside-passes" in feats:
            want.append("timestamp-query-inside-passes")
    alim = adapter.limits
    if limits == "browser":
        req = {}
        for k, v in BROWSER_DEFAULT_LIMITS.items():
            a = alim.get(k.replace("_", "-"), v)
            # alignments are "better" when smaller: never ask for less than the browser guarantees
            req[k.replace("_", "-")] = max(v, a) if k.startswith("min_") else min(v, a)
    elif limits == "adapter":
        req = {k.replace("_", "-"): alim[k.replace("_", "-")] for k in BROWSER_DEFAULT_LIMITS if k.replace("_", "-") in alim}
    else:
        raise ValueError(f"limits must be 'browser' or 'adapter', not {limits!r}")
    try:
        dev = adapter.request_device_sync(required_features=want, required_limits=req)
    except Exception as e:
        raise GPUError(f"requestDevice failed: {e}") from e
    info = adapter.info
    # the smallest subgroup the adapter runs (wgpu-py 0.32 names it stackgroup_min_size), as a browser reports
    # subgroupMinSize: the kernels need at least SG_SIZE lanes (their SG_SIZE 4 path runs on any size). llvmpipe
    # reports 4 but runs its 8 invocations of a SIMD batch as one subgroup: 8 there, as CI has always measured.
    sg_size = int(info.get("subgroup_min_size") or info.get("stackgroup_min_size") or 0) if sub else 0
    if sub and "llvmpipe" in str(info.get("device", "")):
        sg_size = 8
    elif sub and not sg_size:
        sg_size = 4
    caps = Capabilities(
        f16=f16,
        subgroups=sub,
        subgroup_size=sg_size,
        timestamps=ts,
        limits={k: int(dev.limits[k.replace("_", "-")]) for k in BROWSER_DEFAULT_LIMITS if k.replace("_", "-") in dev.limits},
    )
    ainfo = AdapterInfo(
        name=str(info.get("device", "") or info.get("description", "")),
        backend=str(info.get("backend_type", "")),
        adapter_type=str(info.get("adapter_type", "")),
        is_fallback=str(info.get("adapter_type", "")) == "CPU",
    )
    return NativeDevice(wgpu, dev, ainfo, caps)


async def request_device(**kw) -> "NativeDevice":
    return request_device_sync(**kw)


class NativeDevice(Device):
    def __init__(self, wgpu, device, info: AdapterInfo, caps: Capabilities):
        self._wgpu = wgpu
        self.device = device
        self.queue = device.queue
        self.info = info
        self.caps = caps
        self._timing: dict[int, tuple] = {}
        self._raw = _raw_calls()

    # ----------------------------------------------------------------- resources
    def create_buffer(self, size: int, usage: int, label: str = ""):
        try:
            return self.device.create_buffer(size=align(max(size, 4), 4), usage=usage, label=label)
        except Exception as e:
            raise GPUError(f"create_buffer({label or '?'}, {size} bytes): {e}") from e

    def write_buffer(self, buffer, offset: int, data) -> None:
        mv = memoryview(data).cast("B")
        if len(mv) % 4:  # WebGPU requires 4-byte multiples
            mv = memoryview(bytes(mv) + b"\0" * (4 - len(mv) % 4))
        self.queue.write_buffer(buffer, offset, mv)

    def create_pipeline(self, code: str, label: str = "", entry_point: str = "main"):
        try:
            module = self.device.create_shader_module(code=code, label=label)
            return self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry_point}, label=label
            )
        except Exception as e:
            raise GPUError(f"shader {label or '?'} failed to compile: {e}") from e

    def create_bind_group(self, pipeline, bindings, group: int = 0):
        entries = []
        for i, b in enumerate(bindings):
            if not isinstance(b, BufferBinding):
                b = BufferBinding(b)
            size = b.size if b.size is not None else b.buffer.size - b.offset
            entries.append({"binding": i, "resource": {"buffer": b.buffer, "offset": b.offset, "size": size}})
        try:
            return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(group), entries=entries)
        except Exception as e:
            raise GPUError(f"create_bind_group: {e}") from e

    # ----------------------------------------------------------------- execution
    def submit(self, commands: Commands) -> None:
        enc = self.device.create_command_encoder()
        qs = None
        if commands.timed and self.caps.timestamps:
            n = sum(1 for op in commands.ops if op[0] == "dispatch")
            qs = self.device.create_query_set(type="timestamp", count=max(2 * n, 2))

        def begin_pass(qi):
            if qi is None:
                return enc.begin_compute_pass()
            return enc.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": qi, "end_of_pass_write_index": qi + 1})

        def dispatch(cpass, pipe, bg, x, y, z):
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, bg)
            cpass.dispatch_workgroups(x, y, z)

        if self._raw is not None:
            dispatch, raw_copy = self._raw[0], self._raw[1]
            copy = lambda *a: raw_copy(enc, *a)  # noqa: E731
        else:
            copy = enc.copy_buffer_to_buffer
        labels = record_passes(commands, qs is not None, begin_pass, dispatch, copy, enc.clear_buffer)
        qi = 2 * len(labels)
        if qs is not None:
            rb = self.device.create_buffer(size=align(16 * qi, 256), usage=_QUERY_RESOLVE | COPY_SRC)
            enc.resolve_query_set(qs, 0, qi, rb, 0)
            self._timing[id(commands)] = (rb, labels, qi)
        self.queue.submit([enc.finish()])

    async def read_buffer(self, buffer, offset: int = 0, size: int | None = None) -> bytes:
        # The wait for the GPU happens in a worker thread so that an event loop (the HTTP server) keeps serving
        # while a step runs. Safe: the engine issues GPU work from one coroutine at a time.
        return await asyncio.to_thread(self.read_buffer_sync, buffer, offset, size)

    def read_buffer_sync(self, buffer, offset: int = 0, size: int | None = None) -> bytes:
        size = buffer.size - offset if size is None else size
        if size == 0:
            return b""
        # copy ranges must be 4-byte aligned: widen, then slice
        o0 = offset - offset % 4
        n = align(offset + size - o0, 4)
        if buffer.usage & MAP_READ:
            buffer.map_sync(self._wgpu.MapMode.READ, o0, n)
            data = bytes(buffer.read_mapped(o0, n))
            buffer.unmap()
        else:
            data = bytes(self.queue.read_buffer(buffer, o0, n))
        return data[offset - o0 : offset - o0 + size]

    async def read_timings(self, commands: Commands) -> list[tuple[str, float]]:
        entry = self._timing.pop(id(commands), None)
        if entry is None:
            return []
        rb, labels, n = entry
        raw = self.read_buffer_sync(rb, 0, 8 * n)
        ticks = struct.unpack(f"<{n}Q", raw)
        period_ns = 1.0  # wgpu-native resolves timestamps to nanoseconds
        return [(lab, (ticks[2 * i + 1] - ticks[2 * i]) * period_ns / 1e6) for i, lab in enumerate(labels)]

    async def read_span_ms(self, commands: Commands) -> float | None:
        entry = self._timing.pop(id(commands), None)
        if entry is None:
            return None
        rb, _, n = entry
        ticks = struct.unpack(f"<{n}Q", self.read_buffer_sync(rb, 0, 8 * n))
        return (ticks[n - 1] - ticks[0]) / 1e6

    def wgsl_enables(self, f16: bool, subgroups: bool) -> str:
        # naga enables subgroup ops from the device feature alone and rejects `enable subgroups;`
        return "enable f16;\n" if f16 else ""

    def destroy(self) -> None:
        try:
            self.device.destroy()
        except Exception:
            pass
