"""scripts/remote_debug.sh end to end, with stand-ins for ssh and scp that run on this machine."""

import json
import os
import stat
import subprocess
import sys

from tests.conftest import REPO, SCENARIOS


def _fake(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_remote_run_tees_the_log_and_fetches_report_and_bundle(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # ssh HOST CMD -> run CMD here (without the login shell, which would reset PATH); scp HOST:SRC DEST -> cp
    _fake(bin_dir / "ssh", 'shift; cmd="$*"; eval "${cmd/bash -lc/bash -c}"\n')
    _fake(bin_dir / "scp", 'args=(); for a in "$@"; do [[ $a == -* ]] && continue; args+=("$a"); done\n'
                           'src="${args[0]#*:}"; eval cp $src "${args[1]}"\n')
    _fake(bin_dir / "debug-nan", f'exec {sys.executable} -m debug_nan "$@"\n')
    node = tmp_path / "node"
    node.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(tmp_path))
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "remote_debug.sh"), "-d", str(node), "-o", str(tmp_path / "here"),
         "user@gpu-node", "--", "--task", f"{SCENARIOS}:masked_softmax", "--device", "cpu"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    here = tmp_path / "here"
    log = (here / "debug.log").read_text()
    assert "cause        all_masked_softmax" in log and "\r" not in log
    report = json.loads((here / "report.json").read_text())
    assert report["first_nonfinite"]["cause"] == "all_masked_softmax"
    assert (here / "debug-nan-bundle-step1-micro1.pt").is_file()
    assert "debug-nan exited with 1" in proc.stdout


def test_no_host_is_exit_2():
    proc = subprocess.run(["bash", str(REPO / "scripts" / "remote_debug.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and "give the HOST" in proc.stderr
