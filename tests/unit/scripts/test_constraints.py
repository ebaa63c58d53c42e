"""constraints.txt pins every test extra, never torch (a GPU node keeps its CUDA torch)."""

from __future__ import annotations

import re

from debug_nan.settings import tomllib  # (tomli on Python 3.10)
from tests.conftest import REPO


def _pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def test_constraints_pin_every_test_extra_and_never_torch():
    pins = _pins()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower() for reqs in extras.values() for req in reqs}
    assert wanted and not wanted - set(pins), f"test extras without a pin in constraints.txt: {wanted - set(pins)}"
    assert "torch" not in pins and not any(name.startswith("nvidia") for name in pins)
    assert pins["pytest"] and pins["transformers"]
