"""`webinfer serve` under hostile requests (issue 15): who may ask, bounded resources, plain errors.

Real HTTP (uvicorn in a thread, raw sockets where a client library would normalise the attack) against the fake
runner. Each test is one class of attack; the hypothesis test posts random JSON bodies and random bytes and
requires a 2xx/4xx/503 answer, never a 500.

Run: python -m pytest tests/test_server_hostile.py -q
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.fake_model import FakeRunner, FakeTokenizer
from tests.test_server import ServerThread, metrics
from webinfer.api import LLM, Limits
from webinfer.engine.engine import AsyncEngine
from webinfer.prompt import Prompter
from webinfer.errors import WebinferError
from webinfer_packager.server.app import create_app, serve

VOCAB, EOS = 40, (0,)
TEMPLATE = "{% for m in messages %}{{ m.role[0] }} {{ m.content }}.{% endfor %}{% if add_generation_prompt %}a {% endif %}"
BAD_ID_PROMPT = [7, 7, 7, 7]  # the runner answers this prompt with an id outside the vocabulary
JSON = {"content-type": "application/json"}
ORIGINS = ("http://good.example", "chrome-extension://*")


class PoisonRunner(FakeRunner):
    async def execute(self, batch):
        out = await super().execute(batch)
        sampling = [c for c in batch.chunks if c.sample]
        return [10**6 if c.token_ids[:4] == BAD_ID_PROMPT or (c.start_pos == 0 and c.token_ids[:4] == BAD_ID_PROMPT)
                else t for c, t in zip(sampling, out)]


class SlowTokenizer(FakeTokenizer):
    """Encoding a text containing '!' takes a second (a huge prompt, or a slow template, stands for it)."""

    def encode_segments(self, segments, add_special_tokens=False):
        if any("!" in t for t, _ in segments):
            time.sleep(1.0)
        return super().encode_segments(segments, add_special_tokens)

    def encode(self, text, add_special_tokens=False, parse_special=True):
        return self.encode_segments([(text, parse_special)], add_special_tokens)


def make(delay_s=0.002, model_name="fake", **kw):
    runner = PoisonRunner(num_blocks=64, block_size=4, max_model_len=96, vocab=VOCAB, delay_s=delay_s)
    engine = AsyncEngine(runner, eos_ids=EOS, max_num_batched_tokens=32, max_num_seqs=kw.pop("max_num_seqs", 16))
    tok = SlowTokenizer(VOCAB)
    limits = kw.pop("limits", None) or Limits(max_tokens=64, max_messages=4)
    llm = LLM(engine, tok, Prompter(tok, TEMPLATE, {}, None, EOS, VOCAB), model_name, limits)
    app = create_app(llm, max_body_bytes=4096, allowed_origins=ORIGINS, **kw)
    return app, llm


@pytest.fixture(scope="module")
def server():
    app, llm = make(body_timeout_s=1.0, max_waiting=64)
    with ServerThread(app) as url:
        yield url, llm.engine


def port(url) -> int:
    return int(url.rsplit(":", 1)[1])


def raw(url, data: bytes, timeout=10.0) -> bytes:
    """Send raw bytes; return everything the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port(url)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and (b"content-length: 0" in out.lower() or out.endswith(b"}")):
                    break
        except socket.timeout:
            pass
    return out


def status(resp: bytes) -> int:
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/1.1 ") else 0


def chat(content="hi", **kw):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **kw}


# ---------------------------------------------------------------------------------------------------- bodies


def test_chunked_body_is_counted_as_it_arrives(server):
    url, _ = server
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", port(url)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        try:
            while sent < 200 << 20:
                s.sendall(chunk)
                sent += 65536
        except OSError:  # the server answered and closed while we were still sending
            pass
        try:
            answer = s.recv(65536)
        except OSError:
            pass
    assert sent < 64 << 20, f"the server kept reading: {sent} bytes"  # was: all 200 MB accepted
    assert answer == b"" or status(answer) == 413, answer[:200]


def test_content_length_and_transfer_encoding_together_are_refused(server):
    url, _ = server
    body = json.dumps({"prompt": "ab", "max_tokens": 2}).encode()
    r = raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (len(body), len(body), body))
    assert status(r) == 400, r[:300]


