"""The README's "real log" is the one `debug-nan run -- python docs/examples/train.py` writes today: every line it
shows (its `...` stands for lines left out) comes out, in that order, and the bundle it names replays."""

import re
import shutil

from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.support import REPO


def test_the_readmes_log_is_the_examples_log(tmp_path, run_here):
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"```\n(\[debug-nan\] run: python docs/examples/train.py.*?)```", readme, re.S)[1].splitlines()
    (tmp_path / "docs" / "examples").mkdir(parents=True)
    shutil.copy(REPO / "docs" / "examples" / "train.py", tmp_path / "docs" / "examples")
    done, stdout, stderr = run_here("python", "docs/examples/train.py")
    assert done.code == 1 and stdout.count("\n") == 2, done.output
    log, at = " ".join(stderr.split()), 0  # (compared word for word: a terminal's width wraps the lines)
    for part in "\n".join(shown).split("\n  ...\n"):
        words = " ".join(part.split())
        assert words in log[at:], f"the README's log is not the run's:\n{part}\n--- the run's ---\n{stderr}"
        at = log.index(words, at) + len(words)
    replayed = CliRunner().invoke(main, ["replay", "debug-nan-bundle-step3-micro1.pt", "--device", "cpu"])
    assert replayed.exit_code == 1 and "Same origin as recorded in the bundle." in replayed.output
