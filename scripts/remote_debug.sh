#!/usr/bin/env bash
# Run debug-nan on a remote GPU node over SSH; tee the log back here and fetch the JSON report and any repro
# bundle.
#
#   scripts/remote_debug.sh [-d REMOTE_DIR] [-e "ENV SETUP"] [-o LOCAL_DIR] [-s SSH_OPTION]... HOST [-- ARGS...]
#
#   -d  folder on the node to run in (your project, with ./data) [default: ~]
#   -e  shell command that sets up the environment first, e.g. "conda activate aam" or "source .venv/bin/activate"
#   -o  local folder for debug.log, the report and bundles [default: ./debug-nan-HOST]
#   -s  extra ssh/scp option, repeatable (e.g. -s -J -s gateway, -s -p -s 2222)
#   ARGS  passed to debug-nan, e.g. -- --token-limit 512 --max-steps 10 --device cuda
#
# The remote command gets no terminal, so the progress bar stays off and the log is plain text. The exit code
# is debug-nan's: 0 clean, 1 non-finite found, 2 bad input (255: ssh itself failed).
set -uo pipefail

remote_dir="~"
env_setup=""
out_dir=""
ssh_opts=()
while getopts "d:e:o:s:h" opt; do
    case "$opt" in
        d) remote_dir="$OPTARG" ;;
        e) env_setup="$OPTARG" ;;
        o) out_dir="$OPTARG" ;;
        s) ssh_opts+=("$OPTARG") ;;
        h) sed -n '2,16p' "$0"; exit 0 ;;
        *) sed -n '2,16p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [[ $# -lt 1 ]]; then
    echo "remote_debug.sh: error: give the HOST (e.g. user@gpu-node); -h for help" >&2
    exit 2
fi
host="$1"
shift
[[ "${1:-}" == "--" ]] && shift
out_dir="${out_dir:-./debug-nan-${host##*@}}"
mkdir -p "$out_dir"

run_id="debug-nan-$(date +%Y%m%d-%H%M%S)"
args=""
for a in "$@"; do args+=" $(printf '%q' "$a")"; done
remote="cd $remote_dir && ${env_setup:+$env_setup && }mkdir -p $run_id && debug-nan$args --report $run_id/report.json --bundle-dir $run_id 2>&1"

echo "remote_debug: ssh $host: $remote" | tee "$out_dir/debug.log"
ssh "${ssh_opts[@]}" "$host" "bash -lc $(printf '%q' "$remote")" | tee -a "$out_dir/debug.log"
status=${PIPESTATUS[0]}
scp -q "${ssh_opts[@]}" "$host:$remote_dir/$run_id/*" "$out_dir/" 2>/dev/null \
    && echo "remote_debug: fetched $(ls "$out_dir" | tr '\n' ' ')" \
    || echo "remote_debug: nothing to fetch from $host:$remote_dir/$run_id"
echo "remote_debug: debug-nan exited with $status; log in $out_dir/debug.log"
exit "$status"
