"""The GPU interface that everything above it (kernels, model graph, engine) is written against.

Two implementations: `native.py` (wgpu-py, CPython) and `browser.py` (the browser's WebGPU through Pyodide's JS FFI).
The interface is async-first because a browser cannot block on a promise: the only operation that waits for the
GPU, `read_buffer`, is a coroutine. Everything else only records or enqueues work and returns at once.

Work is recorded into a `Commands` list (plain Python tuples) and encoded by the backend at `submit`, so that one
engine step is one command buffer and one queue submit, whatever the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

# GPUBufferUsage bit values: identical in WebGPU (JS) and wgpu-native.
MAP_READ = 0x0001
COPY_SRC = 0x0004
COPY_DST = 0x0008
UNIFORM = 0x0040
STORAGE = 0x0080

# What a browser gives a device that asks for nothing (WebGPU spec defaults). Tests run the native device with
# these so nothing passes natively that would fail in a browser.
BROWSER_DEFAULT_LIMITS = {
    "max_storage_buffer_binding_size": 128 << 20,
    "max_buffer_size": 256 << 20,
    "max_storage_buffers_per_shader_stage": 8,
    "max_compute_workgroup_storage_size": 16384,
    "max_compute_invocations_per_workgroup": 256,
    "max_compute_workgroup_size_x": 256,
    "max_compute_workgroup_size_y": 256,
    "max_compute_workgroup_size_z": 64,
    "max_compute_workgroups_per_dimension": 65535,
    "max_uniform_buffer_binding_size": 65536,
    "min_storage_buffer_offset_alignment": 256,
    "min_uniform_buffer_offset_alignment": 256,
    "max_bind_groups": 4,
}


@dataclass(frozen=True)
class AdapterInfo:
    name: str  # e.g. "llvmpipe (LLVM 15.0.6, 256 bits)" or "SwiftShader Device (Subzero)"
    backend: str  # "Vulkan", "Metal", "D3D12", "WebGPU (browser)"...
    adapter_type: str = ""  # "CPU", "DiscreteGPU", ... ("" when the browser does not say)
    is_fallback: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What the device was created with (not merely what the adapter could offer)."""

    f16: bool  # shader-f16 enabled (and not forced off by WEBINFER_FORCE_F32=1)
    subgroups: bool  # subgroup operations enabled
    subgroup_size: int  # smallest subgroup size the adapter reports (0 if unknown)
    timestamps: bool  # timestamp queries enabled (benchmarks only)
    limits: dict[str, int] = field(default_factory=dict)  # snake_case names as in BROWSER_DEFAULT_LIMITS

    def variant_key(self) -> tuple:
        return ("f16" if self.f16 else "f32", f"sg{self.subgroup_size}" if self.subgroups else "nosg")

    @property
    def max_binding_bytes(self) -> int:
        """The largest storage binding this device accepts: the one place kernels and the model read it from."""
        return int(self.limits.get("max_storage_buffer_binding_size",
                                   BROWSER_DEFAULT_LIMITS["max_storage_buffer_binding_size"]))


@dataclass(frozen=True)
class BufferBinding:
    """A byte range of a buffer bound to one binding slot. size None = to the end of the buffer."""

    buffer: Any
    offset: int = 0
    size: int | None = None


class Commands:
    """A recorded list of GPU commands; the backend encodes it into one command buffer at submit."""

    __slots__ = ("ops", "timed")

    def __init__(self, timed: bool | str = False):
        self.ops: list[tuple] = []
        # benchmarks: True = one timestamped pass per dispatch (per-kernel times); "span" = the passes as usual,
        # each timestamped (the GPU time of the whole list, from its first pass's start to its last pass's end)
        self.timed = timed

    def dispatch(self, pipeline: Any, bind_group: Any, x: int, y: int = 1, z: int = 1, label: str = "") -> None:
        self.ops.append(("dispatch", pipeline, bind_group, x, y, z, label))

    def copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, size: int) -> None:
        self.ops.append(("copy", src, src_offset, dst, dst_offset, size))

    def clear(self, buffer: Any, offset: int = 0, size: int | None = None) -> None:
        self.ops.append(("clear", buffer, offset, size))

    def __len__(self) -> int:
        return len(self.ops)


