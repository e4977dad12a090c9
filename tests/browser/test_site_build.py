"""`webinfer site` without a browser: deterministic wheel, atomic output, hash-checked package copies,
actionable errors when the setup step was skipped."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from webinfer.errors import IntegrityError


def test_runtime_wheel_is_deterministic_and_complete():
    from webinfer_packager.site.build import build_runtime_wheel

    name, a = build_runtime_wheel()
    _, b = build_runtime_wheel()
    assert name == "webinfer-0.1.0-py3-none-any.whl" and a == b
    names = zipfile.ZipFile(io.BytesIO(a)).namelist()
    assert "webinfer/gpu/browser.py" in names and "webinfer_shaders/copy.wgsl" in names
    assert not any(n.startswith("webinfer_packager/") for n in names)  # the browser never needs the packager
    record = zipfile.ZipFile(io.BytesIO(a)).read("webinfer-0.1.0.dist-info/RECORD").decode()
    assert "webinfer/browser_worker.py,sha256=" in record


def test_cli_builds_site_and_rebuild_replaces_it(tiny_package, tmp_path):
    from webinfer_packager.cli.main import main

    out = tmp_path / "site"
    assert main(["site", str(tiny_package), "-o", str(out)]) == 0
    site = json.loads((out / "site.json").read_text())
    manifest = json.loads((tiny_package / "manifest.json").read_text())
    copied = sorted(p.name for p in (out / site["models"][0]["manifest"]).parent.iterdir())
    assert copied == sorted([f["name"] for f in manifest["files"]] + ["manifest.json"])
    (out / "stale.txt").write_text("x")
    assert main(["site", str(tiny_package), "-o", str(out)]) == 0
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "site.json").read_text())["version"] == site["version"]  # same input, same version
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no temporary folders left behind


def test_changed_page_file_changes_the_site_version(tiny_package, tmp_path, monkeypatch):
    """The service worker serves the shell cache-first under the site's version: a changed worker.js must give a new
    version, or returning visitors would keep the old page."""
    import shutil

    import webinfer_packager.site.build as build

    a = build.build_site([tiny_package], tmp_path / "a")
    web = tmp_path / "web"
    shutil.copytree(build.web_dir(), web, ignore=shutil.ignore_patterns("node_modules"))
    (web / "worker.js").write_text((web / "worker.js").read_text() + "\n// changed\n")
    monkeypatch.setattr(build, "web_dir", lambda: web)
    b = build.build_site([tiny_package], tmp_path / "b")
    assert a["assets"]["worker.js"] != b["assets"]["worker.js"] and a["version"] != b["version"]


def test_corrupt_package_fails_and_leaves_previous_site(tiny_package, tmp_path):
    import shutil

    from webinfer_packager.site.build import build_site

    out = tmp_path / "site"
    build_site([tiny_package], out)
    bad = tmp_path / "bad"
    shutil.copytree(tiny_package, bad)
    f = json.loads((bad / "manifest.json").read_text())["files"][0]["name"]
    data = bytearray((bad / f).read_bytes())
    data[0] ^= 1
    (bad / f).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f):
        build_site([bad], out)
    assert (out / "index.html").is_file()  # the previous site is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "site"]


def test_missing_pyodide_is_reported_and_nothing_is_written(tiny_package, tmp_path, monkeypatch):
    from webinfer_packager.site.build import SiteBuildError, build_site

    monkeypatch.setenv("WEBINFER_PYODIDE_DIR", str(tmp_path / "nopyodide"))
    with pytest.raises(SiteBuildError, match="WEBINFER_PYODIDE_DIR=.*pyodide.asm.wasm"):
        build_site([tiny_package], tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_dependency_wheels_are_pure_python_and_import_alone(tmp_path):
    """The jinja2 and markupsafe wheels the browser loads: no compiled modules, and they import (and escape) in an
    interpreter that sees nothing but them, as in Pyodide."""
    import subprocess
    import sys

    from webinfer_packager.site.build import dependency_wheel

    for name in ("jinja2", "markupsafe"):
        whl, data = dependency_wheel(name)
        assert whl.endswith("-py3-none-any.whl") and dependency_wheel(name)[1] == data  # deterministic
        zf = zipfile.ZipFile(io.BytesIO(data))
        assert not [n for n in zf.namelist() if n.endswith((".so", ".pyd", ".c"))]
        zf.extractall(tmp_path / "only")
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import jinja2, markupsafe; "
            "assert markupsafe.__file__.startswith(sys.argv[1]) and jinja2.__file__.startswith(sys.argv[1]); "
            "print(jinja2.Environment(autoescape=True).from_string('{{ x }}').render(x='<b>'))")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path / "only")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "&lt;b&gt;", r.stderr
