"""The one answer of `debug-nan run -- PROGRAM` (app/run_program.py `answer`), in this process: the watched
processes' results (as app/run_folder.py holds them) -> one summary, one report, the exit code."""

import io
import json

import pytest

from debug_nan.app.command import Command
from debug_nan.app.run_program import _place_log, answer
from debug_nan.app.run_options import RunOptions
from debug_nan.errors import CommandRaised, InputError
from debug_nan.presentation.log import Log

EVAL = {"step": 2, "micro_step": 1, "phase": "eval", "module": "attn", "module_type": "MaskedAttention",
        "op": "aten._softmax.default", "kind": "nan", "cause": "all_masked_softmax", "explanation": "rows masked",
        "source": "models.py:35", "suggestions": ["guard the rows"], "rank": None, "first_ranks": None}


def result(rank, status="clean", ending="ended", steps=4, finding=None, code=0, error=None):
    report = {"status": status, "steps_run": steps, "first_nonfinite": finding,
              "findings": [finding] if finding else [], "error": error, "notes": [], "exit_code": code}
    return {"rank": rank, "world": 2, "pid": 100 + rank, "ending": ending, "code": code, "report": report,
            "held": f"[debug-nan] rank {rank}'s lines\n"}


def give(results, code, tmp_path):
    stream = io.StringIO()
    options = RunOptions(report=str(tmp_path / "run.json"), command=["torchrun", "train.py"])
    exit_code = answer(results, code, None, Command("program", "/bin/torchrun", ["torchrun"], ["torchrun"]),
                       options, Log(None, stream=stream), 1.0)
    return exit_code, stream.getvalue(), json.loads((tmp_path / "run.json").read_text())


def test_a_finding_one_rank_made_alone_names_that_rank(tmp_path):
    code, said, report = give([result(0), result(1, "nonfinite", "trip", 2, dict(EVAL))], 1, tmp_path)
    assert code == 1 and report["exit_code"] == 1 and report["status"] == "nonfinite"
    first = report["first_nonfinite"]
    assert (first["rank"], first["first_ranks"], first["rank_origins"]) == (
        1, [1], {"1": "aten._softmax.default at models.py:35 (step 2, phase eval)"})
    assert "where        after step 2, eval batch 1, phase eval, rank 1 (first to see it: rank(s) 1)" in said
    assert said.count("SUMMARY") == 1 and [r["rank"] for r in report["ranks"]] == [0, 1]


def test_a_clean_run_exits_with_the_command_own_code(tmp_path):
    code, said, report = give([result(0, code=3), result(1, code=3)], 3, tmp_path)
    assert (code, report["status"], report["exit_code"]) == (3, "clean", 3) and "CLEAN: 4 step(s)" in said


def test_a_rank_that_left_while_the_others_trained_is_named_with_its_code(tmp_path):
    results = [result(0, "error", "error", 2, error="step 3: RuntimeError: Connection closed by peer"),
               result(1, "clean", "ended", 2, code=3)]
    code, said, report = give(results, 1, tmp_path)
    assert code == 1 and report["status"] == "error"
    assert report["error"].startswith("Rank 1 left the run after 2 step(s) while the others trained: it exited "
                                      "with code 3. Then: step 3: RuntimeError")
    assert "[rank 1]" not in said and "Ctrl-C" not in said


def test_a_rank_its_launcher_stopped_by_sigterm_is_not_the_one_that_left(tmp_path):
    stopped = result(0, "clean", "ended", 2, code=143)
    stopped["report"]["interrupted"] = True  # (torchrun's SIGTERM once rank 1 had exited)
    code, said, report = give([stopped, result(1, "clean", "ended", 2, code=3)], 1, tmp_path)
    assert (code, report["status"], report["interrupted"]) == (1, "error", False)
    assert report["error"] == ("Rank 1 left the run after 2 step(s) while the others trained: it exited with code "
                               "3.")
    assert "Ctrl-C" not in said and "SIGTERM" not in said


def test_a_forked_worker_refused_is_exit_2_whatever_the_command_exits_with(tmp_path):
    refused = {"rank": None, "world": 1, "pid": 7, "code": 2, "ending": "refused", "held": "",
               "report": {"status": "error", "steps_run": 0, "first_nonfinite": None, "findings": [],
                          "error": "process 7 was forked ...", "exit_code": 2}}
    code, said, report = give([refused], 0, tmp_path)
    assert (code, report["status"], report["exit_code"], report["error"]) == (2, "error", 2,
                                                                              "process 7 was forked ...")
    assert "ERROR after 0 step(s) (exit 2)" in said


def test_a_rank_killed_leaves_no_result_and_is_named(tmp_path):
    code, _, report = give([result(0, "error", "error", 2, error="gloo: connection reset")], 137, tmp_path)
    assert code == 137 and report["error"].startswith("Rank 1 ended without a result while the others trained")


