#!/usr/bin/env bash
# Gathers, on this machine, what scripts/device-bench.sh needs on a lent GPU machine that cannot reach the network:
# the Vulkan loader (.gl/: Debian's libvulkan1; the machine has NVIDIA's driver but may lack the loader) and the
# Python wheels it lacks (.whl/: wgpu and its needs, gguf, wasmtime, jsonschema and its needs for the structured-
# output tests, and this project built as a wheel), for the machine's Python 3.12 on x86-64. Both folders are git-ignored; the device call carries them:
#   run(command="bash scripts/device-bench.sh", carry=[".gl", ".whl"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl .gl /tmp/amd64/partial
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2 \
  gguf==0.19.0 wasmtime==50.0.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
  rpds-py==2026.9.1
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
apt-get $o update -qq
(cd .gl && rm -f ./*.deb && apt-get $o download libvulkan1 >/dev/null)
du -sh .whl .gl
