// The chat worker: hosts Pyodide and the engine, so the page's thread never blocks on Python or the GPU.
// Protocol (postMessage, every reply carries the request's id):
//   {id, type: "init", site}                 -> {type: "ready", timings}
//   {id, type: "prepare", site, sha256, pipelines} -> {type: "result"} at once; starts the Python runtime and, when
//                                            an earlier visit left a pipeline record for this model, the GPU device
//                                            and those pipelines (pipelines: "async" | "sync" | "off"), so a later
//                                            load only waits for what is left
//   {id, type: "selftest", name, spec}       -> {type: "result", value}   (name: copy | gemv)
//   {id, type: "load", site, manifestUrl, manifestText, manifestSha256, files, engine}
//                                            -> {type: "progress", ...}*, {type: "result", value}
//                                            (files: name -> Uint8Array, read and verified by loader.js;
//                                             engine: {backend: "webgpu" | "cpu" | "auto", speculative,
//                                             speculative_tokens}; value.backend, value.backend_reason)
//   {id, type: "chat", request, kind}        -> {type: "chunk", chunk}*, {type: "result", value}
//                                            (kind: "chat" | "completion"; without request.stream no chunks and
//                                             value = {response, stats})
//   {id, type: "background"}                 -> {type: "result", value}: what the work after ready has done
//                                            (the lazy pipelines, the bytecode cache; diagnostics and tests)
//   {type: "stop", target}                   (no reply: that chat is aborted after its next chunk; others go on)
// Errors: {id, type: "error", name, message, details}.
import { deleteRuntimeSnapshot, readPipelineRecord, readRuntimeSnapshot, writePipelineRecord } from "./loader.js";

let pyodide = null;
let worker = null;          // the Python module webinfer.browser_worker
let runtime = null;         // the promise of Pyodide + wheels + webinfer imported (started once)
let ahead = null;           // the promise of {adapter, device, pipelines: Map, timings} or null (prepare)
const stops = new Set();
const timings = {};
const T0 = performance.now();  // the worker's start: the page's stage times are measured from here

function post(msg) { self.postMessage(msg); }

function errorReply(id, e) {
  post({ id, type: "error", name: e && e.name || "Error", message: String(e && e.message || e), details: e && e.details || null });
}

// The Python entry points (webinfer/browser_worker.py) return {ok, value} or {ok: false, error: {name, message}}.
function unwrap(pyResult) {
  const r = pyResult.toJs({ dict_converter: Object.fromEntries });
  pyResult.destroy();
  if (r.ok) return r.value;
  const e = new Error(r.error.message);
  e.name = r.error.name;
  throw e;
}

// Python's bytecode for the wheels' modules, kept in IndexedDB across visits (Pyodide compiles a module's source
// at every import: ~1.3 s of webinfer, jinja2 and the grammar package here). Keyed by the wheels' content-addressed
// directories (a new site version is a new key, whose first visit compiles and stores again); "unchecked-hash"
// .pyc files, so Python never compares them with the freshly unpacked sources' times. Written after ready, while
// the engine is idle (browser_worker.py start_deferred). No IndexedDB (private windows): no cache, the same load.
const PYCACHE = "/webinfer-pycache";
async function mountPycache(site) {
  try {
    const key = site.wheels.map((w) => w.split("/").at(-2)).join("-");
    pyodide.FS.mkdir(PYCACHE);
    pyodide.FS.mount(pyodide.FS.filesystems.IDBFS, {}, PYCACHE);
    await syncfs(true);
    for (const old of pyodide.FS.readdir(PYCACHE)) {  // other versions' bytecode: dropped
      if (old !== "." && old !== ".." && old !== key) pyodide.runPython(`import shutil; shutil.rmtree(${JSON.stringify(PYCACHE + "/" + old)})`);
    }
    pyodide.runPython(`import sys; sys.pycache_prefix = ${JSON.stringify(PYCACHE + "/" + key)}`);
    const done = pyodide.FS.analyzePath(`${PYCACHE}/${key}/complete`).exists;
    timings.pycache = done ? "hit" : "empty";
  } catch (e) {
    timings.pycache = `off (${e && e.message || e})`;
  }
}
function syncfs(populate) {
  return new Promise((resolve, reject) => pyodide.FS.syncfs(populate, (e) => (e ? reject(e) : resolve())));
}
self.webinferPersistPycache = () => syncfs(false);  // called by Python once it has written the bytecode

