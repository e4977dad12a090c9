"""The pip path, as a new user takes it: build the wheel from the sources, install it into a clean virtual
environment, and run pack, generate, site and serve from a folder that is not a checkout.

Offline: the wheel installs with --no-deps, and the "full" environment sees this venv's site-packages through a
.pth file (its dependencies, not its editable webinfer: .pth files inside an added path are not processed). The
Pyodide runtime comes from a local stand-in for the npm registry serving the real tarball out of npm's cache."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)


def _pyodide_tarball() -> bytes:
    """The npm tarball that web/package-lock.json pins, from npm's content-addressed cache (filled by `npm ci`)."""
    lock = json.loads((REPO / "web" / "package-lock.json").read_text())
    integrity = lock["packages"]["node_modules/pyodide"]["integrity"]
    h = base64.b64decode(integrity.split("-", 1)[1]).hex()
    cache = Path(os.environ.get("npm_config_cache") or Path.home() / ".npm")
    f = cache / "_cacache" / "content-v2" / "sha512" / h[:2] / h[2:4] / h[4:]
    if not f.is_file():
        msg = f"the Pyodide tarball is not in npm's cache ({f}); run scripts/setup-browser.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return f.read_bytes()


class FakeRegistry:
    """Serves pyodide/-/pyodide-<version>.tgz (given bytes) on 127.0.0.1 and counts the requests."""

    def __init__(self, tarball: bytes):
        self.tarball, self.requests = tarball, 0
        reg = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                reg.requests += 1
                if not self.path.endswith(".tgz"):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(reg.tarball)))
                self.end_headers()
                self.wfile.write(reg.tarball)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """webinfer's wheel built from a copy of the sources git knows (so no build/ or egg-info lands in the tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    listed = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    for rel in filter(None, listed.stdout.split("\0")):
        p = REPO / rel
        if p.is_file() and not p.is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / rel)
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", src,
              "-w", tmp / "dist"])
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("webinfer-*.whl")
    return whl


def _venv(root: Path, wheel: Path, with_deps: bool) -> Path:
    r = _run([sys.executable, "-m", "venv", "--without-pip", root])
    assert r.returncode == 0, r.stderr
    py = root / "bin" / "python"
    r = _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel])
    assert r.returncode == 0, r.stderr[-3000:]
    if with_deps:
        site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        Path(site, "shared-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root / "bin"


def test_wheel_contents(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for f in ("webinfer_web/index.html.j2", "webinfer_web/app.js", "webinfer_web/markdown.js",
              "webinfer_web/package-lock.json", "webinfer_shaders/copy.wgsl", "webinfer_packager/cli/doctor.py"):
        assert f in names, f
    assert not any("node_modules" in n or n.startswith("tests/") for n in names)


def test_bare_install_names_the_missing_extra(wheel, tmp_path):
    bin_ = _venv(tmp_path / "bare", wheel, with_deps=False)
    r = _run([bin_ / "webinfer", "--version"], cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "webinfer 0.1.0", (r.stdout, r.stderr)
    r = _run([bin_ / "webinfer", "pack", tmp_path / "nothing", "-o", tmp_path / "pkg"], cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install "webinfer[pack]"' in lines[0], r.stderr  # one line, no traceback


def test_pip_path_pack_generate_site_serve(wheel, tmp_path):
    from tests.synthetic import write_hf

    bin_ = _venv(tmp_path / "venv", wheel, with_deps=True)
    work = tmp_path / "work"  # not a checkout: nothing here to find web/ or shaders/ in
    work.mkdir()
    env = {**os.environ, "WEBINFER_HOME": str(tmp_path / "home"), "PYTHONPATH": ""}
    env.pop("WEBINFER_PYODIDE_DIR", None)
    code = ("import webinfer, webinfer_packager, webinfer_web, webinfer_shaders as s; "
            "print(webinfer.__file__, webinfer_packager.__file__, list(s.__path__)[0])")
    where = _run([bin_ / "python", "-c", code], cwd=work, env=env)
    assert where.returncode == 0 and str(REPO) not in where.stdout and str(tmp_path / "venv") in where.stdout, where

    write_hf(work / "hf")
    r = _run([bin_ / "webinfer", "pack", work / "hf", "-o", work / "pkg", "--quiet", "--name", "tiny"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([bin_ / "webinfer", "generate", work / "pkg", "--prompt", "hello", "--max-tokens", "3", "--backend",
              "reference", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 1 <= len(json.loads(r.stdout)["output_ids"]) <= 3

    tarball = _pyodide_tarball()
    bad = FakeRegistry(tarball[:-1] + bytes([tarball[-1] ^ 1]))
    try:
        r = _run([bin_ / "webinfer", "site", work / "pkg", "-o", work / "site"],
                 cwd=work, env={**env, "WEBINFER_NPM_REGISTRY": bad.url})
    finally:
        bad.close()
    assert r.returncode == 2 and "sha512" in r.stderr and "package-lock.json" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "home" / "pyodide" / "314.0.7").exists() and not (work / "site").exists()

    reg = FakeRegistry(tarball)
    try:
        site_env = {**env, "WEBINFER_NPM_REGISTRY": reg.url}
        r = _run([bin_ / "webinfer", "site", work / "pkg", "-o", work / "site", "--json", "--quiet"], cwd=work, env=site_env)
        assert r.returncode == 0 and reg.requests == 1, r.stderr[-3000:]
        info = json.loads(r.stdout)
        assert r.stderr.count("\n") <= 1  # --quiet: only the one-time "fetching the Pyodide runtime" line
        r = _run([bin_ / "webinfer", "site", work / "pkg", "-o", work / "site2", "--quiet"], cwd=work, env=site_env)
        assert r.returncode == 0 and reg.requests == 1 and r.stderr == "", r.stderr  # fetched once, then cached
    finally:
        reg.close()
    site = work / "site"
    assert info["models"][0]["name"] == "tiny" and (site / info["models"][0]["manifest"]).is_file()
    assert (site / "pyodide" / "314.0.7" / "pyodide.asm.wasm").stat().st_size > 1_000_000
    for f in ("index.html", "app.js", "markdown.js", "store.js", "worker.js", "loader.js", "sw.js", "style.css"):
        assert (site / f).is_file(), f
    wheels = json.loads((site / "site.json").read_text())["wheels"]
    assert sorted(w.rsplit("/", 1)[1].split("-")[0] for w in wheels) == ["jinja2", "markupsafe", "webinfer"]

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([bin_ / "webinfer", "serve", work / "pkg", "--port", str(port), "--backend", "reference",
                            "--site", site], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert srv.poll() is None, srv.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        assert 'id="site"' in httpx.get(url + "/").text
        models = httpx.get(url + "/v1/models").json()
        assert models["data"][0]["id"] == "tiny"
    finally:
        srv.terminate()
        srv.wait(timeout=30)
