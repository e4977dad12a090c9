"""The CPU backend in the page: load(manifest, {backend: "cpu" | "auto"}) runs the same .wasm through the browser's
WebAssembly (Pyodide calls it through the FFI), and its greedy ids equal the native CPU engine's (wasmtime).
In CI Chromium the only WebGPU adapter is SwiftShader, a fallback adapter, so "auto" must choose the CPU and say why.
A cross-origin isolated page (COOP/COEP) runs the engine on navigator.hardwareConcurrency Workers by default (at most
4; two on this 2-core CI machine: the threads build on a shared memory, web/wasm-thread.js for each thread past
the first), or as many as `threads` asks, with the same ids; a page that is not isolated runs one and says why. On
a host that sends no such headers the site's service worker adds them, so from the second visit on it is isolated.
"""

from __future__ import annotations

import json

import pytest

from .conftest import attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GENERATE = """async ([url, ids, n, backend, cpuMode, threads, sampling]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    const engine = await w.load(url, {backend, cpuMode: cpuMode || "exact", threads: threads ?? undefined});
    const loadMs = performance.now() - t0;
    const got = [];
    const sampled = [];  // (greedy first; then each seeded sampling's ids, on the same engine)
    for (const s of [null, ...(sampling || [])]) {
        const run = [];
        for await (const c of engine.chat.completions.create({prompt_ids: ids, max_tokens: n, temperature: 0,
                                                              ignore_eos: true, stream: true, ...(s || {})}))
            run.push(...(c.choices[0].token_ids || []));
        if (s) sampled.push(run); else got.push(...run);
    }
    const out = {ids: got, sampled, loadMs, info: engine.info, stats: engine.lastStats};
    engine.unload();
    return out;
}"""


# echo's prompt logprobs (kernels.c wi_head, the head split among the Workers): 19 scored rows, two groups
SCORE = """async ([url, ids]) => {
    const w = await import("./webinfer.js");
    const engine = await w.load(url, {backend: "cpu"});
    const r = await engine.completions.create({prompt: ids, max_tokens: 0, echo: true, logprobs: 2});
    const threads = engine.info.timings.wasm_threads;
    engine.unload();
    return {logprobs: r.choices[0].logprobs, threads};
}"""
PROMPT, N = [298, 5, 17, 42, 101], 6  # the tiny model's request in these tests
# seeded sampling (the chat page's defaults; sharper ones whose cut leaves rows out of the two-pass LM head's
# second pass, kernels.c head_cut): the page's ids equal the native engine's here too
SAMPLED = [{"temperature": 0.7, "top_p": 0.95, "seed": 1}, {"temperature": 0.1, "top_p": 0.9, "seed": 3},
           {"temperature": 0.3, "min_p": 0.2, "seed": 2}]


def _open(browser, url, logs):
    """A fresh page (its own context: no service worker yet) on the site's index.html; console lines go to logs."""
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(url + "index.html")
    return page


def _manifest(root):
    return json.loads((root / "site.json").read_text())["models"][0]["manifest"]


def _native_cpu_ids(package, prompt, n, cpu_mode="exact", sampling=None):
    from concurrent.futures import ThreadPoolExecutor

    def run():  # the same request through the native CPU engine: webinfer.open(backend="cpu") -> LLM
        import asyncio

        import webinfer.factory as factory

        llm = factory.open(package, backend="cpu", options=factory.EngineOptions(cpu_mode=cpu_mode))
        r = asyncio.run(llm.completions.create(prompt=prompt, max_tokens=n, ignore_eos=True,
                                               **(sampling or {"temperature": 0})))
        return r["choices"][0]["token_ids"], r["usage"]

    with ThreadPoolExecutor(1) as ex:  # Playwright's sync API keeps an asyncio loop running in this thread
        return ex.submit(run).result()


