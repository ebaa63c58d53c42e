"""engine/explain/evidence.py explosion_finding: the largest gradient's module named, the root's own included."""

from torch import nn

from debug_nan.engine.explain.evidence import explosion_finding
from debug_nan.engine.watch.history import StepRecord


def _steps(norms: dict[str, float]) -> list[StepRecord]:
    first = StepRecord(step=1, grad_norm=10.0, grad_norms={k: 1.0 for k in norms})
    last = StepRecord(step=2, grad_norm=sum(v * v for v in norms.values()) ** 0.5, grad_norms=norms)
    return [first, last]


def test_a_parameter_of_the_root_itself_is_the_models():
    """A bare Linear's `weight` (a script that trains one layer): its module is the model, not "outside" it."""
    steps = _steps({"weight": 3e8, "bias": 1e6})
    f = explosion_finding(steps[-1], 10.0, steps, 1, 1e6, nn.Linear(4, 1))
    assert (f.module, f.module_type, f.cause) == ("", "Linear", "gradient_explosion")
    assert "Largest: `weight` 3e+08 (100% of the squared total)" in f.explanation
    # the threshold's value survives the advice's words for each entry point (which drop a flag's value)
    assert "past the explosion threshold 1e+06 (--explosion-threshold) and" in f.explanation


def test_a_submodules_parameter_names_its_module():
    steps = _steps({"0.weight": 1.0, "2.weight": 5e7})
    f = explosion_finding(steps[-1], 10.0, steps, 1, 1e6, nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)))
    assert (f.module, f.module_type) == ("2", "Linear")
