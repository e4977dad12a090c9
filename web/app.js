// The chat page (UI thread). The engine runs in a worker behind webinfer.js; this file renders, keeps the history
// (store.js, IndexedDB) and shows what the loader (loader.js) has cached on this device.
import * as webinfer from "./webinfer.js";
import { renderMarkdown, copyText } from "./markdown.js";
import * as store from "./store.js";
import { cacheStatus, removeCachedPackage, storageState } from "./loader.js";
import { explain } from "./errors.js";

const $ = (id) => document.getElementById(id);
const site = JSON.parse($("site").textContent);
const ui = {
  engine: null, loadedSha: null, loading: null,  // the engine in the worker and the package it runs
  loadedEngine: null,                           // the engine choice it was loaded with
  conv: null,                                   // the open conversation
  busy: false, stopping: false,
  cache: {},                                    // manifest sha256 -> {cached, bytes}
};

if ("serviceWorker" in navigator) {
  navigator.serviceWorker.register(`sw.js?v=${site.version}`).catch((e) => console.warn("service worker:", e));
}

const fmt = webinfer.fmtBytes;
const modelBySha = (sha) => site.models.find((m) => m.sha256 === sha) || null;
const selectedModel = () => modelBySha($("model").selectedOptions[0]?.dataset.sha256);

// The engine (a choice of this device, not of a conversation): "auto" (the default: the GPU, or the CPU where the
// adapter is missing, a software one or slower), "webgpu", "cpu" (exact) or "cpu-fast".
const ENGINES = ["auto", "webgpu", "cpu", "cpu-fast"];
const ENGINE_KEY = "webinfer.engine";
function engineChoice() {
  const v = $("engine").value;
  return ENGINES.includes(v) ? v : "auto";
}
function engineOptions(choice) {
  return choice === "cpu-fast" ? { backend: "cpu", cpuMode: "fast" } : { backend: choice };
}
try { $("engine").value = ENGINES.includes(localStorage.getItem(ENGINE_KEY)) ? localStorage.getItem(ENGINE_KEY) : "auto"; }
catch { $("engine").value = "auto"; }  // storage blocked: the default
$("engine").onchange = () => {
  try { localStorage.setItem(ENGINE_KEY, engineChoice()); } catch { /* not kept: still used for this page */ }
  if (ui.engine && ui.loadedEngine !== engineChoice()) status("The engine changes at the next load (Load, or send a message).");
};

// Where the engine runs and why, in words (engine.info: backend, backend_reason, device, timings).
function engineWhere(info) {
  const t = info.timings || {};
  if (info.backend === "cpu") {
    const threads = t.wasm_threads > 1 ? `${t.wasm_threads} threads` : "1 thread";
    const mode = info.cpu_mode === "fast" ? "fast" : "exact";
    return `the CPU (WebAssembly SIMD${t.wasm_variant === "relaxed" ? ", relaxed" : ""}, ${threads}, ${mode} mode)`;
  }
  return info.device?.adapter || "this GPU";
}

// ------------------------------------------------------------------------------------------ status and errors

function status(text) { $("status").textContent = text; }

function showError(e, model = null) {
  const [title, todo] = explain(e, model);
  const box = $("error");
  const strong = document.createElement("strong");
  strong.textContent = title;
  const p = document.createElement("p");
  p.textContent = todo;
  const close = document.createElement("button");
  close.type = "button";
  close.className = "secondary";
  close.textContent = "Dismiss";
  close.onclick = () => { box.hidden = true; $("input").focus(); };
  box.replaceChildren(strong, p, close);
  box.hidden = false;
  box.dataset.kind = e?.name || "Error";
}

function clearError() { $("error").hidden = true; }

// ------------------------------------------------------------------------------------------ models and cache

