"""webinfer's CPU engine against wllama (llama.cpp compiled to WebAssembly, the peer issue 16 names) in one Chromium
run on the same machine (not a test): the same model, prompt and greedy decoding, one and two threads each, both
pages served cross-origin isolated (wllama's threads need a SharedArrayBuffer too). The browser runs without
WebGPU, so both engines are on the CPU alone (wllama 3 loads a WebGPU backend when it finds an adapter; WEBGPU=1
keeps the flag on: with n_gpu_layers 0 its figures here were the same either way).

  webinfer   the SmolLM2 site from `webinfer site` (the package packed from the GGUF below), `backend: "cpu"`,
             exact and fast mode, `threads` 1 and 2; decode tok/s from the engine's stats (`decode_tok_s`), prefill
             from its TTFT
  wllama     @wllama/wllama (pinned in web/package.json, from npm) on the GGUF file itself, `n_gpu_layers: 0` (its
             WebGPU offload off: the CPU against the CPU), `n_threads` 1 and 2; decode and prefill tok/s from its
             own `timings` (llama.cpp's predicted_per_second, prompt_per_second)

Each side runs a 40-token chat prompt (its own template: the token counts are printed) and MAX_TOKENS greedy tokens
with EOS ignored, twice per configuration in the same page (the second run is printed: the first pays first-use
costs; each run's system message differs in its first words, so webinfer's prefix cache cannot serve the second
and both sides prefill every prompt token); the configurations alternate between the two engines so both see the
same machine load.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m tests.browser.bench_wllama SITE_DIR GGUF [max_tokens]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .conftest import ARGS, CHROMIUM, SiteServer

WLLAMA = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "@wllama" / "wllama" / "esm"
PROMPT = "What is the capital of France famous for?"  # bench_browser.py's chat 1
SYSTEM = "Run {i}: you are a helpful assistant."

OURS = """async ([manifest, prompt, system, n, threads, mode]) => {
    const w = await import("./webinfer.js");
    const engine = await w.load(manifest, {backend: "cpu", cpuMode: mode, threads});
    const runs = [];
    for (let i = 0; i < 2; i++) {
        const messages = [{role: "system", content: system.replace("{i}", i)}, {role: "user", content: prompt}];
        const it = engine.chat.completions.create({messages, max_tokens: n,
                                                   temperature: 0, ignore_eos: true, stream: true});
        for await (const c of it) {}
        runs.push(it.stats);
    }
    const info = engine.info;
    engine.unload();
    const s = runs[1];
    return {prompt_tokens: s.prompt_tokens, completion_tokens: s.completion_tokens, decode_tok_s: s.decode_tok_s,
            prefill_tok_s: s.prompt_tokens / (s.ttft_ms / 1000), threads: info.timings.wasm_threads,
            variant: info.timings.wasm_variant};
}"""

THEIRS = """async ([prompt, system, n, threads]) => {
    const { Wllama } = await import("./wllama/index.js");
    const w = new Wllama({default: "./wllama/wasm/wllama.wasm"}, {suppressNativeLog: true, allowOffline: true});
    await w.loadModelFromUrl("./model.gguf", {n_threads: threads, n_gpu_layers: 0, n_ctx: 1024, useCache: false});
    const runs = [];
    for (let i = 0; i < 2; i++) {
        const messages = [{role: "system", content: system.replace("{i}", i)}, {role: "user", content: prompt}];
        const r = await w.createChatCompletion({messages, max_tokens: n,
                                                temperature: 0, ignore_eos: true, cache_prompt: false});
        runs.push(r);
    }
    await w.exit();
    const t = runs[1].timings;
    return {prompt_tokens: t.prompt_n, completion_tokens: t.predicted_n, decode_tok_s: t.predicted_per_second,
            prefill_tok_s: t.prompt_per_second, threads};
}"""


def main(site: Path, gguf: Path, n: int) -> None:
    from playwright.sync_api import sync_playwright

    if not (WLLAMA / "wasm" / "wllama.wasm").is_file():
        sys.exit(f"{WLLAMA} is missing: run `npm ci` in web/ (scripts/setup-browser.sh)")
    manifest = json.loads((site / "site.json").read_text())["models"][0]["manifest"]
    with tempfile.TemporaryDirectory() as tmp:
        peer = Path(tmp) / "peer"
        shutil.copytree(WLLAMA, peer / "wllama")
        os.symlink(gguf.resolve(), peer / "model.gguf")
        (peer / "index.html").write_text("<!doctype html><title>wllama</title>")
        ours, theirs = SiteServer(site, isolated=True), SiteServer(peer, isolated=True)
        try:
            with sync_playwright() as p:
                args = ARGS if os.environ.get("WEBGPU") == "1" else [a for a in ARGS if a != "--enable-unsafe-webgpu"]
                ctx = p.chromium.launch_persistent_context(str(Path(tmp) / "profile"), executable_path=CHROMIUM,
                                                           args=args, headless=True)
                ctx.set_default_timeout(600_000)
                try:
                    for threads in (1, 2):
                        for engine in ("webinfer exact", "webinfer fast", "wllama"):
                            page = ctx.new_page()
                            if engine == "wllama":
                                page.goto(theirs.url + "index.html")
                                r = page.evaluate(THEIRS, [PROMPT, SYSTEM, n, threads])
                            else:
                                page.goto(ours.url + "index.html?noprepare")
                                r = page.evaluate(OURS, [manifest, PROMPT, SYSTEM, n, threads, engine.split()[1]])
                            page.close()
                            print(json.dumps({"engine": engine, "webgpu": args is ARGS,
                                              "loadavg": round(os.getloadavg()[0], 2), **r}),
                                  flush=True)
                finally:
                    ctx.close()
        finally:
            ours.stop()
            theirs.stop()


if __name__ == "__main__":
    a = sys.argv
    main(Path(a[1]), Path(a[2]), int(a[3]) if len(a) > 3 else 64)
