"""What both test layers share (tests/unit and tests/e2e import it; pytest collects nothing here).

    models.py       the tiny models, batches and losses written once (their docstrings state the shapes)
    scenarios.py    --task plug-ins, one numerical failure each (and healthy controls)
    public_bugs.py  --task plug-ins rebuilding NaN bugs from public threads
    state_bugs.py   --task plug-ins whose harm lives in state: buffers, schedules, checkpoints
    faults.py       a task file written into temporary folders: tasks that fail the way a user's task can
    tasks/          --task plug-ins of single features (a deep stack, an eval pass, a resume, the user's own run)
    run/            scripts as users write them, for `debug-nan run`, with their --task twins and the helpers that
                    run them alone and watched
    frameworks/     the Lightning / HF Trainer pieces: the parity bugs, their tasks and scripts
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
FAULT_TASKS = (SUPPORT / "faults.py").read_text()  # the text the tests write into a temporary folder as faults.py
