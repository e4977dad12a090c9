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


async def build_engine(timings: dict | None = None, context_tokens: int = 2048) -> Any:
    """(Re)build the engine for the loaded package on a live device (after a device loss too)."""
    from .chat_template import render  # noqa: PLC0415, F401  (fail early if the runtime lacks it)
    from .engine.gpu_model import GPUModel  # noqa: PLC0415
    from .tokenizer import Tokenizer  # noqa: PLC0415

    pkg = _state["package"]
    if pkg is None:
        raise WebinferError("no model is loaded")
    dev = await get_device()
    t0 = time.perf_counter()
    ctx = min(context_tokens, pkg.config.max_position_embeddings)
    with _Timed(dev, ("write_buffer", "create_pipeline", "create_buffer")) as tm:
        runner = await GPUModel.load(dev, pkg, num_blocks=blocks_for(pkg.config, ctx, 16), block_size=16,
                                     max_batch_tokens=64, max_seqs=1, max_model_len=ctx)
    await dev.wait_idle()  # uploads done and pipelines usable: an honest end of "GPU upload"
    t1 = time.perf_counter()
    if _state.get("tokenizer") is None:
        _state["tokenizer"] = Tokenizer.from_json(pkg.tokenizer_json())
    _state["engine"] = runner
    if timings is not None:
        timings.update({"engine_build_ms": (t1 - t0) * 1e3, "gpu_upload_ms": tm.ms["write_buffer"],
                        "pipeline_create_ms": tm.ms["create_pipeline"], "buffer_create_ms": tm.ms["create_buffer"],
                        "tokenizer_ms": (time.perf_counter() - t1) * 1e3})
    return runner


def prompt_ids(req: dict) -> list[int]:
    """Token ids of a request: `prompt_ids` as given, or the messages through the package's chat template."""
    if req.get("prompt_ids"):
        return [int(i) for i in req["prompt_ids"]]
    from .chat_template import render  # noqa: PLC0415

    pkg, tok = _state["package"], _state["tokenizer"]
    messages = req.get("messages") or []
    st = pkg.special_tokens
    if pkg.chat_template:
        text = render(pkg.chat_template, messages, add_generation_prompt=True,
                      bos_token=st.get("bos_token") or "", eos_token=st.get("eos_token") or "")
    else:
        text = "\n".join(str(m.get("content", "")) for m in messages)
    return list(tok.encode(text, add_special_tokens=False))


async def chat(request_json: str, emit: Callable[[str], None], should_stop: Callable[[], bool]) -> dict:
    """Stream an OpenAI-shaped chat completion: emit(chunk_json) per token; returns timing stats.

    One sequence at a time (the worker serves one page); greedy unless temperature > 0. Every chunk also carries
    the sampled `token_ids` (an extension, as vLLM does) so tests can compare ids with the native engine."""
    from .engine.batch import SeqChunk, StepBatch  # noqa: PLC0415

    req = json.loads(request_json)
    t_start = time.perf_counter()
    if _state["engine"] is None or _state["device"] is None or _state["device"].lost:
        await build_engine()  # first message after a device loss: rebuild
    runner, tok, pkg = _state["engine"], _state["tokenizer"], _state["package"]
    ids = prompt_ids(req)
    max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 256)
    if len(ids) + max_tokens > runner.max_model_len:
        max_tokens = max(1, runner.max_model_len - len(ids))
    if len(ids) >= runner.max_model_len:
        from .errors import ContextOverflowError  # noqa: PLC0415

        raise ContextOverflowError(len(ids), runner.max_model_len)
    temp, top_p = float(req.get("temperature") or 0.0), float(req.get("top_p") or 1.0)
    top_k, seed = int(req.get("top_k") or 0), int(req.get("seed") or 0)
    eos = set(pkg.config.eos_token_ids)
    table = list(range(1, runner.num_blocks))
    out: list[int] = []
    cid = f"chatcmpl-{int(t_start * 1e6):x}"
    created, model = int(time.time()), pkg.name
    dec = tok.decode_stream(skip_special_tokens=True)

    def chunk(delta: dict, finish=None, token_ids=None, usage=None):
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if token_ids is not None:
            c["choices"][0]["token_ids"] = token_ids
        if usage is not None:
            c["usage"] = usage
        emit(json.dumps(c))

    def step(tokens, start, sample=True):
        return StepBatch([SeqChunk(0, list(tokens), start, table, sample, temp, top_p, top_k, seed, len(out))])

    chunk({"role": "assistant", "content": ""})
    host_s = 0.0
    t_first = None
    enc_t, sub_t = _Timed(runner, ("encode_step",)), _Timed(_state["device"], ("submit",))
    try:
        pos = 0
        while pos < len(ids):
            part = ids[pos: pos + runner.max_tokens]
            res = await runner.execute(step(part, pos, pos + len(part) == len(ids)))
            pos += len(part)
        t_first = time.perf_counter()
        enc_t.__enter__()
        sub_t.__enter__()
        finish = "length"
        tokn = res[0]
        while True:
            out.append(tokn)
            if tokn in eos:
                finish = "stop"
                break
            chunk({"content": dec.add(tokn)}, token_ids=[tokn])
            if len(out) >= max_tokens:
                break
            if should_stop():
                finish = "stop"
                break
            h0 = time.perf_counter()
            batch = step([tokn], len(ids) + len(out) - 1)
            res = await runner.execute(batch)
            host_s += time.perf_counter() - h0
            tokn = res[0]
        tail = dec.finish()
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out),
                 "total_tokens": len(ids) + len(out)}
        chunk({"content": tail} if tail else {}, finish=finish, usage=usage)
    except DeviceLostError:
        _state["engine"] = None
        raise
    finally:
        if t_first is not None:
            enc_t.__exit__()
            sub_t.__exit__()
    t_end = time.perf_counter()
    n_dec = max(0, len(out) - 1)
    host_ms = (enc_t.ms["encode_step"] + sub_t.ms["submit"]) / n_dec if n_dec else 0.0
    return {"ttft_ms": (t_first - t_start) * 1e3, "completion_tokens": len(out), "prompt_tokens": len(ids),
            "decode_tok_s": n_dec / (t_end - t_first) if n_dec and t_end > t_first else 0.0,
            "step_ms": host_s * 1e3 / n_dec if n_dec else 0.0, "host_ms_per_token": host_ms, "token_ids": out}