def _native_cpu_score(package, prompt):
    """The completions logprobs of an echoed, scored-only prompt on the native CPU engine."""
    from concurrent.futures import ThreadPoolExecutor

    def run():
        import asyncio

        import webinfer.factory as factory

        llm = factory.open(package, backend="cpu")
        r = asyncio.run(llm.completions.create(prompt=prompt, max_tokens=0, echo=True, logprobs=2))
        return r["choices"][0]["logprobs"]

    with ThreadPoolExecutor(1) as ex:
        return ex.submit(run).result()


@pytest.mark.parametrize("backend", ["cpu", "auto", pytest.param(None, id="default")])
def test_tiny_model_cpu_backend_matches_native(served, browser, tiny_package, backend):
    """backend "cpu", "auto" and none given (load()'s default: auto): on CI Chromium's SwiftShader, a fallback
    adapter, the CPU engine, with the native CPU engine's ids."""
    logs: list[str] = []
    page = _open(browser, served.url, logs)
    r = page.evaluate(GENERATE, [_manifest(served.root), PROMPT, N, backend])
    info = r["info"]
    assert info["name"] and info["backend"] == "cpu", (info, logs)
    if backend != "cpu":
        assert "fallback" in info["backend_reason"], info["backend_reason"]
    want, _ = _native_cpu_ids(tiny_package, PROMPT, N)
    assert r["ids"] == want and len(want) == N, (r["ids"], want)
    assert info["timings"]["wasm_variant"] in ("base", "relaxed"), info["timings"]
    assert info["timings"]["wasm_threads"] == 1 and "not cross-origin isolated" in info["timings"]["wasm_reason"]
    print(backend, info["backend_reason"], info["timings"]["wasm_reason"], json.dumps(r["stats"]))


def test_workers_when_cross_origin_isolated(served, browser, tiny_package):
    """The same site served with COOP/COEP: the engine runs on two Workers by default on this 2-core machine
    (threads: 1 still one, threads: 3 three), and all give the native engine's ids, greedy and (one and two
    Workers) seeded sampled; a count past 8 is refused with a message that names the option."""
    from .conftest import SiteServer

    srv = SiteServer(served.root, isolated=True)
    try:
        logs: list[str] = []
        page = _open(browser, srv.url, logs)
        assert page.evaluate("crossOriginIsolated"), logs
        want, _ = _native_cpu_ids(tiny_package, PROMPT, N)
        want_sampled = [_native_cpu_ids(tiny_package, PROMPT, N, sampling=s)[0] for s in SAMPLED]
        assert any(w != want for w in want_sampled)  # (the seeded runs sample: not all the greedy ids)
        for threads, workers in ((None, 2), (1, 1), (3, 3)):
            r = page.evaluate(GENERATE, [_manifest(served.root), PROMPT, N, "cpu", "exact", threads,
                                         SAMPLED if workers < 3 else None])
            t = r["info"]["timings"]
            assert t["wasm_threads"] == workers, (t, logs[-5:])
            assert r["ids"] == want, (threads, r["ids"], want, logs[-5:])
            assert r["sampled"] == (want_sampled if workers < 3 else []), (threads, r["sampled"], want_sampled)
            # the page's default decode blocks ran in the module (wi_steps), on both Workers too
            assert r["stats"]["engine"]["decode_blocks"] > 0, r["stats"]
            # with several Workers each block runs on the thread count its timings choose (cpu/threads.py)
            choice = r["stats"]["cpu_thread_choice"]
            assert (workers == 1) == (choice is None) and 1 <= r["stats"]["cpu_threads"] <= workers, r["stats"]
            if choice:  # every count from 1 to the Workers was timed (candidate_counts of 2 and of 3)
                assert set(choice["exact/1"]) == {str(n) for n in range(1, workers + 1)} | {"using", "recent"}
            # the step time splits into the module's calls and the runner's host work around them
            assert 0 < r["stats"]["cpu_module_ms_per_step"] <= r["stats"]["cpu_ms_per_step"], r["stats"]
            print(threads, t["wasm_reason"], json.dumps(r["stats"]))
        # a prompt scored on two Workers: the native CPU engine's numbers, to the bit
        ids = [(7 * i + 3) % 300 for i in range(20)]
        got = page.evaluate(SCORE, [_manifest(served.root), ids])
        assert got["threads"] == 2 and got["logprobs"] == _native_cpu_score(tiny_package, ids), (got, logs[-5:])
        err = page.evaluate(f"""async () => {{ try {{ await ({GENERATE})([{json.dumps(_manifest(served.root))},
            {PROMPT}, 1, "cpu", "exact", 9]); return null; }} catch (e) {{ return String(e.message || e); }} }}""")
        assert err and "threads=9" in err and "expected 1 to 8" in err, err
    finally:
        srv.stop()


