// webinfer's public ES module: run a packaged language model in this page's browser, on its GPU, offline.
//
//   import * as webinfer from "./webinfer.js";
//   const engine = await webinfer.load("models/SmolLM2-135M-Instruct/manifest.json", {onProgress: console.log});
//   for await (const chunk of engine.chat.completions.create({messages, stream: true}))
//     out.textContent += chunk.choices[0].delta.content ?? "";
//
// The engine lives in a dedicated Web Worker (Pyodide + WebGPU); this module only passes messages, so the page
// never blocks. engine.chat.completions.create and engine.completions.create take the request objects of
// OpenAI's API (as Python's LLM does: tools, n, response_format, ...) and return the same shapes.

import { loadModelFiles } from "./loader.js";

const ROOT = new URL("./", import.meta.url);
let siteConfig = null;

export async function site() {
  if (!siteConfig) {
    const res = await fetch(new URL("site.json", ROOT));
    if (!res.ok) throw new Error(`site.json: HTTP ${res.status}: is webinfer.js served from a site built by \`webinfer site\`?`);
    siteConfig = await res.json();
  }
  return siteConfig;
}

export class PreflightError extends Error {
  constructor(problems) { super(problems.join(" ")); this.name = "PreflightError"; this.problems = problems; }
}

/**
 * Check what this browser offers before any download. model: an entry of site.json's models (bytes,
 * kv_bytes_per_token) or null. Returns {ok, problems, notes, adapter, features, limits, storage}.
 */
export async function preflight(model = null, { contextTokens = 2048 } = {}) {
  const problems = [], notes = [];
  const out = { ok: false, problems, notes, adapter: null, features: [], limits: {}, storage: null };
  if (!("gpu" in navigator)) {
    problems.push("This browser has no WebGPU. Use a recent Chrome, Edge or Safari, or enable WebGPU in the browser's settings.");
    return out;
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    problems.push("WebGPU is present but no GPU adapter is available (disabled, blocklisted, or in a restricted context).");
    return out;
  }
  out.adapter = adapter.info ? { vendor: adapter.info.vendor, architecture: adapter.info.architecture,
    description: adapter.info.description, fallback: !!adapter.info.isFallbackAdapter } : {};
  out.features = [...adapter.features];
  for (const k of ["maxStorageBufferBindingSize", "maxBufferSize", "maxStorageBuffersPerShaderStage",
                   "maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup"]) out.limits[k] = adapter.limits[k];
  if (!adapter.features.has("shader-f16")) notes.push("No shader-f16 on this GPU: using the f32 path (slower, not an error).");
  if (out.adapter.fallback) notes.push("This is a software (fallback) adapter: expect slow generation.");
  if (out.limits.maxStorageBuffersPerShaderStage < 8) problems.push(`The GPU allows only ${out.limits.maxStorageBuffersPerShaderStage} storage buffers per shader; 8 are needed.`);
  if (model) {
    const need = model.bytes + (model.kv_bytes_per_token || 0) * contextTokens;
    out.memoryNeed = need;
    const devMem = navigator.deviceMemory ? navigator.deviceMemory * 2 ** 30 : null;
    if (devMem && need > devMem / 2) notes.push(`The model needs about ${fmtBytes(need)} of GPU memory; this device reports ${fmtBytes(devMem)} of RAM.`);
    if (navigator.storage?.estimate) {
      const est = await navigator.storage.estimate();
      out.storage = est;
      const free = (est.quota ?? 0) - (est.usage ?? 0);
      if (free < model.bytes) notes.push(`Only ${fmtBytes(free)} of storage is available for ${fmtBytes(model.bytes)} of model: it will be kept in memory and downloaded again next visit.`);
    }
    if (navigator.storage?.persist) {
      try { out.persisted = await navigator.storage.persist(); } catch { out.persisted = false; }
      if (!out.persisted) notes.push("The browser may evict the cached model under storage pressure (persistent storage was not granted).");
    }
  }
  out.ok = problems.length === 0;
  return out;
}

export function fmtBytes(n) {
  if (n == null) return "?";
  const u = ["B", "KB", "MB", "GB"]; let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

class WorkerClient {
  constructor() {
    this.worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
    this.nextId = 1;
    this.pending = new Map();
    this.worker.onmessage = (ev) => this.onMessage(ev.data);
    this.worker.onerror = (ev) => {
      for (const p of this.pending.values()) p.reject(new Error(`worker failed: ${ev.message}`));
      this.pending.clear();
    };
  }
  onMessage(msg) {
    const p = this.pending.get(msg.id);
    if (!p) return;
    if (msg.type === "progress") p.onProgress?.(msg);
    else if (msg.type === "chunk") p.onChunk?.(msg.chunk);
    else {
      this.pending.delete(msg.id);
      if (msg.type === "result") p.resolve(msg.value);
      else { const e = new Error(msg.message); e.name = msg.name; e.details = msg.details; p.reject(e); }
    }
  }
  call(type, body = {}, hooks = {}, transfer = []) {
    const id = this.nextId++;
    const promise = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, ...hooks }));
    this.worker.postMessage({ id, type, ...body }, transfer);
    return { id, promise };
  }
  stop(target) { this.worker.postMessage({ type: "stop", target }); }
}