def test_a_body_that_arrives_too_slowly_times_out(server):
    url, _ = server
    t0 = time.perf_counter()
    r = raw(url, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\"", timeout=20)
    assert status(r) == 408 and time.perf_counter() - t0 < 15, r[:300]


# ---------------------------------------------------------------------------------------------------- who may ask


def test_cross_origin_simple_request_is_not_executed(server):
    url, engine = server
    before = metrics(url)["webinfer_generated_tokens_total"]
    r = httpx.post(url + "/v1/chat/completions", content=json.dumps(chat()), headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = httpx.post(url + "/v1/chat/completions", json=chat(), headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert metrics(url)["webinfer_generated_tokens_total"] == before  # nothing ran


@pytest.mark.parametrize("origin, ok", [("http://good.example", True), ("chrome-extension://abcdef", True),
                                        ("http://evil.example", False), ("http://good.example.evil.com", False),
                                        ("null", False), ("http://127.0.0.1:1", False)])
def test_origin_allowlist_and_cors(server, origin, ok):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", json=chat(), headers={"Origin": origin})
    assert r.status_code == (200 if ok else 403)
    assert (r.headers.get("access-control-allow-origin") == origin) == ok
    pre = httpx.options(url + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == (204 if ok else 403)
    assert (pre.headers.get("access-control-allow-origin") == origin) == ok


def test_same_origin_page_may_ask(server):
    url, _ = server
    assert httpx.post(url + "/v1/chat/completions", json=chat(), headers={"Origin": url}).status_code == 200


def test_api_key():
    app, _ = make(api_key="s3cret")
    with ServerThread(app) as url:
        assert httpx.post(url + "/v1/chat/completions", json=chat()).status_code == 401
        assert httpx.post(url + "/v1/chat/completions", json=chat(),
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url + "/metrics").status_code == 401
        r = httpx.post(url + "/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"]
        assert httpx.get(url + "/health").status_code == 200
    with pytest.raises(WebinferError, match="API key"):
        serve(make()[1], host="0.0.0.0", port=1)


@pytest.mark.parametrize("host", ["localhost:8000:1", "127.0.0.1@evil.example", "localhost.", "[::1]x",
                                  "localhost:99999", "localhost:abc", "evil.example#localhost", "local host",
                                  "LOCALHOST.evil", "127.0.0.1.nip.io", "[::1", "::1"])
def test_lenient_host_values_are_refused(server, host):
    url, _ = server
    r = raw(url, b"GET /health HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    assert status(r) in (400, 403), (host, r[:200])


def test_two_host_headers_are_refused(server):
    url, _ = server
    r = raw(url, b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n")
    assert status(r) in (400, 403)


# ---------------------------------------------------------------------------------------------------- plain errors


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user\\udfff", "content": "hi"}]}'),
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "ab", "stop": ["\\udc80"]}'),
    ("/v1/completions", b'{"\\ud800": 1, "prompt": "ab"}'),
])
def test_lone_surrogates_give_400(server, path, body):
    url, _ = server
    r = httpx.post(url + path, content=body, headers=JSON)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 2000 + b"1" + b"}" * 2000,
                                  b'{"prompt": "ab", "x": ' + b"[" * 40 + b"]" * 40 + b"}",
                                  b'{"prompt": "ab", "max_tokens": ' + b"9" * 5000 + b"}"])
def test_deep_or_huge_json_gives_400(body):
    app, _ = make()
    with ServerThread(app) as url:  # its own server: these bodies are over the shared fixture's 4 KiB cap
        pass
    app, _ = make()
    app.user_middleware[0].kwargs["max_body_bytes"] = 1 << 20
    with ServerThread(app) as url:
        r = httpx.post(url + "/v1/completions", content=body, headers=JSON)
        assert r.status_code == 400, r.text[:300]


