// The chat page (UI thread). Everything heavy happens in the worker behind webinfer.js; this file only renders.
import * as webinfer from "./webinfer.js";

const $ = (id) => document.getElementById(id);
const site = JSON.parse($("site").textContent);
const ui = { engine: null, messages: [], busy: false };

if ("serviceWorker" in navigator) {
  navigator.serviceWorker.register(`sw.js?v=${site.version}`).catch((e) => console.warn("service worker:", e));
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function addMessage(role, text = "") {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setBusy(busy) {
  ui.busy = busy;
  $("send").disabled = busy || !ui.engine;
  $("input").disabled = !ui.engine;
  $("stop").disabled = !busy;
  $("load").disabled = busy;
}

function onProgress(p) {
  const bar = $("progress");
  if (p.phase === "preflight") {
    const notes = p.preflight.notes.join(" ");
    if (notes) status(notes);
    return;
  }
  if (p.phase === "runtime") { status("Starting the Python runtime…"); return; }
  if (p.total) {
    bar.hidden = false;
    bar.value = p.loaded / p.total;
    const speed = p.bytesPerSecond ? `, ${webinfer.fmtBytes(p.bytesPerSecond)}/s` : "";
    const left = p.secondsLeft != null && p.phase === "download" ? `, ${Math.ceil(p.secondsLeft)} s left` : "";
    status(`${p.phase === "cache" ? "Reading from cache" : "Downloading"} ${webinfer.fmtBytes(p.loaded)} of ` +
           `${webinfer.fmtBytes(p.total)}${speed}${left}${p.warning ? ". " + p.warning : ""}`);
  }
}

async function loadModel() {
  const opt = $("model").selectedOptions[0];
  if (!opt) { status("This site lists no model.", true); return; }
  setBusy(true);
  try {
    ui.engine?.unload();
    ui.engine = null;
    const t0 = performance.now();
    ui.engine = await webinfer.load(opt.value, { onProgress, manifestSha256: opt.dataset.sha256 });
    const t = ui.engine.info.timings;
    $("progress").hidden = true;
    const where = ui.engine.info.device?.adapter || "GPU";
    status(`${opt.textContent} ready on ${where} in ${((performance.now() - t0) / 1000).toFixed(1)} s` +

           (t.warning ? `. ${t.warning}` : ""));
    document.body.dataset.loaded = "1";
  } catch (e) {
    status(`${e.name}: ${e.message}`, true);
  } finally {
    setBusy(false);
  }
}

async function send(text) {
  ui.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant");
  setBusy(true);
  const t0 = performance.now();
  let first = null, n = 0, answer = "";
  try {
    const stream = ui.engine.chat.completions.create({ messages: ui.messages, stream: true, max_tokens: 256,
                                                         temperature: 0 });  // greedy: steadier for small models
    for await (const chunk of stream) {
      const delta = chunk.choices?.[0]?.delta?.content ?? "";
      if (delta) { first ??= performance.now(); n++; answer += delta; out.textContent = answer; out.scrollIntoView({ block: "end" }); }
    }
    ui.messages.push({ role: "assistant", content: answer });
    const tps = n > 1 ? (n - 1) / ((performance.now() - first) / 1000) : 0;
    $("stats").textContent = `TTFT ${first ? (first - t0).toFixed(0) : "–"} ms · ${tps.toFixed(1)} tokens/s · ${n} tokens`;
  } catch (e) {
    out.classList.add("error");
    out.textContent = answer + `\n[${e.name}: ${e.message}]`;
    if (e.name === "DeviceLostError") status("The GPU was reset; the model will be rebuilt on your next message.", true);
  } finally {
    setBusy(false);
  }
}

$("load").onclick = loadModel;
$("form").onsubmit = (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || ui.busy || !ui.engine) return;
  $("input").value = "";
  send(text);
};
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); }
});
$("stop").onclick = () => ui.engine?.stop();
$("new").onclick = () => { ui.engine?.stop(); ui.messages = []; $("log").replaceChildren(); $("stats").textContent = ""; };
if (new URLSearchParams(location.search).has("autoload")) loadModel();
