#!/usr/bin/env bash
# Install debug-nan and its test extras.
#  * Inside an active virtualenv/conda env that already has torch (e.g. your CUDA torch on a GPU node): install
#    there; the torch you have is kept (never reinstalled).
#  * Otherwise: create ./.venv. Without a GPU, the CPU build torch==2.13.0 goes in first, so nothing pulls
#    gigabytes of CUDA wheels; with a GPU, pip installs the default (CUDA) torch.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]] && python -c "import torch" 2>/dev/null; then
    PY=python
    echo "setup: installing into the active environment ($(python -c 'import sys; print(sys.prefix)')), keeping torch $(python -c 'import torch; print(torch.__version__)')"
else
    if [[ ! -x .venv/bin/python ]]; then
        python3 -m venv .venv
    fi
    PY=.venv/bin/python
    "$PY" -m pip install -q --upgrade pip
    if ! "$PY" -c "import torch" 2>/dev/null; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            echo "setup: GPU found, installing the default (CUDA) torch"
            "$PY" -m pip install -q torch
        else
            echo "setup: no GPU, installing the CPU build torch==2.13.0"
            "$PY" -m pip install -q torch==2.13.0
        fi
    fi
fi
"$PY" -m pip install -q -e ".[test]"
echo "setup: done ($("$PY" -c 'import torch, debug_nan; print("debug-nan", debug_nan.__version__, "torch", torch.__version__)'))"
