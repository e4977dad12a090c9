// Package download, verification and caching (runs in the worker; also importable from a page).
//
// Every file of a package is named by its sha256, so it is cached forever under that hash in the Cache API and a
// second visit makes no network request for model data. A file is stored only after its HTTP status, Content-Type
// (never text/html: a host's error page served with 200 must not poison the cache), size and sha256 all check out.
// A file whose hash does not match is fetched once more, then reported as an IntegrityError. A download cut
// midway resumes with a Range request (If-Range with the ETag, so a changed file restarts instead of splicing).
// When storage is full (QuotaExceededError) the files are kept in memory only and the caller is told so.
// A cached file was hashed before it was stored, and its key is that hash: a later visit trusts it after a size
// check (truncation is what storage does to a file; re-hashing 100 MB costs the second visit ~0.2-0.5 s), unless
// the caller asks for verifyCached.

export const CACHE_NAME = "webinfer-models-v1";
const KEY_ROOT = "__webinfer__/";

export class IntegrityError extends Error {
  constructor(url, expected, actual) {
    super(`${url}: content does not match the manifest: expected ${expected}, got ${actual}`);
    this.name = "IntegrityError";
    this.details = { url, expected, actual };
  }
}

export class DownloadError extends Error {
  constructor(url, problem) {
    super(`${url}: ${problem}`);
    this.name = "DownloadError";
    this.details = { url, problem };
  }
}

export async function sha256Hex(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

function keyUrl(kind, name) {
  // Synthetic same-origin URLs as cache keys: they never collide with a real request, whatever the site's layout.
  return new URL(`${KEY_ROOT}${kind}/${name}`, self.location.origin + "/").href;
}

async function openCache() {
  try { return await caches.open(CACHE_NAME); } catch { return null; }  // no Cache API (e.g. opaque origin)
}

function isQuota(e) { return e && (e.name === "QuotaExceededError" || /quota/i.test(String(e.message))); }

// Fetch one file completely, resuming with Range after a connection cut. Returns a Uint8Array of exactly `size`.
async function fetchWhole(url, size, onBytes, stats) {
  const buf = new Uint8Array(size);
  let got = 0;
  let validator = null;   // ETag (or Last-Modified) of the response we are continuing
  for (let attempt = 0; attempt < 4; attempt++) {
    const headers = {};
    if (got > 0 && validator) { headers.Range = `bytes=${got}-`; headers["If-Range"] = validator; }
    stats.requests++;
    let res;
    try {
      res = await fetch(url, { headers, cache: "no-store" });
    } catch (e) {
      if (attempt === 3) throw new DownloadError(url, `network error: ${e.message}`);
      continue;
    }
    if (res.status === 206 && got > 0) {
      const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(res.headers.get("Content-Range") || "");
      if (!m || Number(m[1]) !== got) {  // not the continuation we asked for: start over
        onBytes(-got); got = 0; validator = null;
        await res.body?.cancel();
        continue;
      }
      stats.resumed++;
    } else if (res.status === 200) {
      if (got > 0) { onBytes(-got); got = 0; }  // the server ignored Range or the file changed: restart
    } else {
      await res.body?.cancel();
      throw new DownloadError(url, `HTTP ${res.status} ${res.statusText}`);
    }
    const type = res.headers.get("Content-Type") || "";
    if (/text\/html/i.test(type)) {
      await res.body?.cancel();
      throw new DownloadError(url, `the server answered with an HTML page (Content-Type ${type}), not the file`);
    }
    validator = res.headers.get("ETag") || res.headers.get("Last-Modified") || validator;
    const reader = res.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (got + value.length > size) {
          throw new IntegrityError(url, `${size} bytes`, `more than ${size} bytes`);
        }
        buf.set(value, got);
        got += value.length;
        onBytes(value.length);
      }
    } catch (e) {
      if (e instanceof IntegrityError) throw e;
      if (attempt === 3) throw new DownloadError(url, `connection lost after ${got} of ${size} bytes: ${e.message}`);
      continue;  // resume from `got`
    }
    if (got !== size) {
      if (attempt === 3 || !validator) throw new IntegrityError(url, `${size} bytes`, `${got} bytes`);
      continue;  // a short body without an error: try to resume too
    }
    return buf;
  }
  throw new DownloadError(url, `gave up after 4 attempts (${got} of ${size} bytes)`);
}

