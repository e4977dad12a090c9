// Service worker: caches the app shell (HTML, JS, CSS, site.json), the Pyodide runtime and the wheels so the whole
// site works offline. It never hosts the engine, and it leaves model files alone: web/loader.js verifies and caches
// those itself under their sha256. One cache per site version (the page registers sw.js?v=<version>).
const VERSION = new URL(self.location.href).searchParams.get("v") || "dev";
const SHELL = `webinfer-shell-${VERSION}`;

self.addEventListener("install", (ev) => {
  ev.waitUntil((async () => {
    const site = await (await fetch("site.json", { cache: "no-cache" })).json();
    const cache = await caches.open(SHELL);
    await cache.addAll(site.shell);
    await self.skipWaiting();
  })());
});

self.addEventListener("activate", (ev) => {
  ev.waitUntil((async () => {
    for (const name of await caches.keys()) {
      if (name.startsWith("webinfer-shell-") && name !== SHELL) await caches.delete(name);
    }
    await self.clients.claim();
  })());
});

// Cross-origin isolation on any static host: the CPU engine's two threads need a SharedArrayBuffer, which a browser
// gives only to a page served with COOP/COEP. `webinfer serve` sends them; a static host (GitHub Pages, a CDN)
// often cannot, so the shell's responses get them here. The page loaded before this worker controlled it is not
// isolated (one CPU thread, and the engine says why); every later visit or reload is. Everything the site loads is
// same-origin, and a model on another origin is fetched with CORS, which require-corp allows.
const ISOLATION = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" };

// Only documents and worker scripts carry isolation (a same-origin subresource needs no header under require-corp):
// a response rebuilt here loses V8's code cache, which for pyodide.asm.wasm is most of Pyodide's start on a
// later visit (measured: 5.0-5.7 s every visit when every response was rebuilt, 3.3-3.5 s from the second visit
// with the server's headers).
function isolated(req, resp) {
  if (req.mode !== "navigate" && req.destination !== "worker" && req.destination !== "sharedworker") return resp;
  if (resp.type === "opaque" || resp.type === "opaqueredirect" || resp.redirected) return resp;  // kept as they are
  if (Object.entries(ISOLATION).every(([k, v]) => resp.headers.get(k) === v)) return resp;
  const headers = new Headers(resp.headers);
  for (const [k, v] of Object.entries(ISOLATION)) headers.set(k, v);
  return new Response(resp.body, { status: resp.status, statusText: resp.statusText, headers });
}

self.addEventListener("fetch", (ev) => {
  const url = new URL(ev.request.url);
  if (ev.request.method !== "GET" || url.origin !== self.location.origin) return;
  if (url.pathname.includes("/models/")) return;  // the loader's business (verified, content-addressed)
  ev.respondWith((async () => {
    const cache = await caches.open(SHELL);
    // Versioned shell: cache first (URLs carry ?v=<hash>; the cache holds exactly this version's files).
    const hit = await cache.match(ev.request, { ignoreSearch: true });
    if (hit) return isolated(ev.request, hit);
    try {
      return isolated(ev.request, await fetch(ev.request));
    } catch (e) {
      if (ev.request.mode === "navigate") {
        const page = await cache.match("index.html");
        if (page) return isolated(ev.request, page);
      }
      throw e;
    }
  })());
});
