#!/usr/bin/env bash
# Run the test suite; pytest's closing line says how many passed. Works alone on a fresh clone: it uses the active
# virtualenv/conda env when debug-nan and pytest are installed there, else ./.venv, which it creates with
# scripts/setup.sh when it is missing. With no argument it runs both layers, tests/unit and tests/e2e, in one pytest
# (pyproject.toml's testpaths), so that pytest-xdist balances them; arguments go to pytest: `bash scripts/test.sh
# tests/unit` (or `-m unit`) runs only the fast unit layer, `-m "e2e and not processes"` the end-to-end tests run in
# this process, `-m processes` those whose subject is a process of its own, `tests/e2e/cli` one group. With
# pytest-xdist installed (the test extras) the tests run in one worker per core (many end-to-end ones start Python
# processes of their own), each torch on one thread unless OMP_NUM_THREADS is set; DEBUG_NAN_TEST_WORKERS=N sets the
# workers (1: in this process, no xdist).
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
WORKERS="${DEBUG_NAN_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
PARALLEL=()
if [[ "$WORKERS" -gt 1 ]] && "$PY" -c "import xdist" 2>/dev/null; then
    # whole files, dealt as workers free up (the longest first: tests/conftest.py), so that no worker is left with
    # a long tail: xdist's default first deals each worker a quarter of its share in collection order, all the
    # multi-rank jobs to the first
    PARALLEL=(-n "$WORKERS" --dist loadfile)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
exec "$PY" -m pytest ${PARALLEL[@]+"${PARALLEL[@]}"} "$@"
