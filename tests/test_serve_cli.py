"""`webinfer serve` as a process and its site cache (issue 15): a corrupted package is refused before serving, the
chat site is reused only when its content matches, and SIGTERM stops the server even with work queued.

Run: python -m pytest tests/test_serve_cli.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests import synthetic
from webinfer_packager.pack.build import pack


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    return pack(synthetic.write_gguf(tmp / "m.gguf"), tmp / "tiny", progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flip_biggest_bin(folder: Path) -> Path:
    f = max(folder.glob("*.bin"), key=lambda p: p.stat().st_size)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 1
    f.write_bytes(bytes(data))
    return f


def _serve(pkg, port, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "webinfer_packager.cli.main", "serve", str(pkg), "--backend",
                             "reference", "--port", str(port), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_serve_refuses_a_corrupted_package(tiny, tmp_path):
    bad = Path(shutil.copytree(tiny, tmp_path / "bad"))
    f = _flip_biggest_bin(bad)
    p = _serve(bad, _free_port(), "--no-site")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and f.name in err and "Traceback" not in err, err[-2000:]


def test_serve_beyond_loopback_needs_a_key(tiny):
    env = {k: v for k, v in os.environ.items() if k != "WEBINFER_API_KEY"}
    p = _serve(tiny, _free_port(), "--no-site", "--host", "0.0.0.0", env=env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "API key" in err


def test_serve_grammar_timeout(tiny):
    """--grammar-timeout reaches the API: a schema whose compile passes it is a 400 naming response_format; a
    timeout that is not a positive number is refused before loading."""
    p = _serve(tiny, _free_port(), "--no-site", "--grammar-timeout", "0")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--grammar-timeout must be a positive number" in err, err[-2000:]
    port = _free_port()
    p = _serve(tiny, port, "--no-site", "--grammar-timeout", "1e-6")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(p, url)
        r = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"schema": {"type": "string", "minLength": 3}}}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        assert "took more than 1e-06 s to compile" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        p.kill()
        p.wait()


def wait_healthy(p, url: str, timeout_s: float = 120) -> None:
    """Until the server process p answers /health with 200 (it failing or the time running out fails the test)."""
    t0 = time.time()
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert p.poll() is None and time.time() - t0 < timeout_s, p.stderr.read() if p.poll() is not None else "timeout"
        time.sleep(0.2)


def test_sigterm_stops_serve_with_renders_queued(tiny, tmp_path):
    """A chat template that spends its whole time budget on every render (the manifest edited after verify), 12
    requests queued behind it: SIGTERM still stops the server within seconds (it froze before)."""
    pkg = Path(shutil.copytree(tiny, tmp_path / "slow"))
    m = json.loads((pkg / "manifest.json").read_text())
    m["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (pkg / "manifest.json").write_text(json.dumps(m))
    port = _free_port()
    p = _serve(pkg, port, "--no-site")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(p, url)
        codes = []

        def ask():
            try:
                r = httpx.post(url + "/v1/chat/completions", timeout=60,
                               json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
                codes.append(r.status_code)
            except httpx.HTTPError:
                codes.append(None)
        threads = [threading.Thread(target=ask, daemon=True) for _ in range(12)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert httpx.get(url + "/health", timeout=2).status_code == 200  # the event loop is free meanwhile
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        assert time.time() - t0 < 20
        assert 200 not in codes and all(c in (400, 500, 503, None) for c in codes), codes
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------------------------------- site cache


def _site_inputs_available() -> bool:
    from webinfer.errors import WebinferError
    from webinfer_packager.site.build import DEPENDENCY_WHEELS, dependency_wheel, pyodide_dir

    try:
        pyodide_dir(fetch=False)
        for name in DEPENDENCY_WHEELS:
            dependency_wheel(name)
        return True
    except WebinferError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(str(e))
        return False


def test_site_cache_is_keyed_by_content(tiny, tmp_path, monkeypatch):
    if not _site_inputs_available():
        pytest.skip("the chat site's inputs (Pyodide, wheels) are not set up: scripts/setup-browser.sh")
    from webinfer.package import Package
    from webinfer_packager.cli.serve import default_site

    monkeypatch.setenv("WEBINFER_HOME", str(tmp_path / "home"))
    a = Path(default_site(tiny))
    assert default_site(tiny) == str(a)  # reused as is
    # the cached copy is damaged: it is rebuilt, not served
    model = next((a / "models").iterdir())
    _flip_biggest_bin(model)
    assert default_site(tiny) == str(a)
    Package.open(model).check_files()
    # another package with the same folder name but other weights gets its own site
    other = pack(synthetic.write_gguf(tmp_path / "o.gguf", seed=1), tmp_path / "o" / tiny.name, progress=False)
    b = Path(default_site(other))
    assert b != a and b.name.startswith(tiny.name)
    assert json.loads((b / "site.json").read_text())["models"][0]["sha256"] != \
        json.loads((a / "site.json").read_text())["models"][0]["sha256"]
