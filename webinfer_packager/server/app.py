"""HTTP server (CPython only): the OpenAI-shaped API over FastAPI, metrics, and an optional static site.

    /v1/chat/completions, /v1/completions   plain JSON, or SSE with `data: [DONE]` when "stream": true
    /v1/models, /health, /metrics (Prometheus text)
    /...                                    files of the --site folder, when given

Who may ask. It listens on 127.0.0.1 by default and answers only requests whose Host header is, strictly parsed,
an allowed name (a web page elsewhere could otherwise reach it through DNS rebinding). A request carrying an
`Origin` must come from the same origin or one of `allowed_origins` (exact, or fnmatch patterns such as
`chrome-extension://*`, like OLLAMA_ORIGINS); only those get CORS headers, and API POSTs must be
`Content-Type: application/json`, so a cross-site "simple request" (text/plain) is never executed. With an
`api_key`, /v1/* and /metrics need `Authorization: Bearer <key>` (required when binding beyond loopback).

Bounded resources. The body is counted as it arrives, whatever the headers say (Content-Length and
Transfer-Encoding together are refused): over the cap gives 413, a body that takes longer than `body_timeout_s`
408. At most `max_waiting` requests wait for the engine (prompt preparation plus the scheduler's queue); more get
503 with Retry-After. Chat templates and tokenization run in a worker thread, not on the event loop, under the
template bounds (webinfer.chat_template). A client that disconnects aborts its request at once, streaming or not
(its KV blocks are freed before the next step). /health answers 503 when the engine loop has died.

Plain errors. Bad fields get 400 naming the limit; a prompt longer than the context gets 400 with both lengths;
invalid JSON, JSON nested deeper than MAX_JSON_DEPTH and strings with lone surrogates get 400; over-long URLs 414;
an unexpected exception 500 without internals (the traceback goes to the server log).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hmac
import json
import logging
import mimetypes
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse

from webinfer.api import LLM
from webinfer.engine.engine import EngineStepError
from webinfer.errors import ChatTemplateError, ContextOverflowError, InvalidRequestError, ServerBusyError, WebinferError

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 1 << 20
BODY_TIMEOUT_S = 30.0     # the whole body must arrive within this (a slow sender holds a connection otherwise)
MAX_WAITING = 64          # requests preparing or queued for the engine; more get 503
RETRY_AFTER_S = 2
MAX_URL_CHARS = 2048
MAX_JSON_DEPTH = 32
GRACEFUL_SHUTDOWN_S = 5   # after SIGTERM, open streams get this long before the server stops anyway
API_PREFIXES = ("/v1/", "/metrics")
log = logging.getLogger("webinfer.server")
# Host: a name or an IPv4 address, or a bracketed IPv6 address, then an optional numeric port; nothing else
_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?))"
                   r"(?::(?P<port>[0-9]{1,5}))?$")

MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".whl": "application/zip", ".wgsl": "text/wgsl", ".html": "text/html",
        ".css": "text/css", ".bin": "application/octet-stream", ".zip": "application/zip", ".svg": "image/svg+xml",
        ".txt": "text/plain", ".map": "application/json", ".ico": "image/x-icon", ".png": "image/png"}
# content-addressed names (a 64-hex sha256 anywhere, or a "name.<8+ hex>.ext" / "name-<8+ hex>.ext" suffix)
HASHED = re.compile(r"(^|[^0-9a-f])[0-9a-f]{64}([^0-9a-f]|$)|[.-][0-9a-f]{8,}\.[A-Za-z0-9]+$")
IMMUTABLE = "public, max-age=31536000, immutable"
# The site's pages cross-origin isolated (crossOriginIsolated, SharedArrayBuffer): what the CPU engine needs to share
# its wasm memory between Workers (docs/cpu-backend.md). require-corp blocks nothing the site loads: its own files
# are same-origin, and a model on another origin is fetched with CORS, which that origin must allow anyway.
CROSS_ORIGIN_ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status,
                        headers=headers)


def origin_allowed(origin: str, host: str, scheme: str, allowed_origins) -> bool:
    """Same origin as the request's Host, or matching one of allowed_origins (exact or an fnmatch pattern)."""
    if origin == f"{scheme}://{host}":
        return True
    return any(origin == o or ("*" in o and fnmatch.fnmatchcase(origin, o)) for o in allowed_origins)