def test_long_url_gives_414_without_paths(server, tmp_path):
    url, _ = server
    r = raw(url, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status(r) == 414 and b"/tmp" not in r and b"/work" not in r
    # a site's long file names: 404, never a 500 that shows the site folder
    (tmp_path / "index.html").write_text("hi")
    app = create_app(make()[1], site=tmp_path)
    with ServerThread(app) as url2:
        r = httpx.get(url2 + "/" + "b" * 300 + "/" + "c" * 1500)
        assert r.status_code == 404 and str(tmp_path) not in r.text


def test_metrics_label_injection_is_escaped():
    app, _ = make(model_name='x"} 1\nwebinfer_fake_metric{a="b')
    with ServerThread(app) as url:
        text = httpx.get(url + "/metrics").text
    import re

    sample = re.compile(r'^webinfer_[a-z_]+\{model="(?:[^"\\\n]|\\.)*"\} [0-9.e+-]+$')  # Prometheus text format
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(samples) == 11 and all(sample.match(line) for line in samples), samples[:3]
    assert 'model="x\\"} 1\\nwebinfer_fake_metric{a=\\"b"' in text


# ---------------------------------------------------------------------------------------------------- bounded work


def test_non_streaming_request_is_aborted_when_its_client_leaves():
    app, _ = make(delay_s=0.03)
    with ServerThread(app) as url:
        body = json.dumps({"prompt": "abcdef", "max_tokens": 64, "temperature": 0, "ignore_eos": True}).encode()
        socks = []
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port(url)))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(s)
        time.sleep(0.5)
        for s in socks:
            s.close()
        t0 = time.time()
        while True:
            m = metrics(url)
            if m["webinfer_running_sequences"] == 0 and m["webinfer_queue_length"] == 0:
                break
            assert time.time() - t0 < 5, m
            time.sleep(0.05)
        assert m["webinfer_requests_aborted_total"] == 8
        assert m["webinfer_generated_tokens_total"] < 8 * 64 / 2  # was: all 8 x 64 generated for nobody
        assert m["webinfer_kv_blocks_used"] == 0


def test_waiting_queue_is_bounded_with_retry_after():
    app, _ = make(delay_s=0.02, max_waiting=4, max_num_seqs=2)
    with ServerThread(app) as url:
        async def main():
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(*(c.post(url + "/v1/completions", json={
                    "prompt": "abc" + "d" * i, "max_tokens": 16, "temperature": 0, "ignore_eos": True}) for i in range(30)))
        rs = asyncio.run(main())
        codes = [r.status_code for r in rs]
        assert set(codes) <= {200, 503} and codes.count(503) >= 10 and codes.count(200) >= 4, codes
        busy = next(r for r in rs if r.status_code == 503)
        assert int(busy.headers["retry-after"]) > 0 and busy.json()["error"]["type"] == "server_busy"


def _schema(n: int) -> dict:
    return {"type": "json_schema", "json_schema": {"schema": {"type": "string", "maxLength": n}}}


def test_grammar_compiles_are_bounded_and_lower_the_switch_interval():
    """Compiles run in the LLM's threads, at most limits.max_grammar_compiles at once: one more is a 503 with
    Retry-After while the event loop stays free. While a compile runs, the GIL switch interval is lowered (the
    engine loop re-takes the GIL after each GPU call; at Python's 5 ms decoding slowed 5-9x beside a compile), and
    it is restored when the last compile ends."""
    import sys

    from webinfer.api import COMPILE_SWITCH_INTERVAL_S

    app, llm = make(limits=Limits(max_tokens=64, max_messages=4, max_grammar_compiles=1))
    before = sys.getswitchinterval()
    assert before > COMPILE_SWITCH_INTERVAL_S
    with ServerThread(app) as url:
        out = []
        with llm.grammars.vocab.lock:  # the compile thread waits for the vocabulary's lock: a compile under way
            t = threading.Thread(target=lambda: out.append(httpx.post(url + "/v1/completions", timeout=30, json={
                "prompt": "ab", "max_tokens": 2, "response_format": _schema(3)})))
            t.start()
            t0 = time.time()
            while llm.compiles != 1:
                assert time.time() - t0 < 10
                time.sleep(0.01)
            assert sys.getswitchinterval() == COMPILE_SWITCH_INTERVAL_S
            r = httpx.post(url + "/v1/completions", timeout=10, json={
                "prompt": "ab", "max_tokens": 2, "response_format": _schema(4)})
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_busy", r.text
            assert int(r.headers["retry-after"]) > 0
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        t.join(30)
        assert out and out[0].status_code == 200, out
        t0 = time.time()
        while llm.compiles:
            assert time.time() - t0 < 10
            time.sleep(0.01)
        assert sys.getswitchinterval() == before
        r = httpx.post(url + "/v1/completions", timeout=10, json={  # compiled: served from the cache
            "prompt": "ab", "max_tokens": 2, "response_format": _schema(3)})
        assert r.status_code == 200 and llm.compiles == 0