def test_service_worker_isolates_a_static_host(served, browser, tiny_package):
    """A host that sends no COOP/COEP (served here without them): the first visit is not isolated (one Worker); once
    the site's service worker controls the page, a reload is (web/sw.js adds the headers), and the CPU engine runs
    on two Workers with the same ids."""
    logs: list[str] = []
    page = _open(browser, served.url, logs)
    assert not page.evaluate("crossOriginIsolated")
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=60_000)
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert page.evaluate("crossOriginIsolated"), logs[-5:]
    # only documents and worker scripts are rebuilt with the headers: a rebuilt pyodide.asm.wasm loses V8's code
    # cache (Pyodide's start stayed 5.0-5.7 s on every visit, against 3.3-3.9 s when passed through)
    wasm_coep = page.evaluate("""async () => {
        const site = await (await fetch("site.json")).json();
        const r = await fetch(site.pyodide + "pyodide.asm.wasm");
        return [r.ok, r.headers.get("cross-origin-embedder-policy")];
    }""")
    assert wasm_coep == [True, None], wasm_coep
    r = page.evaluate(GENERATE, [_manifest(served.root), PROMPT, N, "cpu", "exact", None])
    t = r["info"]["timings"]
    assert t["wasm_threads"] == 2 and "cross-origin isolated" in t["wasm_reason"], (t, logs[-5:])
    want, _ = _native_cpu_ids(tiny_package, PROMPT, N)
    assert r["ids"] == want, (r["ids"], want, logs[-5:])
    assert not [l for l in logs if l.startswith("pageerror")], logs


# one visit: load, a greedy chat, then a reader's pause until the work after ready has reached `wait_for` (a key of
# engine.backgroundStatus()); `corrupt`: damage the stored runtime snapshot for the next visit
VISIT = """async ([url, ids, n, waitFor, corrupt]) => {
    const L = await import("./loader.js");
    const site = await (await fetch("site.json")).json();
    const key = [site.pyodide, ...site.wheels.map((w) => w.split("/").at(-2))].join("|");  // worker.js runtimeKey
    const w = await import("./webinfer.js");
    const engine = await w.load(url, {backend: "cpu"});
    const got = [];
    for await (const c of engine.chat.completions.create({prompt_ids: ids, max_tokens: n, temperature: 0, ignore_eos: true, stream: true}))
        got.push(...(c.choices[0].token_ids || []));
    let bg = null;
    for (let i = 0; i < 240 && !bg?.[waitFor]; i++) {  // done once the engine has been idle (1 s)
        await new Promise((r) => setTimeout(r, 500));
        bg = await engine.backgroundStatus();
    }
    engine.unload();
    const stored = await L.readRuntimeSnapshot(key);
    if (corrupt) {  // for the next visit (the page's runtime starts at page open): the right length, a header that
        stored.fill(7, 0, 64);  // is not Pyodide's: its restore must fail, not load
        await L.writeRuntimeSnapshot(key, stored);
    }
    return {ids: got, timings: engine.info.timings, background: bg, stored: !!stored};
}"""