async function refreshCache() {
  try {
    ui.cache = await cacheStatus(site.models.map((m) => m.sha256));
  } catch (e) {
    console.warn("cache status:", e);
  }
  for (const opt of $("model").options) {
    const c = ui.cache[opt.dataset.sha256];
    const size = fmt(Number(opt.dataset.bytes));
    const loaded = opt.dataset.sha256 === ui.loadedSha ? ", loaded" : "";
    opt.textContent = `${opt.dataset.name} (${size}${c?.cached ? ", cached on this device" : ", download"}${loaded})`;
  }
  const sel = selectedModel();
  $("uncache").hidden = !(sel && ui.cache[sel.sha256]?.cached);
  $("uncache").disabled = ui.busy || !!ui.loading;
  const s = await storageState();
  const used = s.usage != null && s.quota != null ? `Storage: ${fmt(s.usage)} used of ${fmt(s.quota)} allowed. ` : "";
  const kept = s.persisted === true ? "Kept until you remove it." :
    s.persisted === false ? "The browser may clear cached models when space runs low." : "";
  $("storage").textContent = used + kept;
}

function onProgress(p) {
  const wrap = $("progress-wrap"), bar = $("progress");
  wrap.hidden = false;
  if (p.phase === "preflight") {
    stage("Checking this browser's GPU", null);
    const notes = p.preflight.notes.join(" ");
    if (notes) status(notes);
  } else if (p.phase === "runtime") {
    stage("Starting the Python runtime", null);
  } else if (p.phase === "cache" || p.phase === "download") {
    stage(p.phase === "cache" ? "Reading the model from this device" : "Downloading the model", p.loaded / p.total);
    const rate = p.phase === "download" && p.bytesPerSecond ? `, ${fmt(p.bytesPerSecond)}/s` : "";
    const left = p.phase === "download" && p.secondsLeft != null ? `, about ${Math.ceil(p.secondsLeft)} s left` : "";
    $("bytes").textContent = `${fmt(p.loaded)} of ${fmt(p.total)}${rate}${left}`;
    if (p.warning) status(p.warning);
  } else if (p.phase === "compile") {  // the GPU shaders made ahead (a second visit), most of a software GPU's load
    stage("Compiling the GPU shaders", p.loaded / p.total);
    $("bytes").textContent = `${p.loaded} of ${p.total} shaders`;
  } else if (p.phase === "done" || p.phase === "build") {
    const on = { webgpu: " on the GPU", cpu: " on the CPU", "cpu-fast": " on the CPU" }[engineChoice()] ?? "";
    stage(`Building the model${on}`, null);
    $("bytes").textContent = "";
  }
  function stage(text, fraction) {
    $("stage").textContent = text;
    document.body.dataset.stage = p.phase;
    if (fraction == null) bar.removeAttribute("value");  // indeterminate: a stage without byte counts
    else bar.value = fraction;
    bar.setAttribute("aria-valuetext", fraction == null ? text : `${text}: ${Math.round(fraction * 100)} %`);
  }
}

// Where a load's time went (webinfer.js timings; stages overlap: the runtime starts when the page opens).
function stageTimes(t) {
  if (!t) return "";
  const s = (ms) => `${(ms / 1000).toFixed(1)} s`;
  const parts = [];
  if (t.pyodide_start_ms != null) parts.push(`Python runtime ${s(t.pyodide_start_ms + (t.wheel_install_ms || 0))}`);
  if (t.files_ms != null) parts.push(`${t.files_downloaded ? "download" : "model files"} ${s(t.files_ms)}`);
  // the wait for shaders compiled ahead (from page open) is part of the build the user waited for
  if (t.engine_build_ms != null) {
    parts.push(`${t.wasm_variant ? "CPU" : "GPU"} build ${s(t.engine_build_ms + (t.ahead_compile_wait_ms || 0))}`);
  }
  return parts.length ? `: ${parts.join(", ")}` : "";
}

