"""Backward of a function at a point where its derivative is infinite (or 0/0), with a finite forward."""

from __future__ import annotations

import torch

from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause, Phase

SINGULAR_BACKWARD = ("SqrtBackward", "RsqrtBackward", "PowBackward", "NormBackward", "LinalgVectorNormBackward",
                     "AcosBackward", "AsinBackward", "AtanhBackward", "CdistBackward", "LogBackward",
                     "Log2Backward", "Log10Backward", "ReciprocalBackward", "DivBackward", "AcoshBackward",
                     "AngleBackward", "AbsBackward", "SgnBackward", "Atan2Backward")
BACKWARD_FORMULA = {
    "Sqrt": "d/dx sqrt(x) = 1/(2 sqrt(x)) is infinite at x = 0",
    "Rsqrt": "d/dx x^-1/2 = -x^-3/2 / 2 is infinite at x = 0",
    "Pow": "d/dx x^p = p x^(p-1) is infinite at x = 0 for p < 1",
    "Norm": "the gradient of a norm, x / ||x||, is 0/0 where ||x|| = 0",
    "LinalgVectorNorm": "the gradient of a norm, x / ||x||, is 0/0 where ||x|| = 0",
    "Cdist": "the gradient of a Euclidean distance, (x - y) / d, is 0/0 where d = 0",
    "Acos": "d/dx acos(x) = -1/sqrt(1 - x^2) is infinite at |x| = 1",
    "Asin": "d/dx asin(x) = 1/sqrt(1 - x^2) is infinite at |x| = 1",
    "Atanh": "d/dx atanh(x) = 1/(1 - x^2) is infinite at |x| = 1",
    "Log": "d/dx log(x) = 1/x is infinite at x = 0",
    "Angle": "the gradient of angle(z), i z / |z|^2, is 0/0 at z = 0",
    "Abs": "the gradient of |z| for complex z, z / |z|, is 0/0 at z = 0",
    "Sgn": "the gradient of sgn(z) = z / |z| is infinite at z = 0",
    "Atan2": "the gradient of atan2(y, x), (x, -y) / (x^2 + y^2), is 0/0 at x = y = 0",
}


def singular_rule(event: OpEvent) -> tuple[str, str] | None:
    node_name = event.backward_node or ""
    if event.phase != Phase.BACKWARD or not node_name.startswith(SINGULAR_BACKWARD):
        return None
    fn = node_name.split("Backward")[0]
    formula = BACKWARD_FORMULA.get(fn, f"the derivative of {fn.lower()} is infinite there")
    evidence = []
    for name in ("result", "self", "other"):
        saved = event.saved.get(name)
        if isinstance(saved, torch.Tensor) and (saved.is_floating_point() or saved.is_complex()):
            zeros = int((saved == 0).sum())
            if zeros:
                evidence.append(f"its saved forward {name} is 0 at {zeros} of {saved.numel()} positions")
    at = f", forward at {event.forward_source}" if event.forward_source else ""
    detail = "; ".join(evidence) if evidence else "its forward input sits on the singular point"
    return Cause.GRAD_AT_SINGULARITY, (f"Backward of {fn.lower()} ({node_name}{at}) made {event.kind.upper()} from "
                                   f"finite values: {detail}; {formula}.")
