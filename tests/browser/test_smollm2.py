"""The real model in the browser: SmolLM2-135M-Instruct through the built site. Greedy ids, and ids sampled with
a temperature alone (its 49,152-token vocabulary takes the scan's chunk masses: sample.wgsl sample_chunks), equal
the native engine's for the same chat prompt; the chat UI streams an answer (screenshot mid-answer), and Stop ends
it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import ARTIFACTS, SiteServer, attach_console

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
N = 5


@pytest.fixture(scope="module")
def smol_site(tmp_path_factory, smollm2_package):
    from webinfer_packager.site.build import build_site

    out = tmp_path_factory.mktemp("smolsite") / "site"
    build_site([smollm2_package], out)
    srv = SiteServer(out)
    yield srv
    srv.stop()


SAMPLED = {"temperature": 1.0, "seed": 7}


def _native(package):
    """The same chat requests through the native engine (webinfer.open -> LLM), as the page's worker builds them:
    greedy, then SAMPLED."""
    import asyncio

    import webinfer.factory as factory

    llm = factory.open(package)
    r = asyncio.run(llm.chat.completions.create(messages=MESSAGES, max_tokens=N, temperature=0))
    s = asyncio.run(llm.chat.completions.create(messages=MESSAGES, max_tokens=N, **SAMPLED))
    return r["prompt_token_ids"], r["choices"][0]["token_ids"], r["usage"], s["choices"][0]["token_ids"]


def test_smollm2_greedy_ids_equal_native(smol_site, browser, smollm2_package):
    with ThreadPoolExecutor(1) as ex:  # Playwright's sync API keeps an event loop in this thread
        prompt, want, native_t, want_sampled = ex.submit(_native, smollm2_package).result()
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(smol_site.url + "index.html")
    m = json.loads((smol_site.root / "site.json").read_text())["models"][0]
    r = page.evaluate("""async ([url, messages, n, sampled]) => {
        const w = await import("./webinfer.js");
        const engine = await w.load(url, {backend: "webgpu"});
        const ids = []; let text = "";
        for await (const c of engine.chat.completions.create({messages, max_tokens: n, temperature: 0, stream: true})) {
            ids.push(...(c.choices[0].token_ids || [])); text += c.choices[0].delta.content || "";
        }
        const out = {ids, text, info: engine.info, stats: engine.lastStats};
        const s = await engine.chat.completions.create({messages, max_tokens: n, ...sampled});
        out.sampled = s.choices[0].token_ids;
        engine.unload();
        return out;
    }""", [m["manifest"], MESSAGES, N, SAMPLED])
    assert r["stats"]["prompt_tokens"] == len(prompt), (r["stats"], len(prompt))
    eos = [t for t in want if t == 2][:1]  # the engine stops at EOS and reports it; native ran on past it
    assert r["ids"] == (want[: want.index(2)] + eos if eos else want), (r, want, logs)
    assert r["sampled"] == want_sampled and r["sampled"] != r["ids"], (r["sampled"], want_sampled)
    print("smollm2 browser", json.dumps(r["info"]["timings"]), json.dumps({k: v for k, v in r["stats"].items() if k != "token_ids"}))
    print("smollm2 native", json.dumps(native_t), "text:", repr(r["text"]))


def test_chat_ui_streams_and_stops(smol_site, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(smol_site.url + "index.html")
    page.click("#load")
    page.wait_for_selector("body[data-loaded]", timeout=240_000)
    assert "ready" in page.inner_text("#status"), page.inner_text("#status")
    page.fill("#input", "Tell me a story about a robot.")
    page.press("#input", "Enter")
    page.wait_for_function("document.querySelector('.msg.assistant .content')?.textContent.length > 8", timeout=120_000)
    page.screenshot(path=str(ARTIFACTS / "chat-mid-answer.png"))
    assert page.is_enabled("#stop")
    page.click("#stop")
    page.wait_for_function("document.getElementById('stats').textContent.includes('tokens/s')", timeout=60_000)
    assert not page.is_enabled("#stop") and page.is_enabled("#send")
    n = int(page.inner_text("#stats").split("·")[2].split()[0])
    assert 1 < n < 256, page.inner_text("#stats")  # stopped well before max_tokens
    print("ui", page.inner_text("#stats"), repr(page.inner_text(".msg.assistant .content")[:80]))
