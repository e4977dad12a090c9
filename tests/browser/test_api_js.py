"""webinfer.js takes the request objects of Python's LLM and returns the same response shapes: one plain chat request,
one with a forced tool call and n=2, and a completion that echoes its 20-token prompt with logprobs and asks
vLLM's prompt_logprobs (two groups of scored rows on the page's GPU model), whole (not streamed), in Chromium (Pyodide + WebGPU on SwiftShader) against
the same requests through the native engine (webinfer.open, wgpu-py on lavapipe): the same keys, token ids, text
and tool calls, logprobs within 2e-3 as GPU against reference elsewhere (measured: 3.1e-4 at most, SwiftShader
against lavapipe: two GPUs' exp and log over the same tiny random model). The tool call's stream, assembled as a client does,
gives the same call.

Run: python -m pytest tests/browser/test_api_js.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import SiteServer, attach_console

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
PLAIN = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
TOOL_N = {"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 400, "temperature": 1.0, "seed": 1,
          "n": 2, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
          "tool_choice": "required", "parallel_tool_calls": False}
ECHO = {"prompt": [5, 9, 13, 2, 40, 41, 3] + list(range(60, 73)), "max_tokens": 2, "echo": True, "logprobs": 2,
        "temperature": 0, "prompt_logprobs": 3}  # (vLLM's extension too: {id: {logprob, rank, decoded_token}})

RUN = """async ([url, reqs]) => {
    const w = await import("./webinfer.js");
    const engine = await w.load(url, {backend: "webgpu"});
    const out = [];
    for (const r of reqs) out.push(await ("prompt" in r ? engine.completions : engine.chat.completions).create(r));
    const calls = {};
    for await (const c of engine.chat.completions.create({...reqs[1], n: 1, stream: true}))
        for (const tc of c.choices[0]?.delta?.tool_calls ?? []) {
            const t = calls[tc.index] ??= {name: null, arguments: ""};
            t.name = tc.function?.name ?? t.name;
            t.arguments += tc.function?.arguments ?? "";
        }
    engine.unload();
    return {out, streamed: Object.values(calls)};
}"""


@pytest.fixture(scope="module")
def tools_site(tmp_path_factory):
    from tests.synthetic import write_hf
    from webinfer_packager.pack.build import pack
    from webinfer_packager.site.build import build_site

    d = tmp_path_factory.mktemp("apijs")
    write_hf(d / "hf", max_position_embeddings=2048)
    pkg = pack(d / "hf", d / "tiny", progress=False, name="tiny", shard_mb=1,
               chat_template=(ROOT / "docs/chat-templates/hermes-tools.jinja").read_text())
    build_site([pkg], d / "site")
    return pkg, d / "site"


def _native(package, reqs):
    from concurrent.futures import ThreadPoolExecutor

    def run():
        import asyncio

        import webinfer.factory as factory

        llm = factory.open(package)
        return [asyncio.run((llm.completions if "prompt" in r else llm.chat.completions).create(**r)) for r in reqs]

    with ThreadPoolExecutor(1) as ex:  # Playwright's sync API keeps an asyncio loop running in this thread
        return ex.submit(run).result()


def _shape(x):
    """Keys (recursively) and value types, without the values: what must agree between the two APIs."""
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shape(v) for v in x]
    return type(x).__name__ if x is not None else None


def _volatile(r):
    """The response without what differs between runs: ids, timestamps, timings."""
    r = json.loads(json.dumps(r))
    for k in ("id", "created"):
        r.pop(k)
    for k in ("ttft_s", "time_per_output_token_s"):
        r["usage"].pop(k)
    r["usage"].pop("prompt_tokens_details")
    for c in r["choices"]:
        for tc in c.get("message", {}).get("tool_calls") or []:
            assert tc.pop("id").startswith("call_")
    return r


def _values(lps: dict) -> list:
    """A completions logprobs object's numbers: each token's logprob (None for an echoed prompt's first), then its
    alternatives'."""
    return list(lps["token_logprobs"]) + [v for t in lps["top_logprobs"] for v in (t or {}).values()]


def test_js_api_returns_what_python_returns(tools_site, browser, tmp_path):
    package, site_dir = tools_site
    srv = SiteServer(site_dir)
    logs: list[str] = []
    try:
        site = json.loads((site_dir / "site.json").read_text())
        page = browser.new_page()
        attach_console(page, logs)
        page.goto(srv.url + "index.html")
        r = page.evaluate(RUN, [site["models"][0]["manifest"], [PLAIN, TOOL_N, ECHO]])
    finally:
        srv.stop()
    want = _native(package, [PLAIN, TOOL_N, ECHO])
    for js, py in zip(r["out"], want):
        assert _shape(_volatile(js)) == _shape(_volatile(py)), (js, py)
        js_v, py_v = _volatile(js), _volatile(py)
        for cj, cp in zip(js_v["choices"], py_v["choices"]):
            lj, lp = cj.pop("logprobs", None), cp.pop("logprobs", None)
            assert (lj is None) == (lp is None)
            if lj is not None:
                assert lj["tokens"] == lp["tokens"] and lj["text_offset"] == lp["text_offset"]
                assert [list(t or {}) for t in lj["top_logprobs"]] == [list(t or {}) for t in lp["top_logprobs"]]
                assert all((a is None and b is None) or abs(a - b) < 2e-3 for a, b in zip(_values(lj), _values(lp)))
            pj, pp = cj.pop("prompt_logprobs", None), cp.pop("prompt_logprobs", None)
            assert (pj is None) == (pp is None)
            if pj is not None:  # (JSON object keys: the page's are strings, Python's ints)
                assert len(pj) == len(pp) == 20 and pj[0] is None and pp[0] is None
                for dj, dp in zip(pj[1:], pp[1:]):
                    assert sorted(dj) == sorted(map(str, dp)), (dj, dp)
                    for k, v in dp.items():
                        assert dj[str(k)]["rank"] == v["rank"] and dj[str(k)]["decoded_token"] == v["decoded_token"]
                        assert abs(dj[str(k)]["logprob"] - v["logprob"]) < 2e-3
        js_v["usage"].pop("speculative", None), py_v["usage"].pop("speculative", None)
        assert js_v == py_v, (js_v, py_v, logs)
    echo = r["out"][2]["choices"][0]
    assert len(echo["logprobs"]["token_logprobs"]) == 22 and echo["logprobs"]["token_logprobs"][0] is None
    tool = r["out"][1]
    assert [c["finish_reason"] for c in tool["choices"]] == ["tool_calls", "tool_calls"], tool
    assert tool["choices"][0]["token_ids"] != tool["choices"][1]["token_ids"]  # independent samples
    first = tool["choices"][0]["message"]["tool_calls"][0]["function"]
    assert r["streamed"] == [{"name": first["name"], "arguments": first["arguments"]}]
