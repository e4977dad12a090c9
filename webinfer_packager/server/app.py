"""HTTP server (CPython only): the OpenAI-shaped API over FastAPI, metrics, and an optional static site.

    /v1/chat/completions, /v1/completions   plain JSON, or SSE with `data: [DONE]` when "stream": true
    /v1/models, /health, /metrics (Prometheus text)
    /...                                    files of the --site folder, when given

It listens on 127.0.0.1 by default and answers only requests whose Host header is an allowed name (a web page
elsewhere could otherwise reach it through DNS rebinding). Bodies over the cap get 413 before they are read;
bad fields get 400 naming the limit; a prompt longer than the context gets 400 with both lengths. A client that
disconnects mid-stream aborts its request at once (its KV blocks are freed before the next step).
"""

from __future__ import annotations

import json
import mimetypes
import re
from pathlib import Path
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse

from webinfer.api import LLM
from webinfer.errors import ChatTemplateError, ContextOverflowError, InvalidRequestError

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 1 << 20

MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".whl": "application/zip", ".wgsl": "text/wgsl", ".html": "text/html",
        ".css": "text/css", ".bin": "application/octet-stream", ".zip": "application/zip", ".svg": "image/svg+xml",
        ".txt": "text/plain", ".map": "application/json", ".ico": "image/x-icon", ".png": "image/png"}
# content-addressed names (a 64-hex sha256 anywhere, or a "name.<8+ hex>.ext" / "name-<8+ hex>.ext" suffix)
HASHED = re.compile(r"(^|[^0-9a-f])[0-9a-f]{64}([^0-9a-f]|$)|[.-][0-9a-f]{8,}\.[A-Za-z0-9]+$")
IMMUTABLE = "public, max-age=31536000, immutable"


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


class GuardMiddleware:
    """Host allowlist and body cap, as plain ASGI so nothing reads a body before the checks."""

    def __init__(self, app, allowed_hosts, max_body_bytes: int):
        self.app, self.allowed, self.max_body = app, {h.lower() for h in allowed_hosts}, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
        if name.lower() not in self.allowed:
            return await _error(403, f"Host {host!r} is not allowed (allowed: {sorted(self.allowed)})",
                                "host")(scope, receive, send)
        cl = headers.get("content-length")
        if cl is not None:
            if not cl.isdigit():
                return await _error(400, "bad Content-Length", "content-length")(scope, receive, send)
            if int(cl) > self.max_body:
                return await _error(413, f"request body of {cl} bytes is over the limit of {self.max_body} bytes",
                                    "body")(scope, receive, send)
        elif scope["method"] in ("POST", "PUT", "PATCH"):
            # chunked upload: read up to the cap, then replay what was read
            body, more = b"", True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > self.max_body:
                    return await _error(413, f"request body is over the limit of {self.max_body} bytes",
                                        "body")(scope, receive, send)
            sent = False

            async def replay():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()
            return await self.app(scope, replay, send)
        return await self.app(scope, receive, send)


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
    target = (root / rel).resolve() if rel else root
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root) or not target.is_file():
        return None  # resolve() followed symlinks: one that points outside ends here
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
    out = []
    for name, kind, help_, v in rows:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f'{name}{{model="{model}"}} {float(v):.6g}']
    return "\n".join(out) + "\n"


def create_app(llm: LLM, site: str | Path | None = None, allowed_hosts=DEFAULT_HOSTS,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="webinfer", docs_url=None, redoc_url=None, openapi_url=None)
    engine = llm.engine
    model_name = llm.model_name

    @app.exception_handler(Exception)
    async def _crash(request, exc):  # one bad request never takes the server down
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")

    async def _body(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidRequestError("body", f"is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequestError("body", "must be a JSON object")
        if not isinstance(body.get("stream", False), bool):
            raise InvalidRequestError("stream", "must be true or false")
        return body

    async def _complete(request: Request, chat: bool):
        try:
            body = await _body(request)
            result = await llm.create("chat" if chat else "completion", body)
        except InvalidRequestError as e:
            return _error(400, str(e), e.param)
        except ContextOverflowError as e:
            return _error(400, str(e), "messages" if chat else "prompt")
        except ChatTemplateError as e:
            return _error(400, f"chat template: {e}", "messages")
        if not body.get("stream"):
            return JSONResponse(result)

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
            return FileResponse(f, media_type=mime, headers={"Cache-Control": cache})

    app.add_middleware(GuardMiddleware, allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes)
    return app


def serve(llm: LLM, host: str = "127.0.0.1", port: int = 8000, site=None, allowed_hosts=None) -> None:
    import uvicorn

    hosts = set(allowed_hosts or DEFAULT_HOSTS)
    if host not in ("0.0.0.0", "::"):
        hosts.add(host)
    uvicorn.run(create_app(llm, site, hosts), host=host, port=port, log_level="info")
