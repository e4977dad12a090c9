// Conversations kept on this device in IndexedDB (database "webinfer-chat", store "conversations"); nothing is
// sent anywhere. A conversation:
//   {id, title, created, updated (ms since epoch), model (manifest sha256 it was last used with),
//    settings: {system, temperature, top_p, max_tokens}, messages: [{role, content, stats?, stopped?}]}

const DB = "webinfer-chat";
const STORE = "conversations";
export const DEFAULT_SETTINGS = Object.freeze({ system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512 });

let dbPromise = null;

function open() {
  dbPromise ??= new Promise((resolve, reject) => {
    const req = indexedDB.open(DB, 1);
    req.onupgradeneeded = () => {
      const store = req.result.createObjectStore(STORE, { keyPath: "id" });
      store.createIndex("updated", "updated");
    };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
    req.onblocked = () => reject(new Error("the chat history is open in an older version of this page; close other tabs"));
  });
  return dbPromise;
}

async function tx(mode, fn) {
  const db = await open();
  return new Promise((resolve, reject) => {
    const t = db.transaction(STORE, mode);
    const result = fn(t.objectStore(STORE));
    t.oncomplete = () => resolve(result.result ?? result);
    t.onerror = () => reject(t.error);
    t.onabort = () => reject(t.error || new Error("IndexedDB transaction aborted"));
  });
}

export function newConversation(model = null, settings = DEFAULT_SETTINGS) {
  const now = Date.now();
  return { id: crypto.randomUUID(), title: "New chat", created: now, updated: now, model,
           settings: { ...settings }, messages: [] };
}

/** A title from the first user message (one line, at most 60 characters). */
export function titleOf(conv) {
  const first = conv.messages.find((m) => m.role === "user");
  if (!first) return "New chat";
  const line = first.content.trim().split("\n")[0];
  return line.length > 60 ? line.slice(0, 59) + "…" : line || "New chat";
}

/** Every conversation, most recently updated first. */
export async function listConversations() {
  const all = await tx("readonly", (s) => s.getAll());
  return all.sort((a, b) => b.updated - a.updated);
}

export async function getConversation(id) {
  return (await tx("readonly", (s) => s.get(id))) || null;
}

export async function saveConversation(conv) {
  conv.updated = Date.now();
  conv.title = titleOf(conv);
  await tx("readwrite", (s) => s.put(conv));
  return conv;
}

export async function deleteConversation(id) {
  await tx("readwrite", (s) => s.delete(id));
}

/** All conversations as a JSON document (the sidebar's Export button). */
export async function exportJSON() {
  return JSON.stringify({ format: "webinfer-chat-export", version: 1, exported: new Date().toISOString(),
                          conversations: await listConversations() }, null, 1);
}
