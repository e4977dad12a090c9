// The chat worker: hosts Pyodide and the engine, so the page's thread never blocks on Python or the GPU.
// Protocol (postMessage, every reply carries the request's id):
//   {id, type: "init", site}                 -> {type: "ready", timings}
//   {id, type: "selftest", name, spec}       -> {type: "result", value}   (name: copy | gemv)
//   {id, type: "load", manifestUrl, sha256, engine} -> {type: "progress", ...}*, {type: "result", value}
//                                            (engine: {backend: "webgpu" | "cpu" | "auto", speculative,
//                                             speculative_tokens}; value.backend, value.backend_reason)
//   {id, type: "chat", request, kind}        -> {type: "chunk", chunk}*, {type: "result", value}
//                                            (kind: "chat" | "completion"; without request.stream no chunks and
//                                             value = {response, stats})
//   {type: "stop", target}                   (no reply: that chat is aborted after its next chunk; others go on)
// Errors: {id, type: "error", name, message, details}.
import { loadModelFiles } from "./loader.js";

let pyodide = null;
let worker = null;          // the Python module webinfer.browser_worker
let site = null;
const stops = new Set();
const timings = {};

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

async function init(msg) {
  if (pyodide) return { timings };
  site = msg.site;
  const base = new URL(msg.base || "./", self.location.href);
  const t0 = performance.now();
  const { loadPyodide } = await import(new URL(site.pyodide + "pyodide.mjs", base).href);
  pyodide = await loadPyodide({ indexURL: new URL(site.pyodide, base).href });
  const t1 = performance.now();
  await pyodide.loadPackage(site.wheels.map((w) => new URL(w, base).href));
  worker = pyodide.pyimport("webinfer.browser_worker");
  const t2 = performance.now();
  timings.pyodide_start_ms = t1 - t0;
  timings.wheel_install_ms = t2 - t1;
  return { timings };
}

async function load(msg) {
  const t0 = performance.now();
  const onProgress = (p) => post({ id: msg.id, type: "progress", ...p });
  const { manifestText, files, stats } = await loadModelFiles(msg.manifestUrl, {
    manifestSha256: msg.sha256, onProgress, keepPackages: msg.keepPackages,
  });
  const t1 = performance.now();
  const map = new Map(Object.entries(files));
  const value = unwrap(await worker.load(manifestText, map, msg.manifestUrl, JSON.stringify(msg.engine || {})));
  value.timings = { ...timings, ...stats, files_ms: t1 - t0, python_load_ms: performance.now() - t1, ...value.timings };
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

const handlers = { init, load, chat, selftest, loseDevice };

// Setup messages (init, load, selftest, loseDevice) run one at a time, in order. Chats run concurrently: each is
// one request in the shared engine, which batches them; a chat starts once the setup sent before it is done.
// stop must get through at once, while chats run.
const CONCURRENT = new Set(["chat"]);
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
