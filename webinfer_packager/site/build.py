"""`webinfer site PACKAGE... -o SITE`: build the static, offline-capable chat site.

The output is a plain folder that any static host or CDN can serve, with relative URLs only:

    SITE/
      index.html                 rendered from web/index.html.j2 (model list with each manifest's sha256)
      site.json                  what the page, the worker and the service worker need to know (versions, URLs)
      app.js worker.js loader.js webinfer.js sw.js style.css     stable names, referenced with ?v=<sha256 prefix>
      pyodide/<version>/...      the self-hosted Pyodide core runtime (versioned folder)
      wheels/<sha256 prefix>/<name>-py3-none-any.whl              content-addressed folders, immutable
      models/<name>/manifest.json + <sha256>.bin|json             copies of the packages, hash-checked while copying

The folder is written under a temporary name beside SITE and renamed into place, so SITE is complete or absent.
Wheels: webinfer's is built here (deterministically, only the runtime and the shaders); jinja2 and markupsafe come
from the folder scripts/setup-browser.sh fills (build/browser-wheels, or $WEBINFER_BROWSER_WHEELS).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from webinfer.errors import IntegrityError, WebinferError

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "web"
PYODIDE_VERSION = "314.0.7"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
STATIC_FILES = ("app.js", "worker.js", "loader.js", "webinfer.js", "sw.js", "style.css")
DEPENDENCY_WHEELS = ("jinja2", "markupsafe")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources give a byte-identical wheel


class SiteBuildError(WebinferError):
    """Something the site needs is missing (Pyodide runtime, dependency wheels); the message says how to get it."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _setup_hint() -> str:
    return "run scripts/setup-browser.sh from the repository root"


# ----------------------------------------------------------------------------------------------- wheels


def build_runtime_wheel(version: str = "0.1.0") -> tuple[str, bytes]:
    """A py3-none-any wheel of `webinfer` (runtime) and `webinfer_shaders` (WGSL), built in memory.

    Built here rather than with `pip wheel` so that it is deterministic (content-hashed URL stays stable while the
    sources do) and never writes into the shared build/ folder. The packager is left out: the browser never needs it.
    """
    files: list[tuple[str, bytes]] = []
    for pkg, src in (("webinfer", REPO / "webinfer"), ("webinfer_shaders", REPO / "shaders")):
        for p in sorted(src.rglob("*")):
            if p.is_file() and p.suffix in (".py", ".wgsl", ".wasm") and "__pycache__" not in p.parts:
                files.append((f"{pkg}/{p.relative_to(src).as_posix()}", p.read_bytes()))
    dist = f"webinfer-{version}.dist-info"
    files.append((f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: webinfer\nVersion: {version}\n"
                  "Requires-Dist: jinja2>=3.1\n".encode()))
    files.append((f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: webinfer-site\nRoot-Is-Purelib: true\n"
                  b"Tag: py3-none-any\n"))
    files.append((f"{dist}/top_level.txt", b"webinfer\nwebinfer_shaders\n"))
    record = []
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode()))
    out = tempfile.SpooledTemporaryFile()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zi = zipfile.ZipInfo(name, _ZIP_TIME)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data)
    out.seek(0)
    return f"webinfer-{version}-py3-none-any.whl", out.read()


def wheels_dir() -> Path:
    return Path(os.environ.get("WEBINFER_BROWSER_WHEELS") or REPO / "build" / "browser-wheels")


def dependency_wheels() -> list[Path]:
    d = wheels_dir()
    found = []
    for name in DEPENDENCY_WHEELS:
        hits = sorted(d.glob(f"{name}-*-py3-none-any.whl")) if d.is_dir() else []
        if not hits:
            raise SiteBuildError(f"no pure-Python wheel of {name} in {d} (the browser needs {name}); {_setup_hint()}")
        found.append(hits[-1])
    return found


def pyodide_dir() -> Path:
    d = Path(os.environ.get("WEBINFER_PYODIDE_DIR") or WEB / "node_modules" / "pyodide")
    missing = [f for f in PYODIDE_FILES if not (d / f).is_file()]
    if missing:
        raise SiteBuildError(f"the Pyodide {PYODIDE_VERSION} runtime is missing from {d} ({', '.join(missing)}); "
                             f"{_setup_hint()} (it runs `npm ci` in web/)")
    ver = json.loads((d / "package.json").read_text()).get("version") if (d / "package.json").is_file() else None
    if ver not in (None, PYODIDE_VERSION):
        raise SiteBuildError(f"{d} holds Pyodide {ver}, the site pins {PYODIDE_VERSION}; {_setup_hint()}")
    return d


# ----------------------------------------------------------------------------------------------- packages


