"""The command line as programs see it: --version, `doctor` (JSON, exit status), and the one-line message naming
the pip extra when an optional module is missing. The adapter doctor reports is checked against wgpu-py itself."""

from __future__ import annotations

import builtins
import json
import os

import pytest

from webinfer_packager.cli.main import main


def test_version(capsys):
    import webinfer

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"webinfer {webinfer.__version__}"


def _fake_home(tmp_path, monkeypatch) -> int:
    home = tmp_path / "home"
    pkg = home / "packages" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "manifest.json").write_text("{}")
    (pkg / "a.bin").write_bytes(b"x" * 1000)
    (home / "sites" / "s").mkdir(parents=True)
    (home / "sites" / "s" / "index.html").write_bytes(b"y" * 500)
    monkeypatch.setenv("WEBINFER_HOME", str(home))
    return 1000 + 2


def test_doctor_json_reports_adapter_extras_and_caches(tmp_path, monkeypatch, capsys):
    want_pkg = _fake_home(tmp_path, monkeypatch)
    rc = main(["doctor", "--json", "--no-browser"])
    r = json.loads(capsys.readouterr().out)
    assert rc == (0 if r["ok"] else 1) and r["ok"] == (not r["problems"])
    assert r["caches"]["packages"] == {"demo": want_pkg} and r["caches"]["sites_bytes"] == 500
    assert r["extras"]["numpy"] == {"installed": True, "extra": "pack"}
    try:
        import wgpu

        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception:  # noqa: BLE001 (no adapter here: doctor must say so and fail)
        adapter = None
    ce = r["cpu_engine"]  # the WebAssembly engine starts here (wasmtime is a test dependency)
    assert ce["ok"] and ce["variant"] in ("base", "relaxed") and ce["reason"], ce
    if adapter is None:
        assert "no GPU adapter" in ce["auto"], ce
    else:  # lavapipe reports a CPU-type adapter: --backend auto then takes the CPU engine
        assert ("software" in ce["auto"]) == (str(adapter.info.get("adapter_type", "")) == "CPU"), ce
    if adapter is None:
        assert rc == 1 and not r["native_gpu"]["ok"] and any("native GPU" in p for p in r["problems"])
        if os.environ.get("CI") == "true":
            pytest.fail("no WebGPU adapter under CI")
        return
    g = r["native_gpu"]
    assert g["ok"] and g["adapter"] == str(adapter.info.get("device", "") or adapter.info.get("description", ""))
    assert g["limits"]["max-storage-buffer-binding-size"] == adapter.limits["max-storage-buffer-binding-size"]
    assert ("shader-f16" in g["features"]) == ("shader-f16" in adapter.features)


def test_doctor_quiet_prints_only_problems(tmp_path, monkeypatch, capsys):
    _fake_home(tmp_path, monkeypatch)
    monkeypatch.setattr("importlib.util.find_spec", _hide("wgpu"))
    rc = main(["doctor", "--quiet", "--no-browser"])
    out = capsys.readouterr()
    assert rc == 1 and out.out == ""
    assert out.err.splitlines() == ['problem: optional parts missing: pip install "webinfer[gpu]" (or "webinfer[all]")',
                                    'problem: native GPU: wgpu-py is not installed: pip install "webinfer[gpu]"']


def test_doctor_without_wasmtime_names_the_cpu_extra(tmp_path, monkeypatch, capsys):
    _fake_home(tmp_path, monkeypatch)
    monkeypatch.setattr("importlib.util.find_spec", _hide("wasmtime"))
    rc = main(["doctor", "--quiet", "--no-browser"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1 and 'problem: CPU engine: wasmtime is not installed: pip install "webinfer[cpu]"' in err, err
    assert 'problem: optional parts missing: pip install "webinfer[cpu]" (or "webinfer[all]")' in err, err


def _hide(name):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(n, *a, **kw):
        return None if n.split(".")[0] == name else real(n, *a, **kw)

    return find_spec


def test_missing_optional_module_names_the_extra(tmp_path, monkeypatch, capsys):
    """`webinfer pack` where numpy cannot be imported: exit 3 and one line, no traceback."""
    import sys

    real_import = builtins.__import__

    def no_numpy(name, *a, **kw):
        if name.split(".")[0] == "numpy":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *a, **kw)

    for mod in [m for m in sys.modules if m.startswith("webinfer_packager.pack")]:
        monkeypatch.delitem(sys.modules, mod)  # import the command's module afresh, without numpy
    monkeypatch.setattr(builtins, "__import__", no_numpy)
    rc = main(["pack", str(tmp_path / "src"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 3 and err == 'webinfer pack: error: this command needs numpy, which is not installed: pip install "webinfer[pack]"\n'


@pytest.mark.browser
@pytest.mark.slow
def test_doctor_probes_webgpu_in_chromium(tmp_path, monkeypatch):
    from tests.browser.conftest import CHROMIUM, _require_browser
    from webinfer_packager.cli import doctor

    _require_browser()
    monkeypatch.setenv("WEBINFER_CHROMIUM", CHROMIUM)
    b = doctor.check_browser(probe=True)
    assert b["chromium"] == CHROMIUM and "Chromium" in b["version"]
    assert b["webgpu"] is True, b
    assert b["limits"]["maxStorageBufferBindingSize"] >= 128 << 20 and isinstance(b["adapter"]["fallback"], bool)
    # without the flag, the probe must report no adapter rather than crash
    monkeypatch.setattr(doctor, "CHROMIUM_ARGS", [a for a in doctor.CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"])
    b = doctor.check_browser(probe=True)
    assert b["webgpu"] is False and b["reason"], b
