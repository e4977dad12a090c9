"""`webinfer doctor`: what this machine offers webinfer, and what to do about what is missing.

    webinfer doctor [--json] [--quiet] [--no-browser]

Checks: the installed extras, the native WebGPU adapter (name, backend, features, limits), the CPU engine (the
WebAssembly module in wasmtime: which build runs, and what `--backend auto` takes here), Chromium and whether
its WebGPU gives an adapter (through Playwright, when installed), the Pyodide runtime for `webinfer site`, and the
sizes of what is kept under $WEBINFER_HOME. Exit status 0 when the native GPU path works, 1 when something needed
is missing (each problem comes with its fix); `--json` prints one JSON object on stdout for programs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

# Chromium flags for headless WebGPU here (SwiftShader) that keep it off the network; the browser tests use them too.
CHROMIUM_ARGS = ["--enable-unsafe-webgpu", "--headless", "--no-sandbox", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic"]
# Which extra provides each optional module (pyproject.toml); cli/main.py names it when an import fails.
EXTRA_OF = {"numpy": "pack", "gguf": "pack", "safetensors": "pack", "tqdm": "pack", "wgpu": "gpu",
            "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "wasmtime": "cpu"}
LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
          "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup")
PROBE = """async () => {
  if (!("gpu" in navigator)) return {webgpu: false, reason: "navigator.gpu is missing"};
  const a = await navigator.gpu.requestAdapter();
  if (!a) return {webgpu: false, reason: "requestAdapter() returned null"};
  const lim = {};
  for (const k of ["maxStorageBufferBindingSize", "maxBufferSize", "maxStorageBuffersPerShaderStage",
                   "maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup"]) lim[k] = a.limits[k];
  return {webgpu: true, adapter: {vendor: a.info.vendor, architecture: a.info.architecture,
          description: a.info.description, fallback: !!a.info.isFallbackAdapter},
          features: [...a.features].sort(), limits: lim};
}"""


def chromium_path() -> str | None:
    explicit = os.environ.get("WEBINFER_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def check_extras() -> dict:
    return {mod: {"installed": importlib.util.find_spec(mod) is not None, "extra": extra}
            for mod, extra in EXTRA_OF.items() if mod != "starlette"}


def check_native_gpu() -> dict:
    if importlib.util.find_spec("wgpu") is None:
        return {"ok": False, "problem": 'wgpu-py is not installed: pip install "webinfer[gpu]"'}
    from webinfer.errors import WebinferError
    from webinfer.gpu.native import request_adapter_sync

    try:
        adapter = request_adapter_sync()
    except WebinferError as e:
        return {"ok": False, "problem": str(e)}
    info = adapter.info
    return {"ok": True, "adapter": str(info.get("device", "") or info.get("description", "")),
            "backend": str(info.get("backend_type", "")), "type": str(info.get("adapter_type", "")),
            "features": sorted(str(f) for f in adapter.features),
            "limits": {k: int(adapter.limits[k]) for k in LIMITS if k in adapter.limits}}


def check_cpu_engine(gpu: dict) -> dict:
    """The WebAssembly CPU engine natively: which module validates and passes its self-test (relaxed SIMD or base
    SIMD128), and what `--backend auto` takes on this machine (the CPU where the only adapter is a software one or
    there is none; a hardware adapter is decided by a start-up GEMV when a model loads)."""
    if importlib.util.find_spec("wasmtime") is None:
        return {"ok": False, "problem": 'wasmtime is not installed: pip install "webinfer[cpu]"'}
    from webinfer.cpu.wasm import WasmtimeHost
    from webinfer.errors import WebinferError

    try:
        host = WasmtimeHost()
    except WebinferError as e:
        return {"ok": False, "problem": str(e)}
    auto = ("the CPU engine: no GPU adapter" if not gpu["ok"] else
            f"the CPU engine: the GPU adapter is a software one ({gpu['adapter']})" if gpu["type"] == "CPU" else
            "a start-up GEMV decides at load (a hardware adapter)")
    return {"ok": True, "variant": host.variant, "reason": host.reason, "auto": auto}


def check_browser(probe: bool) -> dict:
    path = chromium_path()
    if path is None:
        return {"chromium": None, "note": "no Chromium found (set WEBINFER_CHROMIUM); the browser tests need it, "
                                          "the chat site runs in any browser with WebGPU"}
    out: dict = {"chromium": path}
    try:
        out["version"] = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["version"] = None
        out["note"] = f"{path} --version failed: {e}"
    if not probe:
        return out
    if importlib.util.find_spec("playwright") is None:
        out["note"] = "WebGPU in Chromium not probed: pip install playwright (it drives this Chromium; no download)"
        return out
    try:
        out.update(_probe_webgpu(path))
    except Exception as e:  # noqa: BLE001 (any launch failure is a finding to report, not a crash)
        out.update({"webgpu": False, "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
    return out


def _probe_webgpu(path: str) -> dict:
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="webinfer-doctor-") as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            page = ctx.new_page()
            # a same-machine http origin is a secure context (WebGPU needs one); answered here, no server needed
            page.route("http://127.0.0.1/doctor", lambda r: r.fulfill(body="<!doctype html><title>doctor</title>",
                                                                        content_type="text/html"))
            page.goto("http://127.0.0.1/doctor")
            return page.evaluate(PROBE)
        finally:
            ctx.close()


def check_caches() -> dict:
    from webinfer_packager.paths import webinfer_home
    from webinfer_packager.site.build import SiteBuildError, pyodide_dir, pyodide_pin

    home = webinfer_home()
    out: dict = {"home": str(home), "packages": {}, "sites_bytes": 0, "pyodide_bytes": 0}
    pk = home / "packages"
    if pk.is_dir():
        out["packages"] = {d.name: _dir_bytes(d) for d in sorted(pk.iterdir()) if (d / "manifest.json").is_file()}
    for key, sub in (("sites_bytes", "sites"), ("pyodide_bytes", "pyodide")):
        if (home / sub).is_dir():
            out[key] = _dir_bytes(home / sub)
    version, _ = pyodide_pin()
    try:
        out["site_pyodide"] = {"version": version, "path": str(pyodide_dir(fetch=False))}
    except SiteBuildError:
        out["site_pyodide"] = {"version": version, "path": None,
                               "note": "fetched once from the npm registry by the first `webinfer site`"}
    return out


def diagnose(probe_browser: bool = True) -> dict:
    import webinfer

    report = {"webinfer": webinfer.__version__, "python": platform.python_version(), "platform": platform.platform(),
              "extras": check_extras(), "native_gpu": check_native_gpu(), "browser": check_browser(probe_browser),
              "caches": check_caches()}
    report["cpu_engine"] = check_cpu_engine(report["native_gpu"])
    problems = []
    missing = sorted({v["extra"] for v in report["extras"].values() if not v["installed"]})
    if missing:
        problems.append(f'optional parts missing: pip install "webinfer[{",".join(missing)}]" '
                        '(or "webinfer[all]")')
    if not report["native_gpu"]["ok"]:
        problems.append(f"native GPU: {report['native_gpu']['problem']}")
    if not report["cpu_engine"]["ok"]:
        problems.append(f"CPU engine: {report['cpu_engine']['problem']}")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def print_report(r: dict) -> None:
    w = sys.stdout.write
    w(f"webinfer {r['webinfer']} on Python {r['python']} ({r['platform']})\n")
    have = [m for m, v in r["extras"].items() if v["installed"]]
    w(f"optional modules: {', '.join(have) or 'none'}\n")
    g = r["native_gpu"]
    if g["ok"]:
        w(f"native GPU: {g['adapter']} ({g['backend']}, {g['type']})\n  features: {', '.join(g['features'])}\n")
        w("".join(f"  {k}: {v}\n" for k, v in g["limits"].items()))
    ce = r["cpu_engine"]
    if ce["ok"]:
        w(f"CPU engine (wasmtime): {ce['reason']}; --backend auto here: {ce['auto']}\n")
    b = r["browser"]
    w(f"chromium: {b.get('version') or b['chromium'] or 'not found'}\n")
    if "webgpu" in b:
        if b["webgpu"]:
            a = b["adapter"]
            w(f"  WebGPU: yes, {a['description'] or a['vendor']}{' (software fallback)' if a['fallback'] else ''}; "
              f"shader-f16 {'yes' if 'shader-f16' in b['features'] else 'no'}\n")
        else:
            w(f"  WebGPU: no ({b['reason']})\n")
    if b.get("note"):
        w(f"  note: {b['note']}\n")
    c = r["caches"]
    w(f"cache {c['home']}: sites {_mb(c['sites_bytes'])}, pyodide {_mb(c['pyodide_bytes'])}\n")
    w("".join(f"  package {n}: {_mb(s)}\n" for n, s in c["packages"].items()))
    sp = c["site_pyodide"]
    w(f"  Pyodide {sp['version']} for `webinfer site`: {sp['path'] or sp['note']}\n")
    for p in r["problems"]:
        w(f"problem: {p}\n")
    w("ok\n" if r["ok"] else "")


def cli_main(args) -> int:
    report = diagnose(probe_browser=not args.no_browser)
    if args.json:
        print(json.dumps(report, indent=1))
    elif args.quiet:
        for p in report["problems"]:
            print(f"problem: {p}", file=sys.stderr)
    else:
        print_report(report)
    return 0 if report["ok"] else 1