// Called by Python after ready while the engine idles (browser_worker.py start_deferred): makes the runtime
// snapshot in its own Worker unless this runtime came from one. Resolves to a JSON status.
self.webinferMakeRuntimeSnapshot = () => new Promise((resolve) => {
  if (timings.runtime_snapshot === "restored" || !runtimeSite) {
    resolve(JSON.stringify({ state: timings.runtime_snapshot === "restored" ? "restored" : "off" }));
    return;
  }
  const w = new Worker(new URL("./snapshot-worker.js", import.meta.url), { type: "module" });
  const done = (status) => {
    clearTimeout(timer);
    w.terminate();
    resolve(JSON.stringify(status));
  };
  // ~5 s here; a Worker that never answers must not hold the rest of the work after ready (browser_worker.py)
  const timer = setTimeout(() => done({ state: "error", error: "no answer in 180 s" }), 180_000);
  w.onmessage = ({ data }) => done({ state: data.ok ? "written" : "error", ...data });
  w.onerror = (e) => done({ state: "error", error: String(e.message || e) });
  w.postMessage({ site: runtimeSite.site, base: runtimeSite.base, key: runtimeKey(runtimeSite.site) });
});

// Pyodide restores a snapshot into the memory its module declares (30 MiB), but the snapshot runtime grew past it
// (the imports): grow the new instance's memory to the snapshot's heap before Pyodide takes its views. The
// snapshot's header length is its second u32 (Pyodide 314's format; a mismatch fails the restore, which falls back).
async function withMemoryFor(snap, start) {
  const heap = snap.length - new Uint32Array(snap.buffer, snap.byteOffset, 2)[1];
  const orig = { streaming: WebAssembly.instantiateStreaming, plain: WebAssembly.instantiate };
  const grow = (result) => {
    const mem = result?.instance?.exports?.memory;
    if (mem instanceof WebAssembly.Memory && mem.buffer.byteLength < heap) {
      mem.grow(Math.ceil((heap - mem.buffer.byteLength) / 65536));
    }
    return result;
  };
  WebAssembly.instantiateStreaming = async (...a) => grow(await orig.streaming.apply(WebAssembly, a));
  WebAssembly.instantiate = async (...a) => grow(await orig.plain.apply(WebAssembly, a));
  try {
    return await start();
  } finally {
    WebAssembly.instantiateStreaming = orig.streaming;
    WebAssembly.instantiate = orig.plain;
  }
}

// The runtime snapshot's key: the Pyodide build and the wheels' content-addressed folders (a new site version is a
// new key; loader.js keeps one).
function runtimeKey(site) {
  return [site.pyodide, ...site.wheels.map((w) => w.split("/").at(-2))].join("|");
}
let runtimeSite = null;  // {site, base} of the started runtime: what the snapshot Worker rebuilds

