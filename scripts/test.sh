#!/usr/bin/env bash
# Run the test suite; pytest's closing line says how many passed. Works alone on a fresh clone: it uses the active
# virtualenv/conda env when debug-nan and pytest are installed there, else ./.venv, which it creates with
# scripts/setup.sh when it is missing. Extra arguments go to pytest: `bash scripts/test.sh -m "not e2e"` runs only
# the fast unit layer.
set -euo pipefail
cd "$(dirname "$0")/.."
ready() { "$1" -c "import debug_nan, torch, pytest" 2>/dev/null; }
if [[ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]] && ready python; then
    PY=python
else
    if ! { [[ -x .venv/bin/python ]] && ready .venv/bin/python; }; then
        echo "test: no environment with debug-nan found: running scripts/setup.sh first"
        bash scripts/setup.sh
    fi
    PY=.venv/bin/python
    if [[ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]] && ready python; then PY=python; fi
fi
exec "$PY" -m pytest tests "$@"
