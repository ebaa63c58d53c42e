"""The README's "real log" is the one `debug-nan run -- python docs/examples/train.py` writes today: every line it
shows (its `...` stands for lines left out) comes out, in that order, and the bundle it names replays. Words and
whole numbers (steps, counts, shapes) are compared exactly; the printed statistics (a number with a point or an
exponent: min, max, mean, std, headroom) within a tolerance, since they depend on the CPU's float kernels (another
CPU printed min -0.4101 for the README's -0.4108)."""

import math
import re
import shutil

from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.support import REPO

STATISTIC = re.compile(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?|[-+]?\d+e[-+]?\d+")


def template(text: str) -> tuple[str, list[float]]:
    """Text word by word (a terminal's width wraps the lines) with each statistic as `#` -> (text, statistics)."""
    words = " ".join(text.split())
    return STATISTIC.sub("#", words), [float(x) for x in STATISTIC.findall(words)]


def close(shown: float, printed: float) -> bool:
    return math.isclose(shown, printed, rel_tol=0.02, abs_tol=0.005)


def test_the_readmes_log_is_the_examples_log(tmp_path, run_here):
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"```\n(\[debug-nan\] run: python docs/examples/train.py.*?)```", readme, re.S)[1].splitlines()
    (tmp_path / "docs" / "examples").mkdir(parents=True)
    shutil.copy(REPO / "docs" / "examples" / "train.py", tmp_path / "docs" / "examples")
    done, stdout, stderr = run_here("python", "docs/examples/train.py")
    assert done.code == 1 and stdout.count("\n") == 2, done.output
    log, statistics = template(stderr)
    at = 0
    for part in "\n".join(shown).split("\n  ...\n"):
        words, expected = template(part)
        assert words in log[at:], f"the README's log is not the run's:\n{part}\n--- the run's ---\n{stderr}"
        start = log.index(words, at)
        printed = statistics[log.count("#", 0, start):][:len(expected)]
        assert all(map(close, expected, printed)), f"README {expected}\nthe run {printed}\n{stderr}"
        at = start + len(words)
    replayed = CliRunner().invoke(main, ["replay", "debug-nan-bundle-step3-micro1.pt", "--device", "cpu"])
    assert replayed.exit_code == 1 and "Same origin as recorded in the bundle." in replayed.output


def test_statistics_within_a_tolerance_words_and_counts_exactly():
    """The README's line and the one another CPU printed match; a statistic off by 10% or a count does not."""
    readme = template("in self [8, 12] float32, min -0.4108 max 0.852, mean 0.1256 std 0.486, NaN 0 (0.00%)")
    other_cpu = template("in self [8, 12] float32, min -0.4101 max 0.8527, mean 0.1263 std 0.486, NaN 0 (0.00%)")
    assert readme[0] == other_cpu[0] and all(map(close, readme[1], other_cpu[1]))
    off = template("in self [8, 12] float32, min -0.4108 max 0.937, mean 0.1256 std 0.486, NaN 0 (0.00%)")
    assert not all(map(close, readme[1], off[1]))
    assert template("NaN 12 (12.50%) -Inf 33")[0] != template("NaN 13 (12.50%) -Inf 33")[0]
