"""The main job's path: `webinfer serve` serves the chat site at / (FastAPI static files, not the test server), and
the page loaded from it generates in the browser with the same ids as the native engine, while the same server
answers the OpenAI API."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_server import ServerThread

from .conftest import attach_console
from .test_engine import GENERATE, _native_ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_page_from_webinfer_serve_generates_like_native(tiny_site, tiny_package, browser):
    from webinfer_packager.server.app import create_app
    from webinfer_packager.cli.backend import open_llm

    llm = open_llm(tiny_package, "reference")  # the API side; the page runs its own engine
    site = json.loads((tiny_site / "site.json").read_text())
    prompt, n = [298, 5, 17, 42, 101], 6
    with ServerThread(create_app(llm, site=tiny_site)) as url:
        r = httpx.get(url + "/pyodide/314.0.7/pyodide.asm.wasm")
        assert r.status_code == 200 and r.headers["content-type"] == "application/wasm"
        api = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert api.status_code == 200 and len(api.json()["choices"][0]["token_ids"]) >= 1
        logs: list[str] = []
        page = browser.new_page()
        attach_console(page, logs)
        page.goto(url + "/")
        out = page.evaluate(GENERATE, [site["models"][0]["manifest"], prompt, n, False])
    want = _native_ids(tiny_package, prompt, n)
    assert out["ids"] == want and len(want) == n, (out["ids"], want, logs[-20:])
