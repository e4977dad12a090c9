// A small Markdown renderer for model output, which is untrusted text: it builds DOM nodes and sets only
// textContent and a few safe attributes, never innerHTML, so a "<script>" or "<img onerror=...>" in an answer
// stays visible text. Links keep only http(s) and mailto targets. Half-written input (an unclosed ``` while
// streaming) renders as the block it is becoming, so the layout does not jump when the fence closes.
//
// Blocks: fenced code (with a Copy button), headings, paragraphs, bullet and numbered lists, block quotes,
// tables (a header row, a |---| rule, body rows), horizontal rules. Inline: `code`, **bold**, *italic* / _italic_, [text](url).

const SAFE_URL = /^(https?:|mailto:)/i;

/** Render `text` into a DocumentFragment. */
export function renderMarkdown(text, doc = document) {
  const frag = doc.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/.exec(line);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i++;  // the closing fence (or the end while streaming)
      frag.append(codeBlock(body.join("\n"), fence[2], doc));
      continue;
    }
    if (!line.trim()) { i++; continue; }
    const h = /^(#{1,6})\s+(.*)$/.exec(line);
    if (h) {
      // answers sit under the page's h1/h2: shift model headings down so the outline stays sane
      const el = doc.createElement(`h${Math.min(6, h[1].length + 2)}`);
      inline(el, h[2].replace(/\s#+\s*$/, ""), doc);
      frag.append(el);
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { frag.append(doc.createElement("hr")); i++; continue; }
    if (/^\s*>/.test(line)) {
      const body = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) body.push(lines[i++].replace(/^\s*>\s?/, ""));
      const q = doc.createElement("blockquote");
      q.append(renderMarkdown(body.join("\n"), doc));
      frag.append(q);
      continue;
    }
    if (isTableRow(line) && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
      const head = cells(line);
      i += 2;
      const rows = [];
      while (i < lines.length && isTableRow(lines[i])) rows.push(cells(lines[i++]));
      frag.append(table(head, rows, doc));
      continue;
    }
    const item = listItem(line);
    if (item) {
      const list = doc.createElement(item.ordered ? "ol" : "ul");
      if (item.ordered && item.start !== 1) list.start = item.start;
      let li = null;
      while (i < lines.length) {
        const it = listItem(lines[i]);
        if (it && it.ordered === item.ordered) {
          li = doc.createElement("li");
          inline(li, it.text, doc);
          list.append(li);
          i++;
        } else if (li && /^\s{2,}\S/.test(lines[i]) && !listItem(lines[i])) {
          li.append(doc.createTextNode(" "));  // a wrapped continuation line of the item
          inline(li, lines[i].trim(), doc);
          i++;
        } else break;
      }
      frag.append(list);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) para.push(lines[i++]);
    const p = doc.createElement("p");
    para.forEach((l, k) => {
      if (k) p.append(doc.createElement("br"));
      inline(p, l, doc);
    });
    frag.append(p);
  }
  return frag;
}

const TABLE_RULE = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;
const isTableRow = (line) => line.includes("|") && line.trim() !== "";
const cells = (line) => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());

function table(head, rows, doc) {
  const wrap = doc.createElement("div");
  wrap.className = "table";
  wrap.tabIndex = 0;  // wide tables scroll sideways
  const t = doc.createElement("table");
  const tr = doc.createElement("tr");
  for (const h of head) { const th = doc.createElement("th"); th.scope = "col"; inline(th, h, doc); tr.append(th); }
  const thead = doc.createElement("thead");
  thead.append(tr);
  const tbody = doc.createElement("tbody");
  for (const r of rows) {
    const row = doc.createElement("tr");
    head.forEach((_, k) => { const td = doc.createElement("td"); inline(td, r[k] ?? "", doc); row.append(td); });
    tbody.append(row);
  }
  t.append(thead, tbody);
  wrap.append(t);
  return wrap;
}

function listItem(line) {
  const m = /^\s{0,3}(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(line);
  if (!m) return null;
  return { ordered: !m[1], start: m[2] ? Number(m[2]) : 1, text: m[3] };
}

function startsBlock(line) {
  return /^\s*(```|~~~)/.test(line) || /^#{1,6}\s/.test(line) || /^\s*>/.test(line) || !!listItem(line) ||
    /^\s*([-*_])(\s*\1){2,}\s*$/.test(line);
}

function codeBlock(code, lang, doc) {
  const wrap = doc.createElement("div");
  wrap.className = "code";
  const bar = doc.createElement("div");
  bar.className = "code-bar";
  const label = doc.createElement("span");
  label.textContent = lang || "code";
  const btn = doc.createElement("button");
  btn.type = "button";
  btn.className = "copy";
  btn.textContent = "Copy";
  btn.setAttribute("aria-label", `Copy ${lang || "code"} block`);
  btn.addEventListener("click", () => copyText(code, btn));
  bar.append(label, btn);
  const pre = doc.createElement("pre");
  pre.tabIndex = 0;  // long lines scroll: keyboard users must be able to reach the scroll area
  const el = doc.createElement("code");
  if (lang) el.dataset.lang = lang;
  el.textContent = code;
  pre.append(el);
  wrap.append(bar, pre);
  return wrap;
}

/** Copy text to the clipboard and say so on the button for a moment. */
export async function copyText(text, btn = null) {
  let ok = true;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // no clipboard permission (e.g. an http origin other than localhost): the old way
    const ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.position = "fixed";
    ta.style.opacity = "0";
    document.body.append(ta);
    ta.select();
    ok = document.execCommand("copy");
    ta.remove();
  }
  if (btn) {
    const was = btn.textContent;
    btn.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { btn.textContent = was; }, 1500);
  }
  return ok;
}

// Inline spans, left to right: the earliest match wins; text between matches becomes text nodes.
const INLINE = [
  { re: /`([^`\n]+)`/, make: (m, doc) => { const c = doc.createElement("code"); c.textContent = m[1]; return c; } },
  { re: /\*\*(?=\S)([^*]*?\S)\*\*/, make: (m, doc, rec) => rec(doc.createElement("strong"), m[1]) },
  { re: /__(?=\S)([^_]*?\S)__/, make: (m, doc, rec) => rec(doc.createElement("strong"), m[1]) },
  { re: /\*(?=\S)([^*]*?\S)\*/, make: (m, doc, rec) => rec(doc.createElement("em"), m[1]) },
  { re: /(?<![\w])_(?=\S)([^_]*?\S)_(?![\w])/, make: (m, doc, rec) => rec(doc.createElement("em"), m[1]) },
  { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, make: (m, doc, rec) => {
    if (!SAFE_URL.test(m[2])) return doc.createTextNode(m[0]);  // javascript:, data:, relative: shown as text
    const a = doc.createElement("a");
    a.href = m[2];
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    return rec(a, m[1]);
  } },
];

function inline(parent, text, doc) {
  const rec = (el, t) => { inline(el, t, doc); return el; };
  let rest = text;
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(rest);
      if (m && (!best || m.index < best.m.index)) best = { m, rule };
    }
    if (!best) { parent.append(doc.createTextNode(rest)); return; }
    if (best.m.index) parent.append(doc.createTextNode(rest.slice(0, best.m.index)));
    parent.append(best.rule.make(best.m, doc, rec));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
}
