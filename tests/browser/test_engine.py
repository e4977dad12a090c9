"""The engine in the browser: the site loads a package, generates greedily through webinfer.js, and its token ids
equal the native engine's (wgpu-py on lavapipe, the same request through webinfer.open) for the same prompt.
Then the server is stopped and a reload still answers (service worker + cached shards), with the GPU pipelines made
ahead from the first visit's record (web/worker.js prepare)."""

from __future__ import annotations

import json

import pytest

from .conftest import attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GENERATE = """async ([url, ids, n, lose]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    const engine = await w.load(url, {backend: "webgpu"});
    const loadMs = performance.now() - t0;
    const got = [];
    let text = "";
    for await (const c of engine.chat.completions.create({prompt_ids: ids, max_tokens: n, temperature: 0, ignore_eos: true, stream: true})) {
        got.push(...(c.choices[0].token_ids || []));
        text += c.choices[0].delta.content || "";
    }
    const info = engine.info;
    const stats = engine.lastStats;
    let afterLoss = null;
    if (lose) {  // device lost: the next message must rebuild the engine and answer the same
        await engine._loseDeviceForTest();
        afterLoss = [];
        const it = engine.chat.completions.create({prompt_ids: ids, max_tokens: n, temperature: 0, ignore_eos: true, stream: true});
        for await (const c of it) afterLoss.push(...(c.choices[0].token_ids || []));
        stats.rebuild = it.stats.rebuild_timings;
    }
    engine.unload();
    return {ids: got, text, loadMs, info, stats, afterLoss};
}"""


def _native_ids(package, prompt, n):
    from concurrent.futures import ThreadPoolExecutor

    # its own thread: Playwright's sync API keeps an asyncio loop running in this one
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(_native_run, package, prompt, n).result()


def _native_run(package, prompt, n):
    """The same request through the native engine: webinfer.open -> LLM, as the page's worker builds it."""
    import asyncio

    import webinfer.factory as factory

    llm = factory.open(package)
    r = asyncio.run(llm.completions.create(prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True))
    return r["choices"][0]["token_ids"]


def test_tiny_model_matches_native_and_works_offline(served, browser, tiny_package):
    logs: list[str] = []
    site = json.loads((served.root / "site.json").read_text())
    prompt, n = [298, 5, 17, 42, 101], 6
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    r = page.evaluate(GENERATE, [site["models"][0]["manifest"], prompt, n, False])
    assert r["info"]["name"], (r["info"], logs)
    want = _native_ids(tiny_package, prompt, n)
    assert r["ids"] == want and len(want) == n, (r["ids"], want)  # ignore_eos: exactly n ids, EOS or not
    print("tiny cold", json.dumps(r["info"]["timings"]), json.dumps(r["stats"]))
    # the per-token split (browser_worker._time_split): every part measured, the chunks' hand-over included
    pt = r["stats"]["per_token"]
    assert set(pt) == {"wall_ms", "python_ms", "js_upload_ms", "js_submit_ms", "read_wait_ms", "js_read_ms",
                       "between_steps_ms", "stream_ms", "other_ms"}, pt
    assert min(pt["stream_ms"], pt["read_wait_ms"], pt["js_read_ms"], pt["between_steps_ms"]) > 0 and pt["other_ms"] >= 0, pt
    assert sum(v for k, v in pt.items() if k not in ("wall_ms", "other_ms", "stream_ms")) <= pt["wall_ms"] * 1.001, pt

    # offline: the service worker serves the shell, Pyodide and wheels; the loader serves the shards
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=30_000)
    served.stop()
    page.reload()
    r2 = page.evaluate(GENERATE, [site["models"][0]["manifest"], prompt, n, True])
    assert r2["ids"] == r["ids"], (r2, logs)
    assert r2["afterLoss"] == r["ids"], (r2, logs)
    assert r2["stats"]["rebuild"]["engine_build_ms"] > 0, r2["stats"]  # the loss was seen and the engine rebuilt
    assert r2["info"]["timings"]["files_downloaded"] == 0 and r2["info"]["timings"]["requests"] == 0, r2["info"]
    # the page opened with webinfer.prepare() (app.js): the first visit recorded the pipelines its build created,
    # the second made every one of them from JS before Python asked, and the ids above are still the native ones
    t1, t2 = r["info"]["timings"], r2["info"]["timings"]
    assert t1["pipelines"] > 0 and t1["pipelines_made_ahead"] == 0, t1
    assert t2["pipelines_made_ahead"] == t2["pipelines"] == t1["pipelines"], t2
    # what a single chat does not run (gemv tiles for several chats, ...) is left to after ready: not in the build,
    # not made ahead from the record either
    assert t1["pipelines_deferred"] > 0 and t2["ahead_pipelines"] == t2["pipelines"], t2
    ft = r["stats"]["first_token"]  # the time to the first token, split (one prefill step: the 5-token prompt)
    assert ft["steps"] == 1 and ft["wall_ms"] >= ft["read_wait_ms"] > 0, ft
    print("tiny warm offline", json.dumps(r2["info"]["timings"]), json.dumps(r2["stats"]))


