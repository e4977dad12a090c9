"""The built site in Chromium: Pyodide + our wheels start in the worker, and the browser Device runs a kernel."""

from __future__ import annotations

import json

import pytest

from .conftest import attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_site_layout(tiny_site):
    site = json.loads((tiny_site / "site.json").read_text())
    html = (tiny_site / "index.html").read_text()
    # relative URLs only, content-addressed wheels, versioned pyodide folder, pinned manifest
    assert 'src="/' not in html and 'href="/' not in html and "http" not in html.split("<body>")[1].split("<script type=\"application/json\"")[0]
    assert site["pyodide"] == "pyodide/314.0.7/"
    for w in site["wheels"]:
        f = tiny_site / w
        import hashlib
        assert hashlib.sha256(f.read_bytes()).hexdigest().startswith(w.split("/")[1])
    m = site["models"][0]
    assert hashlib.sha256((tiny_site / m["manifest"]).read_bytes()).hexdigest() == m["sha256"]
    assert m["sha256"] in html
    inline = html.split('<script type="application/json" id="site">')[1].split("</script>")[0]
    assert json.loads(inline) == site  # the page parses this; HTML-escaping it would break the page


def test_browser_device_runs_copy_kernel(served, browser):
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "index.html")
    res = page.evaluate("""async () => {
        const w = await import("./webinfer.js");
        return await w.selftest();
    }""")
    assert res["ok"], (res, logs)
    assert res["words"] == 65536
    assert res["device"]["limits"]["max_storage_buffer_binding_size"] >= 128 << 20
    print("selftest", json.dumps(res["timings"]), f"copy {res['ms']:.1f} ms", res["device"]["adapter"])


def test_embed_example_generates(served, browser):
    import shutil
    from pathlib import Path

    shutil.copyfile(Path(__file__).resolve().parents[2] / "examples" / "embed" / "index.html", served.root / "embed.html")
    logs: list[str] = []
    page = browser.new_page()
    attach_console(page, logs)
    page.goto(served.url + "embed.html?n=3&q=hi")
    page.wait_for_selector("body[data-done]", timeout=300_000)  # Pyodide start: minutes on a loaded 2-core box
    import re

    m = re.match(r"done \((\d+) tokens, TTFT \d+ ms\)", page.inner_text("#status"))
    assert m and 1 <= int(m.group(1)) <= 3, (page.inner_text("#status"), logs)  # max_tokens=3 (EOS may end sooner)
    assert not any(line.startswith("pageerror") for line in logs), logs
