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


async def load(manifest_text: str, js_files, where: str = "manifest.json") -> dict:
    """Take the files over from JS (a Map name -> Uint8Array), open the package and build the engine."""
    t0 = time.perf_counter()
    files = {}
    for name in list(js_files.keys()):
        files[str(name)] = js_files.get(name).to_bytes()  # one copy into the Python heap
    t_copy = time.perf_counter()
    pkg = open_package(manifest_text, files, where)
    _state["package"], _state["files"] = pkg, files
    dev = await get_device()
    timings = {"handover_ms": (t_copy - t0) * 1e3}
    info = {"name": pkg.name, "device": device_summary(dev), "engine": False, "timings": timings}
    try:
        await build_engine(timings)
        info["engine"] = True
    except ImportError as e:  # the engine modules have not landed in this build
        info["engine_missing"] = str(e)
    _state["timings"] = timings
    return info


async def build_engine(timings: dict | None = None) -> Any:
    """(Re)build the engine for the loaded package on a live device (after a device loss too)."""
    from .engine import gpu_model  # noqa: PLC0415

    pkg = _state["package"]
    if pkg is None:
        raise WebinferError("no model is loaded")
    dev = await get_device()
    t0 = time.perf_counter()
    runner = gpu_model.GPUModel.load(dev, pkg)
    if hasattr(runner, "__await__"):
        runner = await runner
    _state["engine"] = runner
    if timings is not None:
        timings["engine_build_ms"] = (time.perf_counter() - t0) * 1e3
    return runner


async def chat(request_json: str, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> dict:
    """Stream an OpenAI-shaped chat completion: emit(chunk_json) per chunk; returns timing stats."""
    req = json.loads(request_json)
    if _state["engine"] is None or _state["device"] is None or _state["device"].lost:
        await build_engine()  # first message after a device loss: rebuild
    from . import api  # noqa: PLC0415

    t0 = time.perf_counter()
    first = None
    n = 0
    try:
        stream = api.create_chat_completion_stream(_state["engine"], _state["package"], **req)
        async for chunk in stream:
            if first is None:
                first = time.perf_counter()
            n += 1
            emit(json.dumps(chunk))
            if should_stop():
                await stream.aclose()
                break
    except DeviceLostError:
        _state["engine"] = None
        raise
    t1 = time.perf_counter()
    ttft = ((first or t1) - t0) * 1e3
    decode_s = t1 - (first or t1)
    return {"ttft_ms": ttft, "chunks": n, "decode_tok_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0}