class Engine {
  constructor(client, info) {
    this.client = client;
    this.info = info;
    this.running = new Set();  // ids of this page's streams in flight (they run concurrently in one engine)
    this.chat = { completions: { create: (req) => this.create(req, "chat") } };
    this.completions = { create: (req) => this.create(req, "completion") };
  }
  // The request objects and results of Python's LLM (webinfer/api.py), whose one mapping runs in the worker.
  // Streaming: an async iterator of chunks (breaking out of the loop stops that generation only); its `stats` holds
  // the request's stats once it has ended. Otherwise a Promise of the whole response: the dict Python's
  // llm.chat.completions.create / llm.completions.create returns (choices with message.tool_calls, n choices,
  // token_ids, usage, prompt_token_ids); engine.lastStats then holds its stats. Calls may overlap: the worker's
  // engine batches them.
  create(request, kind = "chat") {
    if (request.stream) return this.stream(request, kind);
    const { id, promise } = this.client.call("chat", { request, kind });
    this.running.add(id);
    return promise.then(({ response, stats }) => { this.lastStats = stats; return response; })
      .finally(() => this.running.delete(id));
  }
  stream(request, kind = "chat") {
    const queue = [];
    let wake = null, finished = false, failure = null;
    const push = () => { if (wake) { wake(); wake = null; } };
    const { id, promise } = this.client.call("chat", { request: { ...request, stream: true }, kind },
      { onChunk: (c) => { queue.push(c); push(); } });
    this.running.add(id);
    const self = this;
    const iter = {
      stats: null,
      [Symbol.asyncIterator]() { return this; },
      async next() {
        for (;;) {
          if (queue.length) return { value: queue.shift(), done: false };
          if (failure) throw failure;
          if (finished) return { value: undefined, done: true };
          await new Promise((r) => { wake = r; });
        }
      },
      async return() { self.client.stop(id); await promise.catch(() => {}); return { value: undefined, done: true }; },
    };
    promise.then((stats) => { iter.stats = stats; this.lastStats = stats; }, (e) => { failure = e; })
      .finally(() => { finished = true; this.running.delete(id); push(); });
    return iter;
  }
  /** Stop every request of this engine: a stream ends with finish_reason "abort" after its next chunk, a whole
   * request rejects with an AbortError. */
  stop() { for (const id of this.running) this.client.stop(id); }
  /** What the worker's work after ready has done so far: {pending, compiled, ... (the lazy GPU pipelines),
   * pycache: {state: "written" | "hit" | "off" | "error", files, ms}} (Python's bytecode kept for the next visit). */
  backgroundStatus() { return this.client.call("background").promise; }
  /** Tests only: destroy the GPU device as a driver reset would; the next message rebuilds the engine. */
  _loseDeviceForTest() { return this.client.call("loseDevice").promise; }
  /** Tests only: lower the GPU command encoder's handle-table limit; resolves to the table's rebuilds so far. */
  _handleLimitForTest(limit) { return this.client.call("handleLimit", { limit }).promise; }
  unload() { this.client.worker.terminate(); }
}

/**
 * Load a package and return an engine with an OpenAI-shaped chat.completions.create.
 * options: onProgress(p) with p.phase in "preflight" | "runtime" | "cache" | "download" | "done" | "compile" |
 *          "build" and byte counts (the runtime starts with the files: "runtime" comes again after them while it is
 *          not ready; "compile": loaded of total GPU pipelines made ahead are compiled),
 *          manifestSha256 (pins the manifest; default: from site.json when the URL is one of its models),
 *          preflight (default true),
 *          backend: "auto" (default: the CPU engine when there is no WebGPU adapter or only a fallback/software
 *          one, else WebGPU), "webgpu" or "cpu" (the WebAssembly SIMD engine, no GPU needed);
 *          engine.info.backend and engine.info.backend_reason say which was chosen and why (engine.info.cpu_mode:
 *          the CPU engine's mode),
 *          cpuMode: the CPU engine's "exact" (default; f32 precision) or "fast" (int8 activations) mode,
 *          threads: the CPU engine's Workers, 1 to 8 (default: navigator.hardwareConcurrency, at most 4, when the
 *          page is cross-origin isolated; the same output); engine.info.timings.wasm_threads / wasm_reason say
 *          how many run and why; with more than one, each decode block runs on the count of them (1, 2, 4, ...,
 *          all) its own timings show fastest (a chat's stats.cpu_threads, stats.cpu_thread_choice),
 *          speculative: "prompt-lookup" to verify proposed tokens each step (the same output, fewer steps when the
 *          answer repeats its context), speculativeTokens (proposals per step, default 4),
 *          decodeBlock: decode steps the GPU runs per read-back while every request decodes (default 8, 1: off;
 *          the same tokens, streamed a block at a time), decodeBlockMs: and at most about this long, from the
 *          measured step time (default 50; a slow GPU then decodes single steps, so streaming and Stop stay prompt),
 *          gemvKsplit: lanes per group of 4 weight rows in the WebGPU engine's decode GEMVs (null: 1 on a fallback
 *          adapter, 8 on a GPU; 1, 2, 4, 8, 16 or 32; the logits' last bits depend on it; engine.info.gemv_ksplit
 *          says which runs),
 *          pipelines: how the GPU pipelines the last load of this package created are made again before Python asks
 *          for them (see prepare()): "async" (default), "sync" or "off".
 * engine.info.timings: where the load's time went (stage keys: docs/performance.md "Browser").
 */
