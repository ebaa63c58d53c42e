#!/usr/bin/env bash
# Run the test suite with the environment scripts/setup.sh installed into.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python
if [[ -x .venv/bin/python && -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]]; then
    PY=.venv/bin/python
fi
exec "$PY" -m pytest tests "$@"
