#!/usr/bin/env bash
# Sets up (scripts/setup.sh), packs the default model (SmolLM2-135M-Instruct) once, then serves the offline chat site
# and the OpenAI-compatible API on http://127.0.0.1:8000 (open it in a browser: WebGPU, or the CPU engine without).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export XDG_RUNTIME_DIR=/tmp/webinfer-xdg
export PATH="$PWD/.venv/bin:$PATH"
[ -f "${WEBINFER_HOME:-$HOME/.cache/webinfer}/packages/SmolLM2-135M-Instruct/manifest.json" ] || webinfer pack
exec webinfer serve "$@"