// Load the selected model (or `model`), replacing the one loaded. Resolves true when an engine is ready.
async function loadModel(model = selectedModel()) {
  if (!model) { showError(new Error("This site lists no model."), null); return false; }
  if (ui.loading) return ui.loading;
  ui.loading = (async () => {
    clearError();
    try {
      ui.engine?.unload();  // its worker and GPU memory go; the files stay cached for switching back
      ui.engine = null;
      ui.loadedSha = null;
      ui.loadedEngine = null;
      $("where").hidden = true;
      delete document.body.dataset.loaded;
      delete document.body.dataset.backend;
      const t0 = performance.now();
      const choice = engineChoice();
      status(`Loading ${model.name}…`);
      ui.engine = await webinfer.load(model.manifest, { onProgress, manifestSha256: model.sha256,
                                                        ...engineOptions(choice) });
      ui.loadedSha = model.sha256;
      ui.loadedEngine = choice;
      const info = ui.engine.info;
      document.body.dataset.backend = info.backend;
      const warn = info.timings?.warning;
      // Auto says why it chose (no adapter, a software one, or which side a start-up GEMV ran faster on); the
      // line stays while the model is loaded (the status line below it changes with every answer)
      const why = choice === "auto" && info.backend_reason ? ` (Auto: ${info.backend_reason})` : "";
      $("where").textContent = `${model.name} runs on ${engineWhere(info)}${why}.`;
      $("where").hidden = false;
      status(`${model.name} ready on ${engineWhere(info)} (loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s` +
             `${stageTimes(info.timings)})` + (warn ? `. ${warn}` : ""));
      document.body.dataset.loaded = model.sha256;
      return true;
    } catch (e) {
      status(`${model.name} is not loaded.`);
      showError(e, model);
      return false;
    } finally {
      $("progress-wrap").hidden = true;
      delete document.body.dataset.stage;
      ui.loading = null;
      setBusy(ui.busy);
      refreshCache();
    }
  })();
  setBusy(ui.busy);  // now that ui.loading is set: Send, Load and the picker wait for it
  return ui.loading;
}

async function uncache() {
  const m = selectedModel();
  if (!m) return;
  const n = await removeCachedPackage(m.sha256);
  status(`${m.name} removed from this device (${n} file${n === 1 ? "" : "s"} deleted; files other models use are kept).`);
  await refreshCache();
  $("model").focus();
}

// ------------------------------------------------------------------------------------------ conversations

async function renderHistory() {
  const list = await store.listConversations();
  const items = list.map((c) => {
    const li = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "conv";
    open.textContent = c.title;
    open.title = c.title;
    if (ui.conv && c.id === ui.conv.id) open.setAttribute("aria-current", "true");
    open.onclick = () => openConversation(c.id);
    const del = document.createElement("button");
    del.type = "button";
    del.className = "del secondary";
    del.textContent = "Delete";
    del.setAttribute("aria-label", `Delete conversation: ${c.title}`);
    del.onclick = () => removeConversation(c);
    li.append(open, del);
    return li;
  });
  $("history").replaceChildren(...items);
}

async function openConversation(id) {
  if (ui.busy) return;
  const conv = await store.getConversation(id);
  if (!conv) return;
  ui.conv = conv;
  const m = modelBySha(conv.model);
  if (m && !ui.loading) $("model").value = m.manifest;
  renderLog();
  await renderHistory();
  closeSidebar();
  $("input").focus();
}

async function removeConversation(c) {
  if (!confirm(`Delete the conversation "${c.title}"? This cannot be undone.`)) return;
  await store.deleteConversation(c.id);
  if (ui.conv?.id === c.id) newChat(false);
  await renderHistory();
  $("new").focus();
}

function newChat(focus = true) {
  if (ui.busy) ui.engine?.stop();
  const prev = ui.conv?.settings;
  ui.conv = store.newConversation(selectedModel()?.sha256 ?? null, prev || store.DEFAULT_SETTINGS);
  renderLog();
  renderHistory();
  $("stats").textContent = "";
  closeSidebar();
  if (focus) $("input").focus();
}

