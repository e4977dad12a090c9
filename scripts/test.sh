#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite. Extra arguments go to pytest.
# With CI=true, GPU and browser tests fail instead of skipping when no adapter or browser is found.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export XDG_RUNTIME_DIR=/tmp/webinfer-xdg
export PATH="$PWD/.venv/bin:$PATH"
# numpy's decode-sized matmuls are faster single-threaded on 2 cores shared with lavapipe's threads
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
export WEBINFER_HOME="${WEBINFER_HOME:-$PWD/.venv/webinfer-home}"
set +e
python -m pytest -ra -p no:cacheprovider "$@"
rc=$?
set -e
[ $rc -eq 5 ] && { echo "pytest collected no tests"; exit 1; }
exit $rc
