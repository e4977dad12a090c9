"""Browser load and generation timings for a built site (not a test). Each phase is a fresh page load in one
browser profile (so the second and later visits read the model from the cache):

  cold            first visit: download, Pyodide, build (the runtime starts with Load, beside the download)
  warm            second visit, Load at once, pipelines "off": nothing made ahead (the levers below off)
  warm-load       second visit, Load at once: the GPU device and the pipelines recorded by the last load are
                  created from JS (createComputePipelineAsync) while the files are read and Pyodide starts
  warm-sync       the same with createComputePipeline
  warm-wait       webinfer.prepare() at page open (runtime + pipelines ahead), Load WAIT seconds later (a user
                  reading the page): Load -> ready
  cpu-warm        the CPU engine (wasm SIMD, `backend: "cpu"`; two Workers: the bench serves the site cross-origin
                  isolated), second visit, Load at once; cpu-warm-N: the same on N Workers (`threads: N`; cpu-warm-1: one)
  cpu-wait        the CPU engine, prepare() at page open and Load WAIT seconds later
  cpu-fast, cpu-fast-N  cpu-warm and cpu-warm-N in the CPU engine's fast mode (`cpuMode: "fast"`)
  auto-cold, auto-warm  the chat page's default engine (`backend: "auto"`: the CPU on SwiftShader, a fallback
                  adapter), first visit (list it first: the profile is fresh) and second visit, Load at once
  pipelines       each recorded pipeline compiled alone (createComputePipelineAsync, awaited one by one) on a
                  fresh device: what each costs on this adapter
  dispatch        what a dispatch costs on this adapter without any kernel work: one pass of N dependent dispatches
                  of an almost empty shader, submitted and awaited (N = 1 and 160, a decode step's count)

PHASE+S (e.g. cpu-fast+3): the same phase with its first chat S seconds after ready, a reader's pause (the work
after ready runs then: for the CPU engine, the kernels' warm-up first). PHASE-k1 (e.g. cpu-fast-1-k1): the same
with decode blocks off (`decodeBlock: 1`), to set against the default blocks. PHASE-s (e.g. cpu-warm-1-s, or
cpu-warm-1-s-k1): the chats sampled at the chat page's defaults (temperature 0.7, top_p 0.95, seed 1), not greedy;
PHASE-t: sampled with a temperature alone (0.7, seed 1: every id kept, what many API clients send).

Each phase is a fresh page, but Chromium keeps the renderer process, and V8 reuses a WebAssembly module it compiled
there before (the same bytes) with the code it has optimized since: a phase's CPU engine starts from optimized
code when an earlier phase of the run used the same build (one Worker: the plain build; two Workers: the threads
build), unlike a user's first visit in a new browser session. Order the phases with that in mind.

Load phases print {phase, open_to_ready_ms, load_to_ready_ms, timings, background (what the worker did after
ready: each phase waits up to 60 s for its bytecode cache and runtime snapshot, as a reader's pause would)}; with a chat (max_tokens > 0, a 40-token
prompt) also its stats (TTFT and its split `first_token`, decode tok/s, per-token split; ttft_ms is the engine's,
from the request's arrival there; page_ttft_ms from the page's call, so it includes any wait in the worker, e.g.
behind its background warm-up after ready), and `chat2`: a second
chat of the same length right after (what the first one paid once). Stage keys in timings: preflight_ms (the page's
adapter check), pyodide_start_ms, wheel_install_ms, runtime_ready_at_ms (from the worker's start), files_ms (cache
read or download, on the page's thread), verify_ms, runtime_wait_ms (Load waiting for Python after the files),
ahead_* (device and pipelines made before Python: issued and all compiled at, from the worker's start;
ahead_compile_wait_ms: the build waiting for them),
handover_ms, backend_choice_ms ("auto": the adapter check, and on a real adapter the GEMV timing), engine_build_ms (gpu_upload_ms, pipeline_create_ms, gpu_drain_ms: waiting for the GPU process),
pipelines / pipelines_made_ahead / pipelines_deferred (left to compile after ready), tokenizer_ms,
readback_latency_ms (an empty read-back), wasm_warm_ms (the CPU engine's start-up warm-up), ready_at_ms (from the
worker's start).

Run: XDG_RUNTIME_DIR=/tmp/xdg python -m tests.browser.bench_browser SITE_DIR [max_tokens] [phase,...] [wait_s]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .conftest import site_page

# about 40 tokens with SmolLM2's chat template (system prompt included; the stats report the exact count)
PROMPT = "What is the capital of France famous for?"
PROMPT2 = "Why is the sky blue during the day?"
PAGE_SAMPLING = {"temperature": 0.7, "top_p": 0.95, "seed": 1}  # web/store.js DEFAULT_SETTINGS, seeded
TEMPERATURE_SAMPLING = {"temperature": 0.7, "seed": 1}

RUN = """async ([model, n, pipelines, wait, prompts, extra]) => {
    const w = await import("./webinfer.js");
    const {chatPauseMs, sampling, ...extraLoad} = extra;  // (chatPauseMs, sampling: not load options)
    if (wait) {
        await w.prepare(model, {pipelines, ...extraLoad});
        await new Promise((r) => setTimeout(r, wait * 1000));
    }
    const t0 = performance.now();
    const engine = await w.load(model.manifest, {manifestSha256: model.sha256, pipelines, ...extraLoad});
    const t1 = performance.now();
    const chats = [];
    if (chatPauseMs) await new Promise((r) => setTimeout(r, chatPauseMs));
    for (const prompt of n ? prompts : []) {
        const s0 = performance.now();
        let first = null;
        const it = engine.chat.completions.create({messages: [{role: "user", content: prompt}], max_tokens: n,
                                                   temperature: 0, stream: true, ...(sampling ?? {})});
        for await (const c of it) if (first == null && c.choices?.[0]?.token_ids?.length) first = performance.now();
        const chat = it.stats; delete chat.token_ids;
        chat.page_ttft_ms = first == null ? null : first - s0;  // from the page's call: queueing in the worker too
        chats.push(chat);
    }
    // a reader's pause: the work after ready (the bytecode cache and the runtime snapshot for the next visit) runs
    // while the engine idles
    let background = null;
    for (let i = 0; i < 120 && !background?.runtime_snapshot; i++) {
        await new Promise((r) => setTimeout(r, 500));
        background = await engine.backgroundStatus();
    }
    engine.unload();
    return {open_to_ready_ms: t1, load_to_ready_ms: t1 - t0, timings: engine.info.timings, background,
            chat: chats[0] ?? null,
            chat2: chats[1] ?? null};
}"""

COMPILE_EACH = """async ([sha]) => {
    const L = await import("./loader.js");
    const rec = await L.readPipelineRecord(sha);
    if (!rec) return null;
    const adapter = await navigator.gpu.requestAdapter();
    const requiredLimits = {};
    for (const k of rec.limits) requiredLimits[k] = adapter.limits[k];
    const device = await adapter.requestDevice({requiredFeatures: rec.features, requiredLimits});
    const out = [];
    const all0 = performance.now();
    for (const {code, entry, label, deferred} of rec.pipelines) {
        const t0 = performance.now();
        await device.createComputePipelineAsync({layout: "auto", compute: {module: device.createShaderModule({code}), entryPoint: entry}});
        out.push([label + (deferred ? " (deferred)" : ""), Math.round(performance.now() - t0)]);
    }
    const seq = performance.now() - all0;
    device.destroy();
    return {pipelines: out, total_ms: Math.round(seq)};
}"""

DISPATCH = """async () => {
    const adapter = await navigator.gpu.requestAdapter();
    const device = await adapter.requestDevice();
    const code = `@group(0) @binding(0) var<storage, read_write> b: array<u32>;
        @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) { if (g.x == 0u) { b[0] += 1u; } }`;
    const p = await device.createComputePipelineAsync({layout: "auto", compute: {module: device.createShaderModule({code}), entryPoint: "main"}});
    const buf = device.createBuffer({size: 256, usage: GPUBufferUsage.STORAGE});
    const bg = device.createBindGroup({layout: p.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer: buf}}]});
    async function run(n) {
        const t0 = performance.now();
        const enc = device.createCommandEncoder();
        const pass = enc.beginComputePass();
        for (let i = 0; i < n; i++) { pass.setPipeline(p); pass.setBindGroup(0, bg); pass.dispatchWorkgroups(1); }
        pass.end();
        device.queue.submit([enc.finish()]);
        await device.queue.onSubmittedWorkDone();
        return performance.now() - t0;
    }
    const out = {};
    for (const n of [1, 160, 1, 160, 1, 160]) (out[n] ??= []).push(Math.round(await run(n) * 10) / 10);
    device.destroy();
    const min = (a) => Math.min(...a);
    return {ms: out, per_dispatch_ms: Math.round((min(out[160]) - min(out[1])) / 159 * 1000) / 1000};
}"""

PHASES = {"cold": ("async", 0), "warm": ("off", 0), "warm-load": ("async", 0), "warm-sync": ("sync", 0),
          "warm-wait": ("async", None), "cpu-warm": ("off", 0), "cpu-wait": ("off", None),
          "cpu-fast": ("off", 0), "auto-cold": ("async", 0), "auto-warm": ("async", 0)}
GPU = {"backend": "webgpu"}  # (load()'s default is "auto": the CPU engine on SwiftShader)
EXTRA = {"cold": GPU, "warm": GPU, "warm-load": GPU, "warm-sync": GPU, "warm-wait": GPU,
         "cpu-warm": {"backend": "cpu"}, "cpu-wait": {"backend": "cpu"},
         "cpu-fast": {"backend": "cpu", "cpuMode": "fast"}, "auto-cold": {"backend": "auto"},
         "auto-warm": {"backend": "auto"}}


def main(site: Path, n: int, phases: list[str], wait_s: float) -> None:
    import os

    with site_page(site, isolated=True) as (page, url, m):
        for phase in phases:
            page.goto(url + "index.html?noprepare")  # the bench decides what starts ahead
            load = os.getloadavg()[0]
            if phase == "pipelines":
                r = (page.evaluate(COMPILE_EACH, [m["sha256"]])
                     or {"skipped": "no pipeline record: run a load phase first"})
            elif phase == "dispatch":
                r = page.evaluate(DISPATCH)
            else:
                name, _, pause = phase.partition("+")  # PHASE+S: the first chat S seconds after ready
                name, k1 = (name[:-3], {"decodeBlock": 1}) if name.endswith("-k1") else (name, {})
                if name.endswith("-s") or name.endswith("-t"):  # the page's defaults / a temperature alone
                    name, k1 = name[:-2], {**k1, "sampling": PAGE_SAMPLING if name[-1] == "s" else TEMPERATURE_SAMPLING}
                if workers := re.fullmatch(r"(cpu-warm|cpu-fast)-(\d+)", name):  # cpu-warm-N: N Workers
                    name, k1 = workers[1], {**k1, "threads": int(workers[2])}
                mode, wait = PHASES[name]
                r = page.evaluate(RUN, [m, n, mode, wait_s if wait is None else wait, [PROMPT, PROMPT2],
                                        {**EXTRA.get(name, {}), **k1, "chatPauseMs": float(pause or 0) * 1e3}])
            print(json.dumps({"phase": phase, "loadavg": round(load, 2), **r}), flush=True)


if __name__ == "__main__":
    a = sys.argv
    main(Path(a[1]), int(a[2]) if len(a) > 2 else 8,
         a[3].split(",") if len(a) > 3 else ["cold", "warm", "warm-load", "warm-wait", "pipelines"],
         float(a[4]) if len(a) > 4 else 10.0)
