"""`webinfer serve`: the OpenAI-compatible API (and the chat site) on 127.0.0.1, over the LLM from
webinfer_packager.cli.backend.open_llm (native GPU; `--backend auto` falls back to the numpy reference).

    webinfer serve [PACKAGE] [--host 127.0.0.1] [--port 8000] [--site FOLDER | --no-site] [--backend auto|native|reference]
"""

from __future__ import annotations

import sys


def cli_main(args) -> int:
    from webinfer.package import Package
    from webinfer_packager.cli.backend import context_for_budget, engine_options, open_llm
    from webinfer_packager.paths import resolve_package
    from webinfer_packager.server.app import serve

    path = resolve_package(args.package)
    pkg = Package.open(path)
    site = None if args.no_site else (args.site or default_site(path))
    llm = open_llm(pkg, args.backend, options=engine_options(args, context_tokens=context_for_budget(pkg, args.kv_budget_mb)))
    kv = llm.engine.scheduler.kv
    print(f"webinfer serve: {llm.model_name} on http://{args.host}:{args.port}/v1 "
          f"(KV: {kv.pool.num_usable} blocks of {kv.block_size})", file=sys.stderr)
    if site:
        print(f"webinfer serve: chat site at http://{args.host}:{args.port}/ (from {site})", file=sys.stderr)
    serve(llm, host=args.host, port=args.port, site=site)
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