# Two streams at once through the page's one engine, and one of them stopped midway. Each stream alone first,
# then both together: the ids must be the same (batch invariance, per-request sampling counters), the chunks must
# interleave (the engine's background task keeps stepping on Pyodide's webloop while JS awaits chunks), and
# together they must take fewer engine steps than one after the other (they really were batched). Last, both again
# with the GPU encoder's handle table rebuilt before every command list (browser.py _encode_words): the same ids.
CONCURRENT = """async ([url, a, b]) => {
    const w = await import("./webinfer.js");
    // blocks short enough to stop a stream midway
    const engine = await w.load(url, {backend: "webgpu", decodeBlock: 2});
    const events = [];
    async function run(tag, req, stopAfter = 0) {
        const ids = [], ids_seen = new Set(); let finish = null, k = 0, id = null;
        const it = engine.chat.completions.create({...req, stream: true});
        for await (const c of it) {
            events.push(tag);
            ids.push(...(c.choices[0].token_ids || []));
            ids_seen.add(c.id); id = c.id;
            finish = c.choices[0].finish_reason ?? finish;
            if (stopAfter && ++k >= stopAfter) break;
        }
        return {ids, finish, id, oneId: ids_seen.size === 1, stats: it.stats};
    }
    const aloneA = await run("a", a), aloneB = await run("b", b);
    events.length = 0;
    const [bothA, bothB] = await Promise.all([run("a", a), run("b", b)]);
    const order = events.join("");
    const [stopA, stopB] = await Promise.all([run("a", a, 2), run("b", b)]);
    const after = await run("a", a);  // the engine is healthy after the abort, and the aborted blocks are free
    // the encoder's handle table rebuilt before every command list (its limit lowered to 1): the same ids
    const rebuilds0 = await engine._handleLimitForTest(1);
    const [tightA, tightB] = await Promise.all([run("a", a), run("b", b)]);
    const rebuilds = (await engine._handleLimitForTest(4096)) - rebuilds0;
    engine.unload();
    return {aloneA, aloneB, bothA, bothB, order, stopA, stopB, after, tightA, tightB, rebuilds};
}"""