// Download one file and check it; on a hash mismatch fetch it once more, then report.
async function fetchVerified(url, entry, onBytes, stats) {
  for (let tries = 0; ; tries++) {
    const bytes = await fetchWhole(url, entry.bytes, onBytes, stats);
    const t0 = performance.now();
    const actual = await sha256Hex(bytes);
    stats.verify_ms += performance.now() - t0;
    if (actual === entry.sha256) return bytes;
    onBytes(-bytes.length);
    stats.rejected++;
    if (tries >= 1) throw new IntegrityError(url, `sha256 ${entry.sha256}`, `sha256 ${actual}`);
  }
}

async function readCached(cache, entry, stats, verify) {
  if (!cache) return null;
  const t0 = performance.now();
  const res = await cache.match(keyUrl("file", entry.sha256));
  if (!res) return null;
  const bytes = new Uint8Array(await res.arrayBuffer());
  const t1 = performance.now();
  stats.cache_read_ms += t1 - t0;
  // A truncated entry (or with verify, any damaged one) is dropped and downloaded again.
  const ok = bytes.length === entry.bytes && (!verify || (await sha256Hex(bytes)) === entry.sha256);
  stats.verify_ms += performance.now() - t1;
  if (!ok) { await cache.delete(keyUrl("file", entry.sha256)); return null; }
  return bytes;
}

async function store(cache, entry, bytes, state) {
  if (!cache || state.noCache) return;
  try {
    await cache.put(keyUrl("file", entry.sha256), new Response(bytes, {
      headers: { "Content-Type": "application/octet-stream", "Content-Length": String(bytes.length) },
    }));
  } catch (e) {
    if (!isQuota(e)) throw e;
    // Whatever a failed put may have left under this key is not a verified file: drop it (the files stored
    // before are complete and verified, and stay for the next visit).
    try { await cache.delete(keyUrl("file", entry.sha256)); } catch { /* nothing to drop */ }
    state.noCache = true;
    state.warning = "Storage is full: the model is kept in memory only and will be downloaded again next visit. " +
      "Free some disk space or allow this site more storage.";
  }
}

// The manifest: pinned by sha256 when the page knows it (then a cached copy needs no network at all).
async function loadManifest(cache, manifestUrl, sha, stats) {
  if (sha && cache) {
    const res = await cache.match(keyUrl("manifest", sha));
    if (res) return { text: await res.text(), fromCache: true };
  }
  let text;
  try {
    stats.requests++;
    const res = await fetch(manifestUrl, { cache: "no-cache" });
    if (!res.ok) throw new DownloadError(manifestUrl, `HTTP ${res.status} ${res.statusText}`);
    if (/text\/html/i.test(res.headers.get("Content-Type") || "")) {
      throw new DownloadError(manifestUrl, "the server answered with an HTML page, not manifest.json");
    }
    text = await res.text();
  } catch (e) {
    // Offline without a pinned hash: the last manifest seen at this URL.
    const res = cache && await cache.match(keyUrl("manifest-url", encodeURIComponent(manifestUrl)));
    if (res) return { text: await res.text(), fromCache: true };
    throw e;
  }
  const actual = await sha256Hex(new TextEncoder().encode(text));
  if (sha && actual !== sha) throw new IntegrityError(manifestUrl, `sha256 ${sha}`, `sha256 ${actual}`);
  if (cache) {
    const r = () => new Response(text, { headers: { "Content-Type": "application/json" } });
    try {
      await cache.put(keyUrl("manifest", actual), r());
      await cache.put(keyUrl("manifest-url", encodeURIComponent(manifestUrl)), r());
    } catch (e) { if (!isQuota(e)) throw e; }
  }
  return { text, fromCache: false };
}

