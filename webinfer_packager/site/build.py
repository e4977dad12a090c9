"""`webinfer site PACKAGE... -o SITE`: build the static, offline-capable chat site.

The output is a plain folder that any static host or CDN can serve, with relative URLs only:

    SITE/
      index.html                 rendered from web/index.html.j2 (model list with each manifest's sha256)
      site.json                  what the page, the worker and the service worker need to know (versions, URLs)
      app.js ... style.css       the page's assets (STATIC_FILES), stable names, referenced with ?v=<sha256 prefix>
      pyodide/<version>/...      the self-hosted Pyodide core runtime (versioned folder)
      wheels/<sha256 prefix>/<name>-py3-none-any.whl              content-addressed folders, immutable
      models/<name>/manifest.json + <sha256>.bin|json             copies of the packages, hash-checked while copying

The folder is written under a temporary name beside SITE and renamed into place, so SITE is complete or absent.

Everything comes from the installed Python packages, so a `pip install`ed webinfer builds sites without a checkout:
- the page's assets: web/ in a checkout, else the package data `webinfer_web` (the same files, shipped in the wheel);
- wheels: webinfer's (runtime + shaders), jinja2's and markupsafe's are all written here, deterministically, from
  the installed packages' pure-Python files (markupsafe without its C speedups: it falls back to its _native module);
- Pyodide: web/node_modules/pyodide in a checkout (`npm ci`), else `$WEBINFER_HOME/pyodide/<version>/`, filled once
  from the npm registry's tarball, checked against the sha512 `integrity` that web/package-lock.json pins.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from webinfer.errors import IntegrityError, WebinferError

REPO = Path(__file__).resolve().parents[2]
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
STATIC_FILES = ("app.js", "errors.js", "markdown.js", "store.js", "worker.js", "loader.js", "webinfer.js", "sw.js",
                "style.css", "wasm-thread.js", "snapshot-worker.js")
DEPENDENCY_WHEELS = ("jinja2", "markupsafe")
NPM_REGISTRY = "https://registry.npmjs.org/"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources give a byte-identical wheel


class SiteBuildError(WebinferError):
    """Something the site needs is missing (Pyodide runtime, dependency wheels); the message says how to get it."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def web_dir() -> Path:
    """The page's assets: the checkout's web/ (edited in place) or, once installed, the package data webinfer_web."""
    if (REPO / "web" / "index.html.j2").is_file():
        return REPO / "web"
    spec = importlib.util.find_spec("webinfer_web")
    if spec is None or not spec.submodule_search_locations:
        raise SiteBuildError("the chat page's files (package webinfer_web) are not installed; reinstall webinfer")
    return Path(list(spec.submodule_search_locations)[0])


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SiteBuildError(f"{name} is not installed; reinstall webinfer")
    return Path(list(spec.submodule_search_locations)[0])


# ----------------------------------------------------------------------------------------------- wheels


