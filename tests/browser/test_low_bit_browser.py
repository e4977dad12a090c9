"""A low-bit GGUF in the page: tests/test_low_bit_gguf.py's tiny llama (Q3_K, Q2_K, IQ4_XS, IQ4_NL and Q5_0
tensors, an IQ4_NL embedding and tied LM head) packed, built into a site and loaded by webinfer.js on its WebGPU
engine (SwiftShader) and on its CPU engine (the wasm module, exact mode): both generate the native engine's ids."""

from __future__ import annotations

import json

import pytest

from .conftest import SiteServer, attach_console
from .test_engine import _native_ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GENERATE = """async ([url, ids, n, options]) => {
    const w = await import("./webinfer.js");
    const engine = await w.load(url, options);
    const r = await engine.chat.completions.create({prompt_ids: ids, max_tokens: n, temperature: 0, ignore_eos: true});
    const out = {ids: r.choices[0].token_ids, backend: engine.info.backend};
    engine.unload();
    return out;
}"""


@pytest.fixture(scope="module")
def low_bit_site(tmp_path_factory):
    from tests import synthetic
    from tests.test_low_bit_gguf import KQ, MIX
    from webinfer_packager.pack.build import pack
    from webinfer_packager.site.build import build_site

    tmp = tmp_path_factory.mktemp("lowbit-site")
    pkg = pack(synthetic.write_gguf(tmp / "m.gguf", types=MIX, **KQ), tmp / "lowbit", progress=False, name="lowbit")
    build_site([pkg], tmp / "site")
    return tmp / "site", pkg


def test_low_bit_package_runs_in_the_page(low_bit_site, browser):
    site, pkg = low_bit_site
    srv = SiteServer(site)
    logs: list[str] = []
    try:
        page = browser.new_page()
        attach_console(page, logs)
        page.goto(srv.url + "index.html")
        manifest = json.loads((site / "site.json").read_text())["models"][0]["manifest"]
        prompt, n = [5, 17, 200, 33, 1, 9, 250], 8
        want = _native_ids(pkg, prompt, n)
        for options in ({"backend": "webgpu"}, {"backend": "cpu", "cpuMode": "exact", "threads": 1}):
            r = page.evaluate(GENERATE, [manifest, prompt, n, options])
            assert r["ids"] == want and len(want) == n, (options, r, want, logs[-20:])
    finally:
        srv.stop()
