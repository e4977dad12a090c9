"""`webinfer serve`: the OpenAI-compatible API (and the chat site) on 127.0.0.1, over the LLM from
webinfer_packager.cli.backend.open_llm (`--backend auto`: native on a hardware GPU, the CPU engine on a software
adapter or none).

    webinfer serve [PACKAGE] [--host 127.0.0.1] [--port 8000] [--site FOLDER | --no-site] [--backend auto|native|cpu|reference]
                   [--allow-origin ORIGIN ...] [--api-key KEY] [--max-waiting N] [--grammar-timeout S]
                   [--speculative prompt-lookup]

Who may ask: pages from other origins are refused unless listed with --allow-origin or WEBINFER_ORIGINS
(comma-separated; fnmatch patterns such as `chrome-extension://*` allowed, as OLLAMA_ORIGINS); --api-key or
WEBINFER_API_KEY makes /v1/* and /metrics require `Authorization: Bearer KEY`, and is required to bind beyond
loopback (--host 0.0.0.0).
"""

from __future__ import annotations

import sys

from webinfer.errors import WebinferError


def cli_main(args) -> int:
    import os

    from webinfer.api import Limits
    from webinfer.package import Package
    from webinfer_packager.cli.backend import context_for_budget, engine_options, open_llm
    from webinfer_packager.paths import resolve_package
    from webinfer_packager.server.app import LOOPBACK, MAX_WAITING, serve

    origins = list(getattr(args, "allow_origin", None) or [])
    origins += [o.strip() for o in os.environ.get("WEBINFER_ORIGINS", "").split(",") if o.strip()]
    api_key = getattr(args, "api_key", None) or os.environ.get("WEBINFER_API_KEY") or None
    max_waiting = getattr(args, "max_waiting", None) or MAX_WAITING
    if args.host not in LOOPBACK and not api_key:  # before minutes of loading, not after
        raise WebinferError(f"serving on {args.host} (beyond loopback) needs an API key: pass --api-key or set "
                            "WEBINFER_API_KEY")
    if max_waiting < 1:
        raise WebinferError(f"--max-waiting must be at least 1, got {max_waiting}")
    grammar_timeout = getattr(args, "grammar_timeout", 30.0)
    if not grammar_timeout > 0:  # (NaN too)
        raise WebinferError(f"--grammar-timeout must be a positive number of seconds, got {grammar_timeout}")
    path = resolve_package(args.package)
    pkg = Package.open(path)  # every shard is hash-checked as the runner reads it
    site = None if args.no_site else (args.site or default_site(path))
    opts = engine_options(args, context_tokens=context_for_budget(pkg, args.kv_budget_mb))
    llm = open_llm(pkg, args.backend, options=opts, limits=Limits(grammar_timeout_s=grammar_timeout))
    kv = llm.engine.scheduler.kv
    print(f"webinfer serve: {llm.model_name} on http://{args.host}:{args.port}/v1 "
          f"(KV: {kv.pool.num_usable} blocks of {kv.block_size})", file=sys.stderr)
    if site:
        print(f"webinfer serve: chat site at http://{args.host}:{args.port}/ (from {site})", file=sys.stderr)
    serve(llm, host=args.host, port=args.port, site=site, allowed_origins=origins, api_key=api_key,
          max_waiting=max_waiting)
    return 0


def default_site(package_path) -> str | None:
    """The chat site for this package, built once into $WEBINFER_HOME/sites/, keyed by content: the manifest's
    hash (which pins every file's sha256) and the hash of the site's other inputs. A cached site is reused only
    after its copy of the package passes the hash check; otherwise it is rebuilt. The package itself must have
    been verified already (loading reads every shard through the hash check), so the API and the page always
    serve the same weights."""
    import hashlib
    from pathlib import Path

    from webinfer.errors import IntegrityError
    from webinfer.package import Package
    from webinfer_packager.paths import webinfer_home
    from webinfer_packager.site.build import SiteBuildError, build_site, site_inputs_key

    manifest = Path(package_path) / "manifest.json"
    try:
        key = hashlib.sha256(manifest.read_bytes() + site_inputs_key().encode()).hexdigest()[:16]
    except SiteBuildError as e:
        print(f"webinfer serve: warning: no chat site ({e}); serving the API only", file=sys.stderr)
        return None
    out = webinfer_home() / "sites" / f"{Path(package_path).name}-{key}"
    if (out / "index.html").is_file():
        try:
            for m in (out / "models").iterdir():
                Package.open(m).check_files()
            return str(out)
        except (IntegrityError, WebinferError, OSError) as e:
            print(f"webinfer serve: the cached site failed its check ({e}); rebuilding it", file=sys.stderr)
    try:
        build_site([Path(package_path)], out)
    except SiteBuildError as e:  # the API still works without the page
        print(f"webinfer serve: warning: no chat site ({e}); serving the API only", file=sys.stderr)
        return None
    return str(out)