def _wheel(dist: str, version: str, files: list[tuple[str, bytes]], metadata: bytes, top_level: list[str]
           ) -> tuple[str, bytes]:
    """A py3-none-any wheel built in memory with fixed timestamps and sorted entries (same input, same bytes)."""
    info = f"{dist}-{version}.dist-info"
    files = sorted(files) + [(f"{info}/METADATA", metadata),
                             (f"{info}/WHEEL", (b"Wheel-Version: 1.0\nGenerator: webinfer-site\n"
                                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")),
                             (f"{info}/top_level.txt", "".join(t + "\n" for t in top_level).encode())]
    record = []
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zi = zipfile.ZipInfo(name, _ZIP_TIME)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data)
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


def build_runtime_wheel(version: str = "0.1.0") -> tuple[str, bytes]:
    """A py3-none-any wheel of `webinfer` (runtime) and `webinfer_shaders` (WGSL), built in memory from wherever
    they are imported from (the checkout or site-packages).

    Built here rather than with `pip wheel` so that it is deterministic (content-hashed URL stays stable while the
    sources do) and never writes into the shared build/ folder. The packager is left out: the browser never needs it.
    """
    files: list[tuple[str, bytes]] = []
    for pkg in ("webinfer", "webinfer_shaders"):
        src = _package_dir(pkg)
        for p in sorted(src.rglob("*")):
            if p.is_file() and p.suffix in (".py", ".wgsl", ".wasm") and "__pycache__" not in p.parts:
                files.append((f"{pkg}/{p.relative_to(src).as_posix()}", p.read_bytes()))
    meta = f"Metadata-Version: 2.1\nName: webinfer\nVersion: {version}\nRequires-Dist: jinja2>=3.1\n".encode()
    return _wheel("webinfer", version, files, meta, ["webinfer", "webinfer_shaders"])


def dependency_wheel(name: str) -> tuple[str, bytes]:
    """A pure-Python wheel of an installed distribution: its .py files and licenses, no compiled modules.

    Only for packages that work without their extension modules (jinja2 has none; markupsafe imports _speedups
    in a try and falls back to _native). Pyodide (Python 3.14) then loads it like any wheel."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise SiteBuildError(f"{name} is not installed (the browser needs it): pip install {name}") from None
    dist_name = dist.metadata["Name"].lower().replace("-", "_")
    tops = (dist.read_text("top_level.txt") or "").split() or [name]
    files = []
    for f in dist.files or []:
        parts = f.parts
        keep = (parts[0] in tops and f.suffix in (".py", ".typed")) or (".dist-info" in parts[0] and "licenses" in parts)
        if keep and "__pycache__" not in parts:
            arcname = "/".join((f"{dist_name}-{dist.version}.dist-info",) + parts[1:]) if ".dist-info" in parts[0] \
                else f.as_posix()
            files.append((arcname, Path(f.locate()).read_bytes()))
    if not any(n.endswith("/__init__.py") for n, _ in files):
        raise SiteBuildError(f"the installed {name} has no Python sources to put in a wheel ({dist.locate_file('')})")
    return _wheel(dist_name, dist.version, files, dist.read_text("METADATA").encode(), tops)


# ----------------------------------------------------------------------------------------------- Pyodide


def pyodide_pin() -> tuple[str, str]:
    """(version, npm integrity "sha512-<base64>") of the Pyodide that web/package-lock.json pins."""
    lock = json.loads((web_dir() / "package-lock.json").read_text())
    entry = lock["packages"]["node_modules/pyodide"]
    return entry["version"], entry["integrity"]


def _pyodide_complete(d: Path) -> bool:
    return all((d / f).is_file() for f in PYODIDE_FILES)


def pyodide_dir(*, fetch: bool = True) -> Path:
    """The folder holding the pinned Pyodide runtime's files: $WEBINFER_PYODIDE_DIR when set (only there), else the
    checkout's web/node_modules/pyodide (from `npm ci`) or the user cache $WEBINFER_HOME/pyodide/<version>/; when
    neither has it and fetch is true, the user cache is filled from the npm registry ($WEBINFER_NPM_REGISTRY, default
    registry.npmjs.org) after the tarball's sha512 matched the pinned integrity."""
    from webinfer_packager.paths import webinfer_home  # noqa: PLC0415

    version, integrity = pyodide_pin()
    explicit = os.environ.get("WEBINFER_PYODIDE_DIR")
    cache = webinfer_home() / "pyodide" / version
    candidates = [Path(explicit)] if explicit else [web_dir() / "node_modules" / "pyodide", cache]
    for d in candidates:
        if _pyodide_complete(d):
            ver = json.loads((d / "package.json").read_text()).get("version") if (d / "package.json").is_file() else None
            if ver not in (None, version):
                raise SiteBuildError(f"{d} holds Pyodide {ver}, the site pins {version}")
            return d
    if explicit:
        missing = [f for f in PYODIDE_FILES if not (Path(explicit) / f).is_file()]
        raise SiteBuildError(f"WEBINFER_PYODIDE_DIR={explicit} lacks the Pyodide runtime files {', '.join(missing)}")
    if not fetch:
        raise SiteBuildError(f"the Pyodide {version} runtime is not in {cache}; `webinfer site` fetches it once")
    fetch_pyodide(version, integrity, cache)
    return cache


def fetch_pyodide(version: str, integrity: str, dest: Path, registry: str | None = None) -> None:
    """Download the npm tarball pyodide-<version>.tgz, check its sha512 and unpack the runtime files into dest
    (written beside it and renamed into place: dest is complete or absent)."""
    registry = (registry or os.environ.get("WEBINFER_NPM_REGISTRY") or NPM_REGISTRY).rstrip("/") + "/"
    url = f"{registry}pyodide/-/pyodide-{version}.tgz"
    print(f"webinfer site: fetching the Pyodide {version} runtime once from {url}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as res:  # noqa: S310 (https registry or a configured mirror)
            data = res.read()
    except OSError as e:
        raise SiteBuildError(f"could not download the Pyodide runtime from {url} ({e}); connect to the network, set "
                             "WEBINFER_NPM_REGISTRY to a reachable npm registry, or WEBINFER_PYODIDE_DIR to a folder "
                             f"holding node_modules/pyodide from `npm install pyodide@{version}`") from None
    algo, _, want = integrity.partition("-")
    actual = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if actual != want:  # a SiteBuildError, so that `webinfer serve` still serves the API (cli/serve.py)
        raise SiteBuildError(f"{url}: the download does not match the {algo} that web/package-lock.json pins: "
                             f"expected {want}, got {actual}; nothing was kept")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            # only the named files, read as bytes: no paths from the archive reach the file system
            for name in PYODIDE_FILES + ("package.json",):
                member = tf.getmember(f"package/{name}")
                (tmp / name).write_bytes(tf.extractfile(member).read())
        if dest.exists():  # another process finished first, or a damaged earlier copy
            shutil.rmtree(dest)
        tmp.rename(dest)
    except (KeyError, tarfile.TarError) as e:
        raise SiteBuildError(f"{url}: not the expected Pyodide package ({e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def site_inputs_key() -> str:
    """A hash of everything a site is built from besides the packages (runtime wheel, page files, dependency
    wheels, Pyodide version): with the manifest's hash it keys a cached site by content, so a changed runtime or
    page never reuses an old build."""
    h = hashlib.sha256("|".join(pyodide_pin()).encode())
    h.update(build_runtime_wheel()[1])
    web = web_dir()
    for f in (*STATIC_FILES, "index.html.j2"):
        h.update(f.encode() + b"\0" + (web / f).read_bytes())
    for name in DEPENDENCY_WHEELS:
        h.update(dependency_wheel(name)[0].encode())
    return h.hexdigest()



def build_site(packages: list[Path], output: Path, *, force: bool = True) -> dict:
    """Build the site into `output` (replaced atomically). Returns the site.json contents."""
    import jinja2  # noqa: PLC0415

    import webinfer  # noqa: PLC0415

    output = Path(output).resolve()
    web = web_dir()
    pyodide_version, _ = pyodide_pin()
    pyo = pyodide_dir()
    built = [build_runtime_wheel(webinfer.__version__)] + [dependency_wheel(n) for n in DEPENDENCY_WHEELS]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        pdir = tmp / "pyodide" / pyodide_version
        pdir.mkdir(parents=True)
        for f in PYODIDE_FILES:
            shutil.copyfile(pyo / f, pdir / f)

        wheels = []
        for name, data in built:
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
            data = (web / f).read_bytes()
            (tmp / f).write_bytes(data)
            assets[f] = f"{f}?v={_sha256(data)[:12]}"
        # the service worker's precache list; it matches requests ignoring ?v=, and each version has its own cache
        shell = ["./", "index.html", "site.json"] + [f for f in STATIC_FILES if f != "sw.js"]
        shell += [f"pyodide/{pyodide_version}/{f}" for f in PYODIDE_FILES] + wheels
        # the assets' content hashes too: the service worker serves the shell cache-first, so a page or worker
        # change that kept the version would never reach a returning visitor
        version = _sha256(json.dumps([shell, models, assets], sort_keys=True).encode())[:16]
        site = {"version": version, "pyodide": f"pyodide/{pyodide_version}/", "wheels": wheels, "models": models,
                "assets": assets, "shell": shell}
        (tmp / "site.json").write_text(json.dumps(site, indent=1, sort_keys=True) + "\n")

        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(web)), autoescape=True,
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
        from webinfer_packager.paths import resolve_package  # noqa: PLC0415

        packages = [resolve_package(None)]  # a typed error saying to run `webinfer pack` when it is not packed
    site = build_site(packages, Path(args.output))
    total = sum(m["bytes"] for m in site["models"])
    if args.json:
        print(json.dumps({"output": str(Path(args.output).resolve()), "version": site["version"],
                          "models": [{k: m[k] for k in ("name", "manifest", "sha256", "bytes")} for m in site["models"]]}))
    if not args.quiet:
        print(f"site written to {args.output}: {len(site['models'])} model(s), {total / 1e6:.1f} MB of model data, "
              f"version {site['version']}", file=sys.stderr)
        print(f"serve it with any static server, e.g. python -m http.server -d {args.output} 8080", file=sys.stderr)
    return 0
