#!/usr/bin/env bash
# The browser side's extra install step (run after scripts/setup.sh, from anywhere; safe to run again):
# `npm ci` in web/: the self-hosted Pyodide core runtime (pinned pyodide@314.0.7, web/package-lock.json), axe-core
# for the page's accessibility tests and @wllama/wllama, the peer tests/browser/bench_wllama.py measures against. (`webinfer site` writes the jinja2/markupsafe wheels for Pyodide itself, from
# the installed packages, and fetches Pyodide into the user cache when there is no checkout.)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f web/node_modules/pyodide/pyodide.asm.wasm ] || [ ! -f web/node_modules/axe-core/axe.min.js ] \
   || [ ! -f web/node_modules/@wllama/wllama/esm/wasm/wllama.wasm ]; then
  echo "setup-browser: npm ci in web/ (pyodide@314.0.7, axe-core, @wllama/wllama)"
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup-browser: done"