// Pyodide, the wheels and `import webinfer.browser_worker`, started by the first message that needs them. A later
// visit restores the memory snapshot an earlier one left (web/snapshot-worker.js), which skips Pyodide's start
// and the imports; one that fails to restore is deleted and the runtime starts as on a first visit.
function startRuntime(site, baseHref) {
  runtime ??= (async () => {
    const base = new URL(baseHref || "./", self.location.href);
    runtimeSite = { site, base: base.href };
    const t0 = performance.now();
    const { loadPyodide } = await import(new URL(site.pyodide + "pyodide.mjs", base).href);
    const indexURL = new URL(site.pyodide, base).href;
    let snap = null, t1, t1b;
    try { snap = await readRuntimeSnapshot(runtimeKey(site)); } catch { /* no storage: a plain start */ }
    const boot = async (from) => {  // a runtime, its wheels' files and the worker module
      pyodide = from ? await withMemoryFor(from, () => loadPyodide({ indexURL, _loadSnapshot: from }))
                     : await loadPyodide({ indexURL });
      t1 = performance.now();
      await mountPycache(site);
      t1b = performance.now();
      await pyodide.loadPackage(site.wheels.map((w) => new URL(w, base).href));
      worker = pyodide.pyimport("webinfer.browser_worker");
    };
    try {
      await boot(snap);
      timings.runtime_snapshot = snap ? "restored" : "none";
    } catch (e) {
      if (!snap) throw e;
      // a snapshot that does not restore, or whose runtime then fails: deleted, and a plain start (the next visit
      // writes a new one)
      console.warn("webinfer: the runtime snapshot did not restore:", e);
      timings.runtime_snapshot = `failed (${e && e.message || e})`;
      pyodide = worker = null;
      await deleteRuntimeSnapshot(runtimeKey(site)).catch(() => {});
      await boot(null);
    }
    const t2 = performance.now();
    Object.assign(timings, { pyodide_start_ms: t1 - t0, pycache_mount_ms: t1b - t1, wheel_install_ms: t2 - t1b,
                             runtime_ready_at_ms: t2 - T0 });
  })();
  return runtime;
}

async function init(msg) {
  await startRuntime(msg.site, msg.base);
  return { timings };
}

function adapterFingerprint(adapter) {  // the same string as webinfer/gpu/browser.py adapter_fingerprint
  const i = adapter.info || {};
  return ["vendor", "architecture", "device", "description"].map((f) => i[f] || "").join("|");
}

// The device and pipelines of the last visit's record for this model (see webinfer/gpu/browser.py), made while
// Python starts. null when there is no record, no WebGPU, another adapter, or anything fails: Python then does it all.
async function makeAhead(sha256, mode) {
  if (mode === "off" || !sha256 || !("gpu" in navigator)) return null;
  const t0 = performance.now();
  const rec = await readPipelineRecord(sha256);
  if (!rec) return null;
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter || adapterFingerprint(adapter) !== rec.adapter) return null;
  if (!rec.features.every((f) => adapter.features.has(f))) return null;
  const requiredLimits = {};
  for (const k of rec.limits) if (adapter.limits[k] !== undefined) requiredLimits[k] = adapter.limits[k];
  const device = await adapter.requestDevice({ requiredFeatures: rec.features, requiredLimits, label: "webinfer" });
  const t1 = performance.now();
  const pipelines = new Map();
  // the pipelines a chat's first token needs; the record's "deferred" ones Python compiles after ready
  const needed = rec.pipelines.filter((p) => !p.deferred);
  // "async": createComputePipelineAsync; Chrome compiles them off its GPU process's main thread, so other GPU work
  // (the page's preflight, the uploads) does not queue behind them; one that fails is left out and Python creates
  // it again, reporting the error its own way. "sync": createComputePipeline; the GPU process compiles them in
  // order before anything sent after them (these sources compiled without error on this adapter before, so no
  // error scope, which would wait). `ready` resolves when every async one is in the map.
  const timings = { ahead_device_ms: t1 - t0, ahead_pipelines: needed.length, ahead_mode: mode,
                    ahead_issued_at_ms: performance.now() - T0 };
  // done/total and onStep: the load's progress bar while it waits for the compile
  const state = { adapter, device, pipelines, timings, done: 0, total: needed.length, onStep: null };
  const made = needed.map(async ({ code, entry, label }) => {
    const desc = { layout: "auto", label, compute: { module: device.createShaderModule({ code, label }), entryPoint: entry } };
    if (mode === "async") {
      try { pipelines.set(entry + "\0" + code, await device.createComputePipelineAsync(desc)); } catch { /* left out */ }
    } else {
      pipelines.set(entry + "\0" + code, device.createComputePipeline(desc));
    }
    state.done++;
    state.onStep?.();
  });
  state.ready = Promise.all(made).then(() => { timings.ahead_compiled_at_ms = performance.now() - T0; });
  return state;
}

