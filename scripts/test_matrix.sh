#!/usr/bin/env bash
# The support matrix's extra legs (docs/support.md): the oldest supported torch on the oldest and on the newest
# supported Python, each in a new virtualenv of its own, running the version-sensitive core of the suite: the unit
# tests of what differs between torch versions (hooks, dispatch modes, DDP's reducer, optimizer hooks, GradScaler,
# torch.compile) and the end-to-end core (`run`, the parity rows without the frameworks whose releases need a newer
# torch, torchrun/DDP). The main leg (scripts/test.sh: the current pair, the whole suite) is not repeated here.
#
#   bash scripts/test_matrix.sh              # every leg (CI=true runs it from .ci/run)
#   DEBUG_NAN_MATRIX_LEGS=py3.13-torch2.5 bash scripts/test_matrix.sh   # one leg
#   DEBUG_NAN_MATRIX=0 bash .ci/run          # skip the legs (a local run of the CI script)
#
# Each leg's test dependencies are pinned to versions that support its torch (constraints/<leg>.txt, torch itself
# is pinned here). The packages come from PyPI through uv (pinned below, installed into the cache's own venv): it
# resolves in parallel and caches every wheel, where pip took minutes for the test dependencies (docs/support.md).
# uv's cache keeps every wheel unpacked, and each leg's
# virtualenv hardlinks from it: PyPI's torch is a CUDA build (about 2.8 GB of wheels with its nvidia-* packages,
# which are py3-none and shared between Pythons), about 60 s to fetch once, then about 3 s per install.
# The cache (DEBUG_NAN_MATRIX_CACHE, default ~/.cache/debug-nan/matrix) is kept between runs; the legs' virtualenvs
# are made anew every run. A leg whose Python, uv or packages cannot be had fails (exit 1): never a silent pass.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
CACHE="${DEBUG_NAN_MATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/debug-nan/matrix}"
# name  python  torch  tests (core: the unit and end-to-end core below; unit: its unit part, where the oldest torch
# on the oldest Python has run the end-to-end core already: CI's minutes are two CPUs')
LEGS=("py3.10-torch2.4 3.10 2.4.1 core"
      "py3.13-torch2.5 3.13 2.5.1 unit")

# The version-sensitive core (about 2 min of tests per leg on 2 cores, see docs/support.md): the unit tests of what
# differs between torch versions, then a few end-to-end runs of each entry point and of torchrun/DDP.
UNIT=(tests/unit/foundation/test_torch_support.py tests/unit/test_layers.py tests/unit/foundation/test_settings.py
      tests/unit/engine/trace/test_tracer.py tests/unit/engine/watch/test_watch.py
      tests/unit/engine/replay/test_snapshot.py tests/unit/drivers/run/test_tape.py tests/unit/drivers/run/test_ranks.py
      tests/unit/drivers/monitor/test_api.py tests/unit/drivers/run/test_bundle.py
      tests/unit/presentation/test_bundle_signature.py tests/unit/engine/session/test_precision.py
      tests/unit/drivers/run/test_tape_precision.py)
# (the two-rank tests, 30-90 s each on a loaded 2-core machine, live in tests/e2e/ddp and are left to the main leg,
# but the one below: torchrun, the ranks' agreement and DDP's reducer on the oldest torch)
SKIP=()
PARITY=tests/e2e/frameworks/test_parity.py::test_the_same_bug_gives_the_same_finding
E2E=("tests/e2e/run/test_run_plain.py::test_broken_loop_same_finding_as_the_task[masked-masked-2-where0]"
     "tests/e2e/run/test_run_scaler.py::test_scaler_overflow_steps_are_skipped_and_the_nan_after_them_is_found"
     "tests/e2e/run/test_run_optimizer.py::test_optimizer_phase_same_finding_as_the_task"
     "tests/e2e/run/test_run_bundles.py::test_a_loss_code_bug_replays_from_the_bundle_without_the_script"
     "tests/e2e/cli/test_bundle_trust.py::test_a_task_bundle_loads_with_weights_only"
     "tests/unit/engine/watch/test_watch_compile.py::test_the_watch_leaves_one_graph_without_breaks"
     # the parity rows of the CLI, the Monitor and `debug-nan run` of a plain loop (Lightning and the HF Trainer
     # need framework releases that need a newer torch: the main leg runs them)
     "$PARITY[every_label_ignored-cli]" "$PARITY[every_label_ignored-monitor]" "$PARITY[every_label_ignored-run]"
     "$PARITY[optimizer_divides_by_zero-cli]" "$PARITY[optimizer_divides_by_zero-run]"
     # mixed precision: the autocast state's API (torch >= 2.4) and the GradScaler's probe
     "$PARITY[bf16_labels_ignored-cli]" "$PARITY[bf16_labels_ignored-monitor]" "$PARITY[bf16_labels_ignored-run]"
     "tests/e2e/run/test_run_precision.py::test_a_real_nan_under_the_grad_scaler_is_found_at_its_first_step"
     "tests/e2e/ddp/test_run_ddp.py::test_a_nan_born_in_rank_1s_backward_is_rank_1s_though_every_rank_saw_it_first")

