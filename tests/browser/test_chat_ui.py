"""The chat page as a user meets it, in Chromium with WebGPU (SwiftShader), on a site with two tiny packages that
share every shard (the same weights under two names):

- loading shows stages and byte counts, the picker says what is cached on this device, a model can be removed from
  the cache, and a second model loads without a page reload, downloading no shard the first one already stored;
- streaming, stop, regenerate, edit-and-resend, per-conversation settings, history that survives a reload;
- Markdown from the model is untrusted: a <script> or an onerror handler stays text; code blocks get a Copy button;
- keyboard only, at phone size; axe-core (WCAG 2.1 A/AA: contrast, labels, names) finds nothing at both sizes;
- the Engine picker (Auto, the default, picks the CPU on SwiftShader; GPU; CPU fast) and what the status says;
- errors in plain words (no WebGPU, a file damaged on the server).
Screenshots at desktop and phone sizes go to test-artifacts/."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import ARGS, ARTIFACTS, CHROMIUM, SiteServer, _require_browser, attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 780}
AXE = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "axe-core" / "axe.min.js"
ANSWERED = "document.getElementById('stats').textContent.includes('tokens/s') && !document.querySelector('.msg.streaming')"


@pytest.fixture(scope="module")
def two_model_site(tmp_path_factory) -> Path:
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack
    from webinfer_packager.site.build import build_site

    d = tmp_path_factory.mktemp("two")
    # A 2048-token context: on the CPU engine (Auto, here) the tiny model decodes hundreds of tokens a second and its
    # random bytes rarely make text, so a long context keeps the stopped answer running until Stop lands.
    write_hf(d / "hf", max_position_embeddings=2048)
    pack(d / "hf", d / "tiny", progress=False, name="tiny", shard_mb=1)
    pack(d / "hf", d / "tiny-b", progress=False, name="tiny-b", shard_mb=1)  # identical shards, another manifest
    out = d / "site"
    build_site([d / "tiny", d / "tiny-b"], out)
    return out


@pytest.fixture()
def site(two_model_site, tmp_path):
    root = tmp_path / "site"
    shutil.copytree(two_model_site, root)
    srv = SiteServer(root)
    yield srv
    srv.stop()


def _models(srv):
    return json.loads((srv.root / "site.json").read_text())["models"]


def _open(browser, srv, logs, size=DESKTOP):
    page = browser.new_page()
    attach_console(page, logs)
    page.set_viewport_size(size)
    page.goto(srv.url + "index.html")
    page.wait_for_selector("body[data-ready]")
    return page


def _shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"chat-{name}.png"))


def _set_max_tokens(page, n):
    page.click("#settings-open")
    page.fill("#set-max-tokens", str(n))
    page.click("#settings-save")


def _texts(page, sel):
    return [e.inner_text() for e in page.query_selector_all(sel)]


def _axe(page):
    if not AXE.is_file():
        msg = f"axe-core is missing ({AXE}); run `npm ci` in web/ (scripts/setup-browser.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    page.add_script_tag(content=AXE.read_text())
    res = page.evaluate("""async () => {
        const r = await axe.run(document, {runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}});
        return r.violations.map((v) => ({id: v.id, help: v.help, nodes: v.nodes.map((n) => n.target.join(" ") + ": " + n.failureSummary)}));
    }""")
    return res


# ---------------------------------------------------------------------------------------------------- with a model


def test_chat_flow_history_switch_and_cache(site, browser):
    logs: list[str] = []
    m1, m2 = _models(site)
    page = _open(browser, site, logs)
    page.evaluate("window.__sameDocument = 1")  # gone if anything reloads the page
    assert "download" in page.inner_text("#model") and page.is_hidden("#uncache")
    page.evaluate("""() => { window.__stages = new Set();
        new MutationObserver(() => { if (document.body.dataset.stage) window.__stages.add(document.body.dataset.stage); })
          .observe(document.body, {attributes: true, attributeFilter: ["data-stage"]}); }""")

    # first message: loads the selected model (stages with a progress bar), then streams the answer
    _set_max_tokens(page, 12)
    page.fill("#input", "Hello **there**")
    page.press("#input", "Enter")
    page.wait_for_selector("#progress-wrap:not([hidden])")
    page.wait_for_function(ANSWERED, timeout=300_000)
    stages = page.evaluate("[...window.__stages]")
    assert {"runtime", "download", "done"} <= set(stages), stages
    assert page.get_attribute("body", "data-loaded") == m1["sha256"]
    assert "ready" in page.inner_text("#status") or "finished" in page.inner_text("#status")
    assert _texts(page, ".msg.user .content") == ["Hello **there**"]  # the user's text is shown as typed
    first_answer = page.inner_text(".msg.assistant .content")
    assert first_answer.strip(), logs[-20:]
    # Engine "Auto" (the default): CI Chromium's only adapter is SwiftShader, a fallback one, so the CPU runs it and
    # the status says so and why
    assert page.get_attribute("body", "data-backend") == "cpu"
    where = page.inner_text("#where")
    assert "runs on the CPU (WebAssembly SIMD" in where and "fallback" in where, where
    # the stats line: TTFT, tokens/s, and the engine's step time; tokens are counted from the chunks' token ids
    # (not text pieces: the random model's bytes rarely end a character), so a cut answer has exactly max tokens
    stats = page.inner_text("#stats")
    assert stats.startswith("TTFT ") and " tokens/s · " in stats and "per step: CPU " in stats, stats
    note = page.inner_text(".msg.assistant .note")
    assert "Cut at the length limit" not in note or "12 tokens" in note, note
    page.wait_for_function("document.getElementById('model').selectedOptions[0].textContent.includes('cached on this device')")
    assert page.is_visible("#uncache")
    _shot(page, "desktop")

    # stop: a long answer stopped after its first tokens is kept and marked
    _set_max_tokens(page, 1500)
    # (the page presses Stop itself at the first streamed text: the tiny model's whole answer takes a few seconds;
    # the wait below counts the messages: until send() has stored the new one, the last answer still looks done)
    page.evaluate("""() => new MutationObserver((_, obs) => {
        if (document.querySelector(".msg.streaming .content")?.textContent) { obs.disconnect(); document.getElementById("stop").click(); }
    }).observe(document.getElementById("log"), {childList: true, subtree: true, characterData: true})""")
    page.fill("#input", "Tell me more")
    page.press("#input", "Enter")
    page.wait_for_function(ANSWERED + " && document.querySelectorAll('.msg').length === 4")
    assert "Stopped." in page.inner_text(".msg.assistant:last-of-type .note"), (
        _texts(page, ".msg .note"), page.inner_text("#status"), logs[-10:])

    # regenerate replaces the last answer; edit-and-resend drops everything after the edited message
    # (short answers from here on: the tiny model's context is small, and a long history would overflow it)
    _set_max_tokens(page, 8)
    page.click("text=Regenerate")
    page.wait_for_function(ANSWERED + " && document.querySelectorAll('.msg').length === 4")
    assert "Stopped." not in page.inner_text(".msg.assistant:last-of-type")
    page.click(".msg.user >> nth=0 >> text=Edit")
    page.fill(".msg.user textarea", "Hello again")
    page.press(".msg.user textarea", "Enter")
    page.wait_for_function(ANSWERED + " && document.querySelectorAll('.msg').length === 2")
    assert _texts(page, ".msg.user .content") == ["Hello again"]

    # the history survives a reload, settings included
    conv_before = _texts(page, ".msg .content")
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert _texts(page, ".msg .content") == conv_before
    assert _texts(page, "#history .conv") == ["Hello again"]
    page.click("#settings-open")
    assert page.input_value("#set-max-tokens") == "8"
    page.keyboard.press("Escape")
    page.evaluate("window.__sameDocument = 1")

    # switch to the second model without reloading: only its manifest crosses the network (shards are shared)
    site.log.clear()
    page.select_option("#model", m2["manifest"])
    page.click("#load")
    page.wait_for_function(f"document.body.dataset.loaded === '{m2['sha256']}'", timeout=300_000)
    assert page.evaluate("window.__sameDocument") == 1
    fetched = [p for p, _, _ in site.requests_for("/models/")]
    assert fetched == ["/" + m2["manifest"]], fetched
    files = page.evaluate("""async () => (await (await caches.open("webinfer-models-v1")).keys())
                             .map((r) => r.url).filter((u) => u.includes("/__webinfer__/file/"))""")
    shards = {f["sha256"] for m in (m1, m2) for f in json.loads((site.root / m["manifest"]).read_text())["files"]}
    assert len(files) == len(shards), (files, shards)  # each shared file stored once
    page.fill("#input", "And now?")
    page.press("#input", "Enter")
    page.wait_for_function(ANSWERED + " && document.querySelectorAll('.msg').length === 4")

    # remove from device: the other model's files stay, so removing the first frees nothing shared
    page.click("#uncache")
    page.wait_for_function("document.getElementById('status').textContent.includes('removed from this device')")
    assert "0 files deleted" in page.inner_text("#status")
    opts = _texts(page, "#model option")
    assert "download" in opts[1] and "cached on this device" in opts[0], opts
    page.select_option("#model", m1["manifest"])
    page.click("#uncache")
    page.wait_for_function("document.getElementById('status').textContent.includes('tiny removed')")
    assert f"{len(shards)} files deleted" in page.inner_text("#status")
    assert not [l for l in logs if l.startswith("pageerror")], logs


def test_engine_choice_gpu_then_cpu_fast_and_kept(site, browser):
    """The Engine picker: GPU runs on WebGPU (SwiftShader here) with the GPU's per-token split; switching to CPU fast
    reloads the model at the next send; the choice is this device's and survives a reload."""
    logs: list[str] = []
    page = _open(browser, site, logs)
    page.select_option("#engine", "webgpu")
    _set_max_tokens(page, 4)
    page.fill("#input", "Hi")
    page.press("#input", "Enter")
    page.wait_for_function(ANSWERED, timeout=300_000)
    assert page.get_attribute("body", "data-backend") == "webgpu"
    where = page.inner_text("#where")
    assert "runs on " in where and "runs on the CPU" not in where, where
    stats = page.inner_text("#stats")
    assert "per token: GPU " in stats and " ms, host " in stats, stats

    page.select_option("#engine", "cpu-fast")
    assert "next load" in page.inner_text("#status")
    page.fill("#input", "Again")
    page.press("#input", "Enter")
    page.wait_for_function(ANSWERED + " && document.querySelectorAll('.msg').length === 4", timeout=300_000)
    assert page.get_attribute("body", "data-backend") == "cpu"
    where = page.inner_text("#where")
    assert "runs on the CPU (WebAssembly SIMD" in where and "fast mode" in where and "Auto" not in where, where
    assert "per step: CPU " in page.inner_text("#stats")

    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert page.input_value("#engine") == "cpu-fast"
    assert not [l for l in logs if l.startswith("pageerror")], logs


