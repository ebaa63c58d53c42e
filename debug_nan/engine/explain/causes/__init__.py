"""The cause rules of tier 3 (diagnose.py runs them in order): each takes an OpEvent and returns (cause code,
evidence in plain words) or None when it does not apply; precision.py adds the evidence and advice of an overflow
born in float16 / bfloat16 to any rule's."""
