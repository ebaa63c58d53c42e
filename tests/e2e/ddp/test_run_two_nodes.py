"""Two torchrun "nodes" on this machine (`--nnodes 2 --node_rank 0|1`, static rendezvous at node 0: global rank =
node rank, one process each, each LOCAL_RANK 0), running `shard_script.py` on an FSDP2 model whose global rank 1 gets
one corrupt value at step 3, each node watched its own way in the same job:
  * node 0 as `torchrun ... -m debug_nan run -- shard_script.py` (debug-nan inside the rank);
  * node 1 as a SLURM job step runs it on its node (`srun debug-nan run -- torchrun ...`): `debug-nan run -- torchrun
    ...`, the rank watched through the start-up hook, and that node's top debug-nan gives its node's one answer.
Every rank stops together with exit 1 (each node's command reports it); global rank 0 writes run.json, and node 1's
top, which holds no rank 0, writes its answer beside it (run.rank1.json) rather than over it: both name global rank
1, and node 1's summary does not take rank 0 (on the other node) for a rank that left. (The same job is the test of
one corrupt value in an FSDP2 rank's batch: rank 1's forward overflows, rank 0's loss stays finite, its gradients
go NaN through FSDP's reduce-scatter, every rank replays and rank 1's replay names the op.)"""

import json
import subprocess
import sys

from tests.e2e.ddp.test_run_ddp import env
from tests.support import SUPPORT
from tests.support.ports import reserved_port

SCRIPT = str(SUPPORT / "run" / "shard_script.py")
ARGS = ["--", SCRIPT, "--shard", "fsdp2", "--bug", "corrupt"]
WHERE = (3, "forward", 1, [1], "cascade_stages.0.encoder.self_attn",
         "aten._scaled_dot_product_flash_attention_for_cpu.default")


def node(n: int, port: int) -> list[str]:
    return ["-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port)]


def where(report: dict) -> tuple:
    first = report["first_nonfinite"]
    return tuple(first[k] for k in ("step", "phase", "rank", "first_ranks", "module", "op"))


def test_two_nodes_stop_together_and_each_names_the_global_rank(tmp_path):
    with reserved_port() as port:
        nodes = [
            subprocess.Popen([sys.executable, *node(0, port), "-m", "debug_nan", "run", "--report", "run.json", *ARGS],
                             cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            subprocess.Popen([sys.executable, "-m", "debug_nan", "run", "--report", "run.json", "--", sys.executable,
                              *node(1, port), *ARGS[1:]],
                             cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        try:
            outputs = [p.communicate(timeout=300) for p in nodes]
            done = [(p.returncode, out, err) for p, (out, err) in zip(nodes, outputs)]
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
    assert [code for code, _, _ in done] == [1, 1], done[0][2][-3000:] + done[1][2][-3000:]
    (_, out0, err0), (_, out1, err1) = done
    assert out0 == "step 1 loss 1.752029\nstep 2 loss 1.431535\n" and out1 == ""  # global rank 0 prints the lines
    assert "rank 1 (first to see it: rank(s) 1)" in err0
    assert "every rank replays with them (the model is sharded)" in err0
    data = json.loads((tmp_path / "run.json").read_text())
    assert (data["status"], data["integration"]["world_size"]) == ("nonfinite", 2)
    assert where(data) == WHERE and data["first_nonfinite"]["cause"] == "overflow"
    # node 1's top: one summary, last on screen, naming global rank 1; its report beside rank 0's
    assert err1.count("=== SUMMARY ===") == 1 and "Traceback" not in err1[err1.index("=== SUMMARY ==="):]
    said = " ".join(err1[err1.index("=== SUMMARY ==="):].split())
    assert "rank 1 (first to see it: rank(s) 1)" in said and "without a result" not in said
    node1 = json.loads((tmp_path / "run.rank1.json").read_text())
    assert (node1["status"], node1["exit_code"], node1["integration"]["kind"]) == ("nonfinite", 1, "program")
    assert where(node1) == WHERE and [r["rank"] for r in node1["ranks"]] == [1]
    assert f"JSON report written to {tmp_path / 'run.rank1.json'}" in err1