async function prepare(msg) {
  startRuntime(msg.site, msg.base).catch(() => {});  // a failure is reported by the load that needs it
  ahead ??= makeAhead(msg.sha256, msg.pipelines || "async").catch((e) => {
    console.warn("webinfer: pipelines ahead failed:", e);
    return null;
  });
  return true;
}

async function load(msg) {
  // the files come read and verified from the page's thread (webinfer.js): here Pyodide's start, which blocks this
  // thread for seconds at a time, would starve their reads
  const onProgress = (p) => post({ id: msg.id, type: "progress", ...p });
  const rt = startRuntime(msg.site, msg.base);
  const t1 = performance.now();
  if (!worker) onProgress({ phase: "runtime" });
  await rt;
  const runtimeWaitMs = performance.now() - t1;
  const made = ahead ? await ahead : null;
  ahead = null;
  if (made && made.done < made.total) {  // shaders still compiling: a bar of how many are done, then "build"
    made.onStep = () => onProgress({ phase: made.done < made.total ? "compile" : "build", loaded: made.done,
                                     total: made.total });
    made.onStep();
  } else {
    onProgress({ phase: "build" });
  }
  const t2 = performance.now();
  const map = new Map(Object.entries(msg.files));
  const value = unwrap(await worker.load(msg.manifestText, map, msg.manifestUrl, JSON.stringify(msg.engine || {}),
                                         made?.device ? made : undefined));
  const t3 = performance.now();
  value.timings = { ...timings, ...(made?.timings || {}), runtime_wait_ms: runtimeWaitMs,
                    python_load_ms: t3 - t2, ready_at_ms: t3 - T0, ...value.timings };
  if (value.pipeline_record) {  // this build made pipelines the record did not have: keep them for next visit
    await writePipelineRecord(msg.manifestSha256, value.pipeline_record).catch((e) => console.warn("webinfer:", e));
  }
  delete value.pipeline_record;
  return value;
}

async function chat(msg) {
  const emit = (s) => post({ id: msg.id, type: "chunk", chunk: JSON.parse(s) });
  const shouldStop = () => stops.has(msg.id);
  try {
    return unwrap(await worker.chat(JSON.stringify(msg.request), emit, shouldStop, msg.kind || "chat"));
  } finally {
    stops.delete(msg.id);
  }
}

async function selftest(msg) {
  return unwrap(await worker.selftest(msg.name || "copy", JSON.stringify(msg.spec || {})));
}

async function loseDevice() {
  worker.lose_device_for_test();
  await new Promise((r) => setTimeout(r, 50));  // let device.lost resolve
  return true;
}

async function handleLimit(msg) {
  return worker.handle_limit_for_test(msg.limit);
}

async function background() {
  return worker ? JSON.parse(worker.background_stats()) : null;
}

const handlers = { init, prepare, load, chat, selftest, loseDevice, handleLimit, background };

// Setup messages (init, load, selftest, loseDevice, handleLimit) run one at a time, in order. Chats run concurrently: each is
// one request in the shared engine, which batches them; a chat starts once the setup sent before it is done.
// stop must get through at once, while chats run.
const CONCURRENT = new Set(["chat", "background"]);
let queue = Promise.resolve();
async function run(msg, h) {
  try {
    post({ id: msg.id, type: "result", value: await h(msg) });
  } catch (e) {
    errorReply(msg.id, e);
  }
}
self.onmessage = (ev) => {
  const msg = ev.data;
  if (msg.type === "stop") { stops.add(msg.target); return; }
  const h = handlers[msg.type];
  if (!h) { post({ id: msg.id, type: "error", name: "TypeError", message: `unknown message ${msg.type}` }); return; }
  if (CONCURRENT.has(msg.type)) queue.then(() => run(msg, h));
  else queue = queue.then(() => run(msg, h));
};