class GuardMiddleware:
    """Host, URL length, Origin/CORS, API key, Content-Type and the body (counted as received, with a deadline),
    as plain ASGI so nothing reads a body before the checks."""

    def __init__(self, app, allowed_hosts, max_body_bytes: int, allowed_origins=(), api_key: str | None = None,
                 body_timeout_s: float = BODY_TIMEOUT_S):
        self.app, self.allowed, self.max_body = app, {h.lower() for h in allowed_hosts}, max_body_bytes
        self.origins, self.api_key, self.body_timeout = tuple(allowed_origins), api_key, body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        reply = None
        try:
            reply, cors = self._check(scope)
        except _Reject as r:
            return await r.response()(scope, receive, send)
        if reply is not None:
            return await reply(scope, receive, send)
        if cors:
            send = _with_headers(send, cors)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await self._read_body(receive)
            except _Reject as r:
                return await r.response()(scope, receive, send)
            if body is None:
                return  # the client left
            sent = False

            async def replay():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: the disconnect, for the app to notice
            return await self.app(scope, replay, send)
        return await self.app(scope, receive, send)

    def _check(self, scope):
        """(response to send instead of the app or None, CORS headers to add). Raises _Reject."""
        headers: dict[str, list[str]] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.decode("latin-1").lower(), []).append(v.decode("latin-1"))
        hosts = headers.get("host", [])
        if len(hosts) != 1:
            raise _Reject(400, f"expected one Host header, got {len(hosts)}", "host")
        host = hosts[0]
        m = _HOST.match(host)
        name = (m.group("v6") or m.group("name")).lower() if m else None
        if name not in self.allowed or (m.group("port") and int(m.group("port")) > 65535):
            raise _Reject(403, f"Host {host[:100]!r} is not allowed (allowed: {sorted(self.allowed)})", "host")
        raw = scope.get("raw_path") or scope["path"].encode()
        if len(raw) + len(scope.get("query_string", b"")) > MAX_URL_CHARS:
            raise _Reject(414, f"the URL is longer than {MAX_URL_CHARS} characters", "url")
        path = scope["path"]
        api = path.startswith(API_PREFIXES)
        cors = []
        origins = headers.get("origin", [])
        if origins:
            origin = origins[0]
            if len(origins) > 1 or not origin_allowed(origin, host, scope.get("scheme", "http"), self.origins):
                raise _Reject(403, f"Origin {origin[:100]!r} is not allowed; start the server with "
                              "--allow-origin (or WEBINFER_ORIGINS) to allow it", "origin")
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                return PlainTextResponse("", 204, headers={
                    "Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Max-Age": "600",
                    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type"}), []
        if self.api_key is not None and api:
            auth = headers.get("authorization", [""])[0]
            given = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.api_key.encode()):
                raise _Reject(401, "missing or wrong API key (send Authorization: Bearer <key>)", "authorization",
                              {"WWW-Authenticate": "Bearer"})
        if scope["method"] in ("POST", "PUT", "PATCH"):
            if "content-length" in headers and "transfer-encoding" in headers:
                raise _Reject(400, "a request may not carry both Content-Length and Transfer-Encoding", "body")
            cl = headers.get("content-length")
            if cl is not None:
                if len(cl) != 1 or not cl[0].isdigit() or len(cl[0]) > 18:
                    raise _Reject(400, "bad Content-Length", "content-length")
                if int(cl[0]) > self.max_body:
                    raise _Reject(413, f"request body of {cl[0]} bytes is over the limit of {self.max_body} bytes",
                                  "body")
            if api:
                ctype = headers.get("content-type", [""])[0].split(";", 1)[0].strip().lower()
                if ctype != "application/json":
                    raise _Reject(415, f"Content-Type must be application/json, got {ctype or 'none'!r}",
                                  "content-type")
        return None, cors

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, counting the bytes that actually arrive; None if the client disconnected."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        parts, n, more = [], 0, True
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise _Reject(408, f"the request body did not arrive within {self.body_timeout:g} s", "body") from None
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            n += len(chunk)
            if n > self.max_body:
                raise _Reject(413, f"request body is over the limit of {self.max_body} bytes", "body")
            parts.append(chunk)
            more = msg.get("more_body", False)
        return b"".join(parts)


class _Reject(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def response(self) -> JSONResponse:
        # Connection: close, so the server stops reading whatever the client still sends (the rest of a 200 MB body)
        return _error(self.status, self.message, self.param, headers={**(self.headers or {}), "Connection": "close"})


def _with_headers(send, extra: list[tuple[bytes, bytes]]):
    async def wrapped(msg):
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", []), *extra]}
        await send(msg)
    return wrapped


def check_json(value, param: str = "body", depth: int = 0) -> None:
    """400 for what json.loads accepts but nothing downstream can use: lone surrogates (from \\ud800 escapes), which
    cannot be encoded, and nesting deeper than MAX_JSON_DEPTH."""
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequestError(param, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(param, "contains a lone surrogate (invalid Unicode)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_json(k, param, depth + 1)
            check_json(v, f"{param}.{k}" if param != "body" else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_json(v, f"{param}[{i}]", depth + 1)


class _SSEResponse(StreamingResponse):
    """Streams while watching for the client's disconnect, so a closed tab cancels its generation at once
    (Starlette's ASGI 2.4 path would only notice on the next write)."""

    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        scope["asgi"] = {**scope.get("asgi", {}), "spec_version": "2.0"}
        await super().__call__(scope, receive, send)


def _safe_file(root: Path, raw_path: str) -> Path | None:
    """The file under root that raw_path names, or None for anything that could escape root."""
    low = raw_path.lower()
    if "\\" in raw_path or "\x00" in raw_path or "%2e" in low or "%2f" in low or "%5c" in low or "%00" in low:
        return None
    rel = unquote(raw_path).lstrip("/")
    if "\\" in rel or "\x00" in rel or any(p in ("..", ".") for p in rel.split("/")):
        return None
    try:
        target = (root / rel).resolve() if rel else root
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(root) or not target.is_file():
            return None  # resolve() followed symlinks: one that points outside ends here
    except (OSError, ValueError):  # a name too long for the file system, and the like: simply not there
        return None
    return target


def prometheus(stats: dict, model: str) -> str:
    rows = [
        ("webinfer_queue_length", "gauge", "requests waiting to be scheduled", stats["waiting"]),
        ("webinfer_running_sequences", "gauge", "sequences in the running batch", stats["running"]),
        ("webinfer_kv_blocks_used", "gauge", "KV blocks held by sequences", stats["blocks_used"]),
        ("webinfer_kv_blocks_free", "gauge", "KV blocks free (including cached, evictable ones)", stats["blocks_free"]),
        ("webinfer_kv_blocks_cached", "gauge", "KV blocks findable in the prefix cache", stats["blocks_cached"]),
        ("webinfer_kv_blocks_total", "gauge", "KV blocks in the pool", stats["blocks_total"]),
        ("webinfer_prefix_cache_hit_rate", "gauge", "prompt tokens found in the prefix cache / prompt tokens",
         stats["prefix_hit_rate"]),
        ("webinfer_tokens_per_second", "gauge", "generated tokens per second over the last 10 s", stats["tokens_per_s"]),
        ("webinfer_generated_tokens_total", "counter", "tokens generated", stats["tokens_generated"]),
        ("webinfer_requests_aborted_total", "counter", "requests aborted (client left)", stats["requests_aborted"]),
        ("webinfer_preemptions_total", "counter", "sequences preempted for lack of KV blocks", stats["preemptions"]),
    ]
    label = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # Prometheus label escaping
    out = []
    for name, kind, help_, v in rows:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f'{name}{{model="{label}"}} {float(v):.6g}']
    return "\n".join(out) + "\n"


def create_app(llm: LLM, site: str | Path | None = None, allowed_hosts=DEFAULT_HOSTS,
               max_body_bytes: int = MAX_BODY_BYTES, allowed_origins=(), api_key: str | None = None,
               max_waiting: int = MAX_WAITING, body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
    engine = llm.engine
    model_name = llm.model_name
    # one thread: templates and tokenization leave the event loop, and are bounded (chat_template's limits)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webinfer-prompt")
    pending = 0  # requests whose prompt is being prepared (bounded together with the engine's queue)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        pool.shutdown(wait=False, cancel_futures=True)
        try:
            await engine.close()  # open streams end at once, so a SIGTERM'd server stops
        except Exception:  # noqa: BLE001 - a dead engine re-raises what killed it: already reported by /health
            log.warning("the engine had stopped with an error", exc_info=True)

    app = FastAPI(title="webinfer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(Exception)
    async def _crash(request, exc):  # one bad request never takes the server down, nor shows its internals
        log.error("internal error on %s", request.url.path, exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__}); see the server log", kind="server_error")

    async def _body(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, and ints too long to convert
            raise InvalidRequestError("body", f"is not valid JSON: {e}") from None
        except RecursionError:
            raise InvalidRequestError("body", f"is nested deeper than {MAX_JSON_DEPTH} levels") from None
        if not isinstance(body, dict):
            raise InvalidRequestError("body", "must be a JSON object")
        check_json(body)
        if not isinstance(body.get("stream", False), bool):
            raise InvalidRequestError("stream", "must be true or false")
        return body

    async def _unless_disconnected(request: Request, work):
        """The result of `work`, or None (work cancelled: the request is aborted) if the client leaves first."""
        async def gone():
            while (await request.receive())["type"] != "http.disconnect":
                pass
        task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, watch):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, watch, return_exceptions=True)
        return task.result() if not task.cancelled() else None

    async def _complete(request: Request, chat: bool):
        nonlocal pending
        try:
            body = await _body(request)
            if pending + len(engine.scheduler.waiting) >= max_waiting:
                return _error(503, f"the server is busy ({max_waiting} requests waiting); retry later",
                              kind="server_busy", headers={"Retry-After": str(RETRY_AFTER_S)})
            pending += 1
            try:  # the prompt is built in `pool`: templates and tokenization off the event loop
                prepared = await asyncio.get_running_loop().run_in_executor(
                    pool, llm.prepare, "chat" if chat else "completion", body)
            finally:
                pending -= 1
            work = llm.run(*prepared)
            if not body.get("stream", False):
                result = await _unless_disconnected(request, work)  # a client that left aborts its request
                return JSONResponse(result) if result is not None else PlainTextResponse("", 499)
            result = await work
        except InvalidRequestError as e:
            return _error(400, str(e), e.param)
        except ServerBusyError as e:
            return _error(503, str(e), kind="server_busy", headers={"Retry-After": str(RETRY_AFTER_S)})
        except ContextOverflowError as e:
            return _error(400, str(e), "messages" if chat else "prompt")
        except ChatTemplateError as e:
            return _error(400, f"chat template: {e}", "messages")
        except EngineStepError as e:
            return _error(503 if engine.dead is not None else 500, str(e), kind="server_error")

        async def sse():
            try:
                async for chunk in result:
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                yield "data: [DONE]\n\n"
            except Exception as e:  # after the headers went out, an error can only be an event
                yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'server_error'}})}\n\n"
            finally:
                await result.aclose()
        return _SSEResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(request, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "webinfer", "max_model_len": llm.max_model_len}]}

    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return JSONResponse({"status": "dead", "error": type(engine.dead).__name__}, 503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus(engine.stats(), model_name),
                                 media_type="text/plain; version=0.0.4")

    if site is not None:
        root = Path(site).resolve()

        @app.get("/{path:path}")
        async def static(request: Request, path: str):
            raw = request.scope.get("raw_path", b"").decode("latin-1").split("?", 1)[0]
            f = _safe_file(root, raw)
            if f is None:
                return _error(404, "not found", kind="not_found")
            mime = MIME.get(f.suffix.lower()) or mimetypes.guess_type(f.name)[0] or "application/octet-stream"
            cache = IMMUTABLE if HASHED.search(f.name) else "no-cache"
            return FileResponse(f, media_type=mime, headers={"Cache-Control": cache, **CROSS_ORIGIN_ISOLATION})

    app.add_middleware(GuardMiddleware, allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes,
                       allowed_origins=allowed_origins, api_key=api_key, body_timeout_s=body_timeout_s)
    return app


def serve(llm: LLM, host: str = "127.0.0.1", port: int = 8000, site=None, allowed_hosts=None, allowed_origins=(),
          api_key: str | None = None, max_waiting: int = MAX_WAITING) -> None:
    import uvicorn

    if host not in LOOPBACK and not api_key:
        raise WebinferError(f"serving on {host} (beyond loopback) needs an API key: pass --api-key or set "
                            "WEBINFER_API_KEY")
    hosts = set(allowed_hosts or DEFAULT_HOSTS)
    if host not in ("0.0.0.0", "::"):
        hosts.add(host)
    app = create_app(llm, site, hosts, allowed_origins=allowed_origins, api_key=api_key, max_waiting=max_waiting)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
