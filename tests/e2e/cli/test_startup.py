"""What runs without torch, in a fresh process: the CLI's first imports (debug_nan.errors and debug_nan.frames, before
torch loads), and the whole top process of `debug-nan run -- PROGRAM`, which only starts the program and renders
its ranks' results (the finding, the history table, the report, TensorBoard)."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from debug_nan.frames import TORCH_DIR

pytestmark = pytest.mark.processes  # a fresh interpreter's imports are the subject

# one rank's result, as app/run_folder.py holds it: a finding with its evidence, a history with a NaN, its layout
STATS = {"shape": [2], "dtype": "float32", "numel": 2, "nan": 1, "posinf": 0, "neginf": 0, "min": 1.0, "max": 1.0,
         "mean": 1.0, "std": 0.0, "absmax": 1.0, "headroom": 3.4e38}
FINDING = {"step": 2, "micro_step": 1, "phase": "eval", "module": "fc", "module_type": "Linear",
           "op": "aten._softmax.default", "kind": "nan", "cause": "all_masked_softmax", "explanation": "rows masked",
           "source": "models.py:35", "suggestions": ["guard the rows"], "inputs": {"scores": STATS}}
HISTORY = [{"step": s, "loss": 1.0, "grad_norm": g, "max_abs_activation": {"fc": a}, "grad_norms": {"fc.weight": g}}
           for s, a, g in ((1, 2.0, 0.5), (2, float("nan"), float("nan")))]
RESULT = {"rank": 0, "world": 1, "pid": 1, "ending": "trip", "code": 1, "held": "",
          "layout": [["", "Net", []], ["fc", "Linear", ["fc.weight"]]],
          "report": {"status": "nonfinite", "steps_run": 2, "first_nonfinite": FINDING, "findings": [FINDING],
                     "notes": [], "exit_code": 1, "history": HISTORY}}

CHILD = textwrap.dedent("""
    import io, json, sys, traceback
    import debug_nan.errors, debug_nan.frames as f
    assert "torch" not in sys.modules
    print(f.TORCH_DIR)
    first = []  # where torch was first imported, to name the importer when it is
    sys.addaudithook(lambda event, args: first or event != "import" or args[0] != "torch" or first.append(
        "".join(traceback.format_stack())))
    from debug_nan.app import cli  # (the CLI's dispatch of `run`)
    from debug_nan.app.command import Command
    from debug_nan.app.run_options import RunOptions
    from debug_nan.app.run_program import answer
    from debug_nan.presentation.log import Log
    out, result, tensorboard = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] or None
    options = RunOptions(report=f"{out}/run.json", tensorboard=tensorboard, command=["torchrun", "train.py"])
    shown = io.StringIO()
    code = answer([result], 1, None, Command("program", "/bin/torchrun", ["torchrun"], ["torchrun"]), options,
                  Log(None, stream=shown), 1.0)
    assert not first, "torch imported by the top process of a program:\\n" + first[0]
    print(code)
    print(shown.getvalue())
""")


def test_the_cli_and_a_programs_top_process_run_without_torch(tmp_path):
    """The CLI imports errors.py to answer --help before torch loads, and the frame rule must not pull torch in; the
    top process of `debug-nan run -- torchrun ...` renders one rank's finding, history table, report and TensorBoard
    events (where the tensorboard package is installed) without it: seconds of CPU on every node it starts on."""
    tensorboard = tmp_path / "tb" if importlib.util.find_spec("tensorboard") else None
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), json.dumps(RESULT), str(tensorboard or "")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    torch_dir, code, shown = done.stdout.split("\n", 2)
    assert torch_dir == TORCH_DIR and os.path.isfile(os.path.join(torch_dir, "__init__.py"))
    rows = [" ".join(line.split()) for line in shown.splitlines()]
    assert code == "1" and "fc (Linear) 2 nan ▅! 0.5 nan ▅!" in rows and "module fc (Linear)" in rows
    assert "in scores [2] float32, min 1 max 1, mean 1 std 0, NaN 1 (50.00%) +Inf 0 (0.00%) -Inf 0" in rows
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["first_nonfinite"]["op"] == "aten._softmax.default" and report["history"][1]["grad_norm"] == "nan"
    assert tensorboard is None or [p.name.startswith("events.out.tfevents") for p in tensorboard.iterdir()] == [True]