export async function load(manifestUrl, options = {}) {
  const { onProgress = () => {} } = options;
  const tLoad = performance.now();
  const cfg = await site();
  const abs = new URL(manifestUrl, document.baseURI).href;
  const model = cfg.models.find((m) => new URL(m.manifest, ROOT).href === abs) || null;
  const backend = options.backend ?? "auto";
  let preflightMs = 0;
  if (options.preflight !== false) {
    const pf = await preflight(model);
    preflightMs = performance.now() - tLoad;
    onProgress({ phase: "preflight", preflight: pf });
    if (!pf.ok && backend === "webgpu") throw new PreflightError(pf.problems);  // the CPU engine needs no GPU
  }
  // the worker starts the Python runtime (if prepare() has not) while this thread reads or downloads the files
  const client = takePrepared() ?? new WorkerClient();
  client.call("prepare", { site: cfg, base: ROOT.href, sha256: options.manifestSha256 ?? model?.sha256 ?? null,
                           pipelines: backend === "cpu" ? "off" : options.pipelines ?? "async" })
    .promise.catch(() => {});
  onProgress({ phase: "runtime" });
  let got;
  try {
    got = await loadModelFiles(abs, { manifestSha256: options.manifestSha256 ?? model?.sha256 ?? null, onProgress,
                                      keepPackages: cfg.models.map((m) => m.sha256) });
  } catch (e) {
    client.worker.terminate();
    throw e;
  }
  const tFiles = performance.now();
  const { promise } = client.call("load", {
    site: cfg, base: ROOT.href, manifestUrl: abs, manifestText: got.manifestText, manifestSha256: got.manifestSha256,
    files: got.files,
    engine: { backend, cpu_mode: options.cpuMode ?? "exact", threads: options.threads ?? null,
              speculative: options.speculative ?? null,
              speculative_tokens: options.speculativeTokens ?? 4, decode_block: options.decodeBlock ?? 8,
              decode_block_ms: options.decodeBlockMs ?? 50, gemv_ksplit: options.gemvKsplit ?? null },
  }, { onProgress }, [...new Set(Object.values(got.files).map((b) => b.buffer))]);  // moved, not copied
  let info;
  try {
    info = await promise;
  } catch (e) {
    client.worker.terminate();
    throw e;
  }
  info.timings = { ...got.stats, preflight_ms: preflightMs, files_ms: tFiles - tLoad - preflightMs, ...info.timings,
                   load_to_ready_ms: performance.now() - tLoad };
  if (client.preparedAt != null) info.timings.prepare_to_ready_ms = performance.now() - client.preparedAt;
  return new Engine(client, info);
}

let prepared = null;  // a worker started by prepare() and not yet taken by load()

function takePrepared() {
  const c = prepared;
  prepared = null;
  return c;
}

/**
 * Start the engine's worker now, before load(): the Python runtime (Pyodide and the wheels, seconds) and, when this
 * browser loaded `model` before, its GPU device and the pipelines that load created (shader compilation, most of a
 * build on a software GPU) run while the page waits for the user. The next load() takes this worker over and only
 * waits for what is left. model: an entry of site.json's models (or null: the runtime only).
 * options.pipelines: "async" (default: createComputePipelineAsync, compiled beside other GPU work), "sync"
 * (createComputePipeline: compiled in order, before any GPU call made after them) or "off". Cheap to call; a
 * second call does nothing until load() ran.
 */
export async function prepare(model = null, { pipelines = "async" } = {}) {
  if (prepared) return;
  const cfg = await site();
  prepared = new WorkerClient();
  prepared.preparedAt = performance.now();
  prepared.call("prepare", { site: cfg, base: ROOT.href, sha256: model?.sha256 ?? null, pipelines })
    .promise.catch(() => {});  // nothing to report here: load() meets any failure again
}

/**
 * Start a worker and run a GPU self-test: "copy" (shaders/copy.wgsl through the KernelLibrary), or "gemv" (the
 * quantized Linear on weights given in spec, see browser_worker.selftest_gemv). For diagnostics and tests.
 */
export async function selftest(name = "copy", spec = null) {
  const cfg = await site();
  const client = new WorkerClient();
  const init = await client.call("init", { site: cfg, base: ROOT.href }).promise;
  const value = await client.call("selftest", { name, spec }).promise;
  client.worker.terminate();
  return { ...value, timings: init.timings };
}