class Device(ABC):
    """One GPU device. Handles (buffers, pipelines, bind groups) are the backend's own objects."""

    info: AdapterInfo
    caps: Capabilities

    @abstractmethod
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any: ...

    @abstractmethod
    def write_buffer(self, buffer: Any, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Queue a host-to-GPU copy; data may be reused by the caller as soon as this returns."""

    @abstractmethod
    def create_pipeline(self, code: str, label: str = "", entry_point: str = "main") -> Any:
        """Compile a compute pipeline with an automatic layout; raises GPUError with the compiler's message."""

    async def create_pipeline_async(self, code: str, label: str = "", entry_point: str = "main") -> Any:
        """create_pipeline without holding up other GPU work (the browser compiles it off its GPU process's main
        thread); here the same as create_pipeline."""
        return self.create_pipeline(code, label, entry_point)

    @abstractmethod
    def create_bind_group(self, pipeline: Any, bindings: list[BufferBinding | Any], group: int = 0) -> Any:
        """Bind group for `pipeline`'s group `group`: bindings[i] goes to @binding(i). A bare buffer binds whole."""

    def commands(self, timed: bool | str = False) -> Commands:
        return Commands(timed=timed)

    @abstractmethod
    def submit(self, commands: Commands) -> None:
        """Encode and submit: one command buffer, one queue submit."""

    @abstractmethod
    async def read_buffer(self, buffer: Any, offset: int = 0, size: int | None = None) -> bytes:
        """Wait for queued work, then copy `size` bytes at `offset` back to the host (via a staging buffer)."""

    async def read_timings(self, commands: Commands) -> list[tuple[str, float]]:
        """(label, milliseconds) per dispatch of a submitted timed command list; [] if unsupported."""
        return []

    async def read_span_ms(self, commands: Commands) -> float | None:
        """GPU milliseconds from the first pass's start to the last pass's end of a submitted timed="span" list
        (None if unsupported). It never exceeds the wall time around the submit and the read-back."""
        return None

    def destroy_buffer(self, buffer: Any) -> None:
        buffer.destroy()

    def destroy(self) -> None:
        """Release the device (intentional: not reported as a device loss)."""

    @property
    def lost(self) -> bool:
        return False

    def wgsl_enables(self, f16: bool, subgroups: bool) -> str:
        """The `enable` directives a shader needs on this backend (naga rejects `enable subgroups;`, Chrome needs it)."""
        out = []
        if f16:
            out.append("enable f16;")
        if subgroups:
            out.append("enable subgroups;")
        return "\n".join(out) + ("\n" if out else "")


def record_passes(commands: Commands, timed: bool, begin_pass, dispatch, copy, clear) -> list[str]:
    """Walk a command list into compute passes, the one grouping rule both backends share (the browser encodes its
    untimed lists by the same rule in JS: browser.py _ENCODE_JS): consecutive dispatches share one pass; a copy or
    clear ends it; with `timed` True, every dispatch gets its own pass whose timestamps go
    to query slots 2i and 2i+1; with "span", every pass is timestamped (label "pass"). The backend supplies the calls: begin_pass(query_index | None) -> pass (with .end()),
    dispatch(pass, pipeline, bind_group, x, y, z), copy(src, src_offset, dst, dst_offset, size),
    clear(buffer, offset, size). Returns the labels of the timed dispatches, in query order."""
    labels: list[str] = []
    cpass = None
    span = timed == "span"
    for op in commands.ops:
        kind = op[0]
        if kind == "dispatch":
            _, pipe, bg, x, y, z, label = op
            if timed and not span:
                cpass = begin_pass(2 * len(labels))
                labels.append(label)
            elif cpass is None:
                cpass = begin_pass(2 * len(labels) if span else None)
                if span:
                    labels.append("pass")
            dispatch(cpass, pipe, bg, x, y, z)
            if timed and not span:
                cpass.end()
                cpass = None
        else:
            if cpass is not None:
                cpass.end()
                cpass = None
            if kind == "copy":
                copy(*op[1:])
            elif kind == "clear":
                clear(*op[1:])
    if cpass is not None:
        cpass.end()
    return labels


def align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a