def test_closing_settings_leaves_focus_where_the_keys_moved_it(site, browser):
    """The settings dialog gives focus back to Settings as it closes, and its "close" event comes later (a task): a
    key pressed in between (Shift+Tab to the message box) keeps its focus (on a busy page the keyboard test's
    Shift+Tab landed on Send when the handler took focus back)."""
    logs: list[str] = []
    page = _open(browser, site, logs)
    for how in ("save", "cancel"):
        page.click("#settings-open")
        got = page.evaluate("""how => new Promise(done => {
            document.getElementById("settings").close(how);
            document.getElementById("input").focus();  // the user's next key, before the close event
            setTimeout(() => done(document.activeElement.id), 50);
        })""", how)
        assert got == "input", (how, got, logs[-5:])
    page.click("#settings-open")
    page.press("#set-temperature", "Escape")  # closed with nothing moved: focus is on Settings again
    assert page.evaluate("document.activeElement.id") == "settings-open"


def test_keyboard_only_on_a_phone(site, browser):
    logs: list[str] = []
    page = _open(browser, site, logs, PHONE)
    kb = page.keyboard
    focused = lambda: page.evaluate("document.activeElement.id || document.activeElement.className")  # noqa: E731
    _shot(page, "phone-empty")
    kb.press("Tab")
    assert focused() == "skip"
    kb.press("Enter")  # skip link -> the message box
    assert focused() == "input"

    # settings by keyboard: Tab past Send (Stop is disabled) to Settings; greedy, so the answer is reproducible
    kb.press("Tab")
    kb.press("Tab")
    assert focused() == "settings-open"
    kb.press("Enter")
    assert focused() == "set-system"
    _shot(page, "phone-settings")
    kb.press("Tab")
    assert focused() == "set-temperature"
    kb.press("Control+A")
    kb.type("0")
    kb.press("Enter")  # submits the dialog's form with its first button, Save
    assert focused() == "settings-open" and not page.is_visible("#settings")
    kb.press("Shift+Tab")
    kb.press("Shift+Tab")
    assert focused() == "input"
    lines = [f"line {i}" for i in range(16)]  # a tall message, so that the answer makes the log scroll
    for i, line in enumerate(lines):
        kb.type(line)
        if i < len(lines) - 1:
            kb.press("Shift+Enter")  # a new line, not a send
    # streaming without yanking the reader: scrolled up at the first streamed text (by the page itself, so that
    # it happens mid-answer), the log stays put while the answer grows
    page.evaluate("""() => new MutationObserver((_, obs) => {
        const c = document.querySelector(".msg.streaming .content");
        if (!c?.textContent) return;
        obs.disconnect();
        document.getElementById("log").scrollTop = 0;
        window.__mid = {streaming: true, len: c.textContent.length};
    }).observe(document.getElementById("log"), {childList: true, subtree: true, characterData: true})""")
    kb.press("Enter")  # sends, loading the model first
    page.wait_for_function(ANSWERED, timeout=300_000)
    mid = page.evaluate("window.__mid")
    end = page.evaluate("""() => ({top: document.getElementById("log").scrollTop,
        len: document.querySelector(".msg.assistant .content").textContent.length,
        overflow: document.getElementById("log").scrollHeight > document.getElementById("log").clientHeight})""")
    assert mid["streaming"] and end["len"] > mid["len"] and end["overflow"], (mid, end)
    assert end["top"] == 0, end
    assert _texts(page, ".msg.user .content") == ["\n".join(lines)]
    page.evaluate("document.getElementById('log').scrollTop = 1e9")
    _shot(page, "phone-answer")

    # the conversation list slides in from the menu button and closes with Escape
    assert focused() == "input"  # sending kept the focus in the message box
    for _ in range(30):  # back up through the answer's buttons and the picker to the menu button
        kb.press("Shift+Tab")
        if focused() == "menu":
            break
    assert focused() == "menu"
    kb.press("Enter")
    assert page.get_attribute("#menu", "aria-expanded") == "true" and focused() == "new"
    _shot(page, "phone-sidebar")
    kb.press("Tab")
    assert focused() == "conv"
    kb.press("Escape")
    assert page.get_attribute("#menu", "aria-expanded") == "false" and focused() == "menu"
    assert not page.is_visible("#sidebar")

    # Tab order then runs through the picker, the answer's buttons and the form
    seen = []
    for _ in range(12):
        kb.press("Tab")
        seen.append(focused())
    for want in ("model", "load", "uncache", "input", "send", "settings-open"):
        assert want in seen, seen
    assert not [l for l in logs if l.startswith("pageerror")], logs