def test_no_process_that_trained_is_bad_input_unless_the_command_failed_on_its_own(tmp_path):
    with pytest.raises(InputError, match="without training: no Python process it started"):
        give([], 0, tmp_path)
    with pytest.raises(CommandRaised, match="the command failed [(]exit 3[)] before any process") as failed:
        give([], 3, tmp_path)
    assert failed.value.exit_code == 3


def test_a_node_without_rank_0_names_only_its_own_ranks_and_writes_beside_rank_0s_report(tmp_path):
    """`srun debug-nan run -- torchrun --nnodes 2 ...`: node 1's command runs global rank 1 only (its torchrun's
    RANK - LOCAL_RANK, LOCAL_WORLD_SIZE); rank 0 is on the other node, not a rank that left."""
    clean = dict(result(1), node_ranks=[1])
    stream = io.StringIO()
    options = RunOptions(report=str(tmp_path / "run.json"), command=["torchrun", "train.py"])
    code = answer([clean], 0, None, Command("program", "/bin/torchrun", ["torchrun"], ["torchrun"]), options,
                  Log(None, stream=stream), 1.0)
    report = json.loads((tmp_path / "run.rank1.json").read_text())
    assert (code, report["status"], report["error"]) == (0, "clean", None) and not (tmp_path / "run.json").exists()
    assert f"JSON report written to {tmp_path / 'run.rank1.json'}" in stream.getvalue()


def test_the_history_of_the_rank_of_the_finding_is_the_answers_table(tmp_path):
    """Each rank leaves its history (its report's) and its model's layout; the top prints the table of the rank
    that made the value, as `debug-nan run` in one process does."""
    steps = [{"step": s, "loss": 1.0, "grad_norm": g, "max_abs_activation": {"fc": a}, "grad_norms": {"fc.weight": g}}
             for s, a, g in ((1, 2.0, 0.5), (2, float("nan"), float("nan")))]
    made = result(1, "nonfinite", "trip", 2, dict(EVAL, module="fc"))
    made["report"]["history"], made["layout"] = steps, [["", "Net", []], ["fc", "Linear", ["fc.weight"]]]
    other = dict(result(0, "nonfinite", "trip", 2, dict(EVAL, module="fc", rank=1)), layout=[["", "Net", []]])
    code, said, report = give([other, made], 1, tmp_path)
    table = said[said.index("HISTORY (per layer, 2 step(s))"):said.index("=== SUMMARY ===")]
    rows = [" ".join(line.split()) for line in table.splitlines()]
    assert code == 1 and "fc (Linear) 2 nan ▅! 0.5 nan ▅!" in rows and "total gradient norm 0.5 nan ▅!" in rows
    assert report["history"][1]["max_abs_activation"] == {"fc": "nan"}


def test_a_rank_that_raised_systemexit_itself_is_named_with_its_launchers_code(tmp_path):
    """`raise SystemExit(3)` (not sys.exit) leaves the rank's own code unseen: torchrun's word names it; without
    one, the summary says what is known, not a code."""
    unseen = dict(result(1, "clean", "ended", 2, code=0), code_seen=False)
    stopped = result(0, "clean", "ended", 2, code=143)
    stopped["report"]["interrupted"] = True
    stream = io.StringIO()
    options = RunOptions(report=str(tmp_path / "run.json"), command=["torchrun", "train.py"])
    command = Command("program", "/bin/torchrun", ["torchrun"], ["torchrun"])
    answer([stopped, unseen], 1, None, command, options, Log(None, stream=stream), 1.0, {1: 3, 0: -15})
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["error"] == ("Rank 1 left the run after 2 step(s) while the others trained: it exited with code "
                               "3.")
    (tmp_path / "alone").mkdir()
    _, _, report = give([result(0, "clean", "ended", 4), dict(result(1, "clean", "ended", 2), code_seen=False)], 0,
                        tmp_path / "alone")
    assert report["error"].startswith("Rank 1 left the run after 2 step(s) while the others trained: its script "
                                      "ended there (it returned, or raised SystemExit itself")


def test_the_log_of_a_node_without_rank_0_goes_beside_rank_0s(tmp_path):
    """Each node's debug-nan streams its --log copy under a name of its own process, then moves it to --log (the
    node of global rank 0) or beside it (run.rank1.log): two nodes on one file system never share a file."""
    options = RunOptions(log=str(tmp_path / "run.log"))
    for ours in ([1], [0, 1]):
        log = Log(str(tmp_path / f".copy{ours[0]}"), stream=io.StringIO())
        log(f"[debug-nan] node of rank {ours[0]}")
        _place_log(log, options, ours)
    assert (tmp_path / "run.rank1.log").read_text() == "[debug-nan] node of rank 1\n"
    assert (tmp_path / "run.log").read_text() == "[debug-nan] node of rank 0\n"
