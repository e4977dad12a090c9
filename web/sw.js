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

self.addEventListener("fetch", (ev) => {
  const url = new URL(ev.request.url);
  if (ev.request.method !== "GET" || url.origin !== self.location.origin) return;
  if (url.pathname.includes("/models/")) return;  // the loader's business (verified, content-addressed)
  ev.respondWith((async () => {
    const cache = await caches.open(SHELL);
    // Versioned shell: cache first (URLs carry ?v=<hash>; the cache holds exactly this version's files).
    const hit = await cache.match(ev.request, { ignoreSearch: true });
    if (hit) return hit;
    try {
      return await fetch(ev.request);
    } catch (e) {
      if (ev.request.mode === "navigate") {
        const page = await cache.match("index.html");
        if (page) return page;
      }
      throw e;
    }
  })());
});
