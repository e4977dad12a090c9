"""The engine in the browser: the site loads a package, generates greedily through webinfer.js, and its token ids
equal the native engine's (wgpu-py on lavapipe, webinfer_packager.native.generate_native) for the same prompt.
Then the server is stopped and a reload still answers (service worker + cached shards)."""

from __future__ import annotations

import json

import pytest

from .conftest import ARTIFACTS, SiteServer, attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GENERATE = """async ([url, ids, n, lose]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    const engine = await w.load(url);
    const loadMs = performance.now() - t0;
    const got = [];
    let text = "";
    for await (const c of engine.chat.completions.create({prompt_ids: ids, messages: [], max_tokens: n, stream: true})) {
        got.push(...(c.choices[0].token_ids || []));
        text += c.choices[0].delta.content || "";
    }
    const info = engine.info;
    const stats = engine.lastStats;
    let afterLoss = null;
    if (lose) {  // device lost: the next message must rebuild the engine and answer the same
        await engine._loseDeviceForTest();
        afterLoss = [];
        for await (const c of engine.chat.completions.create({prompt_ids: ids, messages: [], max_tokens: n, stream: true}))
            afterLoss.push(...(c.choices[0].token_ids || []));
    }
    engine.unload();
    return {ids: got, text, loadMs, info, stats, afterLoss};
}"""


def _native_ids(package, prompt, n):
    from concurrent.futures import ThreadPoolExecutor

    from webinfer_packager.native import generate_native

    # its own thread: Playwright's sync API keeps an asyncio loop running in this one
    with ThreadPoolExecutor(1) as ex:
        ids, _ = ex.submit(generate_native, package, prompt, n).result()
    return ids


def test_tiny_model_matches_native_and_works_offline(served, browser, tiny_package):
    logs: list[str] = []
    site = json.loads((served.root / "site.json").read_text())
    prompt, n = [298, 5, 17, 42, 101], 6
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    r = page.evaluate(GENERATE, [site["models"][0]["manifest"], prompt, n, False])
    assert r["info"]["engine"], (r["info"], logs)
    want = _native_ids(tiny_package, prompt, n)
    eos = json.loads((tiny_package / "manifest.json").read_text())["config"]["eos_token_ids"]
    assert r["ids"] == [t for t in want if t not in eos] and r["ids"], (r["ids"], want)
    print("tiny cold", json.dumps(r["info"]["timings"]), json.dumps(r["stats"]))

    # offline: the service worker serves the shell, Pyodide and wheels; the loader serves the shards
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=30_000)
    served.stop()
    page.reload()
    r2 = page.evaluate(GENERATE, [site["models"][0]["manifest"], prompt, n, True])
    assert r2["ids"] == r["ids"], (r2, logs)
    assert r2["afterLoss"] == r["ids"], (r2, logs)
    assert r2["info"]["timings"]["files_downloaded"] == 0 and r2["info"]["timings"]["requests"] == 0, r2["info"]
    print("tiny warm offline", json.dumps(r2["info"]["timings"]), json.dumps(r2["stats"]))