def test_a_grammar_past_the_compile_timeout_is_a_400_and_refused_again_at_once():
    from webinfer.grammar import GrammarError, response_format_key

    app, llm = make(limits=Limits(max_tokens=64, max_messages=4, grammar_timeout_s=1e-9))
    with ServerThread(app) as url:
        for _ in range(2):
            r = httpx.post(url + "/v1/completions", timeout=10, json={
                "prompt": "ab", "max_tokens": 2, "response_format": _schema(5)})
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "response_format", r.text
            assert "took more than 1e-09 s to compile" in err["message"]
            with pytest.raises(GrammarError, match="took more than"):
                llm.grammars.peek(response_format_key(_schema(5)))  # the refusal is what the cache holds
        assert llm.compiles == 0


def test_slow_prompt_preparation_does_not_stall_the_event_loop(server):
    url, _ = server

    def post():
        httpx.post(url + "/v1/completions", json={"prompt": "ab!", "max_tokens": 2}, timeout=30)
    threads = [threading.Thread(target=post) for _ in range(3)]  # 3 s of tokenizing, one after the other
    for t in threads:
        t.start()
    time.sleep(0.3)
    r = httpx.get(url + "/health", timeout=2.5)  # on the event loop this would wait for all three
    assert r.status_code == 200
    for t in threads:
        t.join()


def test_a_failing_step_fails_only_its_request_and_a_dead_engine_shows_in_health():
    app, llm = make(delay_s=0.005)
    engine = llm.engine
    with ServerThread(app) as url:
        async def main():
            async with httpx.AsyncClient(timeout=30) as c:
                return await asyncio.gather(
                    c.post(url + "/v1/completions", json={"prompt": BAD_ID_PROMPT, "max_tokens": 8}),
                    *(c.post(url + "/v1/completions", json={"prompt": "abc" * (i + 1), "max_tokens": 8})
                      for i in range(4)))
        bad, *good = asyncio.run(main())
        assert bad.status_code == 500 and "outside the vocabulary" in bad.json()["error"]["message"]
        assert [r.status_code for r in good] == [200] * 4
        assert httpx.get(url + "/health").status_code == 200
        # now a bug outside any one request kills the loop: health says so, requests get 503, not a hang

        def broken():
            raise RuntimeError("scheduler bug")
        engine.scheduler.schedule = broken
        r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 4}, timeout=10)
        assert r.status_code == 503
        h = httpx.get(url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "dead"
        assert httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 4}).status_code == 503


# ---------------------------------------------------------------------------------------------------- random bodies

_json = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                  max_size=4), max_leaves=20)
_field = st.sampled_from(["messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                          "stream", "max_completion_tokens", "model"])
_msg = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", 3]),
                              "content": st.text(max_size=30) | _json})
_body = st.one_of(_json, st.dictionaries(_field, _json, max_size=6),
                  st.fixed_dictionaries({"messages": st.lists(_msg, max_size=5)},
                                        optional={"max_tokens": st.integers(-5, 100), "stream": st.booleans(),
                                                  "stop": _json, "temperature": st.floats()}))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=_body, chat_path=st.booleans(), junk=st.binary(max_size=64))
def test_random_bodies_never_give_500(server, body, chat_path, junk):
    url, _ = server
    path = "/v1/chat/completions" if chat_path else "/v1/completions"
    try:
        data = json.dumps(body, allow_nan=True).encode()
    except (ValueError, TypeError):
        data = junk
    r = httpx.post(url + path, content=data, headers=JSON, timeout=30)
    assert r.status_code in (200, 400, 413, 503), (body, r.status_code, r.text[:300])
    r = httpx.post(url + path, content=junk, headers=JSON, timeout=30)
    assert r.status_code in (200, 400, 413), (junk, r.status_code, r.text[:300])
