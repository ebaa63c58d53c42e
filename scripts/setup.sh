#!/usr/bin/env bash
# Install debug-nan and its test extras.
#  * Inside an active virtualenv/conda env that already has torch (e.g. your CUDA torch on a GPU node): install
#    there; the torch you have is kept (never reinstalled).
#  * Otherwise: create ./.venv and install torch==2.13.0 into it:
#      - with a GPU: the default (CUDA) build from the default index;
#      - without a GPU: a CPU build, never gigabytes of CUDA packages. First the default index, when what it
#        would install is a CPU build (a local CPU wheel, macOS, Windows: checked with `pip install --dry-run`);
#        else PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu); when neither can give a CPU build,
#        it stops and says how to install one (DEBUG_NAN_TORCH_INDEX=default forces the default index).
#  * The test extras (pytest, transformers, lightning, ...) are installed at the versions in constraints.txt (the
#    tested ones) in ./.venv and when CI=true; torch is never in it.
# Overrides (tests, unusual machines): DEBUG_NAN_GPU=0|1 instead of nvidia-smi; DEBUG_NAN_PIP=CMD instead of
# "python -m pip"; DEBUG_NAN_TORCH_INDEX=cpu|default to choose the index; DEBUG_NAN_CONSTRAINTS=0|1 to use constraints.txt never / always;
# DEBUG_NAN_EXTRAS_WITH_UV=1 (CI) to install the test extras into ./.venv with uv instead of pip.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PIN="torch==2.13.0"
CPU_INDEX="https://download.pytorch.org/whl/cpu"

if [[ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]] && python -c "import torch" 2>/dev/null; then
    PY=python
    echo "setup: installing into the active environment ($(python -c 'import sys; print(sys.prefix)')), keeping torch $(python -c 'import torch; print(torch.__version__)')"
else
    if [[ ! -x .venv/bin/python ]]; then
        python3 -m venv .venv
    fi
    PY=.venv/bin/python
fi

pip_() {
    if [[ -n "${DEBUG_NAN_PIP:-}" ]]; then $DEBUG_NAN_PIP "$@"; else "$PY" -m pip "$@"; fi
}

has_gpu() {
    if [[ -n "${DEBUG_NAN_GPU:-}" ]]; then [[ "$DEBUG_NAN_GPU" == 1 ]]; return; fi
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# Would the default index install CUDA packages with torch? (a dry run: metadata only, nothing installed)
default_index_is_cpu() {
    local report
    report=$(mktemp)
    if ! pip_ install --dry-run --quiet --report "$report" "$TORCH_PIN" >/dev/null 2>&1; then
        rm -f "$report"
        return 1
    fi
    if grep -qiE '"name": *"(nvidia-[a-z0-9-]+|triton)"' "$report"; then
        rm -f "$report"
        return 1
    fi
    rm -f "$report"
}

install_cpu_torch() {
    case "${DEBUG_NAN_TORCH_INDEX:-}" in
        default) echo "setup: no GPU; DEBUG_NAN_TORCH_INDEX=default: $TORCH_PIN from the default index"
                 pip_ install -q "$TORCH_PIN"; return ;;
        cpu) ;;
        *) if default_index_is_cpu; then
               echo "setup: no GPU; the default index has a CPU build of $TORCH_PIN: installing it"
               pip_ install -q "$TORCH_PIN"
               return
           fi ;;
    esac
    echo "setup: no GPU; installing the CPU build of $TORCH_PIN from $CPU_INDEX"
    if pip_ install -q --timeout 30 --retries 1 --index-url "$CPU_INDEX" "$TORCH_PIN"; then
        return
    fi
    echo "setup: error: no CPU build of $TORCH_PIN could be installed: $CPU_INDEX cannot be reached and the default" \
         "index would install the CUDA build (gigabytes of CUDA packages on a machine without a GPU). Install a CPU" \
         "torch yourself (pip install $TORCH_PIN --index-url $CPU_INDEX, or a local wheel), or rerun with" \
         "DEBUG_NAN_TORCH_INDEX=default to accept the CUDA build." >&2
    exit 1
}

if [[ "$PY" != python ]]; then
    pip_ install -q --upgrade pip
    if ! "$PY" -c "import torch" 2>/dev/null; then
        if has_gpu; then
            echo "setup: GPU found, installing the default (CUDA) $TORCH_PIN"
            pip_ install -q "$TORCH_PIN"
        else
            install_cpu_torch
        fi
    fi
fi
# The test extras at the tested versions (constraints.txt) in setup's own .venv and in CI; in your own active
# environment only with DEBUG_NAN_CONSTRAINTS=1 (they would move your other packages). DEBUG_NAN_CONSTRAINTS=0: never.
CONSTRAINTS=()
if [[ "${DEBUG_NAN_CONSTRAINTS:-}" != 0 ]] && [[ "$PY" != python || "${CI:-}" == true || "${DEBUG_NAN_CONSTRAINTS:-}" == 1 ]]; then
    CONSTRAINTS=(-c constraints.txt)
    echo "setup: test extras pinned to the tested versions in constraints.txt"
fi
if [[ "${DEBUG_NAN_EXTRAS_WITH_UV:-}" == 1 && "$PY" != python ]]; then
    # (CI: uv, pinned, installs the same pinned extras in parallel in a fraction of pip's CPU time; torch, already
    # installed by pip above from wherever it came, satisfies them and stays)
    pip_ install -q "uv==0.13.9"
    .venv/bin/uv pip install -q --python "$PY" -e ".[test]" ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"}
else
    pip_ install -q -e ".[test]" ${CONSTRAINTS[@]+"${CONSTRAINTS[@]}"}  # (an empty array is unbound under set -u in bash < 4.4)
fi
echo "setup: done ($("$PY" -c 'import torch, debug_nan; print("debug-nan", debug_nan.__version__, "torch", torch.__version__)'))"
