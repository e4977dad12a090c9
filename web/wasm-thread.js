// A worker thread (1, 2, ...) of the CPU engine in the page (webinfer/cpu/wasm.py JsHost.start_worker): started by
// the engine's Worker (worker.js, Pyodide) when the page is cross-origin isolated, one per thread past the first.
// One message brings the compiled threads build (a WebAssembly.Module), its shared WebAssembly.Memory, the Team's
// offset, this thread's id and its stack top; this Worker instantiates the module on that memory (lld's start
// function leaves the data, written once, alone), gives the instance its own stack and runs wi_worker, which
// waits for each step and computes its share of every matrix (wasm/kernels.c "threads") until the engine's host
// makes the team quit. It blocks in wasm all along (a Worker may; the page's main thread never runs the engine).
// Replies: {type: "started"} before wi_worker, {type: "done"} when it returns, {type: "error", message} on a
// failure (then the team is told to quit, so that the engine's step returns instead of waiting at a barrier).
self.onmessage = async ({ data }) => {
  const { module, memory, team, tid, stackTop } = data;
  let inst = null;
  try {
    inst = await WebAssembly.instantiate(module, { env: { memory } });
    inst.exports.__stack_pointer.value = stackTop;
    self.postMessage({ type: "started" });
    inst.exports.wi_worker(team, tid);
    self.postMessage({ type: "done" });
  } catch (e) {
    if (inst) inst.exports.wi_team_quit(team);
    self.postMessage({ type: "error", message: `${e && e.name || "Error"}: ${e && e.message || e}` });
  }
};
