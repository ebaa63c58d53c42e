"""A watch-only finding of `debug-nan run` whose replay fell short: it says so, and `--trace-at` comes first."""

from debug_nan.engine.explain.fallback import suggest_trace_at
from debug_nan.engine.explain.evidence import watch_only_finding
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.watch import Check
from tests.support.models import Net


def _finding(kind: str, why: str | None = None):
    return watch_only_finding(4, 2, None, Check(kind, "fc.weight", float("nan")), Net(), why)


def test_a_replay_that_stayed_finite_gets_the_exact_command_quoted_for_a_shell():
    finding = _finding(CheckKind.GRAD)
    suggest_trace_at(finding, ["python", "train.py", "--name", "two words"])
    assert finding.suggestions[0].startswith(
        "Run the command again as `debug-nan run --trace-at 4:2 -- python train.py --name 'two words'`")
    assert "stayed finite where the run did not" in finding.explanation
    assert "non-deterministic kernel" not in finding.explanation


def test_an_updates_finding_and_a_replayed_one_are_left_alone():
    update = _finding(CheckKind.PARAM, "the optimizer step left every parameter finite.")
    before = list(update.suggestions)
    suggest_trace_at(update, ["python", "train.py"])
    assert update.suggestions == before
    suggest_trace_at(None, ["python", "train.py"])  # no finding: nothing to do
