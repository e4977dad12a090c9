"""Fixtures for the browser tests: a static server we control (to corrupt, cut or replace files, or stop it) and
headless Chromium with WebGPU (SwiftShader), driven by Playwright. Never downloads a browser.

Skipped when Chromium or Playwright is missing, except under CI=true, where that is a failure."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from webinfer_packager.cli.doctor import CHROMIUM_ARGS as ARGS  # the flags `webinfer doctor` probes with

CHROMIUM = os.environ.get("WEBINFER_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _require_browser():
    why = None
    if not Path(CHROMIUM).exists():
        why = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            why = "playwright is not installed (pip install playwright; it drives /usr/bin/chromium)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


class SiteServer:
    """Serves `root` on 127.0.0.1 with ETag and Range support. Faults, keyed by file name, apply once each:
    "flip" (one byte changed), "cut" (connection closed halfway), "html" (an HTML page with status 200).
    isolated: every file with the cross-origin isolation headers `webinfer serve` sends (SharedArrayBuffer: the
    CPU engine's two Workers)."""

    def __init__(self, root: Path, isolated: bool = False):
        self.root = Path(root)
        self.faults: dict[str, str] = {}
        self.log: list[tuple[str, str, str]] = []  # (path, Range header, status)
        self.lock = threading.Lock()
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(server.root), **kw)

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?", 1)[0]
                name = path.rsplit("/", 1)[-1]
                fs = Path(self.translate_path(path))
                rng = self.headers.get("Range") or ""
                with server.lock:
                    fault = server.faults.pop(name, None)
                if not fs.is_file():
                    if fs.is_dir() and (fs / "index.html").is_file():
                        fs = fs / "index.html"
                    else:
                        server.log.append((path, rng, "404"))
                        self.send_error(404)
                        return
                data = fs.read_bytes()
                etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
                ctype = self.guess_type(str(fs))
                if fault == "html":
                    body = b"<!doctype html><html><body>Sorry, something went wrong</body></html>"
                    server.log.append((path, rng, "200-html"))
                    self._send(200, body, "text/html; charset=utf-8", etag)
                    return
                if fault == "flip":
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0x01
                    data = bytes(data)
                start = 0
                if rng.startswith("bytes=") and self.headers.get("If-Range", etag) == etag:
                    start = int(rng[6:].split("-")[0])
                if start:
                    server.log.append((path, rng, "206"))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    data = data[start:]
                else:
                    server.log.append((path, rng, "200" + (f"-{fault}" if fault else "")))
                    self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", etag)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Cache-Control", "no-cache")
                if isolated:
                    self.send_header("Cross-Origin-Opener-Policy", "same-origin")
                    self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
                self.end_headers()
                if fault == "cut":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    time.sleep(0.5)  # let the browser hand the first half to the reader before the cut
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data)

            def _send(self, code, body, ctype, etag):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        Handler.extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript",
                                  ".mjs": "text/javascript", ".wasm": "application/wasm", ".json": "application/json",
                                  ".bin": "application/octet-stream", ".whl": "application/octet-stream"}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def requests_for(self, needle: str) -> list[tuple[str, str, str]]:
        return [r for r in self.log if needle in r[0]]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory) -> Path:
    """A tiny random-weight llama packed into a webinfer package (packager/synthetic.py + pack)."""
    from webinfer_packager.pack.build import pack
    from tests.synthetic import write_hf

    d = tmp_path_factory.mktemp("tinysrc")
    write_hf(d / "hf")
    out = d / "tiny"
    pack(d / "hf", out, progress=False, name="tiny", shard_mb=1)
    return out


@pytest.fixture(scope="session")
def tiny_site(tmp_path_factory, tiny_package) -> Path:
    from webinfer_packager.site.build import build_site

    out = tmp_path_factory.mktemp("site") / "site"
    build_site([tiny_package], out)
    return out


@pytest.fixture()
def served(tiny_site, tmp_path):
    """A private copy of the tiny site (tests may damage files) behind a fresh server."""
    root = tmp_path / "site"
    shutil.copytree(tiny_site, root)
    srv = SiteServer(root)
    yield srv
    srv.stop()


@pytest.fixture()
def browser(tmp_path):
    """A persistent Chromium context (so caches survive reloads) with WebGPU; pages log to test output."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, args=ARGS,
                                                   headless=True, viewport={"width": 390, "height": 780})
        ctx.set_default_timeout(60_000)
        yield ctx
        ctx.close()


@contextlib.contextmanager
def site_page(site: Path, timeout_ms: int = 600_000, isolated: bool = False):
    """(page, server URL, the site's first model entry from site.json): headless Chromium with WebGPU and a fresh
    persistent profile on a built site served here, for the benchmarks (bench_browser.py, bench_speculative.py).
    isolated: served cross-origin isolated, as `webinfer serve` does (the CPU engine's two Workers need it)."""
    from playwright.sync_api import sync_playwright

    srv = SiteServer(site, isolated=isolated)
    model = json.loads((site / "site.json").read_text())["models"][0]
    try:
        with tempfile.TemporaryDirectory() as prof, sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(prof, executable_path=CHROMIUM, args=ARGS, headless=True)
            ctx.set_default_timeout(timeout_ms)
            try:
                yield ctx.new_page(), srv.url, model
            finally:
                ctx.close()
    finally:
        srv.stop()


def attach_console(page, sink: list):
    page.on("console", lambda m: sink.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: sink.append(f"pageerror: {e}"))