async function exportAll() {
  const blob = new Blob([await store.exportJSON()], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `webinfer-chats-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

// ------------------------------------------------------------------------------------------ messages

// scrollTo: where to leave the log (default: at the end, the newest message)
function renderLog(scrollTo = null) {
  const els = ui.conv.messages.map((m, i) => messageEl(m, i));
  if (!els.length) {
    const empty = document.createElement("p");
    empty.className = "empty muted";
    empty.textContent = "Start the conversation below. Answers are generated on this device.";
    els.push(empty);
  }
  $("log").replaceChildren(...els);
  $("log").scrollTop = scrollTo ?? $("log").scrollHeight;
}

function renderContent(el, m) {
  const content = el.querySelector(".content");
  if (m.role === "assistant") content.replaceChildren(renderMarkdown(m.content));
  else content.textContent = m.content;
}

function messageEl(m, i) {
  const art = document.createElement("article");
  art.className = `msg ${m.role}`;
  art.setAttribute("aria-label", m.role === "user" ? "You" : "Assistant");
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = m.role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "content";
  art.append(who, content);
  renderContent(art, m);
  const note = m.stopped ? "Stopped." : m.truncated ? "Cut at the length limit (max tokens or the model's context)." : "";
  if (note || m.stats) {
    const s = document.createElement("div");
    s.className = "note muted";
    s.textContent = [note, m.stats].filter(Boolean).join(" ");
    art.append(s);
  }
  const actions = document.createElement("div");
  actions.className = "actions";
  const last = i === ui.conv.messages.length - 1;
  if (m.role === "user") {
    actions.append(button("Edit", `Edit message ${i + 1} and send again`, () => editMessage(art, i)));
    // a message left without an answer (the load or the answer failed): answer it without retyping
    if (last) actions.append(button("Answer", "Answer this message", regenerate, "answer"));
  } else {
    actions.append(button("Copy", `Copy answer ${i + 1}`, (ev) => copyText(m.content, ev.currentTarget)));
    if (last) actions.append(button("Regenerate", "Regenerate the last answer", regenerate));
  }
  art.append(actions);
  return art;
}

function button(text, label, onclick, extraClass = "") {
  const b = document.createElement("button");
  b.type = "button";
  b.className = `secondary small ${extraClass}`.trim();
  b.textContent = text;
  b.setAttribute("aria-label", label);
  b.onclick = onclick;
  b.disabled = ui.busy || !!ui.loading;
  return b;
}

function editMessage(art, i) {
  if (ui.busy || ui.loading) return;
  const m = ui.conv.messages[i];
  const content = art.querySelector(".content");
  const ta = document.createElement("textarea");
  ta.value = m.content;
  ta.rows = Math.min(10, m.content.split("\n").length + 1);
  ta.setAttribute("aria-label", "Edited message");
  const save = button("Save and send", "Save the edited message and send it again", async () => {
    const text = ta.value.trim();
    if (!text) return;
    // everything after the edited message is replaced by a new answer
    ui.conv.messages = ui.conv.messages.slice(0, i).concat([{ role: "user", content: text }]);
    await store.saveConversation(ui.conv);
    renderLog();
    renderHistory();
    generate();
  });
  const cancel = button("Cancel", "Cancel editing", () => { renderLog(); $("input").focus(); });
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); save.click(); }
    if (ev.key === "Escape") { ev.preventDefault(); cancel.click(); }
  });
  content.replaceChildren(ta);
  art.querySelector(".actions").replaceChildren(save, cancel);
  ta.focus();
}

async function regenerate() {
  if (ui.busy || ui.loading) return;
  const msgs = ui.conv.messages;
  if (msgs.at(-1)?.role === "assistant") msgs.pop();
  renderLog();
  generate();
}

function setBusy(busy) {
  ui.busy = busy;
  $("send").disabled = busy || !!ui.loading;
  $("stop").disabled = !busy;
  $("load").disabled = busy || !!ui.loading;
  $("model").disabled = busy || !!ui.loading;
  $("engine").disabled = busy || !!ui.loading;
  $("uncache").disabled = busy || !!ui.loading;
  for (const b of $("log").querySelectorAll(".actions button")) b.disabled = busy || !!ui.loading;
}

function requestMessages(conv) {
  const s = conv.settings;
  const msgs = conv.messages.map((m) => ({ role: m.role, content: m.content }));
  return s.system.trim() ? [{ role: "system", content: s.system.trim() }, ...msgs] : msgs;
}

async function send(text) {
  ui.conv.messages.push({ role: "user", content: text });
  ui.conv.model = selectedModel()?.sha256 ?? ui.conv.model;
  await store.saveConversation(ui.conv);
  renderLog();
  renderHistory();
  await generate();
}

// Generate the answer to the conversation as it stands (its last message is the user's).
async function generate() {
  const conv = ui.conv;
  const model = selectedModel();
  if (!ui.engine || ui.loadedSha !== model?.sha256 || ui.loadedEngine !== engineChoice()) {
    if (!(await loadModel(model))) return;
  }
  clearError();
  const request = { messages: requestMessages(conv), stream: true, temperature: Number(conv.settings.temperature),
                    top_p: Number(conv.settings.top_p), max_tokens: Number(conv.settings.max_tokens) };
  const msg = { role: "assistant", content: "" };
  conv.messages.push(msg);
  conv.model = ui.loadedSha;
  const log = $("log");
  log.querySelector(".empty")?.remove();
  log.querySelector("button.answer")?.remove();  // the message is being answered now
  const el = messageEl(msg, conv.messages.length - 1);
  el.classList.add("streaming");
  el.setAttribute("aria-busy", "true");
  log.append(el);
  setBusy(true);
  status("Generating…");
  const t0 = performance.now();
  let first = null, nFirst = 0, n = 0, painted = true;  // tokens counted from the chunks' token_ids
  const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 48;
  let follow = true;
  const paint = () => {
    painted = true;
    renderContent(el, msg);
    if (follow) log.scrollTop = log.scrollHeight;  // only while the reader has not scrolled up
  };
  log.onscroll = () => { follow = atBottom(); };
  try {
    const it = ui.engine.chat.completions.create(request);
    for await (const chunk of it) {
      const choice = chunk.choices?.[0];
      const delta = choice?.delta?.content ?? "";
      const got = choice?.token_ids?.length ?? 0;  // a chunk holds 0 or more tokens (text can wait for a
      if (got && first == null) { first = performance.now(); nFirst = got; }  // character's last byte)
      n += got;
      if (delta) {
        msg.content += delta;
        if (painted) { painted = false; requestAnimationFrame(paint); }  // one render per frame, not per token
      }
      if (choice?.finish_reason === "abort") msg.stopped = true;
      if (choice?.finish_reason === "length") msg.truncated = true;
    }
    // decode speed: the tokens that came after the first chunk, over the time since it came
    const tps = n > nFirst ? (n - nFirst) / ((performance.now() - first) / 1000) : 0;
    // where a token's time goes (the worker's split): GPU backend, waiting for the GPU vs Python + JS calls; CPU
    // backend, the engine's step (the wasm call) per step
    const pt = it.stats?.per_token, cpuStep = it.stats?.cpu_ms_per_step, nth = it.stats?.cpu_threads;
    // (cpu_threads: what the last decode block ran on; with several Workers the engine runs each block on the count
    // its measured speed says, which the load-time "N threads" above cannot say)
    const split = pt ? ` · per token: GPU ${pt.read_wait_ms.toFixed(0)} ms, host ${(pt.python_ms + pt.js_upload_ms
      + pt.js_submit_ms + pt.between_steps_ms).toFixed(0)} ms` : ui.engine.info.backend === "cpu" && cpuStep
      ? ` · per step: CPU ${cpuStep.toFixed(1)} ms${nth ? ` on ${nth} thread${nth > 1 ? "s" : ""}` : ""}` : "";
    $("stats").textContent = `TTFT ${first ? (first - t0).toFixed(0) : "–"} ms · ${tps.toFixed(1)} tokens/s · ${n} tokens${split}`;
    msg.stats = `${n} tokens, ${tps.toFixed(1)} tokens/s`;
    status(msg.stopped ? "Stopped." : "Answer finished.");
  } catch (e) {
    if (!msg.content) conv.messages.pop();  // nothing to keep: the user's message stays, Regenerate retries
    else msg.stopped = true;
    status("The answer failed.");
    showError(e, model);
  } finally {
    log.onscroll = null;
    setBusy(false);
    await store.saveConversation(conv);
    renderLog(follow ? null : log.scrollTop);  // a reader who scrolled up stays where they are
    renderHistory();
  }
}

// ------------------------------------------------------------------------------------------ settings

function openSettings() {
  const s = ui.conv.settings;
  $("set-system").value = s.system;
  $("set-temperature").value = s.temperature;
  $("set-top-p").value = s.top_p;
  $("set-max-tokens").value = s.max_tokens;
  $("settings").showModal();
}

// The dialog gives focus back to Settings as it closes; its "close" event comes later, as a task. Put focus there
// only where the browser left it nowhere: a key pressed in between (Shift+Tab) must not have it taken back.
function refocusSettings() {
  const at = document.activeElement;
  if (!at || at === document.body || $("settings").contains(at)) $("settings-open").focus();
}

$("settings").addEventListener("close", async () => {
  if ($("settings").returnValue !== "save") { refocusSettings(); return; }
  const clamp = (v, lo, hi, dflt) => (Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : dflt);
  const d = store.DEFAULT_SETTINGS;
  ui.conv.settings = {
    system: $("set-system").value,
    temperature: clamp(parseFloat($("set-temperature").value), 0, 2, d.temperature),
    top_p: clamp(parseFloat($("set-top-p").value), 0.01, 1, d.top_p),
    max_tokens: Math.round(clamp(parseFloat($("set-max-tokens").value), 1, 8192, d.max_tokens)),
  };
  if (ui.conv.messages.length) await store.saveConversation(ui.conv);
  status("Settings saved for this conversation.");
  refocusSettings();
});

// ------------------------------------------------------------------------------------------ layout and keys

function closeSidebar() {
  if (document.body.classList.contains("nav-open")) {
    document.body.classList.remove("nav-open");
    $("menu").setAttribute("aria-expanded", "false");
  }
}

$("menu").onclick = () => {
  const open = document.body.classList.toggle("nav-open");
  $("menu").setAttribute("aria-expanded", String(open));
  if (open) $("new").focus();
};
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape") return;
  if (ui.busy) { ui.engine?.stop(); return; }
  if (document.body.classList.contains("nav-open")) { closeSidebar(); $("menu").focus(); }
});
$("nav-close").onclick = () => { closeSidebar(); $("menu").focus(); };
$("load").onclick = () => loadModel();
$("uncache").onclick = uncache;
$("model").onchange = () => refreshCache();
$("new").onclick = () => newChat();
$("export").onclick = exportAll;
$("settings-open").onclick = openSettings;
$("stop").onclick = () => ui.engine?.stop();
$("form").onsubmit = (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || ui.busy || ui.loading) return;
  $("input").value = "";
  send(text);
};
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("form").requestSubmit(); }
});

async function start() {
  const list = await store.listConversations().catch((e) => { showError(e); return []; });
  if (list.length) await openConversation(list[0].id);
  else newChat(false);
  await refreshCache();
  // the Python runtime (and the GPU pipelines of the selected model's last load) start now, not on Load
  // (the GPU pipelines only when the GPU may be used: a CPU choice would compile them for nothing)
  if (!new URLSearchParams(location.search).has("noprepare")) {
    webinfer.prepare(selectedModel(), { pipelines: engineChoice().startsWith("cpu") ? "off" : "async" }).catch(() => {});
  }
  document.body.dataset.ready = "1";
  if (new URLSearchParams(location.search).has("autoload")) loadModel();
}
start();
