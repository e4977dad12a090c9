"""`webinfer serve`: the OpenAI-compatible API (and optionally a static site) on 127.0.0.1.

    webinfer serve [PACKAGE] [--host 127.0.0.1] [--port 8000] [--site FOLDER]

The runner is the native GPU model (webinfer_packager.native.load_runner); if that cannot be imported, the numpy
reference runner takes over with a warning (correct, but slow).
"""

from __future__ import annotations

import sys

from webinfer.errors import GPUError, WebinferError


def load_engine(package_path, backend: str = "auto", kv_budget_mb: float = 128.0, device=None, **engine_kw):
    from webinfer.engine.engine import AsyncEngine
    from webinfer.package import Package
    from webinfer.tokenizer import Tokenizer

    pkg = package_path if isinstance(package_path, Package) else Package.open(package_path)
    runner = None
    if backend == "cpu":
        from webinfer_packager.cpu import blocks_for_budget, load_runner as load_cpu

        runner = load_cpu(pkg, mode=engine_kw.pop("cpu_mode", "exact"),
                          num_blocks=blocks_for_budget(pkg, kv_budget_mb, 16), max_model_len=2048)
    if backend in ("auto", "native"):
        try:
            from webinfer_packager.native import load_runner
        except ImportError as e:
            if backend == "native":
                raise WebinferError(f"the native GPU runner is not available: {e}") from None
            print(f"webinfer serve: warning: native GPU runner unavailable ({e}); using the numpy reference runner",
                  file=sys.stderr)
        else:
            try:
                runner = load_runner(package_path, kv_budget_mb=kv_budget_mb, device=device)
            except GPUError as e:  # no adapter here: still serve, slowly, rather than not at all
                if backend == "native":
                    raise
                print(f"webinfer serve: warning: no GPU ({e}); using the numpy reference runner", file=sys.stderr)
    if runner is None:
        from webinfer_packager.reference.model import limit_blas_threads
        from webinfer_packager.reference.runner import ReferenceRunner

        limit_blas_threads(1)
        runner = ReferenceRunner.from_package(pkg, max_model_len=2048)
    tok = Tokenizer.from_json(pkg.tokenizer_json())
    return AsyncEngine(runner, tok, eos_ids=pkg.config.eos_token_ids, chat_template=pkg.chat_template,
                       special_tokens=pkg.special_tokens, model_name=pkg.name or "webinfer", **engine_kw)


def cli_main(args) -> int:
    from webinfer.api import LLM
    from webinfer_packager.server.app import serve
    from webinfer_packager.paths import resolve_package

    path = resolve_package(args.package)
    site = None if args.no_site else (args.site or default_site(path))
    engine = load_engine(path, backend=args.backend, kv_budget_mb=args.kv_budget_mb,
                         **({"cpu_mode": args.cpu_mode} if args.backend == "cpu" else {}))
    print(f"webinfer serve: {engine.model_name} on http://{args.host}:{args.port}/v1 "
          f"(KV: {engine.scheduler.kv.pool.num_usable} blocks of {engine.scheduler.kv.block_size})", file=sys.stderr)
    if site:
        print(f"webinfer serve: chat site at http://{args.host}:{args.port}/ (from {site})", file=sys.stderr)
    serve(LLM(engine), host=args.host, port=args.port, site=site)
    return 0


def default_site(package_path) -> str | None:
    """The chat site for this package, built once into $WEBINFER_HOME/sites/ (keyed by the manifest's hash)."""
    import hashlib
    from pathlib import Path

    from webinfer_packager.paths import webinfer_home
    from webinfer_packager.site.build import SiteBuildError, build_site

    manifest = Path(package_path) / "manifest.json"
    key = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
    out = webinfer_home() / "sites" / f"{Path(package_path).name}-{key}"
    if not (out / "index.html").is_file():
        try:
            build_site([Path(package_path)], out)
        except SiteBuildError as e:  # the API still works without the page
            print(f"webinfer serve: warning: no chat site ({e}); serving the API only", file=sys.stderr)
            return None
    return str(out)