// Remove cached files that belong to no package the site still lists (keep: list of manifest sha256).
async function collectGarbage(cache, currentSha, currentFiles, keep) {
  const idxKey = keyUrl("index", "packages");
  const old = await cache.match(idxKey);
  const index = old ? await old.json() : {};
  index[currentSha] = currentFiles;
  if (keep) for (const sha of Object.keys(index)) if (sha !== currentSha && !keep.includes(sha)) delete index[sha];
  await cache.put(idxKey, new Response(JSON.stringify(index), { headers: { "Content-Type": "application/json" } }));
  if (!keep) return 0;
  const live = new Set(Object.values(index).flat());
  let removed = 0;
  for (const req of await cache.keys()) {
    const m = new RegExp(`/${KEY_ROOT}(file|manifest)/([0-9a-f]{64})$`).exec(req.url);
    if (m && !(m[1] === "file" ? live.has(m[2]) : m[2] in index)) { await cache.delete(req); removed++; }
  }
  return removed;
}

/**
 * Fetch (or read from cache) a package's manifest and files.
 * options: manifestSha256 (pin), onProgress({phase, loaded, total, bytesPerSecond, secondsLeft, warning}),
 *          concurrency (default 3), keepPackages (manifest sha256s the site lists; others' files are removed),
 *          verifyCached (re-hash files read from the cache; default false: a size check).
 * Returns {manifestText, manifest, files: {name: Uint8Array}, stats}.
 */
export async function loadModelFiles(manifestUrl, options = {}) {
  const { manifestSha256 = null, onProgress = () => {}, concurrency = 3, keepPackages = null,
          verifyCached = false } = options;
  const stats = { requests: 0, resumed: 0, rejected: 0, bytes_downloaded: 0, files_cached: 0, files_downloaded: 0,
                  download_ms: 0, verify_ms: 0, cache_read_ms: 0, cached: true, warning: null };
  const cache = await openCache();
  const state = { noCache: !cache, warning: cache ? null : "The Cache API is not available: nothing is stored." };
  const base = new URL(manifestUrl, self.location.href);
  const { text } = await loadManifest(cache, base.href, manifestSha256, stats);
  const manifest = JSON.parse(text);
  const manifestSha = await sha256Hex(new TextEncoder().encode(text));
  const entries = manifest.files || [];
  const total = entries.reduce((s, e) => s + e.bytes, 0);
  let loaded = 0, downloaded = 0;
  const t0 = performance.now();
  const report = (phase) => {
    const dt = (performance.now() - t0) / 1000;
    const speed = dt > 0 ? downloaded / dt : 0;
    onProgress({ phase, loaded, total, bytesPerSecond: speed,
                 secondsLeft: speed > 0 ? (total - loaded) / speed : null, warning: state.warning });
  };
  const files = {};
  const todo = [];
  for (const e of entries) {
    const bytes = await readCached(cache, e, stats, verifyCached);
    if (bytes) { files[e.name] = bytes; loaded += bytes.length; stats.files_cached++; report("cache"); }
    else todo.push(e);
  }
  const onBytes = (n) => { loaded += n; downloaded += n; stats.bytes_downloaded += n; report("download"); };
  const td = performance.now();
  let next = 0;
  async function lane() {
    while (next < todo.length) {
      const e = todo[next++];
      const bytes = await fetchVerified(new URL(e.name, base).href, e, onBytes, stats);
      await store(cache, e, bytes, state);
      files[e.name] = bytes;
      stats.files_downloaded++;
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, todo.length) }, lane));
  stats.download_ms = performance.now() - td;
  if (cache && !state.noCache) await collectGarbage(cache, manifestSha, entries.map((e) => e.sha256), keepPackages);
  stats.cached = !state.noCache;
  stats.warning = state.warning;
  report("done");
  return { manifestText: text, manifest, manifestSha256: manifestSha, files, stats };
}

// ------------------------------------------------------------------------- the pipeline record (webinfer/gpu/browser.py)

/** The GPU pipelines the last load of this package created ({adapter, features, limits, pipelines}) or null. */
export async function readPipelineRecord(manifestSha) {
  const cache = await openCache();
  const res = cache && await cache.match(keyUrl("pipelines", manifestSha));
  return res ? await res.json() : null;
}

export async function writePipelineRecord(manifestSha, record) {
  const cache = await openCache();
  if (!cache) return;
  try {
    await cache.put(keyUrl("pipelines", manifestSha), new Response(JSON.stringify(record),
      { headers: { "Content-Type": "application/json" } }));
  } catch (e) { if (!isQuota(e)) throw e; }  // only a hint: without it the next visit compiles later, that is all
}

