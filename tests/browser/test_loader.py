"""web/loader.js against a server that misbehaves on purpose: corrupted bytes, a cut connection, an HTML error
page with status 200; and the second visit, which must make no network request for model data.
The loader runs in the page here (no Pyodide needed), exactly as it runs in the worker."""

from __future__ import annotations

import json

import pytest

from .conftest import attach_console

pytestmark = pytest.mark.browser

LOAD = """async ([url, sha]) => {
    const L = await import("./loader.js");
    try {
        const r = await L.loadModelFiles(url, {manifestSha256: sha, concurrency: 2});
        const hashes = {};
        for (const [name, bytes] of Object.entries(r.files)) hashes[name] = await L.sha256Hex(bytes);
        return {ok: true, stats: r.stats, hashes};
    } catch (e) { return {ok: false, name: e.name, message: e.message, details: e.details}; }
}"""
CACHED = """async () => {
    const c = await caches.open("webinfer-models-v1");
    return (await c.keys()).map((r) => r.url.split("/__webinfer__/")[1]);
}"""


def _model(served):
    site = json.loads((served.root / "site.json").read_text())
    m = site["models"][0]
    manifest = json.loads((served.root / m["manifest"]).read_text())
    return m, manifest


def _open(served, browser, logs):
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "site.json")  # any same-origin page: the loader needs only fetch and caches
    return page


def _largest(manifest):
    return max(manifest["files"], key=lambda f: f["bytes"])


def test_load_verify_cache_and_second_visit_is_offline(served, browser):
    logs: list[str] = []
    m, manifest = _model(served)
    page = _open(served, browser, logs)
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r["ok"], (r, logs)
    assert r["hashes"] == {f["name"]: f["sha256"] for f in manifest["files"]}
    assert r["stats"]["files_downloaded"] == len(manifest["files"]) and r["stats"]["files_cached"] == 0
    cached = page.evaluate(CACHED)
    assert sorted(k.split("/")[1] for k in cached if k.startswith("file/")) == sorted(f["sha256"] for f in manifest["files"])
    served.log.clear()
    page.reload()
    r2 = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r2["ok"] and r2["stats"]["files_cached"] == len(manifest["files"]), r2
    assert served.requests_for("/models/") == [], "second visit must not touch the network for model data"


def test_flipped_byte_is_rejected_and_fetched_again(served, browser):
    logs: list[str] = []
    m, manifest = _model(served)
    f = _largest(manifest)
    served.faults[f["name"]] = "flip"
    page = _open(served, browser, logs)
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r["ok"], (r, logs)
    assert r["stats"]["rejected"] == 1
    assert r["hashes"][f["name"]] == f["sha256"]
    assert [s for _, _, s in served.requests_for(f["name"])] == ["200-flip", "200"]


def test_twice_corrupted_file_reports_integrity_error(served, browser):
    m, manifest = _model(served)
    f = _largest(manifest)
    path = served.root / m["manifest"].rsplit("/", 1)[0] / f["name"]
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))
    page = _open(served, browser, [])
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert not r["ok"] and r["name"] == "IntegrityError", r
    assert r["details"]["expected"] == f"sha256 {f['sha256']}" and f["name"] in r["details"]["url"]
    assert not any(f["sha256"] in k for k in page.evaluate(CACHED))


def test_cut_download_resumes_with_range(served, browser):
    m, manifest = _model(served)
    f = _largest(manifest)
    served.faults[f["name"]] = "cut"
    page = _open(served, browser, [])
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r["ok"], r
    assert r["hashes"][f["name"]] == f["sha256"]
    reqs = served.requests_for(f["name"])
    assert reqs[0][2] == "200-cut" and reqs[1][2] == "206", reqs
    assert reqs[1][1] == f"bytes={f['bytes'] // 2}-", reqs
    assert r["stats"]["resumed"] == 1


def test_html_error_page_is_never_cached(served, browser):
    m, manifest = _model(served)
    f = _largest(manifest)
    served.faults[f["name"]] = "html"
    page = _open(served, browser, [])
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert not r["ok"] and r["name"] == "DownloadError" and "HTML" in r["message"], r
    assert not any(f["sha256"] in k for k in page.evaluate(CACHED))
    # the next attempt (server healthy again) downloads and caches the real file
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r["ok"] and r["hashes"][f["name"]] == f["sha256"], r
    assert any(f["sha256"] in k for k in page.evaluate(CACHED))


# Storage full: Cache.put stores one file, then writes a truncated entry and throws QuotaExceededError, as a
# browser whose quota runs out mid-write might. Patched in the page, where this loader runs as in the worker.
QUOTA = """() => {
    let puts = 0;
    const put = Cache.prototype.put;
    Cache.prototype.put = async function (req, res) {
        const url = typeof req === "string" ? req : req.url;
        if (!url.includes("/file/")) return put.call(this, req, res);
        if (++puts === 1) return put.call(this, req, res);
        const half = new Uint8Array(await res.arrayBuffer()).slice(0, 100);
        await put.call(this, req, new Response(half));
        throw new DOMException("The quota has been exceeded.", "QuotaExceededError");
    };
}"""


def test_storage_full_keeps_loading_from_memory(served, browser):
    logs: list[str] = []
    m, manifest = _model(served)
    assert len(manifest["files"]) >= 2, "the test needs a package of several files"
    page = _open(served, browser, logs)
    page.evaluate(QUOTA)
    r = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r["ok"], (r, logs)
    assert r["hashes"] == {f["name"]: f["sha256"] for f in manifest["files"]}  # every file, from memory
    assert r["stats"]["cached"] is False and "Storage is full" in r["stats"]["warning"], r["stats"]
    # what the cache holds is complete and verified: the one file stored before the quota ran out, nothing else
    entries = page.evaluate("""async () => {
        const L = await import("./loader.js");
        const c = await caches.open(L.CACHE_NAME);
        const out = {};
        for (const req of await c.keys()) {
            const key = req.url.split("/__webinfer__/")[1];
            if (key.startsWith("file/"))
                out[key.slice(5)] = await L.sha256Hex(new Uint8Array(await (await c.match(req)).arrayBuffer()));
        }
        return out;
    }""")
    assert len(entries) == 1 and all(k == v for k, v in entries.items()), entries
    # the next visit (storage still full) reads that file from the cache and downloads only the others
    served.log.clear()
    page.reload()
    page.evaluate(QUOTA)
    r2 = page.evaluate(LOAD, [m["manifest"], m["sha256"]])
    assert r2["ok"] and r2["stats"]["files_cached"] == 1, r2["stats"]
    assert r2["stats"]["files_downloaded"] == len(manifest["files"]) - 1, r2["stats"]