def copy_package(src: Path, dst: Path) -> dict:
    """Copy manifest.json and every file it lists, checking size and sha256 on the way. Returns the model entry."""
    from webinfer.package import Package  # noqa: PLC0415

    pkg = Package.open(src)  # validates the manifest (format, version, files, tensors) with typed errors
    raw = (src / "manifest.json").read_bytes()
    manifest = pkg.manifest
    dst.mkdir(parents=True)
    total = 0
    for name, e in pkg.files.items():
        data = (src / name).read_bytes()
        if len(data) != e["bytes"] or _sha256(data) != e["sha256"]:
            raise IntegrityError(src / name, f"{e['bytes']} bytes, sha256 {e['sha256']}",
                                 f"{len(data)} bytes, sha256 {_sha256(data)}")
        (dst / name).write_bytes(data)
        total += len(data)
    (dst / "manifest.json").write_bytes(raw)
    cfg = pkg.config
    return {"name": manifest.get("name") or src.name, "manifest": f"models/{dst.name}/manifest.json",
            "sha256": _sha256(raw), "bytes": total, "params": (manifest.get("totals") or {}).get("params"),
            "quantization": manifest.get("quantization"), "architecture": cfg.architecture,
            # f32 K and V per token over all layers: the page's memory estimate before any download
            "kv_bytes_per_token": 2 * 4 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim}


def _folder_name(name: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip(".-") or "model"
    out, i = base, 2
    while out in taken:
        out, i = f"{base}-{i}", i + 1
    taken.add(out)
    return out


# ----------------------------------------------------------------------------------------------- the site


def build_site(packages: list[Path], output: Path, *, force: bool = True) -> dict:
    """Build the site into `output` (replaced atomically). Returns the site.json contents."""
    import jinja2  # noqa: PLC0415

    output = Path(output).resolve()
    pyo = pyodide_dir()
    deps = dependency_wheels()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        pdir = tmp / "pyodide" / PYODIDE_VERSION
        pdir.mkdir(parents=True)
        for f in PYODIDE_FILES:
            shutil.copyfile(pyo / f, pdir / f)

        wheels = []
        for name, data in [build_runtime_wheel()] + [(p.name, p.read_bytes()) for p in deps]:
            sub = tmp / "wheels" / _sha256(data)[:16]
            sub.mkdir(parents=True)
            (sub / name).write_bytes(data)
            wheels.append(f"wheels/{sub.name}/{name}")

        models, taken = [], set()
        for p in packages:
            p = Path(p)
            entry = copy_package(p, tmp / "models" / _folder_name(p.name, taken))
            models.append(entry)

        assets = {}
        for f in STATIC_FILES:
            data = (WEB / f).read_bytes()
            (tmp / f).write_bytes(data)
            assets[f] = f"{f}?v={_sha256(data)[:12]}"
        # the service worker's precache list; it matches requests ignoring ?v=, and each version has its own cache
        shell = ["./", "index.html", "site.json"] + [f for f in STATIC_FILES if f != "sw.js"]
        shell += [f"pyodide/{PYODIDE_VERSION}/{f}" for f in PYODIDE_FILES] + wheels
        version = _sha256(json.dumps([shell, models], sort_keys=True).encode())[:16]
        site = {"version": version, "pyodide": f"pyodide/{PYODIDE_VERSION}/", "wheels": wheels, "models": models,
                "assets": assets, "shell": shell}
        (tmp / "site.json").write_text(json.dumps(site, indent=1, sort_keys=True) + "\n")

        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(WEB)), autoescape=True,
                                 undefined=jinja2.StrictUndefined)
        html = env.get_template("index.html.j2").render(site=site, models=models, assets=assets,
                                                        site_json=_script_json(site))
        (tmp / "index.html").write_text(html, encoding="utf-8")

        if output.exists():
            if not force:
                raise SiteBuildError(f"{output} exists")
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(output)
        return site
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _script_json(value):
    """JSON safe to inline in a <script> element: no '<', '>' or '&' that could close it or start markup."""
    import markupsafe  # noqa: PLC0415

    text = json.dumps(value, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return markupsafe.Markup(text)


def cli_main(args) -> int:
    packages = [Path(p) for p in args.packages]
    if not packages:
        from webinfer_packager.paths import default_package_dir  # noqa: PLC0415

        packages = [Path(default_package_dir())]
    site = build_site(packages, Path(args.output))
    total = sum(m["bytes"] for m in site["models"])
    print(f"site written to {args.output}: {len(site['models'])} model(s), {total / 1e6:.1f} MB of model data, "
          f"version {site['version']}", file=sys.stderr)
    print(f"serve it with any static server, e.g. python -m http.server -d {args.output} 8080", file=sys.stderr)
    return 0
