// Makes the Python runtime's memory snapshot that later visits restore instead of starting Pyodide (worker.js).
// Its own Worker, started once per site version after ready while the engine idles: a runtime made for the
// snapshot must not be the engine's (Pyodide's snapshot mode wraps every JS global that Python reaches in a
// Proxy, which WebGPU's argument checks reject), and its ~5 s of start and imports must not block the engine's
// thread. Protocol: {site, base, key} -> {ok, bytes, ms, modules} | {ok: false, error}.
import { writeRuntimeSnapshot } from "./loader.js";

self.onmessage = async ({ data: { site, base, key } }) => {
  const t0 = performance.now();
  try {
    const root = new URL(base || "./", self.location.href);
    const { loadPyodide } = await import(new URL(site.pyodide + "pyodide.mjs", root).href);
    const py = await loadPyodide({ indexURL: new URL(site.pyodide, root).href, _makeSnapshot: true });
    // unpackArchive, not loadPackage: the snapshot must not record loaded packages (worker.js installs the
    // wheels' files again after a restore: the file system is not in wasm memory), into site-packages as
    // loadPackage does, so that the imported modules' __file__ names where those files will be
    const extractDir = py.runPython("import sysconfig; sysconfig.get_path('purelib')");
    for (const w of site.wheels) {
      const res = await fetch(new URL(w, root));
      if (!res.ok) throw new Error(`${w}: HTTP ${res.status}`);
      py.unpackArchive(new Uint8Array(await res.arrayBuffer()), "wheel", { extractDir });
    }
    const modules = py.runPython("import webinfer.browser_worker as w; w.snapshot_imports()");
    const snap = py.makeMemorySnapshot();
    const stored = await writeRuntimeSnapshot(key, snap);
    self.postMessage({ ok: stored, bytes: snap.length, ms: performance.now() - t0, modules,
                       error: stored ? null : "the storage is full" });
  } catch (e) {
    self.postMessage({ ok: false, error: String(e && e.message || e), ms: performance.now() - t0 });
  }
};
