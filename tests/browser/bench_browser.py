"""Browser load and generation timings for a built site (not a test): cold visit, warm (second) visit, then a
device loss and the rebuild (pipelines precompiled with createComputePipelineAsync from the recorded sources);
the warm visit with decode blocks of 8 (the default) and with single steps.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m tests.browser.bench_browser SITE_DIR [max_tokens]
Prints one JSON line per phase: load timings (JS + Python split) and the chat's stats (TTFT, decode tok/s,
host ms per step)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from .conftest import ARGS, CHROMIUM, SiteServer

RUN = """async ([url, n, lose, block]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    const engine = await w.load(url, {decodeBlock: block, decodeBlockMs: 0});  // exactly `block` steps
    const loadMs = performance.now() - t0;
    const messages = [{role: "user", content: "What is the capital of France?"}];
    const chat = async () => {
        const it = engine.chat.completions.create({messages, max_tokens: n, temperature: 0, stream: true});
        for await (const c of it) {}
        const s = it.stats; delete s.token_ids; return s;
    };
    const first = await chat();
    let rebuild = null;
    if (lose) { await engine._loseDeviceForTest(); rebuild = await chat(); }
    engine.unload();
    return {loadMs, timings: engine.info.timings, first, rebuild};
}"""


def main(site: Path, n: int) -> None:
    from playwright.sync_api import sync_playwright

    srv = SiteServer(site)
    m = json.loads((site / "site.json").read_text())["models"][0]
    with tempfile.TemporaryDirectory() as prof, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(prof, executable_path=CHROMIUM, args=ARGS, headless=True)
        ctx.set_default_timeout(600_000)
        page = ctx.new_page()
        page.goto(srv.url + "index.html")
        # decode blocks of 8 (the default) and single steps on the warm page, same run
        for phase, lose, block in (("cold", False, 8), ("warm", False, 8), ("warm-single-steps", False, 1),
                                   ("warm-device-loss", True, 8)):
            r = page.evaluate(RUN, [m["manifest"], n, lose, block])
            print(json.dumps({"phase": phase, "decode_block": block, **r}), flush=True)
            page.reload()
        ctx.close()
    srv.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 8)
