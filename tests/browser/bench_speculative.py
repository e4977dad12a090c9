"""Speculative decoding (prompt lookup) in the page (not a test): the prompts of webinfer_packager.bench.speculative,
greedy, batch 1, on one engine loaded with speculative: "prompt-lookup"; plain runs ask for speculative_tokens: 0
(the request extension), so both sides share the device, the pipelines and the machine's load, and alternate.

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m tests.browser.bench_speculative SITE_DIR [max_tokens] [reps] [LOAD_OPTIONS]
LOAD_OPTIONS: JSON merged into load()'s options, e.g. '{"backend": "cpu", "cpuMode": "fast", "threads": 1}'; without
it, load()'s own default backend, "auto" (the CPU engine on SwiftShader, a fallback adapter; the WebGPU path:
'{"backend": "webgpu"}'). Prints the engine chosen, then one JSON object per prompt: decode tok/s of both
sides (the best of the reps), steps, proposals accepted, and whether every run produced the same ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from webinfer_packager.bench.speculative import PROMPTS

from .conftest import site_page

LOAD = """async ([url, k, extra]) => {
    const w = await import("./webinfer.js");
    const t0 = performance.now();
    window._engine = await w.load(url, {speculative: "prompt-lookup", speculativeTokens: k, ...extra});
    const i = window._engine.info;
    return {ms: performance.now() - t0, backend: i.backend, cpu_mode: i.cpu_mode ?? null, timings: i.timings};
}"""

RUN = """async ([messages, n, spec]) => {
    const r = await window._engine.chat.completions.create(
        {messages, max_tokens: n, temperature: 0, speculative_tokens: spec});
    return {ids: r.choices[0].token_ids, usage: r.usage};
}"""


def main(site: Path, n: int, reps: int, k: int = 4, extra: dict | None = None) -> None:
    with site_page(site, timeout_ms=1_800_000) as (page, url, m):
        page.goto(url + "index.html")
        info = page.evaluate(LOAD, [m["manifest"], k, extra or {}])
        print(json.dumps({"load_ms": round(info["ms"]), "options": extra or {}, "backend": info["backend"],
                          "cpu_mode": info["cpu_mode"], "threads": info["timings"].get("wasm_threads")}),
              flush=True)
        page.evaluate(RUN, [[{"role": "user", "content": "Hi"}], 4, 0])  # warm-up
        for name, msgs in PROMPTS.items():
            runs = {"plain": [], "speculative": []}
            for _ in range(reps):  # alternate, so both sides see the same machine load
                for label, spec in (("plain", 0), ("speculative", k)):
                    runs[label].append(page.evaluate(RUN, [msgs, n, spec]))
            rate = lambda r: 1.0 / r["usage"]["time_per_output_token_s"] if r["usage"]["time_per_output_token_s"] else 0.0
            best = {label: max(v, key=rate) for label, v in runs.items()}
            s = best["speculative"]["usage"].get("speculative") or {}
            ids = [r["ids"] for v in runs.values() for r in v]
            print(json.dumps({
                "prompt": name, "tokens": len(ids[0]), "identical": all(i == ids[0] for i in ids),
                "plain_decode_tok_s": round(rate(best["plain"]), 2),
                "spec_decode_tok_s": round(rate(best["speculative"]), 2),
                "speedup": round(rate(best["speculative"]) / max(rate(best["plain"]), 1e-9), 3),
                "proposed": s.get("proposed_tokens", 0), "accepted": s.get("accepted_tokens", 0)}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64, int(sys.argv[3]) if len(sys.argv) > 3 else 1,
         extra=json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