def test_damaged_file_is_explained(site, browser):
    m1, _ = _models(site)
    # a file damaged on the server, twice (download and the one retry): the loader's IntegrityError, explained
    f = json.loads((site.root / m1["manifest"]).read_text())["files"][0]
    path = site.root / m1["manifest"].rsplit("/", 1)[0] / f["name"]
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    logs: list[str] = []
    page = _open(browser, site, logs)
    page.click("#load")
    page.wait_for_selector("#error:not([hidden])", timeout=300_000)
    assert page.get_attribute("#error", "data-kind") == "IntegrityError"
    text = page.inner_text("#error")
    assert "damaged" in text and "Press Load to try again" in text, text
    assert page.is_enabled("#load") and page.is_enabled("#send")
    _shot(page, "desktop-error")



def test_no_webgpu_is_explained(site):
    """Chromium without --enable-unsafe-webgpu has no adapter. Engine "GPU": the page says so, and what to do, before
    any download. Engine "Auto" (the default): the model runs on the CPU and the status says why."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[a for a in ARGS if a != "--enable-unsafe-webgpu"])
        try:
            page = b.new_page(viewport=PHONE)
            page.goto(site.url + "index.html")
            page.wait_for_selector("body[data-ready]")
            assert page.input_value("#engine") == "auto"
            page.select_option("#engine", "webgpu")
            page.click("#load")
            page.wait_for_selector("#error:not([hidden])")
            text = page.inner_text("#error")
            assert "WebGPU" in text and ("settings" in text or "driver" in text) and "Engine" in text, text
            assert page.get_attribute("#error", "data-kind") == "PreflightError"
            assert site.requests_for("/models/") == []
            _shot(page, "phone-no-webgpu")

            page.select_option("#engine", "auto")
            page.click("#load")
            page.wait_for_selector("body[data-loaded]", timeout=300_000)
            assert page.get_attribute("body", "data-backend") == "cpu"
            where = page.inner_text("#where")
            assert "runs on the CPU (WebAssembly SIMD" in where and "no WebGPU adapter (navigator.gpu.requestAdapter() returned no adapter" in where, where
        finally:
            b.close()


# ---------------------------------------------------------------------------------------------------- no model needed

UNTRUSTED = """# Title <img src=x onerror="window.__pwned=1">

