"""engine/explain/causes/precision.py: an overflow born in float16 / bfloat16 is told in that dtype's terms."""

import torch

from tests.unit.engine.explain.test_diagnose import traced


def test_a_float16_matmul_past_65504_gets_the_dtypes_evidence_and_advice():
    a = torch.full((2, 2), 300.0, dtype=torch.float16)
    _, (cause, explanation, suggestions) = traced(lambda: a @ a)  # 2 * 300 * 300 = 180000
    assert cause == "overflow"
    assert ("Low precision: float16 result beyond 65504 (the result needs 1.8e+05, 2.75x past it); its inputs had "
            "218x headroom in float16 (largest |input| 300), so the op itself left the range.") in explanation
    assert suggestions[0].startswith("Scale what grows before it leaves float16's range: for attention scores")
    assert suggestions[1].startswith('Compute this op in float32: `with torch.autocast("cpu", enabled=False):`')
    assert "--precision bf16" in suggestions[2]
    assert not any(s.startswith("Run the op in float32") for s in suggestions)  # (replaced by the one above)


def test_a_bfloat16_overflow_gets_the_evidence_and_keeps_the_generic_advice():
    a = torch.full((2,), 1e38, dtype=torch.bfloat16)
    _, (cause, explanation, suggestions) = traced(lambda: a * a)
    assert cause == "overflow" and "Low precision: bfloat16 result beyond 3.38953e+38" in explanation
    assert not any(s.startswith("Scale what grows") for s in suggestions)


def test_a_float32_overflow_is_left_as_it_was():
    _, (cause, explanation, _) = traced(lambda: torch.tensor([100.0]).exp())
    assert cause == "overflow" and "Low precision" not in explanation