def test_concurrent_streams_equal_alone_and_stop_one(served, browser):
    logs: list[str] = []
    site = json.loads((served.root / "site.json").read_text())
    n = 8
    a = {"prompt_ids": [298, 5, 17, 42, 101], "max_tokens": n, "temperature": 0, "ignore_eos": True}
    b = {"prompt_ids": [7, 200, 12, 55, 9, 81, 240, 3, 77], "max_tokens": n + 2, "temperature": 0.9, "seed": 11,
         "ignore_eos": True}
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    r = page.evaluate(CONCURRENT, [site["models"][0]["manifest"], a, b])
    alone_a, alone_b = r["aloneA"]["ids"], r["aloneB"]["ids"]
    assert len(alone_a) == n and len(alone_b) == n + 2, r
    assert r["bothA"]["ids"] == alone_a and r["bothB"]["ids"] == alone_b, (r, logs)
    assert r["bothA"]["id"] != r["bothB"]["id"] and r["bothA"]["oneId"] and r["bothB"]["oneId"]
    # interleaved: some chunk of each stream arrives before the other stream's last chunk
    order = r["order"]
    assert order.index("a") < order.rindex("b") and order.index("b") < order.rindex("a"), order
    steps_alone = r["aloneA"]["stats"]["engine_steps"] + r["aloneB"]["stats"]["engine_steps"]
    steps_both = r["bothB"]["stats"]["engine"]["steps"] - r["aloneB"]["stats"]["engine"]["steps"]
    assert steps_both < steps_alone, (steps_both, steps_alone)
    # stopping one leaves the other untouched; the stopped one ends with "abort" after a prefix of its ids
    assert r["stopB"]["ids"] == alone_b and r["stopB"]["finish"] == "length"
    # (two chunks: the first token and one decode block of 2, a strict prefix)
    stop_ids = r["stopA"]["ids"]
    assert 2 <= len(stop_ids) < n and stop_ids == alone_a[:len(stop_ids)] and r["stopA"]["stats"]["stopped"], r["stopA"]
    assert r["after"]["ids"] == alone_a
    assert r["tightA"]["ids"] == alone_a and r["tightB"]["ids"] == alone_b and r["rebuilds"] >= n, r["rebuilds"]
    print("concurrent steps", steps_both, "vs", steps_alone, "alone;", json.dumps(r["bothA"]["stats"]["engine"]))


# The decode GEMVs with 8 lanes per row group (gemv.wgsl KSPLIT: a real GPU's default, which CI's fallback adapter
# does not take by itself): Chrome's WGSL compiler must accept its workgroup barriers (uniformity), and the page's
# ids must be the native engine's with the same layout, alone and beside a second request (the tiles share
# nothing but the weights). A value outside the list is refused naming the option.
KSPLIT = """async ([url, a, b]) => {
    const w = await import("./webinfer.js");
    let refused = null;
    try { await w.load(url, {backend: "webgpu", gemvKsplit: 3}); } catch (e) { refused = String(e.message || e); }
    const engine = await w.load(url, {backend: "webgpu", gemvKsplit: 8});
    const run = async (req) => (await engine.chat.completions.create(req)).choices[0].token_ids;
    const alone = await run(a);
    const [both, other] = await Promise.all([run(a), run(b)]);
    const ksplit = engine.info.gemv_ksplit;
    engine.unload();
    const dflt = await w.load(url, {backend: "webgpu"});  // the fallback adapter's own choice
    const defaultKsplit = dflt.info.gemv_ksplit;
    dflt.unload();
    return {alone, both, other, refused, ksplit, defaultKsplit};
}"""


def _native_ksplit_ids(package, reqs, ksplit):
    from concurrent.futures import ThreadPoolExecutor

    def go():
        import asyncio

        import webinfer.factory as factory

        llm = asyncio.run(factory.load(package, options=factory.EngineOptions(gemv_ksplit=ksplit)))
        assert llm.engine.runner.ksplit == ksplit
        return [asyncio.run(llm.completions.create(**r))["choices"][0]["token_ids"] for r in reqs]

    with ThreadPoolExecutor(1) as ex:  # (Playwright's sync API keeps an asyncio loop running in this thread)
        return ex.submit(go).result()


def test_gemv_ksplit_in_the_page_equals_native(served, browser, tiny_package):
    logs: list[str] = []
    site = json.loads((served.root / "site.json").read_text())
    a = {"prompt_ids": [298, 5, 17, 42, 101], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    b = {"prompt_ids": [7, 200, 12, 55], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    r = page.evaluate(KSPLIT, [site["models"][0]["manifest"], a, b])
    assert r["refused"] and "gemvKsplit" in r["refused"], (r, logs)
    assert (r["ksplit"], r["defaultKsplit"]) == (8, 1), r  # asked for; SwiftShader, a fallback adapter: 1
    native = [{"prompt": r["prompt_ids"], **{k: v for k, v in r.items() if k != "prompt_ids"}} for r in (a, b)]
    want_a, want_b = _native_ksplit_ids(tiny_package, native, 8)
    assert r["alone"] == want_a and r["both"] == want_a and r["other"] == want_b, (r, want_a, want_b, logs)
