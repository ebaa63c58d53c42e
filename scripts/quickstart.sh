#!/usr/bin/env bash
# Set up, then run the main job on the built-in default data (data/demo.biom + data/demo.nwk):
#   debug-nan --token-limit 512 --max-steps 10 2>&1 | tee debug.log
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ -x .venv/bin/debug-nan && -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]]; then
    export PATH="$PWD/.venv/bin:$PATH"
fi
set +e
debug-nan --token-limit 512 --max-steps 10 "$@" 2>&1 | tee debug.log
status=${PIPESTATUS[0]}
echo "quickstart: debug-nan exited with $status (0 clean, 1 non-finite found, 2 bad input); log in debug.log"
exit "$status"
