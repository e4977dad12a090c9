"""The HTTP server through real HTTP: uvicorn on 127.0.0.1 in a thread, the fake runner behind it.
Run: python -m pytest tests/test_server.py -q"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from tests.fake_model import FakeRunner, FakeTokenizer, fake_llm, generate_alone
from webinfer.api import Limits
from webinfer_packager.server.app import create_app

VOCAB, EOS = 40, (0,)
TEMPLATE = "{% for m in messages %}{{ m.role[0] }} {{ m.content }}.{% endfor %}{% if add_generation_prompt %}a {% endif %}"
SHA = "ab" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 10, "uvicorn did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    outside = root.parent / "secret.txt"
    outside.write_text("secret")
    (root / "index.html").write_text("<h1>hi</h1>")
    (root / "pyodide.asm.wasm").write_bytes(b"\0asm")
    (root / "worker.mjs").write_text("export {}")
    (root / f"{SHA}.json").write_text("{}")
    (root / "app.3f2a9c1b.js").write_text("1")
    (root / "webinfer-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    (root / "k.wgsl").write_text("fn f() {}")
    os.symlink(outside, root / "link.txt")
    return root


@pytest.fixture(scope="module")
def server(site):
    runner = FakeRunner(num_blocks=48, block_size=4, max_model_len=96, vocab=VOCAB, delay_s=0.002)
    llm = fake_llm(runner, VOCAB, EOS, TEMPLATE, limits=Limits(max_tokens=64, max_messages=4),
                   max_num_batched_tokens=32, max_num_seqs=16)
    app = create_app(llm, site=site, max_body_bytes=4096)
    with ServerThread(app) as url:
        yield url, llm.engine


def metrics(url) -> dict:
    text = httpx.get(url + "/metrics").text
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def sse_events(lines) -> list:
    return [line[6:] for line in lines if line.startswith("data: ")]


def test_chat_plain_and_streaming(server):
    url, _ = server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    want, reason = generate_alone(FakeTokenizer(VOCAB).encode("u hi.a "), 10, VOCAB, EOS)
    assert r.json()["choices"][0]["token_ids"] == want and r.json()["choices"][0]["finish_reason"] == reason
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = sse_events(s.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == want
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == r.json()["choices"][0]["message"]["content"]
    r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
    assert r.json()["choices"][0]["token_ids"] == generate_alone(FakeTokenizer(VOCAB).encode("abc"), 3, VOCAB, EOS)[0]
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "fake"
    assert httpx.get(url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 65}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}] * 5}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"prompt": ""}, "prompt"),
])
def test_limits_give_400_naming_the_field(server, body, param):
    url, _ = server
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_overflow_bad_json_huge_body_and_host(server):
    url, _ = server
    r = httpx.post(url + "/v1/completions", json={"prompt": "a" * 100, "max_tokens": 2})
    assert r.status_code == 400 and "100" in r.json()["error"]["message"] and "95" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    # 413 comes from the Content-Length alone: the client offers 10 MB but the server answers before reading it
    c = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=5)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Content-Length", str(10 << 20))
    c.putheader("Content-Type", "application/json")
    c.endheaders()
    c.send(b"{")
    assert c.getresponse().status == 413
    # chunked body over the cap
    r = httpx.post(url + "/v1/completions", content=iter([b" " * 3000, b" " * 3000]),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = httpx.get(url + "/health", headers={"Host": "evil.example:8000"})
    assert r.status_code == 403
    assert httpx.get(url + "/health", headers={"Host": "localhost"}).status_code == 200


TRAVERSAL = ["/../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E/secret.txt", "/..%2fsecret.txt", "/..%2Fsecret.txt",
             "/..\\secret.txt", "/%5c..%5csecret.txt", "/index.html%00", "/link.txt", "/./index.html/../../secret.txt",
             "//etc/passwd", "/%252e%252e/secret.txt", "/nope.js"]


@pytest.mark.parametrize("path", TRAVERSAL)
def test_static_paths_never_escape(server, path):
    url, _ = server
    c = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=5)
    c.request("GET", path)  # http.client sends the path as written (httpx would normalise it)
    r = c.getresponse()
    body = r.read()
    assert r.status in (400, 404) and b"secret" not in body.replace(b"secret.txt", b"")


@pytest.mark.parametrize("name, mime, immutable", [
    ("", "text/html", False), ("index.html", "text/html", False), ("pyodide.asm.wasm", "application/wasm", False),
    ("worker.mjs", "text/javascript", False), (f"{SHA}.json", "application/json", True),
    ("app.3f2a9c1b.js", "text/javascript", True), ("webinfer-0.1.0-py3-none-any.whl", "application/zip", False),
    ("k.wgsl", "text/wgsl", False),
])
def test_static_mime_and_cache(server, name, mime, immutable):
    url, _ = server
    r = httpx.get(f"{url}/{name}")
    assert r.status_code == 200 and r.headers["content-type"].split(";")[0] == mime
    assert (r.headers["cache-control"] == "public, max-age=31536000, immutable") == immutable
    # cross-origin isolated pages (the CPU engine's shared wasm memory between Workers)
    assert r.headers["cross-origin-opener-policy"] == "same-origin"
    assert r.headers["cross-origin-embedder-policy"] == "require-corp"


def test_16_concurrent_streams_with_random_disconnects(server):
    url, engine = server
    rng = random.Random(1)
    jobs = []
    for i in range(16):
        prompt = "".join(rng.choice("abcdefghij") for _ in range(rng.randrange(1, 30)))
        temp = rng.choice([0.0, 0.8])
        cut = rng.random() < 0.4
        jobs.append((prompt, temp, i, rng.randrange(1, 4) if cut else None))

    async def one(client, prompt, temp, seed, cut_after):
        body = {"prompt": prompt, "max_tokens": 24, "temperature": temp, "seed": seed, "stream": True}
        ids, done = [], False
        async with client.stream("POST", url + "/v1/completions", json=body) as s:
            n = 0
            async for line in s.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                ids += json.loads(line[6:])["choices"][0]["token_ids"]
                n += 1
                if cut_after is not None and n >= cut_after:
                    break  # leaving the block closes the connection mid-stream
        return ids, done

    async def main():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, *j) for j in jobs))

    results = asyncio.run(main())
    for (prompt, temp, seed, cut), (ids, done) in zip(jobs, results):
        want, _ = generate_alone(FakeTokenizer(VOCAB).encode(prompt), 24, VOCAB, EOS, temperature=temp, seed=seed)
        if cut is None:
            assert done and ids == want
        else:
            assert ids == want[:len(ids)]
    t0 = time.time()
    while True:
        m = metrics(url)
        if m["webinfer_kv_blocks_used"] == 0 and m["webinfer_running_sequences"] == 0:
            break
        assert time.time() - t0 < 2, f"blocks still held after the streams ended: {m}"
        time.sleep(0.02)
    assert m["webinfer_queue_length"] == 0 and m["webinfer_kv_blocks_free"] == 47
    assert m["webinfer_generated_tokens_total"] > 0
    assert m["webinfer_requests_aborted_total"] >= 1  # some cut streams were still generating: aborted, not run out