// ------------------------------------------------------------- the Python runtime's memory snapshot (worker.js)
// Pyodide's start (~3.5 s on a second visit here: the interpreter's own init) and the wheels' imports, skipped
// by restoring the wasm memory of a runtime that had done both (web/snapshot-worker.js makes it). One per site
// version: `key` names the Pyodide build and the wheels' content-addressed folders.

/** The stored snapshot for `key` (Uint8Array) or null. */
export async function readRuntimeSnapshot(key) {
  const cache = await openCache();
  const res = cache && await cache.match(keyUrl("runtime", encodeURIComponent(key)));
  if (!res) return null;
  const bytes = new Uint8Array(await res.arrayBuffer());
  return bytes.length === Number(res.headers.get("X-Webinfer-Length")) ? bytes : null;  // a cut write: not used
}

/** Stores the snapshot for `key` and drops other versions' (false when the storage is full). */
export async function writeRuntimeSnapshot(key, bytes) {
  const cache = await openCache();
  if (!cache) return false;
  const mine = keyUrl("runtime", encodeURIComponent(key));
  try {
    await cache.put(mine, new Response(bytes, { headers: { "Content-Type": "application/octet-stream",
                                                           "X-Webinfer-Length": String(bytes.length) } }));
  } catch (e) { if (isQuota(e)) return false; throw e; }
  for (const req of await cache.keys()) {
    if (req.url.startsWith(keyUrl("runtime", "")) && req.url !== mine) await cache.delete(req);
  }
  return true;
}

export async function deleteRuntimeSnapshot(key) {
  const cache = await openCache();
  if (cache) await cache.delete(keyUrl("runtime", encodeURIComponent(key)));
}

// ------------------------------------------------------------------------------------------ for the page's picker

async function packageIndex(cache) {
  const res = await cache.match(keyUrl("index", "packages"));
  return res ? await res.json() : {};
}

/**
 * Which packages are complete on this device: {manifestSha256: {cached, bytes}} for the given manifest hashes.
 * A package counts as cached when a full load recorded it and every one of its files is still in the cache.
 */
export async function cacheStatus(manifestShas) {
  const out = {};
  const cache = await openCache();
  const index = cache ? await packageIndex(cache) : {};
  for (const sha of manifestShas) {
    let cached = false, bytes = 0;
    if (cache && index[sha] && await cache.match(keyUrl("manifest", sha))) {
      cached = true;
      for (const f of index[sha]) {
        const res = await cache.match(keyUrl("file", f));
        if (!res) { cached = false; break; }
        bytes += Number(res.headers.get("Content-Length") || 0);
      }
    }
    out[sha] = { cached, bytes: cached ? bytes : 0 };
  }
  return out;
}

/** Remove one package from this device; files another cached package also uses stay. Returns files removed. */
export async function removeCachedPackage(manifestSha) {
  const cache = await openCache();
  if (!cache) return 0;
  const index = await packageIndex(cache);
  const mine = index[manifestSha] || [];
  delete index[manifestSha];
  await cache.put(keyUrl("index", "packages"),
    new Response(JSON.stringify(index), { headers: { "Content-Type": "application/json" } }));
  const shared = new Set(Object.values(index).flat());
  let removed = 0;
  for (const f of mine) if (!shared.has(f) && await cache.delete(keyUrl("file", f))) removed++;
  await cache.delete(keyUrl("manifest", manifestSha));
  await cache.delete(keyUrl("pipelines", manifestSha));
  for (const req of await cache.keys()) {  // the offline fallback copy of the manifest, under its URL
    if (req.url.includes(`/${KEY_ROOT}manifest-url/`)) {
      const text = await (await cache.match(req)).text();
      if (await sha256Hex(new TextEncoder().encode(text)) === manifestSha) await cache.delete(req);
    }
  }
  return removed;
}

/** What the browser grants this site: {usage, quota, persisted} (nulls where it does not say). */
export async function storageState() {
  const s = navigator.storage;
  const est = s?.estimate ? await s.estimate().catch(() => ({})) : {};
  const persisted = s?.persisted ? await s.persisted().catch(() => null) : null;
  return { usage: est.usage ?? null, quota: est.quota ?? null, persisted };
}
