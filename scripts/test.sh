#!/usr/bin/env bash
# Run the test suite with the environment scripts/setup.sh installed into; pytest's closing line says how many
# passed. Extra arguments go to pytest: `bash scripts/test.sh -m "not e2e"` runs only the fast unit layer.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python
if [[ -x .venv/bin/python && -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]]; then
    PY=.venv/bin/python
fi
exec "$PY" -m pytest tests "$@"
