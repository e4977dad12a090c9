#!/usr/bin/env bash
# The browser side's extra install step (run after scripts/setup.sh, from anywhere; safe to run again):
#  - the self-hosted Pyodide core runtime: `npm ci` in web/ (pinned pyodide@314.0.7, web/package-lock.json);
#  - pure-Python wheels of jinja2 and markupsafe for Pyodide, into build/browser-wheels/ (or $WEBINFER_BROWSER_WHEELS).
# markupsafe on PyPI ships only platform wheels and an sdist. Its setup.py falls back to a plain-Python build when the
# C speedups fail to compile, so building the sdist with a compiler that always fails (CC=/bin/false) gives a
# genuine `py3-none-any` wheel (markupsafe then uses its _native module, as it does on PyPy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
out="${WEBINFER_BROWSER_WHEELS:-$PWD/build/browser-wheels}"
mkdir -p "$out"

if [ ! -f web/node_modules/pyodide/pyodide.asm.wasm ]; then
  echo "setup-browser: npm ci in web/ (pyodide@314.0.7)"
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi

if ! ls "$out"/jinja2-3.1.6-py3-none-any.whl >/dev/null 2>&1; then
  echo "setup-browser: jinja2 wheel"
  "$PY" -m pip download -q --no-deps --only-binary=:all: jinja2==3.1.6 -d "$out"
fi
if ! ls "$out"/markupsafe-3.0.3-py3-none-any.whl >/dev/null 2>&1; then
  echo "setup-browser: markupsafe py3-none-any wheel from the sdist, without the C speedups"
  tmp="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps --no-binary=:all: markupsafe==3.0.3 -d "$tmp"
  CC=/bin/false "$PY" -m pip wheel -q --no-deps --no-build-isolation "$tmp"/markupsafe-3.0.3.tar.gz -w "$tmp"
  cp "$tmp"/markupsafe-3.0.3-py3-none-any.whl "$out"/
  rm -rf "$tmp"
fi
echo "setup-browser: done ($out)"