def test_bytecode_cache_across_visits(served, browser, tiny_package):
    """Python's bytecode for the wheels is written to IndexedDB after the first visit's ready (while idle) and used
    by the next visit of the same browser profile; both visits give the native ids, warm the kernels up and time the
    LM head's band limit."""
    logs: list[str] = []
    want, _ = _native_cpu_ids(tiny_package, PROMPT, N)
    states = []
    for _ in range(2):  # two visits in this test's browser profile (its own: IndexedDB starts empty)
        page = _open(browser, served.url, logs)
        r = page.evaluate(VISIT, [_manifest(served.root), PROMPT, N, "pycache", False])
        page.close()
        assert r["ids"] == want, (r["ids"], want, logs[-5:])
        states.append((r["timings"]["pycache"], r["background"]["pycache"]["state"]))
        # the kernels' warm-up runs first (CpuRunner.warm_up; tests/cpu/test_runner.py checks it changes nothing)
        assert r["background"].get("kernel_warm_up_ms", 0) > 0, (r["background"], logs[-5:])
        slices = r["background"]["kernel_warm_up_ms_per_step"]  # slices of 8 steps for ~2 s (browser_worker.py)
        assert r["background"]["kernel_warm_up_steps"] == 8 * len(slices) and all(t > 0 for t in slices), r
        hc = r["background"]["head_calibration"]  # then the LM head's band limit, timed in the page (calibrate_head)
        assert isinstance(hc, dict) and hc["one_ms"] > 0 and 0 <= hc["head_wide"] <= 0.5, hc
    assert states == [("empty", "written"), ("hit", "hit")], (states, logs[-5:])


def test_runtime_snapshot_across_visits(served, browser, tiny_package):
    """The first visit leaves a memory snapshot of a started runtime (web/snapshot-worker.js, after ready); the next
    visit restores it instead of starting Pyodide, and a snapshot that does not restore is deleted and the runtime
    starts as on a first visit (then writes a new one). Every visit gives the native ids."""
    logs: list[str] = []
    want, _ = _native_cpu_ids(tiny_package, PROMPT, N)
    seen = []
    for corrupt in (False, True, False):  # three visits in this test's own browser profile
        page = _open(browser, served.url, logs)
        r = page.evaluate(VISIT, [_manifest(served.root), PROMPT, N, "runtime_snapshot", corrupt])
        page.close()
        assert r["ids"] == want, (r["ids"], want, logs[-5:])
        seen.append((r["timings"]["runtime_snapshot"].split(" ")[0], r["background"]["runtime_snapshot"]["state"],
                     r["stored"]))
    assert seen == [("none", "written", True), ("restored", "restored", True), ("failed", "written", True)], \
        (seen, logs[-8:])


@pytest.mark.model
def test_smollm2_cpu_backend_in_the_page(smollm2_package, browser, tmp_path_factory):
    """The real model on the page's CPU backend, exact and fast mode: greedy ids equal the native CPU engine's;
    prints the page's and the native tok/s, measured in the same minutes."""""
    from webinfer_packager.site.build import build_site

    from .conftest import SiteServer

    out = tmp_path_factory.mktemp("smolcpu") / "site"
    build_site([smollm2_package], out)
    srv = SiteServer(out, isolated=True)  # two Workers (the default when isolated)
    try:
        logs: list[str] = []
        page = browser.new_page()
        attach_console(page, logs)
        page.goto(srv.url + "index.html")
        prompt, n = [1, 6403, 1980, 253, 655], 24
        m = json.loads((out / "site.json").read_text())["models"][0]
        for mode in ("exact", "fast"):
            r = page.evaluate(GENERATE, [m["manifest"], prompt, n, "cpu", mode])
            want, native = _native_cpu_ids(smollm2_package, prompt, n, mode)
            assert r["info"]["timings"]["wasm_threads"] == 2, r["info"]["timings"]
            assert r["ids"] == want, (mode, r["ids"], want, logs[-5:])
            print(f"page cpu {mode}:", json.dumps({"load_ms": r["loadMs"], "stats": r["stats"],
                                                   "timings": r["info"]["timings"]}))
            print(f"native cpu {mode}:", json.dumps(native))
    finally:
        srv.stop()