say() { echo "matrix: $*"; }
die() { echo "matrix: error: $*" >&2; exit 1; }

if [[ "${DEBUG_NAN_MATRIX:-}" == 0 ]] || [[ "${CI:-}" != true && "${DEBUG_NAN_MATRIX:-}" != 1 ]]; then
    say "skipped (the legs run under CI=true or DEBUG_NAN_MATRIX=1; DEBUG_NAN_MATRIX=0 skips them)"
    exit 0
fi

find_python() {  # python3.X on PATH (not a pyenv shim of another version), else pyenv's newest 3.X
    local want=$1 root candidate
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for candidate in "$(command -v "python$want" 2>/dev/null)" \
                     $(ls -d "$root"/versions/"$want".*/bin/python 2>/dev/null | sort -rV); do
        if [[ -n "$candidate" ]] && "$candidate" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$want'" \
                2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

mkdir -p "$CACHE"
export UV_CACHE_DIR="$CACHE/uv" UV_NO_PROGRESS=1
UV="$CACHE/tools/bin/uv"
if ! "$UV" --version 2>/dev/null | grep -q " $UV_VERSION"; then
    say "installing uv $UV_VERSION (PyPI) into $CACHE/tools"
    rm -rf "$CACHE/tools"
    python3 -m venv "$CACHE/tools" && "$CACHE/tools/bin/python" -m pip install -q "uv==$UV_VERSION" \
        || die "could not install uv $UV_VERSION from PyPI"
fi

# The legs run on a copy of the working tree (its tracked and untracked files, none of the ignored ones): .ci/run
# runs scripts/setup.sh beside them, and two editable installs of one folder would write its metadata
# (debug_nan.egg-info) at the same time.
SRC="$CACHE/src"
rm -rf "$SRC" && mkdir -p "$SRC"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$SRC"
else
    tar --exclude=./.venv --exclude=./.git --exclude=./debug_nan.egg-info -cf - . | tar -xf - -C "$SRC"
fi
cd "$SRC"

failed=()
for leg in "${LEGS[@]}"; do
    read -r name python torch tests <<<"$leg"
    if [[ -n "${DEBUG_NAN_MATRIX_LEGS:-}" && " $DEBUG_NAN_MATRIX_LEGS " != *" $name "* ]]; then
        continue
    fi
    started=$SECONDS
    interpreter=$(find_python "$python") || die "$name: no Python $python here (python$python on PATH or pyenv's)"
    venv="$CACHE/venv-$name"
    rm -rf "$venv"
    "$UV" venv -q --python "$interpreter" "$venv" || die "$name: could not make its virtualenv"
    say "$name: installing torch==$torch and the test dependencies (constraints/$name.txt) with $interpreter"
    "$UV" pip install -q --python "$venv/bin/python" -c "constraints/$name.txt" "torch==$torch" -e "$SRC" \
        pytest pytest-xdist transformers matplotlib \
        || die "$name: could not install torch==$torch and its test dependencies from PyPI"
    installed=$((SECONDS - started))
    # uv writes no bytecode: the first imports compile it, here once rather than in every pytest worker at once
    # (an optimizer's first parameter group imports torch._dynamo); the same process says what was installed
    versions=$("$venv/bin/python" -c 'import sys, torch, debug_nan.app.cli, pytest
torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))])
print("Python", sys.version.split()[0], "torch", torch.__version__)') \
        || die "$name: torch or debug-nan does not import in its virtualenv (the error above)"
    say "$name: installed in ${installed} s: $versions"
    selected=("${UNIT[@]}")
    if [[ $tests == core ]]; then selected+=("${E2E[@]}"); fi
    if ! OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -p no:cacheprovider -q -n "$(nproc 2>/dev/null || echo 2)" \
            --durations=10 "${selected[@]}" ${SKIP[@]+"${SKIP[@]}"}; then
        failed+=("$name")
    fi
    say "$name: $((SECONDS - started)) s in all (install ${installed} s)"
done
[[ ${#failed[@]} -eq 0 ]] || die "failed: ${failed[*]}"
say "every leg passed"
