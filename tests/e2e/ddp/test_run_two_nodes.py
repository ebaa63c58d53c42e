"""Two torchrun "nodes" on this machine (`--nnodes 2 --node_rank 0|1`, c10d rendezvous, one process each: global
ranks 0 and 1, each LOCAL_RANK 0), running `-m debug_nan run -- shard_script.py` on an FSDP2 model whose global rank
1 gets one corrupt value at step 3. Every rank of both nodes stops together with exit 1 (each node's torchrun
reports it), and global rank 0, whichever node it landed on, writes the one report, whose finding names global
rank 1."""

import json
import subprocess

from tests.e2e.ddp.test_run_ddp import env
from tests.support import SUPPORT
from tests.support.ports import reserved_port
from tests.support.warm import python

SCRIPT = str(SUPPORT / "run" / "shard_script.py")


def test_two_nodes_stop_together_and_rank_0_names_the_global_rank(tmp_path):
    report = tmp_path / "run.json"
    with reserved_port() as port:
        nodes = [subprocess.Popen(
            [python(), "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n),
             "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
             "--rdzv_id", "two-nodes", "-m", "debug_nan", "run", "--report", str(report), "--", SCRIPT,
             "--shard", "fsdp2", "--bug", "corrupt"],
            cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
        try:
            outputs = [p.communicate(timeout=300) for p in nodes]
            done = [(p.returncode, out, err) for p, (out, err) in zip(nodes, outputs)]
        finally:
            for p in nodes:
                if p.poll() is None:
                    p.kill()
    assert [code for code, _, _ in done] == [1, 1], done[0][2][-3000:]
    main = [i for i, (_, out, _) in enumerate(done) if out]  # the node of global rank 0 prints the script's lines
    assert len(main) == 1 and done[main[0]][1] == "step 1 loss 1.752029\nstep 2 loss 1.431535\n"
    err = done[main[0]][2]
    assert "rank 1 (first to see it: rank(s) 1)" in err and "SUMMARY" not in done[1 - main[0]][2]
    assert not list(tmp_path.glob("run.rank*.json"))  # one report, global rank 0's
    data = json.loads(report.read_text())
    first = data["first_nonfinite"]
    assert (data["status"], data["integration"]["world_size"]) == ("nonfinite", 2)
    assert (first["step"], first["phase"], first["rank"], first["first_ranks"], first["module"], first["op"]) == (
        3, "forward", 1, [1], "cascade_stages.0.encoder.self_attn",
        "aten._scaled_dot_product_flash_attention_for_cpu.default")
