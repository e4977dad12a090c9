#!/usr/bin/env bash
# On a lent GPU machine (the device tool): installs what scripts/device-prepare.sh gathered and runs
# scripts/device_bench.py, which writes results.json and run.log to $OUT (docs/performance.md, "On a real GPU").
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 WEBINFER_HOME=/tmp/webinfer-home XDG_RUNTIME_DIR=/tmp
python3 scripts/device_bench.py "${OUT:-/tmp/webinfer-device-out}" "$@"