Some **bold** and *em* text with `<b>code</b>` and a [good link](https://example.org/) and a [bad one](javascript:window.__pwned=2).

<script>window.__pwned = 3</script>

```html
<script>window.__pwned = 4</script>
```

- one <iframe src="javascript:window.__pwned=5"></iframe>
- two

1. first
2. second

> quoted <svg onload="window.__pwned=6">

| name | value |
|------|------:|
| **a** | <b>1</b> |
"""


def test_untrusted_markdown_stays_text_and_history_export(site, browser):
    logs: list[str] = []
    page = _open(browser, site, logs)
    browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url.rstrip("/"))
    # a conversation as the app stores it, with an answer full of markup: rendered after a reload, from IndexedDB
    page.evaluate("""async (answer) => {
        const s = await import("./store.js");
        const c = s.newConversation(null);
        c.messages.push({role: "user", content: "<b>not bold</b> & <script>window.__pwned = 7</script>"},
                        {role: "assistant", content: answer});
        await s.saveConversation(c);
        const d = s.newConversation(null);
        d.messages.push({role: "user", content: "second chat"});
        await s.saveConversation(d);
    }""", UNTRUSTED)
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert _texts(page, "#history .conv") == ["second chat", "<b>not bold</b> & <script>window.__pwned = 7</script>"]
    page.click("#history li:nth-child(2) .conv")
    page.wait_for_selector(".msg.assistant")
    out = page.evaluate("""() => {
        const a = document.querySelector(".msg.assistant .content");
        const u = document.querySelector(".msg.user .content");
        return {pwned: window.__pwned ?? null, user: u.textContent, userTags: u.querySelectorAll("*").length,
                bad: a.querySelectorAll("script, img, iframe, svg, [onerror], [onload]").length,
                tags: [...a.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()),
                links: [...a.querySelectorAll("a")].map((e) => [e.textContent, e.getAttribute("href"), e.rel]),
                code: [...a.querySelectorAll("pre code")].map((e) => e.textContent),
                text: a.textContent};
    }""")
    assert out["pwned"] is None and out["bad"] == 0, out
    assert out["user"] == "<b>not bold</b> & <script>window.__pwned = 7</script>" and out["userTags"] == 0
    assert {"h3", "strong", "em", "code", "a", "pre", "ul", "ol", "li", "blockquote", "button", "table", "th", "td"} <= set(out["tags"]), out
    cells = page.evaluate("[...document.querySelectorAll('.msg.assistant td')].map((e) => e.innerHTML)")
    assert cells == ["<strong>a</strong>", "&lt;b&gt;1&lt;/b&gt;"], cells
    assert out["links"] == [["good link", "https://example.org/", "noopener noreferrer nofollow"]]
    assert "[bad one](javascript:window.__pwned=2)" in out["text"]
    assert "<script>window.__pwned = 3</script>" in out["text"] and '<svg onload="window.__pwned=6">' in out["text"]
    assert out["code"] == ["<script>window.__pwned = 4</script>"]
    page.click(".code button.copy")
    assert page.evaluate("navigator.clipboard.readText()") == "<script>window.__pwned = 4</script>"
    _shot(page, "desktop-markdown")

    # streaming: a half-written code fence already renders as a code block (no jump when it closes)
    frag = page.evaluate("""async () => {
        const {renderMarkdown} = await import("./markdown.js");
        const d = document.createElement("div");
        d.append(renderMarkdown("Here:\\n```py\\nprint(1)"));
        return d.innerHTML;
    }""")
    assert "<pre" in frag and "print(1)" in frag and 'data-lang="py"' in frag, frag

    # export: every conversation as JSON, downloaded
    with page.expect_download() as dl:
        page.click("#export")
    data = json.loads(Path(dl.value.path()).read_text())
    assert data["format"] == "webinfer-chat-export" and len(data["conversations"]) == 2
    assert data["conversations"][1]["messages"][1]["content"] == UNTRUSTED

    # delete (confirmed), then the list and the store both lose it
    page.once("dialog", lambda d: d.accept())
    page.click("#history li:nth-child(1) .del")
    page.wait_for_function("document.querySelectorAll('#history li').length === 1")
    n = page.evaluate("async () => (await (await import('./store.js')).listConversations()).length")
    assert n == 1
    # New chat: an empty conversation, kept only once it has a message
    page.click("#new")
    assert page.query_selector_all(".msg") == [] and page.is_visible(".empty")
    assert page.evaluate("document.activeElement.id") == "input"
    assert len(page.query_selector_all("#history li")) == 1
    assert not [l for l in logs if l.startswith("pageerror")], logs


def test_accessibility_axe_desktop_and_phone(site, browser):
    logs: list[str] = []
    page = _open(browser, site, logs)
    page.evaluate("""async (answer) => {
        const s = await import("./store.js");
        const c = s.newConversation(null);
        c.messages.push({role: "user", content: "show me code"}, {role: "assistant", content: answer, stats: "9 tokens"});
        await s.saveConversation(c);
    }""", UNTRUSTED)
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert _axe(page) == []
    page.click("#settings-open")
    assert _axe(page) == []  # the settings dialog: every field labelled
    page.keyboard.press("Escape")
    page.set_viewport_size(PHONE)
    assert _axe(page) == []
    page.click("#menu")
    assert _axe(page) == []  # the sidebar over the chat
    _shot(page, "phone-history")
    # every control has an accessible name (labels, aria-label or text)
    unnamed = page.evaluate("""() => [...document.querySelectorAll("button, select, textarea, input")]
        .filter((e) => !(e.labels?.length || e.getAttribute("aria-label") || e.textContent.trim() || e.getAttribute("aria-labelledby")))
        .map((e) => e.outerHTML.slice(0, 80))""")
    assert unnamed == []
    # and the check can fail: light grey text on white is caught
    page.evaluate("""() => { const p = document.createElement("p"); p.textContent = "faint"; p.style.color = "#aaa";
                             p.style.background = "#fff"; document.querySelector("#log").append(p); }""")
    assert [v["id"] for v in _axe(page)] == ["color-contrast"]


def test_every_error_kind_has_plain_words(site, browser):
    """The mapping from the worker's error names to what the user reads (errors.js), for the kinds a test cannot
    provoke cheaply here (quota, device loss, GPU limits, context overflow): each says what happened and what to do."""
    page = _open(browser, site, [])
    out = page.evaluate("""async () => {
        const {explain} = await import("./errors.js");
        const err = (name, message) => Object.assign(new Error(message), {name});
        const model = {name: "SmolLM2"};
        return Object.fromEntries([
            ["quota", err("QuotaExceededError", "The quota has been exceeded.")],
            ["lost", err("DeviceLostError", "the GPU device was lost during generation")],
            ["limits", err("GPUError", "buffer size 300000000 exceeds the limit maxBufferSize")],
            ["small", err("PreflightError", "The GPU allows only 4 storage buffers per shader; 8 are needed.")],
            ["context", err("ContextOverflowError", "prompt of 9000 tokens > context 8192")],
            ["download", err("DownloadError", "models/x/a.bin: HTTP 503 Service Unavailable")],
            ["other", err("TypeError", "x is undefined")],
        ].map(([k, e]) => [k, explain(e, model)]));
    }""")
    assert "storage" in out["quota"][0] and "Remove models" in out["quota"][1]
    assert "GPU was reset" in out["lost"][0] and "Send again" in out["lost"][1]
    assert "too small for SmolLM2" in out["limits"][0] and "maxBufferSize" in out["limits"][1]
    assert "too small for SmolLM2" in out["small"][0]
    assert "longer than the model can read" in out["context"][0] and "new chat" in out["context"][1]
    assert "could not be downloaded" in out["download"][0] and "HTTP 503" in out["download"][1]
    assert out["other"] == ["Something went wrong (TypeError).", "x is undefined"]
