"""Gemma 3 270M in the browser (Chromium, WebGPU on SwiftShader) through the built site and webinfer.js, the path a
page uses: greedy ids equal transformers loading the same GGUF, on 2 prompts x 24 tokens.

What it exercises beyond SmolLM2: a 262,144 x 640 embedding (and tied LM head) over several storage bindings,
Q4_K/Q6_K/Q5_0/Q8_0 weights, head_dim 256, sliding-window layers, and a 250 MB package handed from JS to Pyodide.

Slow (about 10 minutes on a loaded 2-core machine: transformers' GGUF load, the site build, SwiftShader running
a 268M-parameter model); `-m "not slow"` leaves it out of the default CI path. Run:
    python -m pytest tests/browser/test_gemma_browser.py -v -s
It prints the page's load timings and decode tok/s (docs/models.md quotes them). The same measurement for every
model of a built site (a chat prompt, greedy, n tokens; one JSON line per model):
    python -m tests.browser.test_gemma_browser SITE_DIR [n]
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import hf_greedy

from .conftest import SiteServer, attach_console

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.slow, pytest.mark.oracle]

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,"]
N = 24

RUN = """async ([url, requests, n, backend]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    const engine = await w.load(url, {backend: backend || "webgpu"});
    const loadMs = performance.now() - t0;
    const runs = [];
    for (const req of requests) {
        const it = engine.chat.completions.create({...req, max_tokens: n, temperature: 0, stream: true});
        const got = []; let text = "";
        for await (const c of it) { got.push(...(c.choices[0]?.token_ids || [])); text += c.choices[0]?.delta?.content || ""; }
        const s = it.stats;
        runs.push({ids: got, text, decode_tok_s: s.decode_tok_s, ttft_ms: s.ttft_ms, prompt_tokens: s.prompt_tokens});
    }
    const out = {loadMs, info: engine.info, runs};
    engine.unload();
    return out;
}"""


@pytest.fixture(scope="module")
def gemma_site(tmp_path_factory, gemma_package):
    from webinfer_packager.site.build import build_site

    out = tmp_path_factory.mktemp("gemmasite") / "site"
    build_site([gemma_package], out)
    srv = SiteServer(out)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def gemma_want(gemma_hf):
    return hf_greedy(*gemma_hf, PROMPTS, N)


# webgpu: SwiftShader's WebGPU; cpu: the WebAssembly engine (exact mode, one Worker), which the chat page's Auto
# picks on a software adapter: Gemma's GeGLU, sandwich and q/k norms, sliding layers in wasm/kernels.c
@pytest.mark.parametrize("backend", ["webgpu", "cpu"])
def test_gemma_greedy_ids_equal_transformers(gemma_site, gemma_want, browser, backend):
    want = gemma_want
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(gemma_site.url + "index.html")
    m = json.loads((gemma_site.root / "site.json").read_text())["models"][0]
    r = page.evaluate(RUN, [m["manifest"], [{"prompt_ids": ids} for ids, _ in want], N, backend])
    assert r["info"]["backend"] == backend, r["info"]
    print(f"\ngemma browser {backend} load_ms", round(r["loadMs"]), "timings", json.dumps(r["info"]["timings"]))
    for text, (ids, gen), run in zip(PROMPTS, want, r["runs"]):
        print(f"gemma browser {backend} {text!r}: decode {run['decode_tok_s']:.2f} tok/s, "
              f"ttft {run['ttft_ms']:.0f} ms, {run['text']!r}")
        assert run["prompt_tokens"] == len(ids) and ids[0] == 2, (run, ids)
        assert run["ids"] == gen, (text, run["ids"], gen, logs[-20:])


def main(site, n: int) -> None:
    import tempfile
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from .conftest import ARGS, CHROMIUM

    site = Path(site)
    srv = SiteServer(site)
    req = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    with tempfile.TemporaryDirectory() as prof, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(prof, executable_path=CHROMIUM, args=ARGS, headless=True)
        page = ctx.new_page()
        for m in json.loads((site / "site.json").read_text())["models"]:
            page.goto(srv.url + "index.html")
            r = page.evaluate(RUN, [m["manifest"], [req], n])
            run = r["runs"][0]
            print(json.dumps({"model": m["name"], "load_s": round(r["loadMs"] / 1e3, 1), "tokens": len(run["ids"]),
                              "decode_tok_s": round(run["decode_tok_s"], 2), "ttft_ms": round(run["ttft_ms"])}),
                  flush=True)
        ctx.close()
    srv.stop()


if __name__ == "__main__":
    import sys

    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16)
